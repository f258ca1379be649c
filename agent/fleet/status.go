package fleet

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
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
	return members(ctx, c.getClient(), c.cfg.Load().Name)
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
	client, err := newClient(su, cfg.CAFile, timeout, func() (string, string) { return su.Username, pw })
	if err != nil {
		return nil, err
	}
	defer client.Close()
	ms, err := members(ctx, client, cfg.Name)
	if err != nil && isAuth(err) {
		return nil, fmt.Errorf("%w: %s: %v", ErrAuth, redact(cfg.Store), err)
	}
	return ms, err
}

// parsePair reads a value of :est2, "IN TOTAL", or a single value as
// IN = TOTAL (script.go pairLua).
func parsePair(v string) (in, total uint64) {
	a, b, ok := strings.Cut(v, " ")
	in, _ = strconv.ParseUint(a, 10, 64)
	if !ok {
		return in, in
	}
	total, _ = strconv.ParseUint(b, 10, 64)
	return min(in, total), total
}

func members(ctx context.Context, c redis.UniversalClient, name string) ([]Member, error) {
	res, err := statusScript.Run(ctx, c, keys(name)).Slice()
	if err != nil {
		return nil, fmt.Errorf("fleet %s status: %w", name, err)
	}
	if len(res) != 3 {
		return nil, fmt.Errorf("fleet %s status: the script returned %d values, want 3", name, len(res))
	}
	nowS, _ := res[0].(string)
	now, err := strconv.ParseInt(nowS, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("fleet %s status: server time %q: %v", name, nowS, err)
	}
	est, _ := res[1].([]any)
	seen, _ := res[2].([]any)
	byName := map[string]*Member{}
	for i := 0; i+1 < len(est); i += 2 {
		n, _ := est[i].(string)
		v, _ := est[i+1].(string)
		in, tot := parsePair(v)
		byName[n] = &Member{Name: n, Estimate: tot, In: in}
	}
	for i := 0; i+1 < len(seen); i += 2 {
		n, _ := seen[i].(string)
		s, _ := seen[i+1].(string)
		at, err := strconv.ParseFloat(s, 64)
		m := byName[n]
		if m == nil || err != nil {
			continue
		}
		m.Heard = time.UnixMicro(int64(at))
		m.Age = time.Duration(now-int64(at)) * time.Microsecond
	}
	out := make([]Member, 0, len(byName))
	for _, m := range byName {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Estimate != out[j].Estimate {
			return out[i].Estimate > out[j].Estimate
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}
