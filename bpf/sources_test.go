package bpf_test

import (
	"encoding/binary"
	"maps"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/google/gopacket/layers"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// udpFrom is a syslog datagram to udp/514 from src (IPv4 or IPv6).
func udpFrom(tb testing.TB, src netip.Addr) []byte {
	tb.Helper()
	if src.Is4() {
		return Serialize(tb, Eth(layers.EthernetTypeIPv4), IPv4(net.IP(src.AsSlice()), Dst4, layers.IPProtocolUDP), UDP(514), Syslog())
	}
	return Serialize(tb, Eth(layers.EthernetTypeIPv6), IPv6(net.IP(src.AsSlice()), Dst6, layers.IPProtocolUDP), UDP(514), Syslog())
}

// sourcesPolicy is max per hour-long window with a per-source budget, and
// one tier far above what a test sends: over-budget packets are judged on
// the capacity in-budget traffic leaves (docs/design.md §6), so none is dropped
// and the tests see the budget in the counters.
func sourcesPolicy(tb testing.TB, max uint64, s tiers.Sources) tiers.Policy {
	tb.Helper()
	p := ordinalDefault()
	p.Window, p.Max = time.Hour, max
	p.Tiers = []tiers.Tier{{At: tiers.Pct(100000), Drop: tiers.Pct(100)}}
	p.Sources = s
	if err := p.Validate(); err != nil {
		tb.Fatal(err)
	}
	return p
}

func overBudget(st bpf.Stats) (n uint64) {
	for _, c := range st.OverBudget {
		n += c.Packets
	}
	return n
}

// TestSourcesDifferential runs one packet sequence, from heavy and light
// groups of both families over three windows, through the program and the
// reference model (model.Model with the program's sketch seeds): every
// over-budget decision and every window count must agree.
func TestSourcesDifferential(t *testing.T) {
	p := sourcesPolicy(t, 1000, tiers.Sources{Budget: tiers.Pct(5), PrefixV4: 24, PrefixV6: 64})
	h := newHarness(t, p)
	m := model.NewModel(p, h.tab, nil)
	m.SetSketchSeeds(h.l.SketchSeeds())
	r := rand.New(rand.NewPCG(12, 34))

	pool := make([]netip.Addr, 0, 300)
	for i := range 150 {
		var a [16]byte // 2001:db8:0:<i%5>::/64, random host bits
		binary.BigEndian.PutUint64(a[:], 0x20010db800000000|uint64(i%5))
		binary.BigEndian.PutUint64(a[8:], r.Uint64())
		pool = append(pool, netip.AddrFrom4([4]byte{10, byte(i % 7), byte(i), byte(r.Uint32())}), netip.AddrFrom16(a))
	}
	// IPv6 sources that carry IPv4 senders (NAT64, IPv4-mapped, 6to4):
	// grouped as those, with the IPv4 pool's groups (tiers.EmbeddedIPv4).
	for i := range 30 {
		v4 := pool[2*(i%20)].As4()
		var a [16]byte
		switch i % 3 {
		case 0:
			copy(a[:], []byte{0, 0x64, 0xff, 0x9b})
			copy(a[12:], v4[:])
		case 1:
			a[10], a[11] = 0xff, 0xff
			copy(a[12:], v4[:])
		case 2:
			a[0], a[1] = 0x20, 0x02
			copy(a[2:], v4[:])
			a[15] = byte(i)
		}
		pool = append(pool, netip.AddrFrom16(a))
	}
	frames := make([][]byte, len(pool))
	for i, a := range pool {
		frames[i] = udpFrom(t, a)
	}
	var now uint64
	var overs, agree int
	for win := range 3 {
		h.expire()
		now += uint64(p.Window) + 1
		for i := range 2500 {
			// A skewed choice: the first groups are heavy.
			j := int(math.Floor(math.Pow(r.Float64(), 3) * float64(len(pool))))
			d := m.PacketFrom(now, pool[j])
			ret := h.run(frames[j])
			got := h.window().Count
			if (ret == xdpDrop) != (d.Verdict == tiers.VerdictDrop) || got != m.N() {
				t.Fatalf("window %d packet %d from %v: program action %d n %d; model over budget %v n %d",
					win, i, pool[j], ret, got, d.OverBudget, m.N())
			}
			if d.OverBudget {
				overs++
			}
			agree++
		}
	}
	if overs == 0 || overs == agree {
		t.Fatalf("%d of %d packets over budget: the sequence does not test the budget", overs, agree)
	}
	if got := overBudget(h.stats()); got != uint64(overs) {
		t.Errorf("source_stats counts %d over budget, the model %d", got, overs)
	}
	t.Logf("%d packets, %d over budget: program and model agree on each", agree, overs)
}

// TestSourcesSpoofedFlood sends 100,000 datagrams from distinct random /32
// sources in one window, 5 × max: no group is over budget, the sketch's
// memory does not move, and the tiers shed as without sources.
func TestSourcesSpoofedFlood(t *testing.T) {
	const max, offered = 20000, 100000
	p := ordinalDefault()
	p.Window, p.Max = time.Hour, max
	p.Sources = tiers.Sources{Budget: tiers.Pct(10), PrefixV4: 32, PrefixV6: 64}
	h := newHarness(t, p)
	h.expire()
	memBefore, err := h.l.SourceMemory()
	if err != nil {
		t.Fatal(err)
	}
	frame := udpFrom(t, netip.MustParseAddr("192.0.2.1"))
	srcOff := 14 + 12 // Ethernet, then the IPv4 source address
	r := rand.New(rand.NewPCG(5, 6))
	seen := make(map[uint32]bool, offered)
	passed := 0
	for len(seen) < offered {
		a := r.Uint32()
		if seen[a] {
			continue
		}
		seen[a] = true
		binary.BigEndian.PutUint32(frame[srcOff:], a)
		setIPv4Sum(frame)
		if h.run(frame) == xdpPass {
			passed++
		}
	}
	st := h.stats()
	if got := overBudget(st); got != 0 {
		t.Errorf("%d packets over budget among %d one-packet groups", got, offered)
	}
	if got := h.window().Count; got != offered {
		t.Errorf("window n %d, want %d", got, offered)
	}
	memAfter, err := h.l.SourceMemory()
	if err != nil {
		t.Fatal(err)
	}
	if memAfter != memBefore {
		t.Errorf("source memory %d bytes after the flood, %d before", memAfter, memBefore)
	}
	e, err := tiers.Expected(p, offered)
	if err != nil {
		t.Fatal(err)
	}
	if dev := math.Abs(float64(passed) - e.Passed); dev > 5*math.Sqrt(e.Variance) {
		t.Errorf("passed %d, expected %.1f ± %.1f (5σ)", passed, e.Passed, 5*math.Sqrt(e.Variance))
	}
	t.Logf("%d sources: passed %d (expected %.1f, σ %.1f); source memory %d bytes before and after",
		offered, passed, e.Passed, math.Sqrt(e.Variance), memBefore)
}

// TestSourcesGrouping: 50 hosts of one /24 (or one IPv6 /64) share one
// budget; a host of the next prefix has its own.
func TestSourcesGrouping(t *testing.T) {
	for _, c := range []struct {
		name  string
		host  func(i int) netip.Addr
		other netip.Addr
	}{
		{"ipv4/24", func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 1, 2, byte(i + 1)}) }, netip.MustParseAddr("10.1.3.1")},
		{"ipv6/64", func(i int) netip.Addr {
			return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 2, byte(i), 0xaa, 0, 0, 0, 0, 0, byte(i + 1)})
		}, netip.MustParseAddr("2001:db8:1:3::1")},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // a program each
			const budget = 100
			h := newHarness(t, sourcesPolicy(t, 1000, tiers.Sources{BudgetPackets: budget, PrefixV4: 24, PrefixV6: 64}))
			h.expire()
			frames := make([][]byte, 50)
			for i := range frames {
				frames[i] = udpFrom(t, c.host(i))
			}
			dropped := 0
			for round := range 3 {
				for i, f := range frames {
					before := h.window().Count
					ret := h.run(f)
					over := h.window().Count == before
					if n := round*len(frames) + i + 1; over != (n > budget) || ret != xdpPass {
						t.Fatalf("packet %d of the group (host %d): action %d, over budget %v", n, i, ret, over)
					}
					if over {
						dropped++
					}
				}
			}
			if ret := h.run(udpFrom(t, c.other)); ret != xdpPass {
				t.Errorf("a host of another prefix: action %d, want pass", ret)
			}
			st := h.stats()
			if got := st.OverBudget[tiers.VerdictPass].Packets; got != uint64(dropped) || dropped != 50 {
				t.Errorf("over budget: counted %d, dropped %d, want 50", got, dropped)
			}
			if got := h.window().Count; got != budget+1 {
				t.Errorf("window n %d, want %d: over-budget packets must not count", got, budget+1)
			}
			top, err := h.l.TopSources(5)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := c.host(0).Prefix(map[bool]int{true: 24, false: 64}[c.host(0).Is4()])
			if len(top) != 1 || top[0].Group != want || top[0].Packets != 50 || top[0].Windows != 1 {
				t.Errorf("TopSources = %+v, want %v with 50 packets in 1 window", top, want)
			}
		})
	}
}

