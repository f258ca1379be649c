package tiers

import (
	"encoding/binary"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
)

// Fair shedding (docs/design.md §6): per-source budgets.
//
// Each selected packet belongs to a source group, its source address masked
// to PrefixV4 or PrefixV6 bits. Within a window a group's first Budget
// packets go on to the tiers; each further packet is over budget: dropped
// (enforce), would_drop (dry-run) or passed (off), counted apart, and not
// counted in the window's n.
//
// Group counts live in a count-min sketch (Cormode and Muthukrishnan, "An
// improved data stream summary: the count-min sketch and its
// applications", J. Algorithms 55(1), 2005) of SketchRows rows and
// SketchCols columns: bounded memory whatever the number of sources. A
// group's count is the least of its SketchRows cells, one per row, each
// chosen by a hash with the row's seed. It never underestimates; it
// overestimates only where every one of the group's cells is shared with
// other traffic (SketchFalsePositive).

// Sketch dimensions and limits. They mirror bpf/consts.h (TL_SKETCH_ROWS,
// TL_SKETCH_COL_BITS, TL_SRC_TOP_ENTRIES, TL_SEED_WORDS); bpf's TestContract fails when the
// two disagree.
const (
	// SketchRows is the number of rows (independent hashes) of the sketch.
	SketchRows = 2
	// SketchColBits is log2 of SketchCols.
	SketchColBits = 17
	// SketchCols is the number of columns of each row: a group's cell in
	// row r is SourceColumn(group, seeds[r]).
	SketchCols = 1 << SketchColBits
	// SeedWords is the number of 64-bit seeds per row (SourceColumn).
	SeedWords = 6
	// SketchCellBytes is the size of one cell: a 32-bit count in the low
	// half and the 32-bit window id it belongs to in the high half.
	SketchCellBytes = 8
	// SketchBytes is the memory the sketch takes, whatever the traffic.
	SketchBytes = SketchRows * SketchCols * SketchCellBytes
	// TopSources is how many groups over budget the program remembers for
	// `tierlimit status --top` (an LRU table).
	TopSources = 1024
	// MaxBudgetPackets is the largest budget in packets: a cell holds a
	// 32-bit count.
	MaxBudgetPackets = math.MaxUint32 - 1
	// MaxBudgetBytes is the largest budget in bytes (count: bytes): below
	// SketchCellFull, so that a cell's count never carries.
	MaxBudgetBytes = 1 << 31
)

// Sources configures fair shedding. The zero value is off.
type Sources struct {
	// Budget is each group's share of a window as a percent of Max, in
	// (0, 100]. It is used when BudgetPackets is 0.
	Budget Percent
	// BudgetPackets is each group's share of a window in packets (bytes
	// under count: bytes), 1..min(Max, MaxBudgetPackets). When non-zero it is the budget and
	// Budget must be 0.
	BudgetPackets uint64
	// PrefixV4 and PrefixV6 are the prefix lengths that group IPv4 (1..32)
	// and IPv6 (1..128) sources. The config's defaults are 32 and 64.
	PrefixV4, PrefixV6 int
}

// DefaultPrefixV4 and DefaultPrefixV6 group sources when the config leaves
// prefix_v4 and prefix_v6 out.
const (
	DefaultPrefixV4 = 32
	DefaultPrefixV6 = 64
)

// Enabled reports whether per-source budgets are on.
func (s Sources) Enabled() bool { return s.Budget.micro != 0 || s.BudgetPackets != 0 }

// String returns the budget as written in the config: "10%" or "500".
func (s Sources) String() string {
	if s.BudgetPackets != 0 {
		return strconv.FormatUint(s.BudgetPackets, 10)
	}
	return s.Budget.String()
}

