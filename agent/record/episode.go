package record

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

// Episodes (docs/design.md §10): an episode opens at the first window with a
// shed packet and closes after QuietWindows windows in a row with none.
// The tracker reads the counters once a window (the policy's window, on
// the agent's clock), reports the opening, a summary every summary_every
// while open, and the closing, and keeps the open or last episode in a
// state file for `tierlimit status --shed`.
const (
	QuietWindows = 3
	// DefaultStateFile is where `tierlimit run` keeps the open or last
	// episode, under the unit's StateDirectory, when systemd does not say
	// where that is (DefaultStatePath).
	DefaultStateFile = "/var/lib/tierlimit/episode.json"
	// TopGroups is how many source groups a summary names.
	TopGroups = 5
)

// DefaultStatePath is the episode state file of the agent of the default
// pin path: episode.json in $STATE_DIRECTORY (which systemd sets for
// StateDirectory=, the first of them), else DefaultStateFile.
func DefaultStatePath() string {
	if d, _, _ := strings.Cut(os.Getenv("STATE_DIRECTORY"), ":"); d != "" {
		return filepath.Join(d, "episode.json")
	}
	return DefaultStateFile
}

// StatePathFor is the episode state file of the agent of pin path
// pinPath, beside DefaultStatePath: episode@<pin path>.json, the pin
// path's slashes written %2F (and % as %25), so that two agents with
// their own pin paths never share one (docs/design.md §10). The agent of
// the default pin path uses DefaultStatePath itself.
func StatePathFor(pinPath string) string {
	name := strings.TrimPrefix(filepath.Clean(pinPath), "/")
	name = strings.ReplaceAll(strings.ReplaceAll(name, "%", "%25"), "/", "%2F")
	return filepath.Join(filepath.Dir(DefaultStatePath()), "episode@"+name+".json")
}

// Episode is one shedding episode, as reports and the state file give it.
type Episode struct {
	ID         uint64    `json:"id"`
	Open       bool      `json:"open"`
	Start      time.Time `json:"start"`
	End        time.Time `json:"end,omitzero"`
	Interfaces []string  `json:"interfaces"`
	Mode       string    `json:"mode"`
	// PinPath is the pin path of the agent that keeps it ("" unpinned
	// or unknown); Saved when that agent last wrote it (docs/design.md
	// §10: an open episode older than StaleAfter is not taken up).
	PinPath string    `json:"pin_path,omitempty"`
	Saved   time.Time `json:"saved,omitzero"`
	// Max is the max the limiter sheds against (packets per window);
	// MaxOf says whose it is: "fleet.max" under a fleet, "" for the
	// policy's own max (learnt, with max: auto).
	Max   uint64 `json:"max"`
	MaxOf string `json:"max_of,omitempty"`
	// OfferedRate is the selected packets per second in the window that
	// opened it; PeakRate the most of any window since.
	OfferedRate float64 `json:"offered_rate"`
	PeakRate    float64 `json:"peak_rate"`
	// Shed counts the packets shed (dropped, or would_drop in dry-run)
	// since the episode opened, in all and by tier, reason and severity
	// class.
	Shed       uint64            `json:"shed"`
	ByTier     map[string]uint64 `json:"by_tier"`
	ByReason   map[string]uint64 `json:"by_reason"`
	BySeverity map[string]uint64 `json:"by_severity,omitempty"`
	// Samples is the shed packets sampled since it opened; Top the
	// groups with the most of them.
	Samples uint64       `json:"samples"`
	Top     []GroupShare `json:"top_groups"`
	// Weights are the pass fractions of the last report's span
	// (weights.go), for a SIEM to scale its counts back.
	Weights *Weights `json:"weights,omitempty"`
}

// Duration is how long the episode has lasted, or lasted.
func (e Episode) Duration(now time.Time) time.Duration {
	if !e.Open {
		now = e.End
	}
	return now.Sub(e.Start)
}

