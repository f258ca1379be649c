// Package record is the shed record (docs/design.md §10): the Recorder reads
// the program's samples of shed packets and writes them into rotating
// pcapng files (pcapng.go), Episodes tracks shedding episodes and reports
// them as RFC 5424 syslog events (syslog.go), and a reload changes them
// all in place (record_reload.go). It reads the limiter through Limiter
// and knows nothing of the agent.
package record

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/sysutil"
	"github.com/tierlimit/tierlimit/tiers"
)

// RecentSamples is how many samples the agent keeps in memory, newest last.
const RecentSamples = 1024

// Limiter is what the shed record reads and sets of the limiter:
// *bpf.Limiter.
type Limiter interface {
	Stats() (bpf.Stats, error)
	SetRecordShare(share float64) error
	RecordCounts() (sampled, lost uint64, err error)
	Samples() (*bpf.SampleReader, error)
}

// sampleReader is what the recorder reads samples from: *bpf.SampleReader.
type sampleReader interface {
	Read() (bpf.Sample, error)
	Close() error
}

// Recorder keeps the shed record (docs/design.md §10): it reads the program's
// samples, keeps the last RecentSamples in memory, writes them into
// rotating pcapng files when the policy names a record dir, and counts
// them for the episode in progress.
type Recorder struct {
	log *slog.Logger
	rd  sampleReader
	// dirMu guards dir: a reload swaps it (setDir) between two samples.
	dirMu sync.Mutex
	dir   *pcapDir // nil: memory only
	// monoOff turns a sample's CLOCK_MONOTONIC time into wall time.
	monoOff time.Duration

	mu     sync.Mutex
	recent []bpf.Sample // a ring of RecentSamples, next at head
	head   int
	groups map[netip.Prefix]uint64 // samples by group since resetGroups
	nGroup uint64                  // their total
	// groupInv holds, by group, its samples that carry a pass
	// probability q < 1 and their sum of 1/(1 − q) (weights.go).
	groupInv map[netip.Prefix]invSum

	written, lost atomic.Uint64 // samples kept, and those the agent could not write
	dirErr        atomic.Bool   // the last write failed: logged once until it works again
}

// payloadSeverity reads the syslog severity of a sampled UDP frame whose
// <PRI> the program did not read (no severity block): -1 when the frame is
// not UDP, the snaplen cut the payload's start, or it has no valid <PRI>.
func payloadSeverity(frame []byte) int {
	p := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.DecodeOptions{Lazy: true, NoCopy: true})
	udp, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
	if !ok {
		return -1
	}
	if sev, ok := tiers.SyslogSeverity(udp.Payload); ok {
		return sev
	}
	return -1
}

// SampleComment is a sample's packet comment and log form:
// "tier=3 reason=tier severity=info group=10.0.0.0/24 verdict=drop", with
// "dry_run=true" after a would_drop; "-" for a tier or severity the sample
// does not have; then "facility=auth" when the program read the <PRI>,
// and "pass=0.25 weight=4", the pass probability in force when the packet
// was judged and its weight 1/pass (docs/design.md §10), when the sample
// says ("weight=+Inf" at pass 0).
func SampleComment(s bpf.Sample) string {
	tier, sev := "-", "-"
	if s.Tier >= 0 {
		tier = strconv.Itoa(s.Tier)
	}
	if s.Severity >= 0 {
		sev = tiers.SeverityName(s.Severity)
	}
	group := "-"
	if s.Group.IsValid() {
		group = s.Group.String()
	}
	c := fmt.Sprintf("tier=%s reason=%s severity=%s class=%s group=%s verdict=%s", tier, s.Reason, sev, s.Class, group, s.Verdict)
	if s.Verdict == tiers.VerdictWouldDrop {
		c += " dry_run=true"
	}
	if s.Facility >= 0 {
		c += " facility=" + tiers.FacilityName(s.Facility)
	}
	if q := s.PassProbability(); q >= 0 {
		c += " pass=" + strconv.FormatFloat(q, 'g', 6, 64) + " weight=" + strconv.FormatFloat(1/q, 'g', 6, 64)
	}
	return c
}

