package bpf_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// The structural generator of the kernel oracle (issue 33, docs/design.md
// §2): where oracle_frames_test.go mutates valid frames at random, this
// sets every length and offset field the program reads to each of its edge
// values, behind every header chain the parser walks, in both families,
// for a UDP/514 datagram and a TCP SYN to 601. A table of fields × edge
// values × chains × trailers; a campaign adds random combinations of
// edits to the same frames.

// edgeGroup is one spec and the oracle cases of its checksum variants.
type edgeGroup struct {
	spec edgeSpec
	ids  []int
	// allowed names why the program may count the frame though the
	// kernel did not deliver it (counted though not certain, docs/design.md
	// §2); empty when the two must agree both ways.
	allowed string
}

// edgeCasesFor builds the variants of every spec, with ids from next on.
func edgeCasesFor(specs []edgeSpec, next int, n oracleNet) ([]edgeGroup, []oracleCase) {
	var groups []edgeGroup
	var cases []oracleCase
	for _, s := range specs {
		probe := buildEdge(s, next, n)
		natural := len(probe.b) - probe.l4 - s.trailer
		if !probe.apply(s) {
			continue
		}
		g := edgeGroup{spec: s, allowed: edgeAllowed(s, probe)}
		extra := 0
		if probe.tail(s.v6) != nil {
			extra = 8
		}
		for _, l := range probe.l4Lengths(s, natural, extra) {
			f := buildEdge(s, next, n)
			f.apply(s)
			f.finish(s, l)
			frames := [][]byte{f.b}
			if t := f.tail(s.v6); t != nil {
				frames = append(frames, t)
			}
			c := oracleCase{id: next, kind: "edge", desc: []string{s.String(), fmt.Sprintf("l4 checksum over %d", l)}, tcp: s.tcp, frames: frames}
			if s.tcp {
				c.seq = 0x40000000 + uint32(next)
			}
			cases = append(cases, c)
			g.ids = append(g.ids, next)
			next++
		}
		groups = append(groups, g)
	}
	return groups, cases
}

// edgeAllowed is why frame f of s may be counted though the kernel does
// not deliver it, or "" (docs/design.md §2, "counted though not certain").
func edgeAllowed(s edgeSpec, f edgeFrame) string {
	for _, k := range f.kinds {
		if k == extAH {
			return "AH: no security association in the test namespace"
		}
	}
	for _, e := range s.edits {
		if e.field == "frag" && strings.HasSuffix(e.value, "/1") && strings.HasPrefix(e.value, "0/") {
			return "a first fragment is counted at once; the kernel judges the datagram whole"
		}
		if e.field == "vlan" && e.value == "3" {
			return "more VLAN tags than the parser walks: judged as selected"
		}
	}
	return ""
}

// edgeTable is the structural table: every field × edge value × chain ×
// trailer, both families, UDP and TCP SYN, one edit per frame.
func edgeTable() []edgeSpec {
	var specs []edgeSpec
	add := func(v6, tcp bool, chain string, edits ...edgeEdit) {
		for _, tr := range []int{0, 8} {
			specs = append(specs, edgeSpec{v6: v6, tcp: tcp, chain: chain, trailer: tr, edits: edits})
		}
	}
	for _, tcp := range []bool{false, true} {
		for _, chain := range edgeChains4 {
			add(false, tcp, chain)
			for _, v := range edgeValues {
				add(false, tcp, chain, edgeEdit{field: "ip4.tot", value: v})
				add(false, tcp, chain, edgeEdit{field: "ip4.ihl", value: v})
				add(false, tcp, chain, edgeEdit{field: "udp.len", value: v})
				add(false, tcp, chain, edgeEdit{field: "tcp.doff", value: v})
				if chain == "ah" {
					add(false, tcp, chain, edgeEdit{field: "ext.len", value: v})
				}
			}
			for _, v := range edgeFragValues {
				add(false, tcp, chain, edgeEdit{field: "frag", value: v})
			}
		}
		for _, chain := range edgeChainNames6() {
			add(true, tcp, chain)
			for _, v := range edgeValues {
				add(true, tcp, chain, edgeEdit{field: "ip6.plen", value: v})
				add(true, tcp, chain, edgeEdit{field: "udp.len", value: v})
				add(true, tcp, chain, edgeEdit{field: "tcp.doff", value: v})
				for i := range edgeChains6[chain] {
					add(true, tcp, chain, edgeEdit{field: "ext.len", ext: i, value: v})
				}
			}
			if strings.Contains(chain, "frag") {
				for _, v := range edgeFragValues {
					add(true, tcp, chain, edgeEdit{field: "frag", value: v})
					add(true, tcp, chain, edgeEdit{field: "frag", value: v}, edgeEdit{field: "ip6.plen", value: "zero"})
				}
			}
		}
		for _, k := range []string{"0", "1", "2", "3"} {
			add(false, tcp, "none", edgeEdit{field: "vlan", value: k})
			add(true, tcp, "hbh", edgeEdit{field: "vlan", value: k})
		}
		// VLAN IDs: the collector's veth has no VLAN device.
		for _, v := range []string{"1", "42", "4095", "0/42", "42/0", "0/4095"} {
			add(false, tcp, "none", edgeEdit{field: "vid", value: v})
			add(true, tcp, "none", edgeEdit{field: "vid", value: v})
			add(true, tcp, "hbh", edgeEdit{field: "vid", value: v}, edgeEdit{field: "ip6.plen", value: "zero"})
		}
	}
	return specs
}