// validate checks s against a policy whose max is valid and that counts c
// (BudgetPackets is in bytes under CountBytes); off is valid.
func (s Sources) validate(max uint64, c Count) error {
	if !s.Enabled() {
		return nil
	}
	if s.BudgetPackets != 0 {
		if s.Budget.micro != 0 {
			return configErr("sources.budget", s.String(), ErrBudget, "a budget is a percent or a count, not both")
		}
		limit := uint64(MaxBudgetPackets)
		if c == CountBytes {
			limit = MaxBudgetBytes
		}
		if s.BudgetPackets > min(max, limit) {
			return configErr("sources.budget", s.String(), ErrBudget, "must be from 1 to max (%d) %s, and at most %d", max, c.Unit(), limit)
		}
	} else {
		if s.Budget.micro < 0 || s.Budget.micro > microHundred {
			return configErr("sources.budget", s.String(), ErrBudget, "must be more than 0%% and at most 100%%")
		}
		if thresholdOf(max, s.Budget.micro) == 0 {
			return configErr("sources.budget", s.String(), ErrBudget, "%s of max %d is less than one %s", s.Budget, max, strings.TrimSuffix(c.Unit(), "s"))
		}
	}
	if s.PrefixV4 < 1 || s.PrefixV4 > 32 {
		return configErr("sources.prefix_v4", strconv.Itoa(s.PrefixV4), ErrPrefixLen, "want 1 to 32")
	}
	if s.PrefixV6 < 1 || s.PrefixV6 > 128 {
		return configErr("sources.prefix_v6", strconv.Itoa(s.PrefixV6), ErrPrefixLen, "want 1 to 128")
	}
	return nil
}

// SourceBudget is the compiled form of Sources, as the program's settings
// hold it. The zero value is off.
type SourceBudget struct {
	// Budget is the packets (bytes under count: bytes) per group and
	// window; 0 is off. A percent is floor(Max × Budget / 100), at most
	// MaxBudgetPackets (MaxBudgetBytes).
	Budget uint32
	// PrefixV4 and PrefixV6 are the grouping prefix lengths.
	PrefixV4, PrefixV6 uint8
	// Mask4 is the IPv4 mask as the program applies it: the four mask
	// bytes in network order, read as one little-endian uint32 (the
	// program, built for bpfel, loads the source address that way).
	Mask4 uint32
	// Mask6 is the IPv6 mask, four words encoded like Mask4.
	Mask6 [4]uint32
}

// compileSources encodes the Sources of a valid policy.
func compileSources(p Policy) SourceBudget {
	s := p.Sources
	if !s.Enabled() {
		return SourceBudget{}
	}
	b := SourceBudget{PrefixV4: uint8(s.PrefixV4), PrefixV6: uint8(s.PrefixV6)}
	if s.BudgetPackets != 0 {
		b.Budget = uint32(s.BudgetPackets)
	} else {
		limit := uint64(MaxBudgetPackets)
		if p.Count == CountBytes {
			limit = MaxBudgetBytes // a percent of a max past 20 GiB
		}
		b.Budget = uint32(min(thresholdOf(p.Max, s.Budget.micro), limit))
	}
	b.Mask4, b.Mask6 = encodeMasks(s.PrefixV4, s.PrefixV6)
	return b
}

// encodeMasks encodes the group masks of prefix lengths v4 and v6 as the
// program applies them (SourceBudget.Mask4, Mask6).
func encodeMasks(v4, v6 int) (m4 uint32, m6 [4]uint32) {
	m4 = binary.LittleEndian.Uint32(maskBytes(v4, 4))
	b6 := maskBytes(v6, 16)
	for i := range m6 {
		m6[i] = binary.LittleEndian.Uint32(b6[4*i:])
	}
	return m4, m6
}

// maskBytes returns a network-order mask of n bytes with the first bits set.
func maskBytes(bitsSet, n int) []byte {
	m := make([]byte, n)
	for i := range m {
		switch {
		case bitsSet >= 8*(i+1):
			m[i] = 0xff
		case bitsSet > 8*i:
			m[i] = byte(0xff << (8*(i+1) - bitsSet))
		}
	}
	return m
}

