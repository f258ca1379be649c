package bpf_test

import (
	"math/rand/v2"
	"net/netip"
)

// strictKinds are the oracle's mutation kinds whose every frame the
// program must judge as the kernel does, both ways (bpf/host.h and the
// hop-by-hop rule of parse_ipv6): TestKernelOracle fails on an
// amplification of these as on an evasion. They take no mutation of
// another kind, so that a hole elsewhere (a bad UDP checksum, say) does
// not show under their name.
var strictKinds = map[string]bool{"mac": true, "martian": true, "hbh": true}

// mutateHost applies the kinds of frames for this host: mac (another
// host's unicast MAC, or the collector's), martian (the source and
// destination addresses ip_route_input_slow and ip6_rcv_core always
// discard, beside ones they deliver), hbh (a hop-by-hop header first, or
// later in a chain Linux otherwise walks).
func mutateHost(r *rand.Rand, m *mut, kind string, d func(string, ...any)) {
	switch kind {
	case "mac":
		m.dstMAC = pick(r, macOther, []byte{0x02, 0x00, 0x5e, 0x00, 0x00, 0x03}, []byte{0x00, 0x16, 0x3e, 0x12, 0x34, 0x56}, m.dstMAC)
		d("dmac %x", m.dstMAC)
	case "martian":
		mutateMartian(r, m)
		d("src %v dst %v dmac %x", m.src, m.dst, m.dstMAC)
	case "hbh":
		if !m.v6 {
			m.v6 = true
			m.src, m.dst = netip.MustParseAddr("2001:db8:51::2"), netip.MustParseAddr("2001:db8:51::1")
		}
		// Destination options and routing headers only: Linux takes a
		// chain of them (a TCP SYN behind a fragment header is another
		// matter, the ext kinds').
		m.exts = nil
		for _, e := range cleanChain(r, r.IntN(4)) {
			if e[len(e)-1] != extFrag {
				m.exts = append(m.exts, e)
			}
		}
		h := make([]byte, 8*(1+r.IntN(2)))
		h[1], h[2], h[3] = byte(len(h)/8-1), 0x1e, byte(len(h)-4)
		pos := r.IntN(len(m.exts) + 1)
		m.exts = append(m.exts[:pos], append([][]byte{append(h, extHBH)}, m.exts[pos:]...)...)
		if r.IntN(3) == 0 {
			m.exts = append(m.exts, append(append([]byte(nil), h...), extHBH))
		}
		d("v6 exts %s", extNames(m.exts))
	}
}

// mutateMartian draws a source and destination pair, with the MAC a
// sender would use for the destination.
func mutateMartian(r *rand.Rand, m *mut) {
	if m.v6 {
		pairs := [][2]string{
			{"ff02::1", ""}, {"::1", ""}, {"", "::1"}, {"::ffff:198.51.100.2", ""}, {"::ffff:127.0.0.1", ""},
			{"", "ff01::1"}, {"", "ff00::1"}, {"", "ff02::1"}, {"", "ff11::1"},
		}
		if !m.tcp {
			// A SYN-ACK to these has no route or neighbour in the
			// harness: only UDP shows whether Linux delivers them.
			pairs = append(pairs, [2]string{"::", ""}, [2]string{"fe80::5", ""})
		}
		p := pick(r, pairs...)
		if p[0] != "" {
			m.src = netip.MustParseAddr(p[0])
		}
		if p[1] != "" {
			m.dst = netip.MustParseAddr(p[1])
		}
		if m.dst.IsMulticast() {
			m.dstMAC = macMcast6
		}
		return
	}
	pairs := [][2]string{
		{"224.0.0.5", ""}, {"255.255.255.255", ""}, {"0.0.0.0", ""}, {"0.1.2.3", ""}, {"127.0.0.1", ""}, {"240.0.0.1", ""},
		{"", "0.1.2.3"}, {"", "127.0.0.1"}, {"0.0.0.0", "255.255.255.255"}, {"0.1.2.3", "255.255.255.255"},
		{"0.0.0.0", "0.0.0.0"}, {"0.0.0.0", "224.0.0.1"}, {"0.0.0.0", "239.1.2.3"}, {"127.0.0.1", "224.0.0.1"},
		{"", "224.0.0.1"}, {"", "255.255.255.255"},
	}
	p := pick(r, pairs...)
	if p[0] != "" {
		m.src = netip.MustParseAddr(p[0])
	}
	if p[1] != "" {
		m.dst = netip.MustParseAddr(p[1])
	}
	switch {
	case m.dst.IsMulticast():
		m.dstMAC = macMcast4
	case m.dst == netip.MustParseAddr("255.255.255.255"):
		m.dstMAC = macBroadcast
	}
}