// edgeCampaign is k random combinations of two or three edits on random
// chains, drawn from seed.
func edgeCampaign(seed uint64, k int) []edgeSpec {
	r := rand.New(rand.NewPCG(seed, 0xed6e))
	fields4 := []string{"ip4.tot", "ip4.ihl", "udp.len", "tcp.doff", "frag", "ext.len", "vlan", "vid"}
	fields6 := []string{"ip6.plen", "udp.len", "tcp.doff", "frag", "ext.len", "ext.len", "vlan", "vid"}
	var specs []edgeSpec
	for range k {
		s := edgeSpec{v6: r.IntN(2) == 0, tcp: r.IntN(3) == 0, trailer: pick(r, 0, 0, 1, 8, 40)}
		fields := fields4
		if s.v6 {
			s.chain = pick(r, edgeChainNames6()...)
			fields = fields6
		} else {
			s.chain = pick(r, edgeChains4...)
		}
		var applicable []string
		for _, f := range fields {
			nExt := len(edgeChains6[s.chain])
			if !s.v6 && s.chain == "ah" {
				nExt = 1
			}
			switch {
			case f == "udp.len" && s.tcp, f == "tcp.doff" && !s.tcp,
				f == "ext.len" && nExt == 0, f == "frag" && s.v6 && !strings.Contains(s.chain, "frag"):
				continue
			}
			applicable = append(applicable, f)
		}
		for range 2 + r.IntN(2) {
			e := edgeEdit{field: pick(r, applicable...)}
			switch e.field {
			case "frag":
				e.value = pick(r, edgeFragValues...)
			case "vlan":
				e.value = pick(r, "0", "1", "2")
			case "vid":
				e.value = pick(r, "0", "1", "42", "0/42", "42/0", "0/0")
			default:
				e.value = pick(r, append(edgeValues, strconv.Itoa(r.IntN(80)))...)
			}
			if n := len(edgeChains6[s.chain]); e.field == "ext.len" && n > 0 {
				e.ext = r.IntN(n)
			}
			s.edits = append(s.edits, e)
		}
		specs = append(specs, s)
	}
	return specs
}

// edgeBudget is how many random combinations run beside the table: a
// fixed number in CI, TIERLIMIT_ORACLE_BUDGET=N for a campaign.
func edgeBudget() (int, error) {
	if s := os.Getenv("TIERLIMIT_ORACLE_BUDGET"); s != "" {
		return strconv.Atoi(s)
	}
	return 300, nil
}

// edgeRecipes are issue 33's bypasses, named: each is delivered by the
// kernel, so the program must count it (and drop it when saturated).
var edgeRecipes = []struct {
	name string
	spec edgeSpec
}{
	{"(a) ipv6 udp/514, UDP length 0", edgeSpec{v6: true, chain: "none", edits: []edgeEdit{{field: "udp.len", value: "zero"}}}},
	{"(b) ipv6 hop-by-hop PadN, udp/514, payload length 0", edgeSpec{v6: true, chain: "hbh", edits: []edgeEdit{{field: "ip6.plen", value: "zero"}}}},
	{"(b') ipv6 hop-by-hop PadN, tcp/601 syn, payload length 0", edgeSpec{v6: true, tcp: true, chain: "hbh", edits: []edgeEdit{{field: "ip6.plen", value: "zero"}}}},
}