// TestSourcesModes: dry-run and off count over-budget packets and pass
// them, and they stay out of the window.
func TestSourcesModes(t *testing.T) {
	for _, mode := range []tiers.Mode{tiers.ModeEnforce, tiers.ModeDryRun, tiers.ModeOff} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel() // a program each
			p := sourcesPolicy(t, 1000, tiers.Sources{BudgetPackets: 10, PrefixV4: 32, PrefixV6: 64})
			p.Mode = mode
			h := newHarness(t, p)
			h.expire()
			// One tier at T_1 = 15, drop 100%: over-budget packets take
			// positions n + rank = 11.. (docs/design.md §6), so ranks 1-4 pass
			// and the other 16 are dropped, would_drop or passed by mode.
			p.Tiers = []tiers.Tier{{At: tiers.MustParsePercent("1.5%"), Drop: tiers.Pct(100)}}
			h.apply(p)
			frame := udpFrom(t, netip.MustParseAddr("192.0.2.77"))
			want := uint32(xdpPass)
			if mode == tiers.ModeEnforce {
				want = xdpDrop
			}
			for i := range 30 {
				ret := h.run(frame)
				if w := map[bool]uint32{true: want, false: xdpPass}[i >= 14]; ret != w {
					t.Fatalf("packet %d: action %d, want %d", i+1, ret, w)
				}
			}
			st := h.stats()
			v := map[tiers.Mode]tiers.Verdict{tiers.ModeEnforce: tiers.VerdictDrop, tiers.ModeDryRun: tiers.VerdictWouldDrop, tiers.ModeOff: tiers.VerdictPass}[mode]
			if st.OverBudget[v].Packets != 16+map[bool]uint64{true: 4}[mode == tiers.ModeOff] || overBudget(st) != 20 {
				t.Errorf("over budget by verdict %+v, want 16 %s of 20", st.OverBudget, v)
			}
			if n := h.window().Count; n != 10 || st.SelectedPackets() != 10 {
				t.Errorf("window n %d, selected %d; want 10 and 10", n, st.SelectedPackets())
			}
		})
	}
}

