package tiers

import (
	"errors"
	"math"
	"os"
	"strings"
	"testing"
)

// checkAccepted checks what every accepted policy must satisfy: it
// validates, compiles into a table that keeps the invariants, and its
// expectations add up.
func checkAccepted(t *testing.T, p Policy) {
	t.Helper()
	if err := p.Validate(); err != nil {
		t.Fatalf("accepted policy does not Validate: %v", err)
	}
	tab, err := Compile(p, 0)
	if err != nil {
		t.Fatalf("accepted policy does not compile: %v", err)
	}
	if msg := checkTable(p, tab); msg != "" {
		t.Fatalf("%v: %s", p, msg)
	}
	for _, offered := range []uint64{0, 1, p.Max, 3 * p.Max} {
		e := tab.Expected(offered)
		var packets uint64
		for _, te := range e.PerTier {
			packets += te.Packets
		}
		if packets != offered || math.Abs(e.Passed+e.Dropped-float64(offered)) > 1e-6*float64(offered)+1e-9 {
			t.Fatalf("%v: Expected(%d) = %+v", p, offered, e)
		}
	}
	_ = p.String()
}

// checkRejected checks that a rejected policy comes with a located error.
func checkRejected(t *testing.T, err error) {
	t.Helper()
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v is not a *ConfigError", err)
	}
	if ce.Err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("error %q: no sentinel, or more than one line", err)
	}
}

func FuzzParseYAML(f *testing.F) {
	f.Add(defaultYAML)
	f.Add([]byte(""))
	f.Add([]byte("max: 3\ntiers: [{at: 50%, drop: 12.5%}, {at: 120, drop: 100}]\n"))
	f.Add([]byte("max: 100000000\nwindow: 500ms\nmode: dry-run\n"))
	f.Add([]byte("select: [{proto: udp, ports: [514, \"1000-2000\"], dests: [10.0.0.0/8, \"::1\"]}]\nexempt: {sources: [192.0.2.0/24]}\n"))
	f.Add([]byte("tiers:\n  - {at: 70%, drop: 20%}\n  - {at: 60%, drop: 50%}\n"))
	f.Add([]byte("max: &a 7\ntiers: [{at: *a, drop: *a}]\n"))
	f.Add([]byte("select: [{proto: udp, ports: [514], count: syn}]"))
	f.Add([]byte("fleet: {name: eu, store: 'redis+sentinel://s1,s2:26380/m/1', max: 2000, report: 50ms, ttl: 1s, fallback: local}\n"))
	f.Add([]byte("max: auto\nfleet: {name: a.b_c, store: 'rediss://u@[::1]:6390', ca_file: /ca.pem, password_file: /pw, max: 7}\n"))
	f.Add([]byte("fleet: {name: x, store: 'redis+cluster://h1,h2,h3', max: 1}\nshape: ordinal\n"))
	f.Add([]byte("max: 50\nfleet: {name: s, store: 'redis://h', max: 900}\nsources: {budget: 2%, prefix_v4: 24}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParseYAML(data)
		if err != nil {
			checkRejected(t, err)
			return
		}
		checkAccepted(t, p)
	})
}

func FuzzParseProperties(f *testing.F) {
	seed, err := os.ReadFile("testdata/seed.properties")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte(""))
	f.Add([]byte("limiter.switch=false\nlimiter.max=3\nlimiter.strategys[1].limit=120\nlimiter.strategys[1].rate=100\nlimiter.strategys[0].limit=50%\nlimiter.strategys[0].rate=12.5\n"))
	f.Add([]byte("limiter.max=1099511627776\nlimiter.strategys[0].limit=100000\nlimiter.strategys[0].rate=99.999999\n"))
	f.Add([]byte("server.port=8080\nlimiter.max : 7 # x\nlimiter.strategys[2].limit=1\n"))
	f.Add([]byte("limiter.max=4\\\n0\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParseProperties(data)
		if err != nil {
			checkRejected(t, err)
			return
		}
		checkAccepted(t, p)
	})
}