// TestKernelOracleEdges is the structural differential (docs/design.md
// §2): every frame of the edge table, the named recipes and a budget of
// random combinations (edgeBudget) go to the kernel with no program (run
// 1: delivered to a socket or answered) and with the program attached and
// saturated (run 2), and through the program by test_run (counted or not).
// A frame the kernel delivers must be counted, and dropped in run 2; a
// frame the program counts must be delivered in run 1, unless edgeAllowed
// names it a documented "counted though not certain" case.
func TestKernelOracleEdges(t *testing.T) {
	testenv.Require(t)
	n := oracleNet{
		collMAC: oracleCollMAC, sendMAC: oracleSendMAC,
		coll4: netip.MustParseAddr("198.51.100.1"), send4: netip.MustParseAddr("198.51.100.2"),
		coll6: netip.MustParseAddr("2001:db8:51::1"), send6: netip.MustParseAddr("2001:db8:51::2"),
	}
	budget, err := edgeBudget()
	if err != nil {
		t.Fatalf("TIERLIMIT_ORACLE_BUDGET: %v", err)
	}
	seed := uint64(33)
	if s := os.Getenv("TIERLIMIT_ORACLE_SEED"); s != "" {
		if seed, err = strconv.ParseUint(s, 0, 64); err != nil {
			t.Fatalf("TIERLIMIT_ORACLE_SEED=%q: %v", s, err)
		}
	}
	var specs []edgeSpec
	for _, r := range edgeRecipes {
		specs = append(specs, r.spec)
	}
	specs = append(specs, edgeTable()...)
	specs = append(specs, edgeCampaign(seed, budget)...)
	l, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var st edgeStats
	st.allowed = map[string]int{}
	// Ids stay below 30000, which a datagram's source port carries
	// (datagramID): a campaign runs in chunks.
	for len(specs) > 0 {
		k := min(len(specs), edgeChunk)
		groups, cases := edgeCasesFor(specs[:k], 0, n)
		specs = specs[k:]
		got1 := oracleRun(t, cases, nil)
		got2 := oracleRun(t, cases, l)
		counted, tiny := countedIDs(t, l, cases)
		if len(got1) == 0 {
			t.Fatal("run 1 delivered nothing: the harness is broken")
		}
		st.judge(t, groups, got1, got2, counted, tiny, st.specs == 0)
		st.frames += countFrames(cases)
	}
	delivered, nCounted, allowedAmp := st.delivered, st.counted, st.allowed
	t.Logf("seed %d, budget %d: %d specs, %d cases (their checksum variants), %d frames (with the tails of first fragments); the kernel delivered %d specs, the program counted %d", seed, budget, st.specs, st.cases, st.frames, delivered, nCounted)
	if st.tiny > 0 {
		t.Logf("delivered, and dropped uncounted as tiny fragments (RFC 1858): %d", st.tiny)
	}
	for why, k := range allowedAmp {
		t.Logf("counted though not delivered, allowed (%s): %d", why, k)
	}
}

// edgeChunk is the most specs one pair of runs takes: with their checksum
// variants (at most 8 each: 4 lengths, and 4 more with a tail fragment),
// their ids stay below 30000.
const edgeChunk = 3500

// edgeStats sums the judgements of TestKernelOracleEdges's chunks.
type edgeStats struct {
	specs, cases, frames, delivered, counted, tiny int
	allowed                                        map[string]int
}

// judge compares, per group, the kernel's delivery (got1), the saturated
// program's (got2) and the program's count; recipes: the first groups are
// edgeRecipes.
func (st *edgeStats) judge(t *testing.T, groups []edgeGroup, got1, got2, counted, tiny map[int]bool, recipes bool) {
	t.Helper()
	any := func(m map[int]bool, ids []int) bool {
		for _, id := range ids {
			if m[id] {
				return true
			}
		}
		return false
	}
	for i, g := range groups {
		st.specs++
		st.cases += len(g.ids)
		d, c, d2 := any(got1, g.ids), any(counted, g.ids), any(got2, g.ids)
		if recipes && i < len(edgeRecipes) {
			t.Logf("%s: delivered %v, counted %v, delivered with the program %v", edgeRecipes[i].name, d, c, d2)
			if !d || !c || d2 {
				t.Errorf("recipe %s: delivered %v, counted %v, delivered with the program %v; want true, true, false", edgeRecipes[i].name, d, c, d2)
			}
		}
		if d {
			st.delivered++
		}
		if c {
			st.counted++
		}
		switch {
		case d && !c && any(tiny, g.ids) && !d2:
			// A TCP header cut by the fragment's end: dropped
			// whatever the window (RFC 1858), never counted.
			st.tiny++
		case d && !c:
			t.Errorf("evasion: the kernel delivers, the program does not count: %s", g.spec)
		case d && d2:
			t.Errorf("evasion: delivered with the saturated program attached: %s", g.spec)
		case c && !d && g.allowed != "":
			st.allowed[g.allowed]++
		case c && !d:
			t.Errorf("amplification: the program counts what the kernel discards: %s", g.spec)
		}
	}
}

