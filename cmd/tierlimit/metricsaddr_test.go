package main

import (
	"net"
	"strings"
	"testing"
)

// TestMetricsListenAddr: every form --metrics-addr takes on IPv4, IPv6 and
// dual-stack nodes, including what the DaemonSet's
// --metrics-addr=[$(POD_IP)]:9713 expands to for either family, and a bare
// IP; the forms that cannot be read are refused, naming the flag.
func TestMetricsListenAddr(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"127.0.0.1:9713", "127.0.0.1:9713"},
		{"0.0.0.0:0", "0.0.0.0:0"},
		{":9713", ":9713"},
		{"localhost:9713", "localhost:9713"},
		{"[10.1.2.3]:9713", "10.1.2.3:9713"},       // DaemonSet, IPv4 pod IP
		{"[fd00:10::5]:9713", "[fd00:10::5]:9713"}, // DaemonSet, IPv6 pod IP
		{"[::]:9713", "[::]:9713"},                 // dual-stack wildcard
		{"[::ffff:10.1.2.3]:9713", "[::ffff:10.1.2.3]:9713"},
		{"[fe80::1%eth0]:9713", "[fe80::1%eth0]:9713"},
		{"10.1.2.3", "10.1.2.3:9713"},
		{"fd00:10::5", "[fd00:10::5]:9713"},
		{"[fd00:10::5]", "[fd00:10::5]:9713"},
		{"::", "[::]:9713"},
		{"fe80::1%eth0", "[fe80::1%eth0]:9713"},
	} {
		got, err := metricsListenAddr(c.in)
		if err != nil || got != c.want {
			t.Errorf("metricsListenAddr(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"fd00:10::5:99999", "10.1.2.3:", "10.1.2.3:70000", "host", "[fd00::1", "fd00::1]:9713", "1.2.3.4:x"} {
		if got, err := metricsListenAddr(in); err == nil || !strings.Contains(err.Error(), "--metrics-addr") {
			t.Errorf("metricsListenAddr(%q) = %q, %v; want an error naming --metrics-addr", in, got, err)
		}
	}
	// The forms listen: loopback of each family, port 0.
	for _, in := range []string{"[127.0.0.1]:0", "[::1]:0"} {
		addr, err := metricsListenAddr(in)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("listen %s (from %s): %v", addr, in, err)
			continue
		}
		ln.Close()
	}
}