// TestSourcesExemptAndFragments: an exempt source is never judged against a
// budget, and the fragments of an over-budget datagram follow it.
func TestSourcesExemptAndFragments(t *testing.T) {
	p := sourcesPolicy(t, 1000, tiers.Sources{BudgetPackets: 5, PrefixV4: 32, PrefixV6: 64})
	// T_1 = 6: the over-budget datagram's position, 5 + 1, drops.
	p.Tiers = []tiers.Tier{{At: tiers.MustParsePercent("0.6%"), Drop: tiers.Pct(100)}}
	p.Exempt = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
	h := newHarness(t, p)
	h.expire()
	ex := udpFrom(t, netip.MustParseAddr("203.0.113.9"))
	for i := range 20 {
		if ret := h.run(ex); ret != xdpPass {
			t.Fatalf("exempt packet %d: action %d", i, ret)
		}
	}
	if st := h.stats(); st.Exempt.Packets != 20 || overBudget(st) != 0 {
		t.Errorf("exempt %d, over budget %d; want 20 and 0", st.Exempt.Packets, overBudget(st))
	}
	// Src4 sends 5 datagrams, then a fragmented one over budget.
	for range 5 {
		if ret := h.run(UDP4(t, 514)); ret != xdpPass {
			t.Fatalf("within budget: action %d", ret)
		}
	}
	if ret := h.run(frag4(t, 77, 0, true, UDP(514), Syslog())); ret != xdpDrop {
		t.Fatalf("first fragment over budget: action %d, want drop", ret)
	}
	if ret := h.run(frag4(t, 77, 8, false, Syslog())); ret != xdpDrop {
		t.Errorf("its next fragment: action %d, want drop", ret)
	}
	if st := h.stats(); st.FragmentDrop.Packets != 1 {
		t.Errorf("fragment drops %d, want 1", st.FragmentDrop.Packets)
	}
}

