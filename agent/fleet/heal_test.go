package fleet_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestFleetSumHeals: the members' own ACL user (the one of
// docs/operations.md) writes garbage into the fleet's keys and a plain SET
// of a plausible sum; each member's view is right at every report after
// each write. A well-formed forgery of another member's
// entry is gone within one report interval (the sums are rebuilt from the
// entries once they are a report old).
func TestFleetSumHeals(t *testing.T) {
	r, store, pf := aclStore(t)
	var ms []*member
	for i, est := range [][2]uint64{{400, 600}, {300, 300}, {100, 100}} {
		cfg := testConfig(store, "acl", string(rune('a'+i)))
		cfg.PasswordFile = pf
		ms = append(ms, joinPair(t, cfg, est[0], est[1]))
	}
	shares(t, 20, ms...)

	evil := redis.NewClient(&redis.Options{Addr: r.Addrs[0], Username: "member", Password: "member-pw"})
	defer evil.Close()
	ctx := context.Background()
	tag := "{tierlimit:fleet:acl}"
	fields, err := evil.HGetAll(ctx, tag+":est3").Result()
	if err != nil || len(fields) != 3 {
		t.Fatalf("the member's user reads the entries: %v, %v", fields, err)
	}
	var bField string
	for f := range fields {
		if strings.HasPrefix(f, "b#") {
			bField = f
		}
	}

	for _, bad := range []struct {
		name  string
		skip  int
		write func() error
	}{
		{"garbage entries", 0, func() error {
			if err := evil.HSet(ctx, tag+":est3", "evil#0000000000000000", "nan nan 1 1 1 1 zz").Err(); err != nil {
				return err
			}
			return evil.ZAdd(ctx, tag+":exp3", redis.Z{Score: 1e18, Member: "ghost#0000000000000001"}).Err()
		}},
		{"a plain SET of a plausible sum", 0, func() error {
			now, err := evil.Time(ctx).Result()
			if err != nil {
				return err
			}
			return evil.Set(ctx, tag+":sum3", fmt.Sprintf("100000 100000 %d 1 0 3|x", now.UnixMicro()), 0).Err()
		}},
		{"garbage sum", 0, func() error {
			return evil.Set(ctx, tag+":sum3", "NaN -1e308 garbage", 0).Err()
		}},
		{"the keys deleted", 0, func() error {
			return evil.Del(ctx, tag+":sum3", tag+":exp3").Err()
		}},
		// Another member's entry deleted: the sums still hold it, and b's
		// next report finds its entry gone and rebuilds them.
		{"another member's entry deleted", 0, func() error {
			return evil.HDel(ctx, tag+":est3", bField).Err()
		}},
		// Another member's entry made garbage is dropped by a rebuild that
		// comes before b's next report: the others then miss b until
		// b's report writes it again, within one report interval.
		{"garbage in another member's entry", 2, func() error {
			return evil.HSet(ctx, tag+":est3", bField, "-5 inf").Err()
		}},
		// A well-formed forgery of the sums, with its expiry, is gone at
		// the next rebuild: within a second (rebuildEvery) at report 100 ms.
		{"a forged sum with its expiry", int(time.Second/testReport) + 2, func() error {
			now, err := evil.Time(ctx).Result()
			if err != nil {
				return err
			}
			return evil.Set(ctx, tag+":sum3", fmt.Sprintf("100000 100000 %d 1 0 3|x", now.UnixMicro()), 5*time.Second).Err()
		}},
	} {
		n0 := make([]int, len(ms))
		for i, m := range ms {
			_, n0[i] = m.k.calls()
		}
		if err := bad.write(); err != nil {
			t.Fatalf("%s: the member's user: %v", bad.name, err)
		}
		healed(t, bad.name, n0, bad.skip, ms...)
	}

	// A well-formed forgery: b's entry rewritten with 0 estimates. The sums
	// still hold b's own; b's next report finds its entry not what it
	// wrote and rebuilds them.
	n0 := make([]int, len(ms))
	for i, m := range ms {
		_, n0[i] = m.k.calls()
	}
	v, err := evil.HGet(ctx, tag+":est3", bField).Result()
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(v)
	f[0], f[1] = "0", "0"
	if err := evil.HSet(ctx, tag+":est3", bField, strings.Join(f, " ")).Err(); err != nil {
		t.Fatal(err)
	}
	healed(t, "a forged entry", n0, 0, ms...)

}

// healed checks that from each member's report n0+skip+1 on (n0 its count
// of SetFleetOthers before the bad write) its others' sums are the other
// members' estimates, over five more reports. With skip 0 that is every
// report after the write: one in flight either ran before it, and saw the
// state before, or after it, and healed it.
func healed(t *testing.T, what string, n0 []int, skip int, ms ...*member) {
	t.Helper()
	for i, m := range ms {
		if !waitFor(40, func() bool { _, n := m.k.calls(); return n >= n0[i]+skip+5 }) {
			t.Fatalf("%s: member %s stopped reporting", what, m.name)
		}
	}
	var totalIn, total uint64
	for _, m := range ms {
		totalIn, total = totalIn+m.k.estIn, total+m.k.est
	}
	for i, m := range ms {
		m.k.mu.Lock()
		gotIn, got := m.k.historyIn[n0[i]+skip:], m.k.history[n0[i]+skip:]
		wantIn, want := totalIn-m.k.estIn, total-m.k.est
		m.k.mu.Unlock()
		for j := range got {
			if gotIn[j] != wantIn || got[j] != want {
				t.Errorf("%s: member %s's report %d after the write saw others %d in budget, %d in all; want %d, %d (from then on: %v)",
					what, m.name, skip+j+1, gotIn[j], got[j], wantIn, want, got)
				break
			}
		}
		// The member count (a ghost in the index) heals at the next
		// rebuild, within a second.
		if !waitFor(20, func() bool { return metric(t, m.c, "tierlimit_fleet_members") == float64(len(ms)) }) {
			t.Errorf("%s: member %s counts %v members; want %d", what, m.name, metric(t, m.c, "tierlimit_fleet_members"), len(ms))
		}
	}
}
