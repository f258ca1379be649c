package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/tierlimit/tierlimit/tiers"
)

// Reason says why a sampled packet was shed (types.h enum tl_reason).
type Reason uint8

// The reasons of a sample.
const (
	ReasonTier       = Reason(LimiterTlReasonTL_REASON_TIER)
	ReasonOverBudget = Reason(LimiterTlReasonTL_REASON_OVER_BUDGET)
	ReasonShedFirst  = Reason(LimiterTlReasonTL_REASON_SHED_FIRST)
	ReasonFragment   = Reason(LimiterTlReasonTL_REASON_FRAGMENT)
	// NumReasons is the number of reasons.
	NumReasons = int(LimiterTlReasonTL_REASONS)
)

var reasonNames = [...]string{"tier", "over_budget", "shed_first", "fragment"}

// String returns the reason's name as the packet comments and reports
// write it: tier, over_budget, shed_first, fragment.
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason%d", r)
}

// recordNone is tl_sample.tier and .sev when unknown.
const recordNone = uint8(LimiterTlConstTL_RECORD_NONE)

// RecordSnapMax is the most bytes a sample keeps (TL_RECORD_SNAP_MAX).
const RecordSnapMax = int(LimiterTlConstTL_C_RECORD_SNAP_MAX)

// Sample is one sampled shed packet (docs/design.md §10).
type Sample struct {
	// Mono is the kernel's CLOCK_MONOTONIC when the packet was judged.
	Mono time.Duration
	// Ifindex is the interface it arrived on.
	Ifindex int
	// Len is the frame's length; Data its first bytes (at most snaplen).
	Len  int
	Data []byte
	// Tier is its tier, -1 when it has none (over budget, fragments).
	Tier    int
	Reason  Reason
	Verdict tiers.Verdict
	// Severity is its <PRI>'s severity 0..7, -1 when the program did not
	// read one (no severity block, not UDP, no valid <PRI>); Facility its
	// facility 0..23, -1 then too (and in a format 1 sample).
	Severity int
	Facility int
	Class    tiers.SeverityClass
	// Format is the sample's format: SampleFormat, or 1 for a sample an
	// older program wrote (no Facility, no Pass).
	Format int
	// Pass is the pass probability in force when the packet was judged,
	// a fraction of 2^32 (PassProbability), as the program stores it: ~thr
	// of the drop threshold it was drawn at (docs/design.md §10).
	Pass uint32
	// Group is its source group: the source masked to the group prefix;
	// the zero Prefix when the frame's source was not found.
	Group netip.Prefix
}

// SampleFormat is the format of this program's samples (TL_SAMPLE_FORMAT):
// 2 added the facility and the pass probability to format 1.
const SampleFormat = int(LimiterTlConstTL_SAMPLE_FORMAT)

// PassProbability is the sample's pass probability, 0..1: Pass / 2^32,
// and 1 for 0xffffffff (a packet that could not be dropped, as
// tiers.AlwaysDrop is one that could not pass); -1 when the sample does not
// say (format 1). Its weight for a SIEM is 1 / PassProbability.
func (s Sample) PassProbability() float64 {
	switch {
	case s.Format < 2:
		return -1
	case s.Pass == 0xffffffff:
		return 1
	}
	return float64(s.Pass) / (1 << 32)
}

// RecordBurst returns how many samples the program may take at once at
// samples per second (tiers.RecordBurst).
func RecordBurst(samples uint32) uint64 { return tiers.RecordBurst(samples) }

// setRecord fills the settings of the shed record (record.h): the rate,
// the snaplen, the group masks, and the cap's gate on the clock of the
// tick gate (tickNs; 0 reads bpf_ktime_get_ns).
func setRecord(set *LimiterTlSettings, r tiers.RecordTable, tickNs uint64) {
	set.RecSamples = r.Samples
	set.RecSnaplen = min(r.Snaplen, uint32(RecordSnapMax))
	set.RecMask4, set.RecMask6 = r.Mask4, r.Mask6
	set.RecPrefixes = uint32(r.PrefixV4) | uint32(r.PrefixV6)<<8
	if r.Samples == 0 {
		return
	}
	set.RecIntervalNs, set.RecTauNs = r.IntervalNs, r.TauNs
	set.RecTickNs = tickNs
}

// SetRecordShare sets the share (0..1) of shed packets that may take a
// sample, the rest being passed over before the cap's gate (maps.h
// tl_record_share): a share a few times record.samples over the shed rate
// makes the samples a random draw of the shed packets. 1 at load.
func (l *Limiter) SetRecordShare(share float64) error {
	thr := uint32(tiers.AlwaysDrop)
	if share < 1 {
		thr = uint32(max(share, 0) * (1 << 32))
	}
	if err := l.objs.TlRecordShare.Set(thr); err != nil {
		return fmt.Errorf("set tl_record_share: %w", err)
	}
	return nil
}

