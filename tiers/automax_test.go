package tiers

import (
	"errors"
	"strings"
	"testing"
)

func TestParseYAMLAuto(t *testing.T) {
	for _, c := range []struct {
		name, src string
		want      AutoMax
	}{
		{"defaults", "max: auto\n", AutoMax{Start: 40000, Floor: 1000, Ceiling: 200000}},
		{"issue example", "max: auto\nauto:\n  start: 40000\n  floor: 1000\n  ceiling: 200000\n", AutoMax{Start: 40000, Floor: 1000, Ceiling: 200000}},
		{"block before max", "auto: {start: 500}\nmax: auto\n", AutoMax{Start: 500, Floor: 12, Ceiling: 2500}},
		{"tiny start", "max: auto\nauto: {start: 1}\n", AutoMax{Start: 1, Floor: 1, Ceiling: 5}},
		{"floor equals start equals ceiling", "max: auto\nauto: {start: 7, floor: 7, ceiling: 7}\n", AutoMax{Start: 7, Floor: 7, Ceiling: 7}},
		{"null block", "max: auto\nauto:\n", AutoMax{Start: 40000, Floor: 1000, Ceiling: 200000}},
		{"huge start", "max: auto\nauto: {start: 1099511627776}\n", AutoMax{Start: MaxPackets, Floor: MaxPackets / 40, Ceiling: MaxPackets}},
		{"netns", "max: auto\nauto:\n  start: 500\n  netns: /run/netns/collector\n", AutoMax{Start: 500, Floor: 12, Ceiling: 2500, NetNS: "/run/netns/collector"}},
		{"netns of a pid", "max: auto\nauto: {netns: /proc/4242/ns/net}\n", AutoMax{Start: 40000, Floor: 1000, Ceiling: 200000, NetNS: "/proc/4242/ns/net"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := ParseYAML([]byte(c.src))
			if err != nil {
				t.Fatal(err)
			}
			if p.Auto == nil || *p.Auto != c.want {
				t.Fatalf("Auto = %+v, want %+v", p.Auto, c.want)
			}
			if p.Max != c.want.Start {
				t.Errorf("Max = %d, want start %d", p.Max, c.want.Start)
			}
			q := p.Clone()
			q.Auto.Start++
			if p.Auto.Start != c.want.Start {
				t.Error("Clone shares Auto")
			}
			if !strings.Contains(p.String(), "auto=["+c.want.String()+"]") {
				t.Errorf("String() = %q", p.String())
			}
		})
	}
	p, err := ParseYAML([]byte("max: 500\n"))
	if err != nil || p.Auto != nil {
		t.Fatalf("fixed max: Auto = %+v, err %v", p.Auto, err)
	}
}

func TestParseYAMLAutoInvalid(t *testing.T) {
	for _, c := range []struct {
		name, src string
		err       error
		key       string
		value     string
		line      int
	}{
		{"block without max auto", "max: 100\nauto:\n  start: 50\n", ErrAuto, "auto", "{...}", 3},
		{"block with default max", "auto: {start: 50}\n", ErrAuto, "auto", "{...}", 1},
		{"floor over start", "max: auto\nauto:\n  start: 100\n  floor: 200\n", ErrAuto, "auto.floor", "200", 4},
		{"start over ceiling", "max: auto\nauto:\n  start: 100\n  ceiling: 50\n", ErrAuto, "auto.ceiling", "50", 4},
		{"default ceiling under start", "max: auto\nauto:\n  floor: 5\n  ceiling: 10\n", ErrAuto, "auto.ceiling", "10", 4},
		{"start 0", "max: auto\nauto: {start: 0}\n", ErrAuto, "auto.start", "0", 2},
		{"floor too big", "max: auto\nauto:\n  floor: 1099511627777\n", ErrAuto, "auto.floor", "1099511627777", 3},
		{"ceiling text", "max: auto\nauto:\n  ceiling: lots\n", ErrType, "auto.ceiling", "lots", 3},
		{"unknown key", "max: auto\nauto:\n  beta: 0.5\n", ErrUnknownKey, "auto.beta", "", 3},
		{"block not a mapping", "max: auto\nauto: 5\n", ErrType, "auto", "5", 2},
		{"max other text", "max: automatic\n", ErrType, "max", "automatic", 1},
		{"netns empty", "max: auto\nauto:\n  netns: \"\"\n", ErrAuto, "auto.netns", "", 3},
		{"netns relative", "max: auto\nauto:\n  start: 500\n  netns: run/netns/collector\n", ErrAuto, "auto.netns", "run/netns/collector", 4},
		{"netns a number", "max: auto\nauto: {netns: 4242}\n", ErrType, "auto.netns", "4242", 2},
		{"netns null", "max: auto\nauto:\n  netns:\n", ErrType, "auto.netns", "", 3},
		{"no udp rule", "max: auto\nselect:\n  - {proto: tcp, ports: [601]}\n", ErrAuto, "max", "auto", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseYAML([]byte(c.src))
			var ce *ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, c.err) {
				t.Fatalf("error = %v, want a *ConfigError wrapping %v", err, c.err)
			}
			if ce.Key != c.key || ce.Value != c.value || ce.Line != c.line {
				t.Errorf("key %q value %q line %d, want %q %q %d (%v)", ce.Key, ce.Value, ce.Line, c.key, c.value, c.line, err)
			}
		})
	}
}

func TestValidateAuto(t *testing.T) {
	p := Default()
	p.Auto = &AutoMax{Start: 1000, Floor: 100, Ceiling: 2000}
	for _, c := range []struct {
		max uint64
		ok  bool
	}{{99, false}, {100, true}, {1500, true}, {2000, true}, {2001, false}} {
		err := p.WithMax(c.max).Validate()
		if (err == nil) != c.ok || err != nil && !errors.Is(err, ErrAuto) {
			t.Errorf("max %d: Validate = %v, want ok %v", c.max, err, c.ok)
		}
	}
	if q := p.WithMax(150); p.Max != 40000 || q.Max != 150 || q.Auto == p.Auto {
		t.Errorf("WithMax changed p or shares Auto: %d %d", p.Max, q.Max)
	}
	for ns, ok := range map[string]bool{"": true, "/proc/1/ns/net": true, "proc/1/ns/net": false, "collector": false} {
		q := p.WithMax(1000)
		q.Auto.NetNS = ns
		var ce *ConfigError
		if err := q.Validate(); (err == nil) != ok || err != nil && (!errors.As(err, &ce) || ce.Key != "auto.netns" || ce.Value != ns) {
			t.Errorf("netns %q: Validate = %v, want ok %v", ns, err, ok)
		}
	}
}

func TestPropertiesRefuseAuto(t *testing.T) {
	_, err := ParseProperties([]byte("limiter.switch=true\nlimiter.max=auto\n"))
	var ce *ConfigError
	if !errors.As(err, &ce) || !errors.Is(err, ErrAuto) || ce.Key != "limiter.max" || ce.Value != "auto" || ce.Line != 2 {
		t.Fatalf("error = %v, want ErrAuto on limiter.max line 2", err)
	}
	if !strings.Contains(err.Error(), "YAML") {
		t.Errorf("error does not say to use YAML: %v", err)
	}
}
