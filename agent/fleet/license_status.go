package fleet

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tierlimit/tierlimit/tiers/storeurl"
)

// LicenseDay is the fleet's spend on one license day as the store holds
// it (status --license with fleet:).
type LicenseDay struct {
	// Start and End bound the day the store's clock is in, [Start, End)
	// on that clock (License.Day's start and end); Named is its start as
	// the license names it; StoreTime is the store's clock at the query.
	Start, End, Named, StoreTime time.Time
	// Total is the fleet's bytes that day: what its members added.
	Total uint64
	// Members is each instance's bytes that day, most first.
	Members []MemberSpend
}

// MemberSpend is one instance's bytes on a license day.
type MemberSpend struct {
	Name, Instance string
	Bytes          uint64
}

// licenseStatusScript returns {the store's TIME µs, the day of
// KEYS[1..3] it is in (ARGV "B0 B1 B2 B3", µs; -1 for none), HGETALL of
// that day's key}; it writes nothing.
var licenseStatusScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local nowS = t[1] .. string.sub('00000' .. t[2], -6)
local b = {}
for v in string.gmatch(ARGV[1], '%d+') do b[#b + 1] = tonumber(v) end
for j = 1, 3 do
  if b[j] and b[j + 1] and b[j] <= now and now < b[j + 1] then
    return {nowS, j - 1, redis.call('HGETALL', KEYS[j])}
  end
end
return {nowS, -1, {}}
`)

// licenseDay reads the day of days that the store's clock is in
// (store.license): its index (-1 for none, with only StoreTime set) and
// what the day's key holds.
func licenseDay(ctx context.Context, c redis.UniversalClient, name string, days [3]span) (int, LicenseDay, error) {
	a := &licenseAdd{Days: days}
	f := strings.Fields(a.arg())
	res, err := licenseStatusScript.Run(ctx, c, a.keys(name), strings.Join(f[3:7], " ")).Slice()
	if err != nil {
		return 0, LicenseDay{}, err
	}
	if len(res) != 3 {
		return 0, LicenseDay{}, fmt.Errorf("fleet %s license status: the script returned %d values, want 3", name, len(res))
	}
	nowS, _ := res[0].(string)
	now, err := strconv.ParseInt(nowS, 10, 64)
	if err != nil {
		return 0, LicenseDay{}, fmt.Errorf("fleet %s license status: server time %q: %v", name, nowS, err)
	}
	i, _ := res[1].(int64)
	if i < 0 || i > 2 {
		return -1, LicenseDay{StoreTime: time.UnixMicro(now)}, nil
	}
	h, _ := res[2].([]any)
	return int(i), readDay(days[i], time.UnixMicro(now), h), nil
}

// LicenseStatus reads cfg's fleet's spend on the license day the store's
// clock is in, with lic's day, without joining the fleet: one connection
// as Status opens it, one round trip (two when this host's clock is a day
// or more off the store's). Its errors are Status's.
func LicenseStatus(ctx context.Context, cfg Config, lic License) (LicenseDay, error) {
	if lic.Day == nil {
		return LicenseDay{}, fmt.Errorf("%w: license without a day", ErrConfig)
	}
	st, err := statusStore(ctx, &cfg)
	if err != nil {
		return LicenseDay{}, err
	}
	defer st.close()
	days := lic.days(time.Now())
	i, d, err := st.license(ctx, cfg.Name, days)
	if err == nil && i < 0 {
		days = lic.days(d.StoreTime)
		i, d, err = st.license(ctx, cfg.Name, days)
	}
	if err != nil {
		if isAuth(err) {
			return LicenseDay{}, fmt.Errorf("%w: %s: %v", ErrAuth, storeurl.Redact(cfg.Store), err)
		}
		return LicenseDay{}, fmt.Errorf("fleet %s license status: %w", cfg.Name, err)
	}
	if i < 0 {
		return LicenseDay{}, fmt.Errorf("fleet %s license status: the store's clock %v is in none of the days around it", cfg.Name, d.StoreTime)
	}
	return d, nil
}

// readDay reads a day's hash (licenseLua): its total, and each
// instance's spend; fields it cannot read are left out.
func readDay(d span, now time.Time, h []any) LicenseDay {
	out := LicenseDay{Start: d.start, End: d.end, Named: d.named, StoreTime: now}
	for i := 0; i+1 < len(h); i += 2 {
		f, _ := h[i].(string)
		v, _ := h[i+1].(string)
		if f == "total" {
			out.Total, _ = strconv.ParseUint(v, 10, 64)
			continue
		}
		k := strings.LastIndexByte(f, '#')
		p := strings.Fields(v)
		if k < 0 || len(p) != 3 {
			continue
		}
		if n, err := strconv.ParseUint(p[2], 10, 64); err == nil {
			out.Members = append(out.Members, MemberSpend{Name: f[:k], Instance: f[k+1:], Bytes: n})
		}
	}
	sort.Slice(out.Members, func(i, j int) bool {
		a, b := out.Members[i], out.Members[j]
		if a.Bytes != b.Bytes {
			return a.Bytes > b.Bytes
		}
		return a.Name+"#"+a.Instance < b.Name+"#"+b.Instance
	})
	return out
}
