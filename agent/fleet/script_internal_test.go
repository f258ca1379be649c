package fleet

import (
	"context"
	"strings"
	"testing"

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
