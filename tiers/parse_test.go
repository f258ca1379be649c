package tiers

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestDefault(t *testing.T) {
	want := Policy{
		Mode:   ModeEnforce,
		Shape:  ShapeSmooth,
		Window: time.Second,
		Max:    40000,
		Tiers:  []Tier{{Pct(70), Pct(20)}, {Pct(80), Pct(50)}, {Pct(100), Pct(100)}},
		Select: []Rule{
			{Proto: ProtoUDP, Ports: []PortRange{{514, 514}}, Local: true, Count: CountPackets},
			{Proto: ProtoTCP, Ports: []PortRange{{601, 601}, {6514, 6514}}, Local: true, Count: CountSYN},
		},
		Record: Record{Samples: 100, Snaplen: 256, MaxBytes: 256 << 20},
		Events: Events{SummaryEvery: 10 * time.Second},
	}
	got := Default()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Default() = %+v\nwant %+v", got, want)
	}
	// Each call is a fresh copy.
	got.Tiers[0].At = Pct(1)
	got.Select[0].Ports[0].First = 1
	if again := Default(); !reflect.DeepEqual(again, want) {
		t.Fatalf("Default() changed by its caller: %+v", again)
	}
	if s := want.String(); s != "enforce window=1s max=40000 shape=smooth tiers=[70%→20% 80%→50% 100%→100%] select=[udp/514 to local; tcp/601,6514 syn to local] exempt=[]" {
		t.Errorf("String() = %q", s)
	}
}

func TestParseYAMLDesignExample(t *testing.T) {
	// docs/design.md §3, verbatim.
	src := `
mode: enforce            # enforce | dry-run | off       (seed: limiter.switch=true|false)
window: 1s
max: 40000               # selected packets per window   (seed: limiter.max)
tiers:                   # seed: limiter.strategys[i].limit / .rate
  - {at: 70%, drop: 20%}
  - {at: 80%, drop: 50%}
  - {at: 100%, drop: 100%}
select:
  - {proto: udp, ports: [514]}
  - {proto: tcp, ports: [601, 6514], count: syn}
exempt:
  sources: [192.0.2.0/24]
`
	got, err := ParseYAML([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.Exempt = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

func TestParseYAML(t *testing.T) {
	for _, c := range []struct {
		name, src string
		want      func(p *Policy)
	}{
		{"omitted keys take the default", "max: 1000\nmode: dry-run\n", func(p *Policy) {
			p.Max, p.Mode = 1000, ModeDryRun
		}},
		{"mode off, window 500ms", "mode: off\nwindow: 500ms\n", func(p *Policy) {
			p.Mode, p.Window = ModeOff, 500*time.Millisecond
		}},
		{"percent forms", `tiers: [{at: 12.5, drop: "7%"}, {at: "70", drop: 20.25%}, {at: 100%, drop: 100}]`, func(p *Policy) {
			p.Tiers = []Tier{{MustParsePercent("12.5"), Pct(7)}, {Pct(70), MustParsePercent("20.25")}, {Pct(100), Pct(100)}}
		}},
		{"at over 100%", `tiers: [{at: 150%, drop: 100%}]`, func(p *Policy) {
			p.Tiers = []Tier{{Pct(150), Pct(100)}}
		}},
		{"count defaults by proto", "select:\n  - {proto: tcp, ports: [601]}\n  - {proto: udp, ports: [514]}\n  - {proto: tcp, ports: [10514], count: packets}\n", func(p *Policy) {
			p.Select = []Rule{
				{Proto: ProtoTCP, Ports: []PortRange{{601, 601}}, Local: true, Count: CountSYN},
				{Proto: ProtoUDP, Ports: []PortRange{{514, 514}}, Local: true, Count: CountPackets},
				{Proto: ProtoTCP, Ports: []PortRange{{10514, 10514}}, Local: true, Count: CountPackets},
			}
		}},
		{"dests local, alone and among prefixes", "select:\n  - {proto: udp, ports: [514], dests: local}\n  - {proto: udp, ports: [515], dests: [local, 10.0.0.0/8]}\n", func(p *Policy) {
			p.Select = []Rule{
				{Proto: ProtoUDP, Ports: []PortRange{{514, 514}}, Local: true},
				{Proto: ProtoUDP, Ports: []PortRange{{515, 515}}, Local: true, Dests: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
			}
		}},
		{"port ranges and dests", `select: [{proto: udp, ports: [514, "1000-2000", "65535"], dests: [10.0.0.0/8, "2001:db8::1", 192.0.2.7/24]}]`, func(p *Policy) {
			p.Select = []Rule{{Proto: ProtoUDP, Ports: []PortRange{{514, 514}, {1000, 2000}, {65535, 65535}}, Dests: []netip.Prefix{
				netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::1/128"), netip.MustParsePrefix("192.0.2.0/24"),
			}}}
		}},
		{"exempt", "exempt:\n  sources: [192.0.2.0/24, 2001:db8::/32]\n", func(p *Policy) {
			p.Exempt = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/32")}
		}},
		{"empty exempt", "exempt: {sources: []}\n", func(p *Policy) {}},
		{"anchors", "max: &m 500\ntiers: [{at: *m, drop: 100}]\n", func(p *Policy) {
			p.Max, p.Tiers = 500, []Tier{{Pct(500), Pct(100)}}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseYAML([]byte(c.src))
			if err != nil {
				t.Fatal(err)
			}
			want := Default()
			c.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got %+v\nwant %+v", got, want)
			}
		})
	}
}

var sentinels = []error{
	ErrEmptyConfig, ErrSyntax, ErrUnknownKey, ErrDuplicateKey, ErrMissingKey, ErrType, ErrTierOrder, ErrEmptyTiers,
	ErrPercentRange, ErrMax, ErrEmptySelect, ErrCIDR, ErrPort, ErrProto, ErrMode, ErrCount, ErrWindow, ErrTooMany, ErrBudget, ErrPrefixLen,
	ErrFleet,
}

// checkConfigError checks that err is a *ConfigError wrapping want and no
// other sentinel, naming key (when not empty) at line.
func checkConfigError(t *testing.T, err, want error, key string, line int) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %v", want)
	}
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("%v: not a *ConfigError", err)
	}
	if !errors.Is(err, want) {
		t.Errorf("%v: not %v", err, want)
	}
	for _, s := range sentinels {
		if s != want && errors.Is(err, s) {
			t.Errorf("%v: also %v", err, s)
		}
	}
	if ce.Key != key {
		t.Errorf("%v: Key = %q, want %q", err, ce.Key, key)
	}
	if key != "" && !strings.Contains(err.Error(), key) {
		t.Errorf("%v: message does not name %q", err, key)
	}
	if ce.Line != line {
		t.Errorf("%v: Line = %d, want %d", err, ce.Line, line)
	}
	if line > 0 && !strings.HasPrefix(err.Error(), fmt.Sprintf("line %d: ", line)) {
		t.Errorf("%v: message does not start with the line", err)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("%q: more than one line", err)
	}
}

