package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestReportScriptRefuses: the report script, run by any client, refuses
// an estimate that is not a whole number up to maxEstimate (NaN,
// infinities, negatives, exponents, over the cap, in over total) and a
// bad ttl, and writes nothing for it.
func TestReportScriptRefuses(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := redis.NewClient(&redis.Options{Addr: r.Addrs[0]})
	defer c.Close()
	ctx := context.Background()
	args := func(in, total, ttl string) []any {
		return []any{"m#0000000000000000", "m", in, total, ttl + " 1000000000 1000 ab", "100000", "2000", ""}
	}
	for _, tc := range []struct{ in, total, ttl string }{
		{"nan", "nan", "1000000"}, {"inf", "inf", "1000000"}, {"-5", "10", "1000000"}, {"1e3", "1e3", "1000000"},
		{"17592186044417", "17592186044417", "1000000"}, {"10", "5", "1000000"}, {"", "", "1000000"}, {"0x10", "0x10", "1000000"},
		{"1", "1", "0"}, {"1", "1", "-1"}, {"1", "1", "3600000001"}, {"1", "1", "1e6"},
	} {
		err := reportScript.Run(ctx, c, keys("refuse"), args(tc.in, tc.total, tc.ttl)...).Err()
		if err == nil || !strings.Contains(err.Error(), "tierlimit:") {
			t.Errorf("in %q total %q ttl %q: %v; want the script's refusal", tc.in, tc.total, tc.ttl, err)
		}
	}
	if n, err := c.Exists(ctx, keys("refuse")...).Result(); err != nil || n != 0 {
		t.Errorf("%d keys written by refused reports (%v); want none", n, err)
	}
	if err := reportScript.Run(ctx, c, keys("refuse"), args("17592186044416", "17592186044416", "1000000")...).Err(); err != nil {
		t.Errorf("the cap itself: %v; want it taken", err)
	}
}

// TestReportScriptIncremental: reports of members already in the fleet
// keep the sums without a rebuild while they are less than a report old
// (the sums' rebuild time stays); so does a join, counted at once.
func TestReportScriptIncremental(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := redis.NewClient(&redis.Options{Addr: r.Addrs[0]})
	defer c.Close()
	ctx := context.Background()
	e := func(m string, est uint64) entry {
		return entry{Member: m, Instance: "00000000000000a" + m, Est: Sums{In: est, Total: est}, TTL: time.Minute,
			Report: time.Minute, Window: time.Second, Max: 1000, Digest: "ab"}
	}
	at := func() string {
		s, err := c.Get(ctx, keys("inc")[2]).Result()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Fields(s)[2]
	}
	for _, m := range []string{"a", "b"} {
		if _, err := report(ctx, c, "inc", e(m, 10)); err != nil {
			t.Fatal(err)
		}
	}
	at0 := at()
	for i := range 5 {
		v, err := report(ctx, c, "inc", e("a", uint64(20+i)))
		if err != nil || v.others.Total != 10 || v.members != 2 {
			t.Fatalf("report: %+v, %v; want others 10 of 2 members", v, err)
		}
	}
	if got := at(); got != at0 {
		t.Errorf("the sums were rebuilt (at %s, then %s) by reports of members already in", at0, got)
	}
	v, err := report(ctx, c, "inc", e("c", 5))
	if err != nil || v.others.Total != 24+10 || v.members != 3 {
		t.Fatalf("a join: %+v, %v; want others 34 of 3 members", v, err)
	}
	if got := at(); got != at0 {
		t.Errorf("a join rebuilt the sums")
	}
}
