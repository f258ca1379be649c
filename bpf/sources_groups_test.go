package bpf_test

import (
	"net/netip"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestSourcesTransition is issue 25 §6 on the program: a heavy IPv4 sender
// behind NAT64 (64:ff9b::/96) goes over its budget, and 50 light IPv4
// senders behind the same relay, in other /24s, each stay within theirs;
// so do light ones behind 6to4 and IPv4-mapped. The heavy one is listed
// as its IPv4 group.
func TestSourcesTransition(t *testing.T) {
	const budget = 20
	h := newHarness(t, sourcesPolicy(t, 1000, tiers.Sources{BudgetPackets: budget, PrefixV4: 24, PrefixV6: 64}))
	h.expire()
	nat64 := func(a, b, c, d byte) netip.Addr {
		return netip.AddrFrom16([16]byte{0, 0x64, 0xff, 0x9b, 12: a, 13: b, 14: c, 15: d})
	}
	heavy := udpFrom(t, nat64(10, 9, 9, 9))
	for i := range budget + 30 {
		before := h.window().Count
		h.run(heavy)
		if over := h.window().Count == before; over != (i >= budget) {
			t.Fatalf("heavy packet %d: over budget %v", i+1, over)
		}
	}
	for i := range 50 {
		for _, src := range []netip.Addr{
			nat64(10, byte(i), 1, 1),
			netip.AddrFrom16([16]byte{10: 0xff, 11: 0xff, 12: 172, 13: 16, 14: byte(i), 15: 1}),
			netip.AddrFrom16([16]byte{0x20, 0x02, 192, 168, byte(i), 1, 15: 1}),
		} {
			before := h.window().Count
			h.run(udpFrom(t, src))
			if h.window().Count == before {
				t.Errorf("light sender %v (one packet) over budget: grouped with the relay's others", src)
			}
		}
	}
	top, err := h.l.TopSources(0)
	if err != nil {
		t.Fatal(err)
	}
	if want := netip.MustParsePrefix("10.9.9.0/24"); len(top) != 1 || top[0].Group != want || top[0].Packets != 30 {
		t.Errorf("TopSources = %+v, want %v with 30 packets", top, want)
	}
}

// TestSourcesTopEveryCPU is issue 25 §6: the table of groups over budget
// keeps tiers.TopSources groups however the CPUs share the work. The
// kernel's LRU hands each CPU free entries in batches of 128 and evicts as
// many at once, so a table of exactly TopSources evicts early; here the
// CPUs take turns, each putting new groups over budget, and every one of
// TopSources groups must be listed.
func TestSourcesTopEveryCPU(t *testing.T) {
	h := newHarness(t, sourcesPolicy(t, 1000, tiers.Sources{BudgetPackets: 1, PrefixV4: 32, PrefixV6: 64}))
	h.expire()
	cpus := runtime.NumCPU()
	if cpus < 2 {
		t.Skip("needs two CPUs to take turns")
	}
	t.Logf("source_top holds %d entries on %d CPUs", bpf.SourceTopEntries(cpus), cpus)
	const turn = 100 // groups a CPU puts over budget before the next takes over
	n := 0
	for n < tiers.TopSources {
		cpu := (n / turn) % cpus
		done := make(chan error)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				done <- err
				return
			}
			for i := 0; i < turn && n < tiers.TopSources; i++ {
				f := udpFrom(t, netip.AddrFrom4([4]byte{10, 20, byte(n >> 8), byte(n)}))
				h.run(f) // within the budget
				h.run(f) // over it: a new group in source_top
				n++
			}
			done <- nil
		}()
		if err := <-done; err != nil {
			t.Fatalf("pin to CPU %d: %v", cpu, err)
		}
	}
	top, err := h.l.TopSources(0)
	if err != nil {
		t.Fatal(err)
	}
	if len(top) != tiers.TopSources {
		t.Errorf("TopSources lists %d groups over budget, want all %d", len(top), tiers.TopSources)
	}
}
