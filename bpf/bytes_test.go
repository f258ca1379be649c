package bpf_test

import (
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// bytesPolicy is the test policy under count: bytes: max bytes per window,
// the default tiers, udp/514 and tcp/601 (count syn), shape ordinal.
func bytesPolicy(tb testing.TB, max uint64) tiers.Policy {
	p := testPolicy(tb)
	p.Count = tiers.CountBytes
	p.Shape = tiers.ShapeOrdinal
	p.Max = max
	p.Window = time.Hour
	p.Select = []tiers.Rule{
		{Proto: tiers.ProtoUDP, Ports: []tiers.PortRange{{First: 514, Last: 514}}},
		{Proto: tiers.ProtoTCP, Ports: []tiers.PortRange{{First: 601, Last: 601}}, Count: tiers.CountSYN},
	}
	return p
}

// udpSized is a datagram to port 514 from src carrying n payload bytes,
// over IPv4 or, when v6, IPv6.
func udpSized(tb testing.TB, v6 bool, src byte, n int) []byte {
	pay := gopacket.Payload(make([]byte, n))
	if v6 {
		s := append(net.IP{}, Src6...)
		s[15] = src
		return Serialize(tb, Eth(layers.EthernetTypeIPv6), IPv6(s, Dst6, layers.IPProtocolUDP), UDP(514), pay)
	}
	return Serialize(tb, Eth(layers.EthernetTypeIPv4), IPv4(net.IP{198, 51, 100, src}, Dst4, layers.IPProtocolUDP), UDP(514), pay)
}

// tcpSized is a segment to port 601 with n payload bytes.
func tcpSized(tb testing.TB, syn bool, n int) []byte {
	return Serialize(tb, Eth(layers.EthernetTypeIPv4), IPv4(Src4, Dst4, layers.IPProtocolTCP), TCP(601, syn, !syn),
		gopacket.Payload(make([]byte, n)))
}

// TestBytesDifferential runs datagrams of random payload sizes (0 to 1400
// bytes), IPv4 and IPv6, from 8 sources, with TCP SYNs and segments of
// established connections between them, through the program and
// model.Model.Weighed under count: bytes, without and with per-source
// budgets: every selected datagram has the model's n (bytes counted before
// it plus its own) and tier, or is over budget exactly when the model says
// so; the segments are counted (their payload joins the window) and never
// shed; the payload counters hold the payload, by verdict; and the drops
// agree with the model within 5 sigma.
func TestBytesDifferential(t *testing.T) {
	for _, c := range []struct {
		name   string
		budget uint64
	}{{"no-budgets", 0}, {"budgets", 40_000}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // an hour-long window, expired by hand: no clock judged
			p := bytesPolicy(t, 200_000)
			if c.budget != 0 {
				p.Sources = tiers.Sources{BudgetPackets: c.budget, PrefixV4: 32, PrefixV6: 128}
			}
			h := newHarness(t, p)
			ref := model.NewModel(p, h.tab, nil)
			ref.SetSketchSeeds(h.l.SketchSeeds())
			rng := rand.New(rand.NewPCG(3, 4))
			var now uint64 = 1
			var judged, progDrops, payload int
			var modelDrops, variance float64
			s0 := h.stats()
			for i := range 6000 {
				if i%2000 == 1999 {
					h.expire()
					now += uint64(p.Window) + 1
				}
				now++
				before := h.stats()
				switch k := rng.IntN(10); {
				case k == 0: // a segment of a connection: counted, never shed
					n := rng.IntN(1400)
					if ret := h.run(tcpSized(t, false, n)); ret != xdpPass {
						t.Fatalf("packet %d: a counted TCP segment got %d", i, ret)
					}
					ref.Counted(now, uint32(n))
					if got := h.stats().TCPCounted.Bytes - before.TCPCounted.Bytes; got != uint64(n) {
						t.Fatalf("packet %d: TCP segment of %d bytes counted %d", i, n, got)
					}
					continue
				case k == 1: // a SYN: weighs its payload, 0
					ret := h.run(tcpSized(t, true, 0))
					d := ref.Weighed(now, netip.Addr{}, model.NotUDP, 0)
					judgedOne(t, h, before, d, ret, &progDrops, &modelDrops, &variance)
					continue
				}
				v6, src, n := rng.IntN(2) == 0, byte(1+rng.IntN(8)), rng.IntN(1401)
				f := udpSized(t, v6, src, n)
				addr := netip.AddrFrom4([4]byte{198, 51, 100, src})
				if v6 {
					a := Src6.To16()
					a[15] = src
					addr = netip.AddrFrom16([16]byte(a))
				}
				ret := h.run(f)
				d := ref.Weighed(now, addr, model.NotUDP, uint32(n))
				judged++
				payload += n
				after := h.stats()
				over := after.OverBudget != before.OverBudget
				if over != d.OverBudget {
					t.Fatalf("packet %d (%d bytes from %v): program over budget %v, model %v", i, n, addr, over, d.OverBudget)
				}
				if over {
					continue // judged on the share the in-budget ones leave (sources_test)
				}
				judgedOne(t, h, before, d, ret, &progDrops, &modelDrops, &variance)
			}
			st := h.stats()
			var got uint64
			for v := range st.Payload {
				got += st.Payload[v].Bytes - s0.Payload[v].Bytes
			}
			if got != uint64(payload) {
				t.Fatalf("payload counters hold %d bytes, the datagrams carried %d", got, payload)
			}
			if d := st.Payload[tiers.VerdictDrop].Bytes - s0.Payload[tiers.VerdictDrop].Bytes; st.PassedBytes()-s0.PassedBytes()+d != got+st.TCPCounted.Bytes-s0.TCPCounted.Bytes {
				t.Fatalf("passed %d + dropped %d bytes: not the %d counted", st.PassedBytes()-s0.PassedBytes(), d, got)
			}
			bound := 5 * math.Sqrt(variance)
			t.Logf("%d datagrams (%d payload bytes); tier drops: program %d, model %.1f ± %.1f (5σ)", judged, payload, progDrops, modelDrops, bound)
			if math.Abs(float64(progDrops)-modelDrops) > bound {
				t.Fatalf("program dropped %d, model expects %.1f ± %.1f", progDrops, modelDrops, bound)
			}
		})
	}
}