// TestSourcesReload: turning sources on, changing the budget and turning
// them off takes effect with the slot flip, mid-window; under concurrent
// traffic every packet is either counted or over budget, never lost.
func TestSourcesReload(t *testing.T) {
	off := sourcesPolicy(t, 1000, tiers.Sources{})
	on := func(budget uint64) tiers.Policy {
		return sourcesPolicy(t, 1000, tiers.Sources{BudgetPackets: budget, PrefixV4: 32, PrefixV6: 64})
	}
	h := newHarness(t, off)
	h.expire()
	frame := UDP4(t, 514)
	// send returns how many of n packets were over budget.
	send := func(n int) (over int) {
		before := overBudget(h.stats())
		for range n {
			if h.run(frame) == xdpDrop {
				t.Fatal("a drop under a tier far above the traffic")
			}
		}
		return int(overBudget(h.stats()) - before)
	}
	if d := send(30); d != 0 {
		t.Fatalf("sources off: %d over budget", d)
	}
	h.apply(on(20)) // the sketch starts counting now: 20 pass, 10 over
	if d := send(30); d != 10 {
		t.Errorf("budget 20 turned on: %d of 30 over budget, want 10", d)
	}
	// Over budget, the group's cells stopped at 21 (sketch_over): raised
	// to 50, the budget lets 29 more through in this window.
	h.apply(on(50))
	if d := send(30); d != 1 {
		t.Errorf("budget raised to 50: %d of 30 over budget, want 1", d)
	}
	h.apply(off)
	if d := send(30); d != 0 {
		t.Errorf("sources off again: %d over budget", d)
	}
	if a, err := h.l.Active(); err != nil || a.Sources.Budget != 0 {
		t.Errorf("Active after turning off: %+v, %v", a.Sources, err)
	}

	// Concurrent: flip on and off while another goroutine sends.
	h.expire()
	before := h.stats()
	var (
		wg   sync.WaitGroup
		sent uint64
		done = make(chan struct{})
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			if _, err := runExact(h.l.Program(), frame, 500); err != nil {
				t.Error(err)
				return
			}
			sent += 500
		}
	}()
	for i := range 6 {
		if i%2 == 0 {
			h.apply(on(uint64(100 + i)))
		} else {
			h.apply(off)
		}
	}
	close(done)
	wg.Wait()
	after := h.stats()
	counted := after.SelectedPackets() - before.SelectedPackets()
	over := overBudget(after) - overBudget(before)
	if counted+over != sent || over == 0 || counted == 0 {
		t.Errorf("%d counted + %d over budget, %d sent: want every packet in one, and both", counted, over, sent)
	}
	t.Logf("under reloads: %d counted, %d over budget", counted, over)
}

// TestSourcesConcurrent floods one group from 2 CPUs at once: no packet is
// lost between the window and the over-budget count, at least the budget
// passes (each row lets exactly its first budget packets through), and the
// overshoot at the budget's edge stays small. A packet passes when it is
// among the first budget in any one row, and racing CPUs can interleave
// their rows differently: the overshoot is bounded by what the other CPU
// processes while one packet is between its first and last row (ns, or
// an interrupt's length); 1% of the budget is a loose ceiling.
func TestSourcesConcurrent(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs")
	}
	const budget, perCPU, rounds = 100_000, 100_000, 3
	h := newHarness(t, sourcesPolicy(t, 1_000_000, tiers.Sources{BudgetPackets: budget, PrefixV4: 32, PrefixV6: 64}))
	h.expire()
	h.run(UDP4(t, 514)) // opens the window, so that no CPU races to open it
	frame := UDP4(t, 514)
	for range rounds {
		if err := concurrently(h, frame, []int{0, 1}, []uint32{perCPU, perCPU}); err != nil {
			t.Fatal(err)
		}
	}
	const total = 2*perCPU*rounds + 1
	st := h.stats()
	counted, over := h.window().Count, overBudget(st)
	if counted+over != total || st.SelectedPackets() != counted {
		t.Fatalf("window %d + over budget %d != %d sent (selected %d)", counted, over, total, st.SelectedPackets())
	}
	if counted < budget || counted > budget+budget/100 {
		t.Errorf("%d packets within a budget of %d from 2 CPUs", counted, budget)
	}
	t.Logf("2 CPUs, %d packets of one group: %d within the budget of %d (overshoot %d), %d over", total, counted, budget, counted-budget, over)

	// The table of groups over budget is per CPU: its packets, summed
	// over the CPUs, are the over-budget count but for the one packet an
	// insert race may lose on each CPU's first miss; one window.
	top, err := h.l.TopSources(0)
	if err != nil {
		t.Fatal(err)
	}
	if len(top) != 1 || top[0].Packets > over || top[0].Packets+2 < over || top[0].Windows != 1 {
		t.Errorf("TopSources = %+v, want one group with %d packets (at most 2 fewer) in 1 window", top, over)
	}
}

