package main

import (
	"strings"
	"testing"
)

// TestServiceUnitEgress (issue 35 B49): the packaged unit lets the agent
// reach events.syslog on another host: it sets no IPAddressDeny= (with
// IPAddressDeny=any and IPAddressAllow=localhost, the README's own
// udp://10.0.0.5:514 got EPERM), and says in its comments how to add a
// filter that allows the SIEM.
func TestServiceUnitEgress(t *testing.T) {
	u := unitSettings(t)
	if d := u["IPAddressDeny"]; len(d) > 0 {
		t.Errorf("IPAddressDeny=%v (IPAddressAllow=%v): events.syslog to a remote SIEM is refused", d, u["IPAddressAllow"])
	}
	for _, f := range []string{"RestrictAddressFamilies"} {
		if v := strings.Join(u[f], " "); !strings.Contains(v, "AF_INET") || !strings.Contains(v, "AF_INET6") {
			t.Errorf("%s=%q: reports need AF_INET and AF_INET6", f, v)
		}
	}
}
