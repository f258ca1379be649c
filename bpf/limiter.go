// Package bpf holds the tierlimit XDP program (limiter.c and the headers
// it includes, maps.h to verdict.h), its bpf2go
// bindings, and the small API that loads it, writes a compiled policy into
// its maps and reads its counters back. The agent and the tests share this
// one path to the kernel.
//
// The program needs Linux >= 5.17 (bpf_loop; BPF atomics with -mcpu=v3,
// bounded loops, bpf_jiffies64) built with CONFIG_BPF_SYSCALL,
// CONFIG_BPF_JIT and kernel BTF (CO-RE), which Load probes first
// (features.go); counting UDP GSO/GRO super-packets in generic mode
// needs Linux >= 6.2 (SetSKBIfaces). Loading needs CAP_BPF, CAP_PERFMON and
// CAP_NET_ADMIN (root).
package bpf

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/tierlimit/tierlimit/tiers"
)

// Limits compiled into the program, from consts.h through types.h's enum
// tl_const (bpf2go -type): C is their one source.
const (
	// MaxTiers is the most tiers a policy may have (TL_MAX_TIERS).
	MaxTiers = int(LimiterTlConstTL_C_MAX_TIERS)
	// MaxTableEntries is the most entries of one compiled table (TL_TABLE_MAX).
	MaxTableEntries = int(LimiterTlConstTL_C_TABLE_MAX)
	// MaxSelectRules is the most select rules (TL_MAX_RULES).
	MaxSelectRules = int(LimiterTlConstTL_C_MAX_RULES)
	// NumVerdicts is the number of verdicts per tier in the stats map.
	NumVerdicts = int(LimiterTlVerdictTL_VERDICTS)
	// MaxPrefixes is the most prefixes of one policy's exempt sources, and
	// of all its select rules' dests together (TL_LPM_PREFIXES, which is
	// TL_LPM_ENTRIES / TL_SLOTS).
	MaxPrefixes = int(LimiterTlConstTL_C_LPM_ENTRIES / LimiterTlConstTL_C_SLOTS)
	// PrefixEntries is the most prefixes each LPM trie (exempt sources,
	// select dests) holds, over both policy slots (TL_LPM_ENTRIES): slots ×
	// MaxPrefixes, so that the next policy always fits beside the running one.
	PrefixEntries = int(LimiterTlConstTL_C_LPM_ENTRIES)
	// FragmentEntries is the most first fragments whose verdict is
	// remembered at once (TL_FRAG_ENTRIES).
	FragmentEntries = int(LimiterTlConstTL_C_FRAG_ENTRIES)
	// slots is the number of policy slots (TL_SLOTS).
	slots = uint32(LimiterTlConstTL_C_SLOTS)
	// portKeys is the number of ports keys per slot and protocol.
	portKeys = uint32(LimiterTlConstTL_PORT_KEYS)
	// destRuleBits is where the slot sits in a select_dests tag.
	destRuleBits = uint32(LimiterTlConstTL_DEST_RULE_BITS)
	// lpmTagBits is the part of an LPM key's prefixlen that covers its tag.
	lpmTagBits = uint32(LimiterTlConstTL_LPM_TAG_BITS)
	// lpmTagIPv6 is the family bit of an LPM tag.
	lpmTagIPv6 = uint32(LimiterTlConstTL_LPM_TAG_IPV6)
	// FragmentTTL is how long a first fragment's drop verdict holds for
	// its followers (TL_FRAG_TTL_MS).
	FragmentTTL = time.Duration(LimiterTlConstTL_C_FRAG_TTL_MS) * time.Millisecond
	// NumMalformed is the number of malformed reasons (enum tl_malformed),
	// which tiers.Malformed mirrors.
	NumMalformed = int(LimiterTlMalformedTL_MAL_MAX)
	// NumUnclassified is the number of unclassified reasons (enum
	// tl_unclassified), which tiers.Unclassified mirrors.
	NumUnclassified = int(LimiterTlUnclassifiedTL_UNCL_MAX)
	// maxCPUs is the most CPUs with a slot in the overflow map (TL_MAX_CPUS).
	maxCPUs = int(LimiterTlConstTL_C_MAX_CPUS)
)