// ParseSampleComment reads a comment SampleComment wrote back into its
// keys and values.
func ParseSampleComment(c string) (map[string]string, error) {
	out := map[string]string{}
	for _, f := range strings.Fields(c) {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("comment %q: field %q is not key=value", c, f)
		}
		out[k] = v
	}
	for _, k := range []string{"tier", "reason", "severity", "class", "group", "verdict"} {
		if _, ok := out[k]; !ok {
			return nil, fmt.Errorf("comment %q: no %s", c, k)
		}
	}
	return out, nil
}

// newRecorder makes a recorder of rd's samples, in memory only until it
// gets a dir (setDir, startDir).
func newRecorder(log *slog.Logger, rd sampleReader) (*Recorder, error) {
	rec := &Recorder{log: log, rd: rd, recent: make([]bpf.Sample, 0, RecentSamples), groups: map[netip.Prefix]uint64{},
		groupInv: map[netip.Prefix]invSum{}}
	mono, err := sysutil.Monotonic()
	if err != nil {
		return nil, err
	}
	rec.monoOff = time.Duration(time.Now().UnixNano() - int64(mono))
	return rec, nil
}

// startDir gives the recorder r.Dir at the agent's start, if set, even
// when the dir is not usable yet (it is made again as each file opens):
// that is logged, and samples are counted lost until it is. ifname names
// interfaces for the files.
func (rec *Recorder) startDir(r tiers.Record, ifname func(int) string) {
	if r.Dir == "" {
		return
	}
	d, err := newPcapDir(r.Dir, r.MaxBytes, max(r.Snaplen, 1), ifname)
	if err != nil {
		rec.log.Warn("shed record: the record dir is not usable yet; samples are kept in memory and counted lost until it is", "dir", r.Dir, "error", err)
	}
	rec.setDir(d)
	rec.dirErr.Store(err != nil)
}

// run reads samples until the reader is closed.
func (r *Recorder) run() {
	for {
		s, err := r.rd.Read()
		if errors.Is(err, bpf.ErrClosed) {
			r.setDir(nil)
			return
		}
		if err != nil {
			r.lost.Add(1)
			r.log.Warn("shed record: read sample", "error", err)
			continue
		}
		r.keep(s)
	}
}

// keep stores one sample: in memory, in the episode's groups and, with a
// dir, in the pcapng files. A sample the files refuse (a full or read-only
// disk) is counted lost; shedding is not affected.
func (r *Recorder) keep(s bpf.Sample) {
	if s.Severity < 0 {
		s.Severity = payloadSeverity(s.Data)
	}
	r.mu.Lock()
	if len(r.recent) < RecentSamples {
		r.recent = append(r.recent, s)
	} else {
		r.recent[r.head] = s
	}
	r.head = (r.head + 1) % RecentSamples
	if s.Group.IsValid() {
		r.groups[s.Group]++
		if q := s.PassProbability(); q >= 0 && q < 1 {
			if r.groupInv == nil {
				r.groupInv = map[netip.Prefix]invSum{}
			}
			w := r.groupInv[s.Group]
			w.n++
			w.inv += 1 / (1 - q)
			r.groupInv[s.Group] = w
		}
	}
	r.nGroup++
	r.mu.Unlock()
	r.dirMu.Lock()
	defer r.dirMu.Unlock()
	if r.dir == nil {
		r.written.Add(1)
		return
	}
	err := r.dir.write(r.wall(s.Mono), s.Ifindex, s.Len, s.Data, SampleComment(s))
	if err != nil {
		r.lost.Add(1)
		if !r.dirErr.Swap(true) {
			r.log.Warn("shed record: samples not written, counted lost until the dir takes them again", "dir", r.dir.dir, "error", err)
		}
		return
	}
	if r.dirErr.Swap(false) {
		r.log.Info("shed record: samples written again", "dir", r.dir.dir)
	}
	r.written.Add(1)
}