func TestParseYAMLInvalid(t *testing.T) {
	for _, c := range []struct {
		name, src string
		err       error
		key       string
		line      int
	}{
		{"unknown key", "mode: enforce\nmodes: off\n", ErrUnknownKey, "modes", 2},
		{"unknown nested key", "select:\n  - {proto: udp, port: [514]}\n", ErrUnknownKey, "select[0].port", 2},
		{"duplicate key", "max: 1\nmax: 2\n", ErrDuplicateKey, "max", 2},
		{"missing drop", "tiers:\n  - at: 70\n", ErrMissingKey, "tiers[0].drop", 2},
		{"missing ports", "select: [{proto: udp}]\n", ErrMissingKey, "select[0].ports", 1},
		{"tiers out of order", "tiers:\n  - {at: 70%, drop: 20%}\n  - {at: 60%, drop: 50%}\n", ErrTierOrder, "tiers[1].at", 3},
		{"equal at", "tiers:\n  - {at: 70, drop: 20}\n  - {at: 70, drop: 50}\n", ErrTierOrder, "tiers[1].at", 3},
		{"drop over 100", "tiers: [{at: 70, drop: 101%}]\n", ErrPercentRange, "tiers[0].drop", 1},
		{"drop below 0", "\ntiers: [{at: 70, drop: -1}]\n", ErrPercentRange, "tiers[0].drop", 2},
		{"at 0", "tiers: [{at: 0%, drop: 10}]\n", ErrPercentRange, "tiers[0].at", 1},
		{"at below 0", "tiers: [{at: -5, drop: 10}]\n", ErrPercentRange, "tiers[0].at", 1},
		{"at too big", "tiers: [{at: 100001, drop: 10}]\n", ErrPercentRange, "tiers[0].at", 1},
		{"at too fine", "tiers: [{at: 12.3456789, drop: 10}]\n", ErrPercentRange, "tiers[0].at", 1},
		{"at not a number", "tiers: [{at: lots, drop: 10}]\n", ErrType, "tiers[0].at", 1},
		{"at with exponent", "tiers: [{at: 1e2, drop: 10}]\n", ErrType, "tiers[0].at", 1},
		{"empty tiers", "tiers: []\n", ErrEmptyTiers, "tiers", 1},
		{"too many tiers", "tiers: [" + strings.Repeat("{at: 1, drop: 1},", 17) + "]\n", ErrTooMany, "tiers", 1},
		{"max 0", "max: 0\n", ErrMax, "max", 1},
		{"max negative", "max: -40000\n", ErrMax, "max", 1},
		{"max too big", "max: 1099511627777\n", ErrMax, "max", 1},
		{"max as text", "max: \"40000\"\n", ErrType, "max", 1},
		{"max float", "max: 4.5\n", ErrType, "max", 1},
		{"empty select", "mode: enforce\nselect: []\n", ErrEmptySelect, "select", 2},
		{"null select", "select:\n", ErrEmptySelect, "select", 1},
		{"too many rules", "select: [" + strings.Repeat("{proto: udp, ports: [514]},", 33) + "]\n", ErrTooMany, "select", 1},
		{"bad dest CIDR", "select:\n  - proto: udp\n    ports: [514]\n    dests: [10.0.0.0/33]\n", ErrCIDR, "select[0].dests[0]", 4},
		{"bad exempt CIDR", "exempt:\n  sources:\n    - 192.0.2.0/24\n    - 192.0.2.300/24\n", ErrCIDR, "exempt.sources[1]", 4},
		{"empty dests", "select: [{proto: udp, ports: [514], dests: []}]\n", ErrCIDR, "select[0].dests", 1},
		{"port 0", "select: [{proto: udp, ports: [0]}]\n", ErrPort, "select[0].ports[0]", 1},
		{"port 70000", "select: [{proto: udp, ports: [514, 70000]}]\n", ErrPort, "select[0].ports[1]", 1},
		{"reversed range", "select: [{proto: udp, ports: [\"2000-1000\"]}]\n", ErrPort, "select[0].ports[0]", 1},
		{"no ports", "select: [{proto: udp, ports: []}]\n", ErrPort, "select[0].ports", 1},
		{"unknown proto", "select:\n  - {proto: sctp, ports: [514]}\n", ErrProto, "select[0].proto", 2},
		{"unknown mode", "mode: enforcing\n", ErrMode, "mode", 1},
		{"unknown count", "select: [{proto: tcp, ports: [601], count: bytes}]\n", ErrCount, "select[0].count", 1},
		{"count syn on udp", "select:\n  - proto: udp\n    ports: [514]\n    count: syn\n", ErrCount, "select[0].count", 4},
		{"window 0", "window: 0s\n", ErrWindow, "window", 1},
		{"window negative", "window: -1s\n", ErrWindow, "window", 1},
		{"window over 1h", "window: 61m\n", ErrWindow, "window", 1},
		{"window not a duration", "window: soon\n", ErrWindow, "window", 1},
		{"window as a number", "window: 1\n", ErrType, "window", 1},
		{"tiers not a list", "tiers: 70\n", ErrType, "tiers", 1},
		{"top level list", "- 1\n", ErrType, "", 1},
		{"empty file", "", ErrEmptyConfig, "", 0},
		{"only comments", "# nothing here\n\n", ErrEmptyConfig, "", 0},
		{"empty mapping", "{}\n", ErrEmptyConfig, "", 0},
		{"syntax", "max: 1\ntiers: [\n", ErrSyntax, "", 2},
		{"two documents", "max: 1\n---\nmax: 2\n", ErrSyntax, "", 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseYAML([]byte(c.src))
			checkConfigError(t, err, c.err, c.key, c.line)
		})
	}
}