// Group returns the source group of src: src masked to the prefix length of
// its family. An IPv6 source that carries an IPv4 sender's address is that
// IPv4 address (EmbeddedIPv4), grouped under PrefixV4. It returns the zero
// Prefix when b is off or src is invalid.
func (b SourceBudget) Group(src netip.Addr) netip.Prefix {
	if b.Budget == 0 || !src.IsValid() {
		return netip.Prefix{}
	}
	src = src.WithZone("")
	if v4, ok := EmbeddedIPv4(src); ok {
		src = v4
	}
	bitsLen := int(b.PrefixV6)
	if src.Is4() {
		bitsLen = int(b.PrefixV4)
	}
	pfx, _ := src.Prefix(bitsLen)
	return pfx
}

// Transition prefixes whose IPv6 sources carry an IPv4 sender's address.
var (
	nat64WellKnown = netip.MustParsePrefix("64:ff9b::/96")  // RFC 6052: the last 32 bits
	ipv4Mapped     = netip.MustParsePrefix("::ffff:0:0/96") // the last 32 bits
	sixToFour      = netip.MustParsePrefix("2002::/16")     // RFC 3056: bits 16..47
)

// EmbeddedIPv4 returns the IPv4 address an IPv6 source of a transition
// prefix carries: NAT64's well-known prefix 64:ff9b::/96, IPv4-mapped
// ::ffff:0:0/96 and 6to4 2002::/16. Behind them every IPv4 sender would
// otherwise share one IPv6 group (a /64 of the relay). Network-specific
// NAT64 prefixes (64:ff9b:1::/48 and an operator's own) do not say where
// the address sits, and are grouped as IPv6.
func EmbeddedIPv4(a netip.Addr) (netip.Addr, bool) {
	if !a.Is6() {
		return netip.Addr{}, false
	}
	b := a.As16()
	switch {
	case nat64WellKnown.Contains(a), ipv4Mapped.Contains(a):
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case sixToFour.Contains(a):
		return netip.AddrFrom4([4]byte(b[2:6])), true
	}
	return netip.Addr{}, false
}

// SketchSeeds are the seeds of the sketch's rows: row r places a group by
// SourceColumn(group, seeds[r]). The program draws them at load.
type SketchSeeds [SketchRows][SeedWords]uint64

// SourceColumn is the column of group in a sketch row whose seeds are
// a_0..a_4, b: the vector multiply-shift hash (Dietzfelbinger et al. 1997;
// Thorup, "High speed hashing for integers and strings", 2015)
//
//	(a_0 x_0 + a_1 x_1 + a_2 x_2 + a_3 x_3 + a_4 f + b) mod 2^64 >> (64 - SketchColBits)
//
// of the masked address's 32-bit words x_i (little-endian loads of its
// network-order bytes, as the program loads them; IPv4 has only x_0) and
// the family f (0 for IPv4, 1 for IPv6). It is strongly universal: two
// different groups share a column with probability 2^-SketchColBits over
// random seeds, which is all the count-min sketch's analysis asks of a
// row. bpf/sources.h's source_cells computes it for every row at once.
func SourceColumn(group netip.Prefix, a [SeedWords]uint64) uint32 {
	addr := group.Addr()
	h := a[5]
	if addr.Is4() {
		b := addr.As4()
		h += a[0] * uint64(binary.LittleEndian.Uint32(b[:]))
	} else {
		b := addr.As16()
		for i := range 4 {
			h += a[i] * uint64(binary.LittleEndian.Uint32(b[4*i:]))
		}
		h += a[4]
	}
	return uint32(h >> (64 - SketchColBits))
}

// Sketch is the count-min sketch of the reference model: the program's
// tl_sketch (bpf/maps.h), sequentially. Each cell is a count and the window id
// it belongs to; a cell of another window counts as 0 and is reset by the
// first packet that touches it, so no pass ever clears the sketch.
type Sketch struct {
	seeds SketchSeeds
	cells [SketchRows][SketchCols]uint64
}

// NewSketch returns an empty sketch whose rows hash with seeds.
func NewSketch(seeds SketchSeeds) *Sketch {
	return &Sketch{seeds: seeds}
}

// Add counts one packet of group in window (the program's window id, which
// is truncated to 32 bits) and returns the group's estimated count in that
// window including this packet: the least of its cells, never less than
// the true count.
func (s *Sketch) Add(group netip.Prefix, window uint64) uint32 {
	return s.AddN(group, window, 1)
}