// Episodes tracks shedding episodes and reports them. A reload changes
// its settings in place (record_reload.go): the fields from rec to record
// are guarded by mu, as the episode is.
type Episodes struct {
	log    *slog.Logger
	lim    Limiter
	ifaces func() []string
	// ifname names an interface by ifindex, for a reload's new dir.
	ifname func(int) string
	state  string // the state file; "" for none
	owner  Owner  // the agent's pin path, and whether its pins outlived the last agent
	host   string
	// ctx is run's: the readers and senders a reload starts end with it.
	ctx context.Context
	// retick tells run that the window changed.
	retick chan struct{}
	events eventCounts // what every sender, old or new, counts into

	mu     sync.Mutex
	rec    *Recorder // nil until sampling is first on
	send   *eventSender
	window time.Duration
	every  time.Duration
	mode   tiers.Mode
	max    uint64
	maxOf  string // Episode.MaxOf
	// samples is record.samples; share the eligible share set last.
	samples uint32
	share   float64
	// record and events are the policy's blocks in force.
	record tiers.Record
	evcfg  tiers.Events

	cur         Episode
	carry       Episode // counts of a resumed episode from before the restart (resume)
	resumed     bool    // cur was resumed, and its start counters not read yet
	start, prev bpf.Stats
	prevAt      time.Time
	// wFrom is the counters at the start of the next report's span
	// (weights.go), read at wFromAt; zero until the episode's first.
	wFrom       bpf.Stats
	wFromAt     time.Time
	severity    bool // the policy has a severity block
	quiet       int
	nextSummary time.Time

	episodes atomic.Uint64
	shedding atomic.Bool
}

func newEpisodes(log *slog.Logger, lim Limiter, rec *Recorder, p tiers.Policy, ifaces func() []string, state string) *Episodes {
	return newEpisodesOf(Owner{}, log, lim, rec, p, ifaces, state)
}

func newEpisodesOf(o Owner, log *slog.Logger, lim Limiter, rec *Recorder, p tiers.Policy, ifaces func() []string, state string) *Episodes {
	host, _ := os.Hostname()
	e := &Episodes{log: log, lim: lim, rec: rec, ifaces: ifaces, state: state, owner: o, host: host, share: 1,
		retick: make(chan struct{}, 1), record: p.Record, evcfg: p.Events}
	e.setPolicy(p)
	if p.Events.Network != "" { // before resume: a stale episode's close is reported
		e.send = newEventSender(log, p.Events.Network, p.Events.Addr, &e.events)
		e.send.framing = p.Events.Framing
	}
	e.resume(time.Now())
	return e
}

// setPolicy takes the window, summary period, mode, max and sample rate
// of p.
func (e *Episodes) setPolicy(p tiers.Policy) {
	e.window = max(p.Window, 100*time.Millisecond)
	e.every = p.Events.SummaryEvery
	if e.every <= 0 {
		e.every = tiers.DefaultSummaryEvery
	}
	e.mode, e.samples = p.Mode, p.Record.Samples
	e.severity = p.Severity != nil
	e.max, e.maxOf = maxOf(p)
}

// maxOf is the max p's limiter sheds against and whose it is:
// fleet.max under a fleet (its table is compiled for it, tiers
// TableMax), else the policy's max.
func maxOf(p tiers.Policy) (uint64, string) {
	if p.Fleet != nil {
		return p.Fleet.Max, "fleet.max"
	}
	return p.Max, ""
}

// SetMax takes the max of p, the policy the agent applied between
// reloads (the max that `max: auto` learnt, a fleet's fallback): the next
// episode's reports say it. An open episode keeps the max it opened with.
func (e *Episodes) SetMax(p tiers.Policy) {
	e.mu.Lock()
	e.max, e.maxOf = maxOf(p)
	e.mu.Unlock()
}

func (e *Episodes) run(ctx context.Context) {
	e.mu.Lock()
	if e.send != nil {
		go e.send.run(ctx)
	}
	t := time.NewTicker(e.window)
	e.mu.Unlock()
	defer t.Stop()
	for {
		if st, err := e.lim.Stats(); err != nil {
			e.log.Warn("episodes: read counters", "error", err)
		} else {
			e.tick(time.Now(), st)
		}
		select {
		case <-ctx.Done():
			return
		case <-e.retick:
			e.mu.Lock()
			t.Reset(e.window)
			e.mu.Unlock()
		case <-t.C:
		}
	}
}