// countedIDs runs every case's frames through the program (test_run) and
// returns the ids of those it counted as selected, and of those it
// dropped without counting them (tiny fragments, RFC 1858).
func countedIDs(t *testing.T, l *bpf.Limiter, cases []oracleCase) (out, tiny map[int]bool) {
	t.Helper()
	out, tiny = map[int]bool{}, map[int]bool{}
	for _, c := range cases {
		for _, f := range c.frames {
			s0, err := l.Stats()
			if err != nil {
				t.Fatal(err)
			}
			act, err := l.Program().Run(&ebpf.RunOptions{Data: f})
			if err != nil {
				t.Fatalf("test_run %s: %v", c.String(), err)
			}
			s1, err := l.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if s1.SelectedPackets() != s0.SelectedPackets() {
				out[c.id] = true
			}
			if s1.Malformed[tiers.MalformedTinyFragment].Packets != s0.Malformed[tiers.MalformedTinyFragment].Packets && act == xdpDrop {
				tiny[c.id] = true
			}
		}
	}
	return out, tiny
}

// TestKernelFragmentChains is issue 33 item 4 on a veth: IPv6 datagrams
// whose fragment header names destination options or a routing header
// before UDP/514, sent as a first and a non-first fragment. Without the
// program the kernel reassembles and delivers them; with it attached and
// saturated the first is dropped and the non-first follows it (counted
// as a fragment drop), instead of passing as unselected.
func TestKernelFragmentChains(t *testing.T) {
	testenv.Require(t)
	n := oracleNet{
		collMAC: oracleCollMAC, sendMAC: oracleSendMAC,
		coll4: netip.MustParseAddr("198.51.100.1"), send4: netip.MustParseAddr("198.51.100.2"),
		coll6: netip.MustParseAddr("2001:db8:51::1"), send6: netip.MustParseAddr("2001:db8:51::2"),
	}
	var cases []oracleCase
	for i, ext := range [][]byte{{0, 0, 1, 4, 0, 0, 0, 0, extDst}, {0, 0, 0, 0, 0, 0, 0, 0, extRt}} {
		m := mut{v6: true, dstMAC: n.collMAC, ttl: 64, src: n.send6, dst: n.coll6, payload: 100,
			exts: [][]byte{ext}, fragPos: 0, fragSizes: []int{48}}
		c := oracleCase{id: i, kind: "fragchain", desc: []string{extNames(m.exts)}}
		c.frames = m.build(n, i, 0)
		if len(c.frames) != 2 {
			t.Fatalf("%s: %d fragments, want 2", c.String(), len(c.frames))
		}
		cases = append(cases, c)
	}
	got1 := oracleRun(t, cases, nil)
	l, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s0, err := l.Stats()
	if err != nil {
		t.Fatal(err)
	}
	got2 := oracleRun(t, cases, l)
	s1, err := l.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		if !got1[c.id] || got2[c.id] {
			t.Errorf("%s: delivered without the program %v, with it %v; want true, false", c.String(), got1[c.id], got2[c.id])
		}
	}
	drops, passes := s1.FragmentDrop.Packets-s0.FragmentDrop.Packets, s1.FragmentPass.Packets-s0.FragmentPass.Packets
	unsel := s1.Unselected.Packets - s0.Unselected.Packets
	t.Logf("with the program: %d non-first fragments dropped, %d passed, %d frames unselected", drops, passes, unsel)
	if drops != uint64(len(cases)) {
		t.Errorf("%d non-first fragments dropped after their first, want %d", drops, len(cases))
	}
}