// setDir makes d the record's dir from the next sample on (nil: memory
// only), and closes the file of the old one: a sample is written whole
// into one or the other.
func (r *Recorder) setDir(d *pcapDir) {
	r.dirMu.Lock()
	defer r.dirMu.Unlock()
	if r.dir != nil {
		r.dir.close()
	}
	r.dir = d
	r.dirErr.Store(false)
}

// setLimits gives the dir a reload's max_bytes and snaplen (pcapDir
// setLimits); nothing without a dir.
func (r *Recorder) setLimits(maxBytes uint64, snaplen uint32) error {
	r.dirMu.Lock()
	defer r.dirMu.Unlock()
	if r.dir == nil {
		return nil
	}
	return r.dir.setLimits(maxBytes, max(snaplen, 1))
}

func (r *Recorder) wall(mono time.Duration) time.Time {
	return time.Unix(0, int64(mono+r.monoOff))
}

// Recent returns the samples in memory, oldest first.
func (r *Recorder) Recent() []bpf.Sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.recent) < RecentSamples {
		return append([]bpf.Sample(nil), r.recent...)
	}
	return append(append([]bpf.Sample(nil), r.recent[r.head:]...), r.recent[:r.head]...)
}

// GroupShare is a source group's share of an episode's samples, and the
// estimate of its pass fraction from them (weights.go passEstimate; nil
// when none of its samples carries a pass probability).
type GroupShare struct {
	Group   netip.Prefix `json:"group"`
	Samples uint64       `json:"samples"`
	Share   float64      `json:"share"`
	PassEst *float64     `json:"pass_est,omitempty"`
}

// topGroups returns the n groups with the most samples since the last
// reset, and the number of samples.
func (r *Recorder) topGroups(n int) ([]GroupShare, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]GroupShare, 0, len(r.groups))
	for g, c := range r.groups {
		out = append(out, GroupShare{Group: g, Samples: c})
	}
	sortShares(out)
	if len(out) > n {
		out = out[:n]
	}
	for i := range out {
		out[i].Share = float64(out[i].Samples) / float64(max(r.nGroup, 1))
		out[i].PassEst = r.groupInv[out[i].Group].passEstimate()
	}
	return out, r.nGroup
}

// resetGroups starts counting groups afresh: an episode closed.
func (r *Recorder) resetGroups() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.groups)
	clear(r.groupInv)
	r.nGroup = 0
}

// close stops run.
func (r *Recorder) close() { r.rd.Close() }

// Counts are the shed record's counters (docs/design.md §5).
type Counts struct {
	Shedding      bool
	Episodes      uint64
	Written, Lost uint64 // samples; Lost includes the program's ring-full losses
	Sent, Errors  uint64 // event reports
}

// Start starts the shed record (docs/design.md §10) of policy p, reading and
// setting lim: the sample reader (with p.Record.Samples > 0), the pcapng
// files (with p.Record.Dir; ifname names the interfaces in them) and the
// episode tracker, which reports to p.Events, names the interfaces ifaces
// gives and keeps the open or last episode in statePath ("" for none).
// Cancelling ctx stops them. A reload changes them all in place
// (Episodes.Prepare). o says whose state file it is (resume).
func Start(ctx context.Context, log *slog.Logger, lim Limiter, p tiers.Policy, ifname func(int) string, ifaces func() []string, statePath string, o Owner) (*Episodes, error) {
	var rec *Recorder
	if p.Record.Samples > 0 {
		rd, err := lim.Samples()
		if err != nil {
			return nil, err
		}
		if rec, err = newRecorder(log, rd); err != nil {
			rd.Close()
			return nil, err
		}
		rec.startDir(p.Record, ifname)
		go rec.run()
		context.AfterFunc(ctx, rec.close)
	}
	ep := newEpisodesOf(o, log, lim, rec, p, ifaces, statePath)
	ep.ctx, ep.ifname = ctx, ifname
	go ep.run(ctx)
	return ep, nil
}