// Indexes of the misc_stats map (types.h enum tl_misc), and flags of
// tl_port and tl_settings.
const (
	miscUnselected = LimiterTlMiscTL_MISC_UNSELECTED
	miscExempt     = LimiterTlMiscTL_MISC_EXEMPT
	miscFragPass   = LimiterTlMiscTL_MISC_FRAG_PASS
	miscFragDrop   = LimiterTlMiscTL_MISC_FRAG_DROP
	miscMax        = int(LimiterTlMiscTL_MISC_MAX)

	portPackets = uint32(LimiterTlPortFlagTL_PORT_PACKETS)
	portSYN     = uint32(LimiterTlPortFlagTL_PORT_SYN)
	hasExempt   = uint32(LimiterTlSettingsFlagTL_HAS_EXEMPT)
	anyDest     = uint32(LimiterTlSettingsFlagTL_ANY_DEST)
	countBytes  = uint32(LimiterTlSettingsFlagTL_COUNT_BYTES)

	sevStats = int(LimiterTlSevStatTL_SEV_STATS)
	// sevFacShift is where tl_settings.sev_on holds the protected
	// facilities' mask (tiers.SeverityTable.Facilities).
	sevFacShift = uint32(LimiterTlConstTL_SEV_FAC_SHIFT)
)

// verifierTail is how many of the verifier log's last lines a load error
// carries: the reason and the instructions that led to it.
const verifierTail = 40

// Options configure Load.
type Options struct {
	// PinPath, when set, is a bpffs directory: maps are pinned there by name
	// and maps already pinned there are reused, so the window and counters
	// survive a reload of the program. Empty means no pinning.
	PinPath string
	// TickNs is the kernel's tick (1/CONFIG_HZ) in ns, from KernelTick. It
	// enables the program's tick gate, which skips bpf_ktime_get_ns for
	// packets that cannot be at a window's end (window.h window_expired).
	// 0 disables the gate: every selected packet reads the clock.
	TickNs uint64
	// JudgeCall loads the program with its judgement called (tl_judge)
	// instead of tail-called (tl_judge_tail), as Load does by itself on a
	// kernel that refuses a tail call in a program with BPF-to-BPF calls
	// (docs/design.md §2, "The selected path's calls"): same verdicts, one
	// call more per selected packet. For tests and benchmarks.
	JudgeCall bool
}

// Limiter is the loaded XDP program and its maps.
type Limiter struct {
	objs LimiterObjects
	bss  *ebpf.Map // the program's globals (.bss), the source sketch among them
	// sketchOff is the sketch's offset in bss (maps.h tl_sketch)
	sketchOff uint32
	// exempt and dests mirror the LPM tries, so that Apply writes only
	// the prefixes that changed.
	exempt, dests lpmMirror
	tickNs        uint64
	grace         *grace
	judgeCalled   bool // loaded with tl_judge_jump 0 (Options.JudgeCall)
	lastSlot      uint32
	hasPolicy     bool                           // lastSlot is the slot this Limiter made active
	graced        bool                           // a grace period passed since that flip
	seeds         [SketchRows * seedWords]uint64 // sketch row seeds (sources.go)
}

// ErrPolicy is returned by Apply for a policy or table that the program
// cannot hold (too many tiers, rules or table entries).
var ErrPolicy = errors.New("policy does not fit the program")

// Load loads the program and creates (or, with PinPath, reuses) its maps.
// Nothing is attached.
func Load(opts Options) (*Limiter, error) {
	spec, err := LoadLimiter()
	if err != nil {
		return nil, fmt.Errorf("load limiter spec: %w", err)
	}
	return load(opts, spec)
}

