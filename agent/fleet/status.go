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

// Member is one member of a fleet as the store holds it.
type Member struct {
	Name string
	// Estimate is the member's last reported R̂ of all its selected
	// packets, packets per window, and In that of its in-budget packets
	// (equal without per-source budgets).
	Estimate, In uint64
	// Heard is when the store last heard from it (the store's clock), and
	// Age how long before the query that was. A member whose Age exceeds
	// its fleet's ttl is out of the fleet; the next report removes it.
	Heard time.Time
	Age   time.Duration
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
	st, err := dial(&connOptions{su: su, cfg: cfg, dials: new(atomic.Uint64), log: slog.New(slog.DiscardHandler),
		creds:  func(context.Context) (string, string, error) { return su.Username, pw, nil },
		report: func() time.Duration { return timeout },
		ttl:    func() time.Duration { return timeout }})
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

// busiestFirst sorts ms by estimate, highest first, then by name.
func busiestFirst(ms []Member, err error) ([]Member, error) {
	sort.Slice(ms, func(i, j int) bool {
		if ms[i].Estimate != ms[j].Estimate {
			return ms[i].Estimate > ms[j].Estimate
		}
		return ms[i].Name < ms[j].Name
	})
	return ms, err
}