// TestSourcesSeedsSurviveReload: a Limiter loaded on pinned maps takes over
// the sketch's seeds, so the current window's group counts, which it
// adopts from the program it replaces as the agent of a restart does
// (AdoptSketch), stay valid across the restart; fresh maps draw new
// seeds.
func TestSourcesSeedsSurviveReload(t *testing.T) {
	Require(t)
	pin := PinPath(t)
	if err := os.MkdirAll(pin, 0o700); err != nil {
		t.Fatal(err)
	}
	p := sourcesPolicy(t, 1000, tiers.Sources{BudgetPackets: 5, PrefixV4: 32, PrefixV6: 64})
	first := newHarnessOpts(t, p, bpf.Options{PinPath: pin})
	first.expire()
	frame := UDP4(t, 514)
	for range 5 {
		first.run(frame)
	}
	second := newHarnessOpts(t, p, bpf.Options{PinPath: pin})
	if second.l.SketchSeeds() != first.l.SketchSeeds() {
		t.Error("a limiter on pinned maps drew new seeds")
	}
	if err := second.l.AdoptSketch(first.l.Globals()); err != nil {
		t.Fatal(err)
	}
	// The group's 5 packets of this window still count: the 6th is over.
	before := overBudget(second.stats())
	second.run(frame)
	if got := overBudget(second.stats()) - before; got != 1 {
		t.Errorf("6th packet after the reload: %d over budget, want 1", got)
	}
	if other := newHarness(t, p); other.l.SketchSeeds() == first.l.SketchSeeds() {
		t.Error("fresh maps reuse the seeds")
	}
}

// TestSourcesTopRuns: a CPU counts a run of one group's over-budget
// packets in source_run and adds it to source_top when the run ends (another
// group over budget, or a new window); TopSources adds the open runs, so
// its counts are exact at every step: after a run, across groups that
// alternate, with the run still open, and across windows.
func TestSourcesTopRuns(t *testing.T) {
	h := newHarness(t, sourcesPolicy(t, 1000, tiers.Sources{BudgetPackets: 2, PrefixV4: 32, PrefixV6: 64}))
	h.expire()
	a, b := udpFrom(t, netip.MustParseAddr("192.0.2.1")), udpFrom(t, netip.MustParseAddr("2001:db8::7"))
	ga, gb := netip.MustParsePrefix("192.0.2.1/32"), netip.MustParsePrefix("2001:db8::/64")
	want := map[netip.Prefix]sourceCount{}
	check := func(step string) {
		t.Helper()
		top, err := h.l.TopSources(0)
		if err != nil {
			t.Fatal(err)
		}
		got := map[netip.Prefix]sourceCount{}
		for _, g := range top {
			got[g.Group] = sourceCount{g.Packets, g.Windows}
		}
		if !maps.Equal(got, want) {
			t.Errorf("%s: TopSources %v, want %v", step, got, want)
		}
	}
	send := func(f []byte, n int) {
		for range n {
			h.run(f)
		}
	}
	send(a, 12) // 2 within the budget, a run of 10 over it
	want[ga] = sourceCount{10, 1}
	check("A's run open")
	send(b, 5) // ends A's run; 3 over for B
	want[gb] = sourceCount{3, 1}
	check("A's run ended, B's open")
	for range 4 { // alternating: every run is one packet long
		send(a, 1)
		send(b, 1)
	}
	want[ga], want[gb] = sourceCount{14, 1}, sourceCount{7, 1}
	check("alternating")
	h.expire() // the next packet opens a new window: budgets start again
	send(a, 6)
	want[ga] = sourceCount{18, 2}
	check("A in a second window")
	if got := overBudget(h.stats()); got != 25 {
		t.Errorf("over-budget packets %d, want 25", got)
	}
}

// sourceCount is a group's packets over budget and windows over budget.
type sourceCount struct{ Packets, Windows uint64 }