// load loads spec, the limiter's (or, for the benchmarks' stage loads,
// export_test.go, the same program built with its stage stops).
func load(opts Options, spec *ebpf.CollectionSpec) (*Limiter, error) {
	if err := sizeMaps(spec); err != nil {
		return nil, err
	}
	var copts ebpf.CollectionOptions
	if opts.PinPath != "" {
		for name, m := range spec.Maps {
			if !pinnedName(name) {
				continue
			}
			m.Pinning = ebpf.PinByName
		}
		copts.Maps.PinPath = opts.PinPath
	}
	// One line naming what the kernel lacks, before the verifier's log.
	if err := checkKernel(spec, kernelProber, kernelRelease()); err != nil {
		return nil, err
	}
	l := &Limiter{tickNs: opts.TickNs}
	if v, ok := spec.Variables[LimiterVarTlSketch]; ok {
		l.sketchOff = v.Offset
	}
	var err error
	if !opts.JudgeCall {
		err = loadAssign(spec, &copts, &l.objs, &l.bss)
	}
	if opts.JudgeCall || tailCallRefused(err) {
		// Linux before 6.0 allows a tail call beside BPF-to-BPF calls
		// only on x86-64's JIT (verifier.c allow_tail_call_in_subprogs):
		// elsewhere the judgement is called, its tail call dead code.
		v, ok := spec.Variables[LimiterVarTlJudgeJump]
		if !ok {
			return nil, fmt.Errorf("load limiter: %w", err)
		}
		if err := v.Set(uint32(0)); err != nil {
			return nil, fmt.Errorf("load limiter: %s: %w", LimiterVarTlJudgeJump, err)
		}
		l.judgeCalled = true
		err = loadAssign(spec, &copts, &l.objs, &l.bss)
	}
	if err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			// The verifier's reason is at the end of its log; the whole
			// log runs to megabytes, more than a log line holds.
			tail := verr.Log[max(0, len(verr.Log)-verifierTail):]
			return nil, fmt.Errorf("load limiter: %w: verifier log, last %d lines:\n%s", verr.Cause, len(tail), strings.Join(tail, "\n"))
		}
		return nil, fmt.Errorf("load limiter: %w", err)
	}
	if err := l.initSeeds(); err != nil {
		l.Close()
		return nil, err
	}
	if err := l.initWindow(); err != nil {
		l.Close()
		return nil, err
	}
	g, err := newGrace()
	if err != nil {
		l.Close()
		return nil, err
	}
	l.grace = g
	return l, nil
}

// Program is the XDP program, to attach or to run with BPF_PROG_TEST_RUN.
func (l *Limiter) Program() *ebpf.Program { return l.objs.Tierlimit }

// JudgeTailCalled reports whether the program tail-calls its judgement
// (false when loaded with Options.JudgeCall or on a kernel that refuses
// the tail call: then every selected packet calls tl_judge).
func (l *Limiter) JudgeTailCalled() bool { return !l.judgeCalled && l.objs.TlJudgeTail != nil }

// tailCallRefused reports whether err is the verifier's refusal of a tail
// call in a program with BPF-to-BPF calls ("tail_calls are not allowed in
// programs with bpf-to-bpf calls", or "... in non-JITed programs ...":
// kernel/bpf/verifier.c).
func tailCallRefused(err error) bool {
	var verr *ebpf.VerifierError
	if !errors.As(err, &verr) {
		return false
	}
	for _, line := range verr.Log {
		if strings.Contains(line, "tail_calls are not allowed") {
			return true
		}
	}
	return strings.Contains(verr.Error(), "tail_calls are not allowed")
}

// JumpTable is the program array of the judgement's tail call (maps.h
// tl_jump), holding this load's tl_judge_tail: pinned beside the program
// (agent/pin.Dir.PinProgram), so that it stays filled past the process;
// nil for an object of an earlier build.
func (l *Limiter) JumpTable() *ebpf.Map { return l.objs.TlJump }

// Close releases the program and the maps (pinned maps stay pinned).
func (l *Limiter) Close() error {
	if l.grace != nil {
		l.grace.close()
	}
	if l.bss != nil {
		l.bss.Close()
	}
	return l.objs.Close()
}

// Apply writes t, a policy as tiers.Compile made it for the program's
// tick (Tick), into the inactive slot and then makes that slot active with
// one 4-byte map update, so that every packet sees either the whole old
// policy or the whole new one. It writes what t holds and derives nothing.
// The window and the counters carry on. It gives up, returning ctx's
// error, when ctx ends before the new policy is active: the running policy
// stays, whole. Only prefix writes take long (about 20 µs each), so ctx is
// checked between them. Returns ErrPolicy when t exceeds the program's
// limits or was compiled for another tick; on any error the active policy
// is unchanged.
func (l *Limiter) Apply(ctx context.Context, t tiers.Table) error {
	if err := l.fits(t); err != nil {
		return err
	}
	active, err := l.activeSlot()
	if err != nil {
		return err
	}
	slot := active ^ 1
	// The slot we are about to write may have been active until a flip:
	// ours, or another agent's before this one adopted the pins. Packets
	// that read it then have finished after an RCU grace period (grace).
	if !l.hasPolicy || l.lastSlot != active || !l.graced {
		if err := l.grace.wait(); err != nil {
			return err
		}
		l.graced = true
	}

	if err := l.writeTable(slot, t); err != nil {
		return err
	}
	if err := l.writeSelectors(ctx, slot, t.Selectors); err != nil {
		return err
	}
	if err := l.clearDestCache(); err != nil {
		return err
	}
	set, err := l.settings(t)
	if err != nil {
		return err
	}
	if err := l.objs.Settings.Put(slot, &set); err != nil {
		return fmt.Errorf("write settings of slot %d: %w", slot, err)
	}
	if err := l.objs.ActiveSlot.Put(uint32(0), slot); err != nil {
		return fmt.Errorf("activate slot %d: %w", slot, err)
	}
	l.lastSlot, l.hasPolicy, l.graced = slot, true, false
	return nil
}