func TestConfigErrorMessage(t *testing.T) {
	src := `# line 1
mode: enforce
window: 1s
max: 40000
tiers:
  - {at: 70%, drop: 20%}
  - {at: 60%, drop: 50%}
`
	_, err := ParseYAML([]byte(src))
	want := `line 7: tiers[1].at: "60%": tiers out of order: at must be greater than tiers[0].at (70%)`
	if err == nil || err.Error() != want {
		t.Fatalf("error = %v\nwant    %s", err, want)
	}
	// Without a line or value, those parts are left out.
	e := &ConfigError{Key: "select", Err: ErrEmptySelect}
	if e.Error() != "select: empty select" {
		t.Errorf("Error() = %q", e.Error())
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(p *Policy)
		err    error
		key    string
	}{
		{"mode", func(p *Policy) { p.Mode = 3 }, ErrMode, "mode"},
		{"window", func(p *Policy) { p.Window = 0 }, ErrWindow, "window"},
		{"max", func(p *Policy) { p.Max = 0 }, ErrMax, "max"},
		{"no tiers", func(p *Policy) { p.Tiers = nil }, ErrEmptyTiers, "tiers"},
		{"zero at", func(p *Policy) { p.Tiers[0].At = Pct(0) }, ErrPercentRange, "tiers[0].at"},
		{"negative drop", func(p *Policy) { p.Tiers[1].Drop = PercentFromMicro(-1) }, ErrPercentRange, "tiers[1].drop"},
		{"drop over 100", func(p *Policy) { p.Tiers[1].Drop = PercentFromMicro(100_000_001) }, ErrPercentRange, "tiers[1].drop"},
		{"huge at", func(p *Policy) { p.Tiers[2].At = Pct(MaxAtPercent + 1) }, ErrPercentRange, "tiers[2].at"},
		{"order", func(p *Policy) { p.Tiers[2].At = Pct(80) }, ErrTierOrder, "tiers[2].at"},
		{"no select", func(p *Policy) { p.Select = nil }, ErrEmptySelect, "select"},
		{"proto", func(p *Policy) { p.Select[1].Proto = 1 }, ErrProto, "select[1].proto"},
		{"no ports", func(p *Policy) { p.Select[0].Ports = nil }, ErrPort, "select[0].ports"},
		{"port 0", func(p *Policy) { p.Select[1].Ports[1].First = 0 }, ErrPort, "select[1].ports[1]"},
		{"reversed", func(p *Policy) { p.Select[0].Ports[0] = PortRange{20, 10} }, ErrPort, "select[0].ports[0]"},
		{"dest", func(p *Policy) { p.Select[0].Dests = []netip.Prefix{{}} }, ErrCIDR, "select[0].dests[0]"},
		{"exempt", func(p *Policy) { p.Exempt = []netip.Prefix{{}} }, ErrCIDR, "exempt.sources[0]"},
		{"count", func(p *Policy) { p.Select[0].Count = CountSYN }, ErrCount, "select[0].count"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := Default()
			c.change(&p)
			checkConfigError(t, p.Validate(), c.err, c.key, 0)
		})
	}
	if err := Default().Validate(); err != nil {
		t.Errorf("Default().Validate() = %v", err)
	}
}

