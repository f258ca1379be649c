package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync/atomic"
	"time"

	"github.com/tierlimit/tierlimit/tiers/storeurl"
)

// Member is one entry of a fleet as the store holds it: one instance of a
// member (one start of its agent).
type Member struct {
	// Name is the member's name; Instance the id of the agent's start
	// that wrote the entry (16 hex digits, random per start).
	Name, Instance string
	// Estimate is the member's last reported R̂ of all its selected
	// packets, packets per window, and In that of its in-budget packets
	// (equal without per-source budgets).
	Estimate, In uint64
	// Heard is when the store last heard from it (the store's clock), and
	// Age how long before the query that was. An entry whose Age exceeds
	// its own TTL is out of the fleet; the next report removes it.
	Heard time.Time
	Age   time.Duration
	// TTL, Window, Max and Digest are the settings the member wrote with
	// its entry: its ttl, its policy's window, fleet.max and the digest of
	// its table (tiers.Policy.FleetDigest).
	TTL, Window time.Duration
	Max         uint64
	Digest      string
	// Conflict: another live entry carries the same Name (two processes
	// under one member name; both are counted). Differs: its settings are
	// not those of the most live entries (docs/design.md §12, Agreement).
	Conflict, Differs bool
}

// Live says whether the entry is in the fleet: heard within its own ttl.
func (m Member) Live() bool { return m.Age <= m.TTL }

// settings is the key the script compares settings by:
// "TTL WINDOW MAX DIGEST", the ttl in µs and the window in ns
// (entry.settings).
func (m Member) settings() string {
	return fmt.Sprintf("%d %d %d %s", m.TTL.Microseconds(), m.Window.Nanoseconds(), m.Max, m.Digest)
}

// judgeMembers sets Conflict and Differs on ms as the report script
// judges them, among the live entries: the settings of the most entries
// (on a tie the least as a string) are the fleet's.
func judgeMembers(ms []Member) {
	names, census := map[string]int{}, map[string]int{}
	for _, m := range ms {
		if m.Live() {
			names[m.Name]++
			census[m.settings()]++
		}
	}
	best, most := "", 0
	for s, n := range census {
		if n > most || (n == most && s < best) {
			best, most = s, n
		}
	}
	for i := range ms {
		ms[i].Conflict = ms[i].Live() && names[ms[i].Name] > 1
		ms[i].Differs = ms[i].Live() && ms[i].settings() != best
	}
}

// Members lists the fleet's members, busiest first (for status --fleet).
func (c *Controller) Members(ctx context.Context) ([]Member, error) {
	return busiestFirst(c.st.members(ctx, c.cfg.Load().Name))
}

// Status lists the members of cfg's fleet without joining it: it opens
// its own connection (password_file and ca_file as Start reads them),
// makes one round trip within ctx, and closes it. Its errors are Start's,
// and ErrAuth when the store refuses the credentials.
func Status(ctx context.Context, cfg Config) ([]Member, error) {
	st, err := statusStore(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	defer st.close()
	ms, err := busiestFirst(st.members(ctx, cfg.Name))
	if err != nil && isAuth(err) {
		return nil, fmt.Errorf("%w: %s: %v", ErrAuth, storeurl.Redact(cfg.Store), err)
	}
	return ms, err
}

// statusStore opens cfg's store for one query, as Status does.
func statusStore(ctx context.Context, cfg *Config) (store, error) {
	if cfg.Report <= 0 {
		cfg.Report = time.Second
	}
	if cfg.TTL <= cfg.Report {
		cfg.TTL = 2 * cfg.Report
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	su, err := parseStore(cfg.Store)
	if err != nil {
		return nil, err
	}
	pw := ""
	if cfg.PasswordFile != "" {
		if pw, err = readPassword(cfg.PasswordFile); err != nil {
			return nil, err
		}
	}
	timeout := 5 * time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	return dial(&connOptions{su: su, cfg: *cfg, dials: new(atomic.Uint64), log: slog.New(slog.DiscardHandler),
		creds:  func(context.Context) (string, string, error) { return su.Username, pw, nil },
		report: func() time.Duration { return timeout },
		ttl:    func() time.Duration { return timeout }})
}

// busiestFirst sorts ms by estimate, highest first, then by name and
// instance.
func busiestFirst(ms []Member, err error) ([]Member, error) {
	sort.Slice(ms, func(i, j int) bool {
		if ms[i].Estimate != ms[j].Estimate {
			return ms[i].Estimate > ms[j].Estimate
		}
		if ms[i].Name != ms[j].Name {
			return ms[i].Name < ms[j].Name
		}
		return ms[i].Instance < ms[j].Instance
	})
	return ms, err
}