// shedOf sums what st counts as shed: selected packets dropped (or
// would_drop), over-budget ones, and fragments that followed a drop.
func shedOf(st *bpf.Stats) uint64 {
	n := st.SelectedTotal(tiers.VerdictDrop).Packets + st.SelectedTotal(tiers.VerdictWouldDrop).Packets
	n += st.OverBudget[tiers.VerdictDrop].Packets + st.OverBudget[tiers.VerdictWouldDrop].Packets
	return n + st.FragmentDrop.Packets
}

// offeredOf counts every selected packet, over budget or not.
func offeredOf(st *bpf.Stats) uint64 {
	n := st.SelectedPackets()
	for _, c := range st.OverBudget {
		n += c.Packets
	}
	return n
}

// tick takes one window's counters.
func (e *Episodes) tick(now time.Time, st bpf.Stats) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.prevAt.IsZero() {
		e.prev, e.prevAt = st, now
		if e.resumed { // counted from here on, beside what it carries
			e.start, e.resumed = st, false
			e.wFrom, e.wFromAt = st, now
		}
		return
	}
	shed := shedOf(&st) - shedOf(&e.prev)
	dt := now.Sub(e.prevAt).Seconds()
	rate := float64(offeredOf(&st)-offeredOf(&e.prev)) / dt
	e.setShare(float64(shed) / dt)
	prev, prevAt := e.prev, e.prevAt
	e.prev, e.prevAt = st, now
	switch {
	case !e.cur.Open && shed > 0:
		e.open(now, prev, prevAt, rate)
	case e.cur.Open && shed > 0:
		e.quiet = 0
	case e.cur.Open:
		e.quiet++
	default:
		return
	}
	e.cur.PeakRate = max(e.cur.PeakRate, rate)
	e.fill(st)
	switch {
	case e.quiet >= QuietWindows:
		e.cur.Open, e.cur.End = false, now
		e.shedding.Store(false)
		e.report("close", now)
		if e.rec != nil { // the next episode's samples start here
			e.rec.resetGroups()
		}
	case !now.Add(e.window / 2).Before(e.nextSummary):
		// Due within half a window: a tick a little early (the ticker's
		// jitter) would otherwise put the summary off by a whole window.
		e.nextSummary = now.Add(e.every)
		e.report("summary", now)
	default:
		// Every window of an open episode, so that an agent restarted
		// in it takes it up with its counts (resume).
		if err := e.save(); err != nil {
			e.log.Warn("episodes: state file", "error", err)
		}
	}
}

// recordOversample: the share of shed packets eligible for a sample is
// this many times record.samples over the last window's shed rate (bpf
// SetRecordShare), so that the cap's gate still finds an eligible packet
// soon after each token while the samples stay a random draw.
const recordOversample = 4

// setShare sets the share of shed packets eligible for a sample from the
// last window's shed rate (packets/s): all of them when nothing was shed.
func (e *Episodes) setShare(shedRate float64) {
	if e.lim == nil || e.samples == 0 {
		return
	}
	share := 1.0
	if shedRate > 0 {
		share = min(1, recordOversample*float64(e.samples)/shedRate)
	}
	if share == e.share {
		return
	}
	if err := e.lim.SetRecordShare(share); err != nil {
		e.log.Warn("shed record: set the sampled share", "error", err)
		return
	}
	e.share = share
}

// open opens an episode at now, whose first shed window began at startAt
// with counters start.
func (e *Episodes) open(now time.Time, start bpf.Stats, startAt time.Time, rate float64) {
	id := e.episodes.Add(1)
	e.cur = Episode{ID: id, Open: true, Start: now, Interfaces: e.ifaces(), Mode: e.mode.String(), PinPath: e.owner.PinPath, Max: e.max,
		MaxOf: e.maxOf, OfferedRate: rate}
	e.start, e.quiet = start, 0
	e.wFrom, e.wFromAt = start, startAt
	e.carry = Episode{}
	e.nextSummary = now.Add(e.every)
	// The groups are not reset here but at the last episode's close: the
	// samples of the window that opened this one, read before this tick,
	// are this episode's, as its shed count is.
	e.shedding.Store(true)
	e.report("open", now)
}

