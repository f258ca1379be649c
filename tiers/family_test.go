package tiers

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// TestMappedPrefixRefused: a policy built in Go with an IPv4-mapped prefix
// is refused like a config file's, with the IPv4 prefix to write instead.
func TestMappedPrefixRefused(t *testing.T) {
	p := Default()
	p.Exempt = []netip.Prefix{netip.MustParsePrefix("::ffff:192.0.2.0/120")}
	err := p.Validate()
	if !errors.Is(err, ErrCIDR) || !strings.Contains(err.Error(), "exempt.sources[0]") || !strings.Contains(err.Error(), "192.0.2.0/24") {
		t.Errorf("exempt ::ffff:192.0.2.0/120: %v, want ErrCIDR naming exempt.sources[0] and 192.0.2.0/24", err)
	}
	p = Default()
	p.Select[0].Dests = []netip.Prefix{netip.MustParsePrefix("::ffff:0:0/96")}
	if err := p.Validate(); !errors.Is(err, ErrCIDR) || !strings.Contains(err.Error(), "select[0].dests[0]") {
		t.Errorf("dests ::ffff:0:0/96: %v, want ErrCIDR naming select[0].dests[0]", err)
	}
	// Neighbours of the mapped space are plain IPv6 prefixes.
	p = Default()
	p.Exempt = []netip.Prefix{netip.MustParsePrefix("::/0"), netip.MustParsePrefix("::fffe:0:0/95")}
	if err := p.Validate(); err != nil {
		t.Errorf("::/0 and ::fffe:0:0/95: %v", err)
	}
}