func TestParsePropertiesSeed(t *testing.T) {
	// The seed's config block, verbatim, comments and all.
	data, err := os.ReadFile("testdata/seed.properties")
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseProperties(data)
	if err != nil {
		t.Fatal(err)
	}
	if want := Default(); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

func TestParseProperties(t *testing.T) {
	for _, c := range []struct {
		name, src string
		want      func(p *Policy)
	}{
		{"switch off, any index order, other keys ignored", `
# a Spring application.properties
server.port=8080
spring.application.name = collector
limiter.strategys[1].rate=100
limiter.strategys[0].rate : 12.5
limiter.switch=false
limiter.strategys[1].limit=90
limiter.max 1000
! another comment
limiter.strategys[0].limit=50% // half
`, func(p *Policy) {
			p.Mode, p.Max = ModeOff, 1000
			p.Tiers = []Tier{{Pct(50), MustParsePercent("12.5")}, {Pct(90), Pct(100)}}
		}},
		{"switch true, max only", "limiter.switch=TRUE\nlimiter.max=5", func(p *Policy) { p.Max = 5 }},
		{"continuation", "limiter.max=40\\\n   000\n", func(p *Policy) { p.Max = 40000 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseProperties([]byte(c.src))
			if err != nil {
				t.Fatal(err)
			}
			want := Default()
			c.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestParsePropertiesInvalid(t *testing.T) {
	for _, c := range []struct {
		name, src string
		err       error
		key       string
		line      int
	}{
		{"unknown limiter key", "limiter.max=1\nlimiter.maximum=2\n", ErrUnknownKey, "limiter.maximum", 2},
		{"unknown strategy field", "limiter.strategys[0].limits=2\n", ErrUnknownKey, "limiter.strategys[0].limits", 1},
		{"duplicate", "limiter.max=1\n\nlimiter.max=2\n", ErrDuplicateKey, "limiter.max", 3},
		{"duplicate index spelled twice", "limiter.strategys[1].rate=1\nlimiter.strategys[01].rate=2\n", ErrDuplicateKey, "limiter.strategys[01].rate", 2},
		{"gap", "limiter.strategys[0].limit=70\nlimiter.strategys[0].rate=20\nlimiter.strategys[2].limit=100\nlimiter.strategys[2].rate=100\n", ErrMissingKey, "limiter.strategys[1]", 3},
		{"no index 0", "limiter.strategys[1].limit=70\nlimiter.strategys[1].rate=20\n", ErrMissingKey, "limiter.strategys[0]", 1},
		{"missing rate", "limiter.strategys[0].limit=70\n", ErrMissingKey, "limiter.strategys[0].rate", 1},
		{"index too big", "limiter.strategys[16].limit=70\n", ErrTooMany, "limiter.strategys[16].limit", 1},
		{"switch not a boolean", "limiter.switch=yes\n", ErrType, "limiter.switch", 1},
		{"max not a number", "limiter.max=lots\n", ErrType, "limiter.max", 1},
		{"max 0", "limiter.max=0 # none\n", ErrMax, "limiter.max", 1},
		{"max too big", "limiter.max=1099511627777\n", ErrMax, "limiter.max", 1},
		{"empty value", "limiter.max=\n", ErrType, "limiter.max", 1},
		{"empty file", "", ErrEmptyConfig, "", 0},
		{"no limiter key", "server.port=8080\n", ErrEmptyConfig, "", 0},
		{"rate not a number", "limiter.strategys[0].limit=70\nlimiter.strategys[0].rate=a lot\n", ErrType, "limiter.strategys[0].rate", 2},
		{"out of order", "limiter.strategys[0].limit=80\nlimiter.strategys[0].rate=20\nlimiter.strategys[1].limit=70\nlimiter.strategys[1].rate=50\n", ErrTierOrder, "limiter.strategys[1].limit", 3},
		{"rate over 100", "limiter.strategys[0].limit=80\nlimiter.strategys[0].rate=120\n", ErrPercentRange, "limiter.strategys[0].rate", 2},
		{"limit 0", "limiter.strategys[0].rate=10\nlimiter.strategys[0].limit=0\n", ErrPercentRange, "limiter.strategys[0].limit", 2},
		{"no key", "=5\n", ErrSyntax, "", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseProperties([]byte(c.src))
			checkConfigError(t, err, c.err, c.key, c.line)
		})
	}
}

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	p, err := LoadFile(write("a.yaml", "max: 100\n"))
	if err != nil || p.Max != 100 {
		t.Errorf("LoadFile(a.yaml) = %v, %v", p.Max, err)
	}
	p, err = LoadFile(write("a.PROPERTIES", "limiter.max=200\n"))
	if err != nil || p.Max != 200 {
		t.Errorf("LoadFile(a.PROPERTIES) = %v, %v", p.Max, err)
	}
	// A .properties line is not YAML for a .yml file.
	bad := write("b.yml", "max: 1\nlimiter.max: 2\n")
	_, err = LoadFile(bad)
	if err == nil || !strings.HasPrefix(err.Error(), bad+": line 2: limiter.max: unknown key") || !errors.Is(err, ErrUnknownKey) {
		t.Errorf("LoadFile(b.yml) = %v", err)
	}
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Line != 2 {
		t.Errorf("LoadFile(b.yml): no *ConfigError at line 2 in %v", err)
	}
	// The seed's file under another name: the error says what it is.
	seed, err := os.ReadFile("testdata/seed.properties")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(write("limiter.conf", string(seed))); err == nil || !strings.Contains(err.Error(), "name the file *.properties") {
		t.Errorf("LoadFile(limiter.conf) = %v, want a hint about .properties", err)
	}
	if _, err := LoadFile(filepath.Join(dir, "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadFile(missing) = %v", err)
	}
}

func TestParseMode(t *testing.T) {
	for _, m := range []Mode{ModeEnforce, ModeDryRun, ModeOff} {
		if got, err := ParseMode(m.String()); got != m || err != nil {
			t.Errorf("ParseMode(%q) = %v, %v", m, got, err)
		}
	}
	if _, err := ParseMode("on"); !errors.Is(err, ErrMode) {
		t.Errorf("ParseMode(on) = %v", err)
	}
}