// SketchCellFull is the count from which a cell is full (bpf/consts.h
// TL_CELL_FULL): it is over any budget (MaxBudgetBytes is below it), and
// not added to, so that a count of bytes never carries into the window id.
const SketchCellFull = 3 << 30

// AddN is Add for a packet of weight w (1, or its bytes under count:
// bytes, docs/design.md §2): each cell of the group's gains w, but a full
// one (SketchCellFull), which keeps its count.
func (s *Sketch) AddN(group netip.Prefix, window uint64, w uint32) uint32 {
	wid := uint64(uint32(window)) << 32
	est := uint32(math.MaxUint32)
	for r := range s.seeds {
		c := &s.cells[r][SourceColumn(group, s.seeds[r])]
		if *c&^math.MaxUint32 != wid {
			*c = wid
		}
		if uint32(*c) < SketchCellFull {
			*c += uint64(w)
		}
		est = min(est, uint32(*c))
	}
	return est
}

// Over counts one packet of group in window against budget as the program
// does, and reports whether the group is over budget. A group whose cells
// all exceed the budget already is over, and its cells are left as they
// are: adding to them would change no decision, for it or for any group
// that shares a cell. Otherwise it is Add(group, window) > budget. So
// counts stop just above the budget; below it they are Add's.
func (s *Sketch) Over(group netip.Prefix, window uint64, budget uint32) bool {
	over, _ := s.OverSpent(group, window, budget)
	return over
}

// OverSpent is Over, and also reports whether this packet spent the
// group's budget: its add took the group's estimate to exactly the
// budget, so the group adds no in-budget packet in this window any more
// (the program's sketch_over, which counts such groups for the smooth
// shape, docs/design.md §6). The estimate never falls below the group's
// true count: a group that shares its cells spends its budget early.
func (s *Sketch) OverSpent(group netip.Prefix, window uint64, budget uint32) (over, spent bool) {
	return s.OverSpentN(group, window, budget, 1)
}

// OverSpentN is OverSpent for a packet of weight w: spent when its add
// took the group's estimate from below the budget to it or past it.
func (s *Sketch) OverSpentN(group netip.Prefix, window uint64, budget, w uint32) (over, spent bool) {
	wid := uint64(uint32(window)) << 32
	est := uint32(math.MaxUint32)
	for r := range s.seeds {
		c := s.cells[r][SourceColumn(group, s.seeds[r])]
		if c&^math.MaxUint32 != wid {
			c = wid
		}
		est = min(est, uint32(c))
	}
	if est > budget {
		return true, false
	}
	est = s.AddN(group, window, w)
	return est > budget, est >= budget && est-min(est, w) < budget
}

// SketchFalsePositive bounds the probability that a group with few packets
// is judged over budget when heavy groups (each over budget) share the
// window: each of its SketchRows cells must collide with some heavy group.
// It returns (1 - (1 - 1/w)^heavy)^d for d rows of w columns, the
// probability with random row hashes (the count-min sketch's collision
// analysis, Cormode and Muthukrishnan 2005), and union, min(1, heavy/w)^d,
// which holds for any pairwise-independent rows such as SourceColumn's.
// Both ignore the light groups' own sum in a cell, which stays far below a
// budget unless the window holds about SketchCols × budget packets.
func SketchFalsePositive(heavy int) (random, union float64) {
	if heavy <= 0 {
		return 0, 0
	}
	hit := 1 - math.Pow(1-1.0/SketchCols, float64(heavy))
	return math.Pow(hit, SketchRows), math.Pow(min(1, float64(heavy)/SketchCols), SketchRows)
}

// String returns a compact form for logs: "budget 100 packets per /32 or /64".
func (b SourceBudget) String() string {
	if b.Budget == 0 {
		return "off"
	}
	return fmt.Sprintf("budget %d packets per /%d (IPv4) or /%d (IPv6) group", b.Budget, b.PrefixV4, b.PrefixV6)
}