// fill sets the episode's counts from st, less those at its start.
func (e *Episodes) fill(st bpf.Stats) {
	c := &e.cur
	c.Shed = shedOf(&st) - shedOf(&e.start)
	c.ByTier, c.ByReason, c.BySeverity = map[string]uint64{}, map[string]uint64{}, map[string]uint64{}
	var tierShed uint64
	for t := range st.Selected {
		var n uint64
		for _, v := range []tiers.Verdict{tiers.VerdictDrop, tiers.VerdictWouldDrop} {
			n += st.Selected[t][v].Packets - e.start.Selected[t][v].Packets
		}
		if n > 0 {
			c.ByTier[strconv.Itoa(t)] = n
			tierShed += n
		}
	}
	for cls := range st.Severity {
		var n uint64
		for _, v := range []tiers.Verdict{tiers.VerdictDrop, tiers.VerdictWouldDrop} {
			n += st.Severity[cls][v].Packets - e.start.Severity[cls][v].Packets
		}
		if n > 0 {
			c.BySeverity[tiers.SeverityClass(cls).String()] = n
		}
	}
	shedFirst := c.BySeverity[tiers.SevShedFirst.String()]
	over := st.OverBudget[tiers.VerdictDrop].Packets + st.OverBudget[tiers.VerdictWouldDrop].Packets -
		e.start.OverBudget[tiers.VerdictDrop].Packets - e.start.OverBudget[tiers.VerdictWouldDrop].Packets
	for r, n := range map[bpf.Reason]uint64{bpf.ReasonTier: tierShed - min(shedFirst, tierShed), bpf.ReasonShedFirst: shedFirst,
		bpf.ReasonOverBudget: over, bpf.ReasonFragment: st.FragmentDrop.Packets - e.start.FragmentDrop.Packets} {
		if n > 0 {
			c.ByReason[r.String()] = n
		}
	}
	if e.rec != nil {
		c.Top, c.Samples = e.rec.topGroups(TopGroups)
	}
	e.addCarry()
}

// report sends and logs one report of the current episode, and saves it:
// with the weights of its span, from the last report (or the window that
// opened it) to the counters of this window, when the tracker read both.
func (e *Episodes) report(kind string, now time.Time) {
	if !e.wFromAt.IsZero() && !e.prevAt.IsZero() {
		w := weightsOf(&e.wFrom, &e.prev, e.wFromAt, e.prevAt, e.severity)
		e.cur.Weights = &w
		e.wFrom, e.wFromAt = e.prev, e.prevAt
	} else {
		e.cur.Weights = nil // a stale episode closed at start: its spans were reported
	}
	c := e.cur
	params, msg := reportParams(kind, c, now)
	sev := 5 // notice
	if kind == "open" {
		sev = 4 // warning
	}
	if e.send != nil {
		e.send.send(formatRFC5424(sev, now, e.host, "shed-"+kind, params, msg))
	}
	attrs := []any{"episode", c.ID}
	for _, p := range params[2:] {
		attrs = append(attrs, p.name, p.value)
	}
	e.log.Warn("shedding episode "+kind+": "+msg, attrs...)
	if err := e.save(); err != nil {
		e.log.Warn("episodes: state file", "error", err)
	}
}