// settings is the settings map's value of t: t's fields as they are.
func (l *Limiter) settings(t tiers.Table) (LimiterTlSettings, error) {
	st := t.Settings
	set := LimiterTlSettings{
		WindowNs: uint64(st.Window.Nanoseconds()),
		// Whole ticks in a window: the tick gate's bound.
		WindowJiffies: st.WindowTicks,
		TableLen:      uint32(len(t.Thresholds)),
		Shift:         uint32(t.Shift),
		Mode:          uint32(st.Mode),
		SynRules:      t.Selectors.SynRules,
		DestRules:     t.Selectors.DestRules,
		Tiers:         uint32(len(t.Bounds)),
		Max:           st.Max,
	}
	if err := l.setSaturation(&set, t); err != nil {
		return set, err
	}
	copy(set.Bounds[:], st.TierStarts)
	copy(set.Drops[:], t.Drops)
	setShape(&set, t)
	if sv := t.Severity; sv.On {
		set.SevOn = 1 | sv.Facilities<<sevFacShift
		set.ProtectBudget = sv.ProtectBudget
		copy(set.ShedDrops[:], sv.ShedDrops)
		if t.Shape == tiers.ShapeSmooth {
			copy(set.ShedDrops[:], t.Smoothed.ShedDrops)
		}
		for sev, c := range sv.Class {
			set.SevClass[sev] = uint8(c)
		}
	}
	if st.HasExempt {
		set.Flags |= hasExempt
	}
	if t.Selectors.AnyDest {
		set.Flags |= anyDest
	}
	if st.Bytes {
		set.Flags |= countBytes
	}
	l.setSources(&set, t.Sources)
	setRecord(&set, t.Record, st.TickNs)
	return set, nil
}

// setSaturation fills the settings of the saturated window's fast path
// (window.h window_count): the first n of the table's last entry, that
// entry, and how many overflow slots the program sums.
func (l *Limiter) setSaturation(set *LimiterTlSettings, t tiers.Table) error {
	last := len(t.Thresholds) - 1
	set.LastN = t.Settings.LastN
	set.LastThr = t.Thresholds[last]
	set.LastTier = uint32(t.Tiers[last])
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("count possible CPUs: %w", err)
	}
	set.NrCpus = uint32(min(cpus, maxCPUs))
	return nil
}

// setShape fills the settings of the shape (docs/design.md §9, smooth.h): the
// ticks of a window as the estimate counts them (tiers.Settings), and the
// smooth table's closed form past its end.
func setShape(set *LimiterTlSettings, t tiers.Table) {
	set.Shape = uint32(t.Shape)
	set.SmTicks = t.Settings.SmoothTicks
	if t.Shape == tiers.ShapeSmooth {
		set.SmLastN = t.Smoothed.LastN
		set.SmPassBase = t.Smoothed.PassBase
		set.SmPassLast = t.Smoothed.PassLast
	}
}

// Tick is the kernel's tick in ns that the program's tick gate counts
// (Options.TickNs), 0 when every selected packet reads the clock: what
// tiers.Compile takes for the tables Apply writes.
func (l *Limiter) Tick() uint64 { return l.tickNs }

// TickNs returns the tick of the smooth estimate in ns (tiers.SmoothTick,
// model.Model.SetTick).
func (l *Limiter) TickNs() uint64 { return tiers.SmoothTick(l.tickNs) }