// RecordCounts returns the samples the program wrote into the ring, and
// those it had no room for, summed over CPUs.
func (l *Limiter) RecordCounts() (sampled, lost uint64, err error) {
	var per []LimiterTlRecordCpu
	if err := l.objs.RecordCpu.Lookup(uint32(0), &per); err != nil {
		return 0, 0, fmt.Errorf("read record_cpu: %w", err)
	}
	for _, c := range per {
		sampled += c.Sampled
		lost += c.Lost
	}
	return sampled, lost, nil
}

// SampleReader reads the samples the program writes (the shed_samples ring
// buffer). One reader per limiter: a ring buffer has one consumer.
type SampleReader struct {
	rd *ringbuf.Reader
}

// ErrClosed is returned by SampleReader.Read once the reader is closed.
var ErrClosed = os.ErrClosed

// Samples opens a reader of the program's samples.
func (l *Limiter) Samples() (*SampleReader, error) {
	rd, err := ringbuf.NewReader(l.objs.ShedSamples)
	if err != nil {
		return nil, fmt.Errorf("open shed_samples: %w", err)
	}
	return &SampleReader{rd: rd}, nil
}

// SetDeadline makes Read return os.ErrDeadlineExceeded after t when no
// sample arrives; the zero time waits for ever.
func (r *SampleReader) SetDeadline(t time.Time) { r.rd.SetDeadline(t) }

// Read waits for the next sample. It returns ErrClosed once Close is
// called, and os.ErrDeadlineExceeded past the deadline.
func (r *SampleReader) Read() (Sample, error) {
	rec, err := r.rd.Read()
	if errors.Is(err, ringbuf.ErrClosed) {
		return Sample{}, ErrClosed
	}
	if err != nil {
		return Sample{}, err
	}
	return DecodeSample(rec.RawSample)
}

// Close ends Read.
func (r *SampleReader) Close() error { return r.rd.Close() }

// sampleV1Data is where a format 1 sample's data began (its facility's
// byte now), and sampleV1Size its size: an older program's samples.
const (
	sampleV1Data = int(unsafe.Offsetof(LimiterTlSample{}.Facility))
	sampleV1Size = sampleV1Data + RecordSnapMax
)

// DecodeSample decodes one record of the ring (struct tl_sample), of this
// program's format or format 1 (an older program's, still in a pinned ring
// an agent adopts: its fields up to the group where they are now, then the
// data).
func DecodeSample(raw []byte) (Sample, error) {
	var s LimiterTlSample
	whole := unsafe.Slice((*byte)(unsafe.Pointer(&s)), unsafe.Sizeof(s))
	format := 1
	switch {
	case len(raw) >= len(whole) && raw[unsafe.Offsetof(s.Format)] >= 2:
		// The program wrote the struct in this host's layout
		// (HostLayout, bpfel): copied whole, byte for byte, whatever
		// raw's alignment. binary.Decode, field by field through
		// reflection, took ~2 µs.
		copy(whole, raw)
		format = int(s.Format)
	case len(raw) >= sampleV1Size && raw[unsafe.Offsetof(s.Format)] == 0:
		copy(whole[:sampleV1Data], raw)
		copy(s.Data[:], raw[sampleV1Data:sampleV1Size])
		s.Facility, s.Pass = recordNone, 0
	default:
		return Sample{}, fmt.Errorf("sample of %d bytes, want %d (format %d) or %d (format 1)", len(raw), len(whole), SampleFormat, sampleV1Size)
	}
	caplen := min(int(s.Caplen), RecordSnapMax, int(s.Len))
	out := Sample{
		Mono:     time.Duration(s.TimeNs),
		Ifindex:  int(s.Ifindex),
		Len:      int(s.Len),
		Data:     append([]byte(nil), s.Data[:caplen]...),
		Tier:     int(s.Tier),
		Reason:   Reason(s.Reason),
		Verdict:  tiers.Verdict(s.Verdict),
		Severity: int(s.Sev),
		Facility: int(s.Facility),
		Class:    tiers.SeverityClass(s.SevClass),
		Format:   format,
		Pass:     s.Pass,
	}
	if s.Tier == recordNone {
		out.Tier = -1
	}
	if s.Sev == recordNone {
		out.Severity = -1
	}
	if s.Facility == recordNone {
		out.Facility = -1
	}
	var b [16]byte
	for i, w := range s.Group {
		binary.LittleEndian.PutUint32(b[4*i:], w)
	}
	switch s.Family {
	case 4:
		out.Group = netip.PrefixFrom(netip.AddrFrom4([4]byte(b[:4])), min(int(s.Prefix), 32))
	case 6:
		out.Group = netip.PrefixFrom(netip.AddrFrom16(b), min(int(s.Prefix), 128))
	}
	return out, nil
}