// judgedOne checks a packet the tiers judged: the window's count is the
// model's n, the tier the program counted it under is the model's, and it
// adds its drop probability to the expectation.
func judgedOne(t *testing.T, h *harness, before bpf.Stats, d model.Decision, ret uint32, progDrops *int, modelDrops, variance *float64) {
	t.Helper()
	if n := h.window().Count; n != d.N {
		t.Fatalf("program n=%d, model n=%d", n, d.N)
	}
	after := h.stats()
	tier := -1
	for k := range after.Selected {
		if after.Selected[k] != before.Selected[k] {
			tier = k
		}
	}
	if tier != d.Tier {
		t.Fatalf("n=%d: program tier %d, model tier %d", d.N, tier, d.Tier)
	}
	if ret == xdpDrop {
		*progDrops++
	}
	pr := tiers.DropRatio(h.tab.Drops[d.Tier])
	*modelDrops += pr
	*variance += pr * (1 - pr)
}

// TestBytesSmoothProgram: the smooth shape under count: bytes judges each
// datagram at q(R̂) with R̂ in bytes per window: R̂ injected at 0.5 (tier 0:
// no q to memoise, it passes), 2, 10
// and 1000 × a max of 1 GB, a datagram of 1000 payload bytes reads R̂ =
// the injected bytes plus its own, and its threshold is the model's
// (tiers.Table.Smooth) to the bit; then datagrams pass at R̂ (1 − q) =
// P(R̂) (more than 0 of the 25 expected: 5 sigma).
func TestBytesSmoothProgram(t *testing.T) {
	p := bytesPolicy(t, 1_000_000_000)
	p.Shape, p.Window = tiers.ShapeSmooth, 20*time.Second
	h := newHarnessOpts(t, p, bpf.Options{})
	const size = 1000
	frame := udpSized(t, false, 1, size)
	for _, k := range []float64{0.5, 2, 10, 1000} {
		r := uint64(k * float64(p.Max))
		h.injectEstimate(r)
		h.run(frame)
		c := h.smoothCPU()
		_, want := h.tab.Smooth(c.HiR)
		pr := h.tab.Expected(c.HiR).Passed
		t.Logf("R̂ %g × max: R̂ %d bytes, thr %#x (model %#x), P(R̂) %.0f bytes", k, c.HiR, c.HiThr, want, pr)
		if k <= 1 {
			if c.HiThr != 0 {
				t.Errorf("R̂ %g × max: threshold %#x, want 0 (tier 0)", k, c.HiThr)
			}
			continue
		}
		if c.HiR < r+size || c.HiR > r+size+r/1000 {
			t.Errorf("R̂ %g × max: the program's R̂ is %d bytes, want %d (the injected bytes and the datagram's)", k, c.HiR, r+size)
		}
		if c.HiThr != want {
			t.Errorf("R̂ %g × max: threshold %#x, the model's %#x", k, c.HiThr, want)
		}
		st := h.stats()
		before := st.SelectedTotal(tiers.VerdictPass).Packets
		n := uint32(25 * float64(c.HiR) / pr)
		h.repeat(frame, n)
		st = h.stats()
		got := st.SelectedTotal(tiers.VerdictPass).Packets - before
		t.Logf("R̂ %g × max: %d of %d datagrams passed, %.1f expected", k, got, n, float64(n)*pr/float64(c.HiR))
		if got == 0 {
			t.Errorf("R̂ %g × max: none of %d passed", k, n)
		}
	}
}