// fits refuses a table the program cannot hold, or compiled for another
// tick than the program's (ErrPolicy).
func (l *Limiter) fits(t tiers.Table) error {
	st := t.Settings
	switch {
	case st.TickNs != l.tickNs:
		return fmt.Errorf("%w: compiled for a tick of %d ns, the program's is %d ns", ErrPolicy, st.TickNs, l.tickNs)
	case len(t.Bounds) > MaxTiers:
		return fmt.Errorf("%w: %d tiers, at most %d", ErrPolicy, len(t.Bounds), MaxTiers)
	case st.Rules > MaxSelectRules:
		return fmt.Errorf("%w: %d select rules, at most %d", ErrPolicy, st.Rules, MaxSelectRules)
	case len(t.Thresholds) == 0 || len(t.Thresholds) > MaxTableEntries:
		return fmt.Errorf("%w: table of %d entries, want 1..%d", ErrPolicy, len(t.Thresholds), MaxTableEntries)
	case len(st.TierStarts) != len(t.Bounds) || len(t.Drops) != len(t.Bounds)+1:
		return fmt.Errorf("%w: table compiled for %d tiers, its settings have %d", ErrPolicy, len(t.Drops)-1, len(st.TierStarts))
	case len(t.Tiers) != len(t.Thresholds):
		return fmt.Errorf("%w: table has %d tiers for %d thresholds", ErrPolicy, len(t.Tiers), len(t.Thresholds))
	case t.Shift > 63:
		return fmt.Errorf("%w: table step 2^%d", ErrPolicy, t.Shift)
	case st.Exempts > MaxPrefixes:
		return fmt.Errorf("%w: %d exempt prefixes, at most %d", ErrPolicy, st.Exempts, MaxPrefixes)
	case st.Dests > MaxPrefixes:
		return fmt.Errorf("%w: %d dests prefixes, at most %d", ErrPolicy, st.Dests, MaxPrefixes)
	}
	// One trie entry per destination, however many rules name it
	// (tiers.DestKey): the policy's dests and the host's destinations.
	if n, most := len(t.Selectors.Dests), MaxPrefixes+int(LimiterTlConstTL_C_LOCAL_PREFIXES); n > most {
		return fmt.Errorf("%w: %d destinations of dests and dests: local together, at most %d", ErrPolicy, n, most)
	}
	return nil
}

// activeSlot returns the slot (0 or 1) that packets currently read.
func (l *Limiter) activeSlot() (uint32, error) {
	var slot uint32
	if err := l.objs.ActiveSlot.Lookup(uint32(0), &slot); err != nil {
		return 0, fmt.Errorf("read active slot: %w", err)
	}
	return slot % slots, nil
}

func (l *Limiter) writeTable(slot uint32, t tiers.Table) error {
	keys := make([]uint32, len(t.Thresholds))
	vals := make([]LimiterTlEntry, len(t.Thresholds))
	base := slot * uint32(MaxTableEntries)
	thrs := t.Thresholds
	if t.Shape == tiers.ShapeSmooth {
		thrs = t.Smoothed.Thresholds
	}
	for i, thr := range thrs {
		keys[i] = base + uint32(i)
		vals[i] = LimiterTlEntry{Thr: thr, Tier: uint32(t.Tiers[i])}
	}
	if err := putAll(l.objs.TierTable, keys, vals); err != nil {
		return fmt.Errorf("write tier table of slot %d: %w", slot, err)
	}
	return nil
}

// Window is the shared window's state.
type Window struct {
	// StartNs is the clock (CLOCK_MONOTONIC, ns) of the packet that opened the window.
	StartNs uint64
	// Count is n of the latest selected packet: packets in this window.
	Count uint64
	// LastCount is the final n of the previous window.
	LastCount uint64
	// Opened counts the windows opened since the maps were created.
	Opened uint64
	// StartJiffies is bpf_jiffies64 when the window opened. SetWindow with
	// 0 makes the next packets read the clock until a window opens.
	StartJiffies uint64
	// Debt is the window's drop debt (severity, docs/design.md §7): protected
	// passes not yet paid off, packets.
	Debt uint64
	// Overflow is the part of Count that CPUs counted in their own overflow
	// slots rather than on the shared count: the packets past the table's
	// last entry's first n (window.h window_count). Read only: SetWindow
	// ignores it and puts all of Count on the shared count.
	Overflow uint64
	// Gap is the ticks between the previous window's end and this one's
	// start, and Onset whether the smooth shape latched this window as an
	// onset (docs/design.md §9). Read only.
	Gap   uint64
	Onset bool
	// StartTick is the tick the window opened at as the smooth estimate
	// counts it (tiers.StartTick). Read only.
	StartTick uint64
	// Ex and LastEx are the selected packets over their source's budget
	// in this window and in the previous one, which Count and LastCount
	// leave out: the shared counts plus every CPU's overflow slot. Read
	// only.
	Ex, LastEx uint64
}