// reportParams are a report's structured data and its message text.
func reportParams(kind string, c Episode, now time.Time) ([]sdParam, string) {
	p := []sdParam{{"event", kind}, {"episode", strconv.FormatUint(c.ID, 10)}, {"mode", c.Mode}}
	switch kind {
	case "open":
		p = append(p, sdParam{"interfaces", strings.Join(c.Interfaces, ",")},
			sdParam{"offered_pps", fmt.Sprintf("%.0f", c.OfferedRate)}, sdParam{"max", strconv.FormatUint(c.Max, 10)})
		of := ""
		if c.MaxOf != "" {
			p = append(p, sdParam{"max_of", c.MaxOf})
			of = " (" + c.MaxOf + ")"
		}
		p = append(p, weightParams(c.Weights, nil)...)
		return p, fmt.Sprintf("shedding began on %s: %.0f selected packets/s offered, max %d per window%s",
			strings.Join(c.Interfaces, ","), c.OfferedRate, c.Max, of)
	case "close":
		d := c.Duration(now).Round(time.Millisecond)
		p = append(p, sdParam{"duration", d.String()}, sdParam{"shed", strconv.FormatUint(c.Shed, 10)},
			sdParam{"peak_pps", fmt.Sprintf("%.0f", c.PeakRate)})
		p = append(p, countParams(c)...)
		p = append(p, weightParams(c.Weights, c.Top)...)
		return p, fmt.Sprintf("shedding ended after %s: %d packets shed, peak %.0f selected packets/s", d, c.Shed, c.PeakRate)
	}
	p = append(p, sdParam{"shed", strconv.FormatUint(c.Shed, 10)})
	p = append(p, countParams(c)...)
	p = append(p, weightParams(c.Weights, c.Top)...)
	var top []string
	for _, g := range c.Top {
		top = append(top, fmt.Sprintf("%s %.1f%%", g.Group, 100*g.Share))
	}
	return p, fmt.Sprintf("shedding for %s: %d packets shed; top source groups by sampled sheds (%d samples): %s",
		c.Duration(now).Round(time.Second), c.Shed, c.Samples, strings.Join(top, ", "))
}

// countParams are the by-tier, by-reason, by-severity and top-group params.
func countParams(c Episode) []sdParam {
	p := []sdParam{{"by_tier", kvList(c.ByTier)}, {"by_reason", kvList(c.ByReason)}}
	if len(c.BySeverity) > 0 {
		p = append(p, sdParam{"by_severity", kvList(c.BySeverity)})
	}
	var top []string
	for _, g := range c.Top {
		top = append(top, fmt.Sprintf("%s:%.4f", g.Group, g.Share))
	}
	return append(p, sdParam{"samples", strconv.FormatUint(c.Samples, 10)}, sdParam{"top_sampled", strings.Join(top, ",")})
}

// kvList renders a count map as "k:v,k:v", keys sorted.
func kvList(m map[string]uint64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		keys[i] = k + ":" + strconv.FormatUint(m[k], 10)
	}
	return strings.Join(keys, ",")
}

// sortShares orders groups by samples, most first, then by prefix.
func sortShares(g []GroupShare) {
	slices.SortFunc(g, func(a, b GroupShare) int {
		if a.Samples != b.Samples {
			if a.Samples > b.Samples {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Group.String(), b.Group.String())
	})
}

// save writes the episode to the state file, stamped Saved now.
func (e *Episodes) save() error {
	if e.state == "" {
		return nil
	}
	e.cur.Saved = time.Now()
	b, err := json.MarshalIndent(e.cur, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(e.state, append(b, '\n'))
}

// writeAtomic writes b to path whole or not at all, across a crash or a
// power cut: a temporary file, fsynced, renamed over path, and the
// directory fsynced, so that the rename itself is durable and IDs never
// go back (docs/design.md §10).
func writeAtomic(path string, b []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	if _, err = f.Write(b); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Current returns the open episode, or the last one (ID 0: none yet).
func (e *Episodes) Current() Episode {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cur
}

// Recorder returns the sample recorder, nil while sampling has never
// been on.
func (e *Episodes) Recorder() *Recorder {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rec
}

// ReadEpisode reads the state file an agent wrote; one that does not
// parse is a *StateError.
func ReadEpisode(path string) (Episode, error) {
	ep, _, err := readState(path)
	return ep, err
}

// counts are the record's metrics.
func (e *Episodes) Counts() *Counts {
	c := &Counts{Shedding: e.shedding.Load(), Episodes: e.episodes.Load(),
		Sent: e.events.sent.Load(), Errors: e.events.errs.Load()}
	if rec := e.Recorder(); rec != nil {
		c.Written, c.Lost = rec.written.Load(), rec.lost.Load()
	}
	if _, lost, err := e.lim.RecordCounts(); err == nil {
		c.Lost += lost
	}
	return c
}