// Active is the policy in force, as the program's maps hold it.
type Active struct {
	// Mode is the mode (tiers.Mode).
	Mode tiers.Mode
	// Window is the window length.
	Window time.Duration
	// Max is the max the table applies, packets per window: the policy's
	// max, or fleet.max with a fleet (tiers.Policy.TableMax).
	Max uint64
	// Bounds are the first n of tiers 1..K as the table applies them: T_k,
	// rounded up to the table's step when Shift > 0.
	Bounds []uint64
	// Drops are the drop thresholds of tiers 0..K on the
	// bpf_get_prandom_u32 scale (tiers.Table.Drops).
	Drops []uint32
	// DropRatios of tiers 0..K, 0..1: tiers.DropRatio of Drops, within
	// 2^-33 of the configured drop percent.
	DropRatios []float64
	// TableLen and Shift describe the table: entry i covers n>>Shift == i.
	TableLen int
	Shift    uint
	// Severity is the severity block's compiled form; Severity.On is false
	// without one.
	Severity tiers.SeverityTable
	// Sources is the per-source budget; Budget 0 is off.
	Sources tiers.SourceBudget
	// Shape is the policy's shape (docs/design.md §9), and Ticks the ticks of a
	// window as the smooth estimate counts them (at least 1).
	Shape tiers.Shape
	Ticks uint64
	// Count is what the window counts: tiers.CountPackets, or
	// tiers.CountBytes (docs/design.md §2), in which Max, Bounds, the
	// sources' budget and the window's counts are bytes.
	Count tiers.Count
}

// WindowPolicy is what tiers.WindowNow reads of the policy in force.
func (a Active) WindowPolicy() tiers.WindowPolicy {
	return tiers.WindowPolicy{Window: a.Window, Ticks: a.Ticks, Bounds: a.Bounds, Shape: a.Shape, Budgeted: a.Sources.Budget != 0}
}

// Active reads the active slot's settings, which hold what tiers.Compile
// made: nothing is derived again. Returns ErrPolicy when no policy has been
// applied, or when the settings claim more tiers than the program holds.
func (l *Limiter) Active() (Active, error) {
	slot, err := l.activeSlot()
	if err != nil {
		return Active{}, err
	}
	var set LimiterTlSettings
	if err := l.objs.Settings.Lookup(slot, &set); err != nil {
		return Active{}, fmt.Errorf("read settings: %w", err)
	}
	if set.TableLen == 0 {
		return Active{}, fmt.Errorf("%w: no policy applied", ErrPolicy)
	}
	if int(set.Tiers) > MaxTiers {
		return Active{}, fmt.Errorf("%w: settings of slot %d claim %d tiers", ErrPolicy, slot, set.Tiers)
	}
	a := Active{
		Mode:       tiers.Mode(set.Mode),
		Window:     time.Duration(set.WindowNs),
		Max:        set.Max,
		TableLen:   int(set.TableLen),
		Shift:      uint(set.Shift),
		Bounds:     make([]uint64, set.Tiers),
		DropRatios: make([]float64, set.Tiers+1),
		Drops:      make([]uint32, set.Tiers+1),
		Sources:    activeSources(&set),
		Shape:      tiers.Shape(set.Shape),
		Ticks:      max(set.SmTicks, 1),
	}
	if set.Flags&countBytes != 0 {
		a.Count = tiers.CountBytes
	}
	for k := range a.Bounds {
		a.Bounds[k] = set.Bounds[k]
	}
	for k := range a.Drops {
		a.Drops[k] = set.Drops[k]
		a.DropRatios[k] = tiers.DropRatio(set.Drops[k])
	}
	if set.SevOn != 0 {
		a.Severity = tiers.SeverityTable{On: true, ProtectBudget: set.ProtectBudget,
			ShedDrops: append([]uint32(nil), set.ShedDrops[:set.Tiers+1]...), Facilities: set.SevOn >> sevFacShift}
		for sev, c := range set.SevClass {
			a.Severity.Class[sev] = tiers.SeverityClass(c)
		}
	}
	return a, nil
}
