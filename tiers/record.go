package tiers

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// ErrRecord: a record or events setting (DESIGN.md §10) out of range: a
// sample rate or snaplen beyond its limits, a relative dir, a max_bytes too
// small for one file, an events.syslog that is not udp:// or tcp://
// HOST:PORT, or a summary_every outside [1s, 24h].
var ErrRecord = errors.New("bad shed record setting")

// Limits and defaults of the shed record (DESIGN.md §10).
const (
	// DefaultRecordSamples is the default cap of sampled shed packets per
	// second, in all.
	DefaultRecordSamples = 100
	// MaxRecordSamples is the most samples per second a policy may ask.
	MaxRecordSamples = 100000
	// RecordSnapMax is the most bytes a sample keeps of its frame: the
	// program's TL_RECORD_SNAP_MAX (bpf's contract test checks it).
	RecordSnapMax = 256
	// DefaultRecordMaxBytes is the default size of the pcapng directory.
	DefaultRecordMaxBytes = 256 << 20
	// MinRecordMaxBytes is the least max_bytes: room for a few files.
	MinRecordMaxBytes = 1 << 20
	// DefaultSummaryEvery is the default period of an episode's summaries.
	DefaultSummaryEvery = 10 * time.Second
)

// Record is the `record:` block: what the program samples of shed packets
// and where the agent keeps the samples. The zero value samples nothing.
type Record struct {
	// Samples is the most shed packets sampled per second, in all; 0 is off.
	Samples uint32
	// Snaplen is the bytes kept of each sampled frame, 1..RecordSnapMax.
	Snaplen uint32
	// Dir is the directory of the pcapng files; empty keeps samples in
	// memory only.
	Dir string
	// MaxBytes is the most bytes the files in Dir take; the oldest go first.
	MaxBytes uint64
}

// Events is the `events:` block: where episode reports go.
type Events struct {
	// Network is "udp" or "tcp", and Addr HOST:PORT, of events.syslog; an
	// empty Network reports in the agent's log only.
	Network, Addr string
	// SummaryEvery is the period of an open episode's summaries.
	SummaryEvery time.Duration
}

// Syslog returns events.syslog as written: "udp://HOST:PORT", or "".
func (e Events) Syslog() string {
	if e.Network == "" {
		return ""
	}
	return e.Network + "://" + e.Addr
}

// RecordTable is the shed record as the program's settings hold it.
type RecordTable struct {
	// Samples per second in all (0: off) and Snaplen, as Record.
	Samples, Snaplen uint32
	// Mask4 and Mask6 mask a sample's source into its group, encoded as
	// SourceBudget's; PrefixV4 and PrefixV6 are their lengths: the
	// sources' prefixes, or the defaults without sources.
	Mask4              uint32
	Mask6              [4]uint32
	PrefixV4, PrefixV6 uint8
	// IntervalNs is the cap's interval between samples, 1 s / Samples, and
	// TauNs its burst, (RecordBurst - 1) intervals (record.h); both 0 when
	// sampling is off.
	IntervalNs, TauNs uint64
}

// recordBurstDiv: each CPU's bucket holds its share of 1/recordBurstDiv of
// a second's samples, and at least one sample.
const recordBurstDiv = 10

// RecordBurst returns how many samples the program may take at once at
// samples per second: a tenth of a second's, and at least one. The program
// never samples more than samples × (t + tick) + RecordBurst over any t,
// tick being the tick gate's (0 without it).
func RecordBurst(samples uint32) uint64 {
	return max(1, uint64(samples)/recordBurstDiv)
}

// compileRecord encodes the record of a valid policy.
func compileRecord(p Policy) RecordTable {
	v4, v6 := DefaultPrefixV4, DefaultPrefixV6
	if p.Sources.Enabled() {
		v4, v6 = p.Sources.PrefixV4, p.Sources.PrefixV6
	}
	rt := RecordTable{Samples: p.Record.Samples, Snaplen: p.Record.Snaplen,
		PrefixV4: uint8(v4), PrefixV6: uint8(v6)}
	rt.Mask4, rt.Mask6 = encodeMasks(v4, v6)
	if rt.Samples != 0 {
		rt.IntervalNs = uint64(time.Second) / uint64(rt.Samples)
		rt.TauNs = (RecordBurst(rt.Samples) - 1) * rt.IntervalNs
	}
	return rt
}

// validate checks what Go code builds (the parser checks each key as it
// reads it).
func (r Record) validate() error {
	switch {
	case r.Samples > MaxRecordSamples:
		return configErr("record.samples", strconv.FormatUint(uint64(r.Samples), 10), ErrRecord, "want at most %d/s", MaxRecordSamples)
	case r.Snaplen > RecordSnapMax || r.Samples > 0 && r.Snaplen == 0:
		return configErr("record.snaplen", strconv.FormatUint(uint64(r.Snaplen), 10), ErrRecord, "want 1 to %d bytes", RecordSnapMax)
	case r.Dir != "" && !filepath.IsAbs(r.Dir):
		return configErr("record.dir", r.Dir, ErrRecord, "want an absolute directory path")
	case r.Dir != "" && r.MaxBytes < MinRecordMaxBytes:
		return configErr("record.max_bytes", strconv.FormatUint(r.MaxBytes, 10), ErrRecord, "want at least 1MiB")
	}
	return nil
}

// record parses the record mapping over the policy's record (the
// defaults, or the base's), key by key:
//
//	record: {samples: 100/s, snaplen: 256, dir: /var/lib/tierlimit/shed, max_bytes: 256MiB}
func (ps *yamlParser) record(key string, v *yaml.Node, r *Record) error {
	if isNull(v) {
		return nil
	}
	_, err := ps.mapping(key, v, []field{
		{"samples", func(key string, v *yaml.Node) error {
			n, ok := rateNode(v)
			if !ok {
				return typeErr(key, v, "samples per second such as 100/s (0 turns sampling off)")
			}
			if n > MaxRecordSamples {
				return valueErr(key, v, ErrRecord, "want at most %d/s", MaxRecordSamples)
			}
			r.Samples = uint32(n)
			return nil
		}},
		{"snaplen", func(key string, v *yaml.Node) error {
			var n int64
			if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!int" || v.Decode(&n) != nil {
				return typeErr(key, v, "a number of bytes")
			}
			if n < 1 || n > RecordSnapMax {
				return valueErr(key, v, ErrRecord, "want 1 to %d bytes", RecordSnapMax)
			}
			r.Snaplen = uint32(n)
			return nil
		}},
		{"dir", func(key string, v *yaml.Node) error {
			if isNull(v) {
				r.Dir = ""
				return nil
			}
			s, err := scalar(key, v, "an absolute directory path")
			if err != nil {
				return err
			}
			if !filepath.IsAbs(s) {
				return valueErr(key, v, ErrRecord, "want an absolute directory path")
			}
			r.Dir = filepath.Clean(s)
			return nil
		}},
		{"max_bytes", func(key string, v *yaml.Node) error {
			n, ok := sizeNode(v)
			if !ok {
				return typeErr(key, v, "a size such as 256MiB or 1GiB")
			}
			if n < MinRecordMaxBytes {
				return valueErr(key, v, ErrRecord, "want at least 1MiB")
			}
			r.MaxBytes = n
			return nil
		}},
	})
	return err
}

// events parses the events mapping over the policy's events:
//
//	events: {syslog: udp://127.0.0.1:514, summary_every: 10s}
func (ps *yamlParser) events(key string, v *yaml.Node, e *Events) error {
	if isNull(v) {
		return nil
	}
	_, err := ps.mapping(key, v, []field{
		{"syslog", func(key string, v *yaml.Node) error {
			if isNull(v) {
				e.Network, e.Addr = "", ""
				return nil
			}
			s, err := scalar(key, v, "udp://HOST:PORT or tcp://HOST:PORT")
			if err != nil {
				return err
			}
			network, addr, err := ParseSyslogURL(s)
			if err != nil {
				return valueErr(key, v, ErrRecord, "%v", err)
			}
			e.Network, e.Addr = network, addr
			return nil
		}},
		{"summary_every", func(key string, v *yaml.Node) error {
			if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!str" {
				return typeErr(key, v, "a duration such as 10s")
			}
			d, err := time.ParseDuration(v.Value)
			if err != nil {
				return typeErr(key, v, "a duration such as 10s")
			}
			if d < time.Second || d > 24*time.Hour {
				return valueErr(key, v, ErrRecord, "want 1s to 24h")
			}
			e.SummaryEvery = d
			return nil
		}},
	})
	return err
}

// ParseSyslogURL splits "udp://HOST:PORT" or "tcp://HOST:PORT" into the
// network and the address.
func ParseSyslogURL(s string) (network, addr string, err error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "udp" && u.Scheme != "tcp") {
		return "", "", fmt.Errorf("want udp://HOST:PORT or tcp://HOST:PORT")
	}
	if u.Path != "" || u.RawQuery != "" || u.User != nil || u.Fragment != "" {
		return "", "", fmt.Errorf("want udp://HOST:PORT or tcp://HOST:PORT, without a path")
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || host == "" {
		return "", "", fmt.Errorf("want udp://HOST:PORT or tcp://HOST:PORT")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", "", fmt.Errorf("want a port from 1 to 65535")
	}
	return u.Scheme, u.Host, nil
}

// rateNode reads "N/s" or a whole number N.
func rateNode(v *yaml.Node) (uint64, bool) {
	if v.Kind != yaml.ScalarNode || isNull(v) {
		return 0, false
	}
	s := strings.TrimSpace(v.Value)
	if v.ShortTag() == "!!str" {
		var ok bool
		if s, ok = strings.CutSuffix(s, "/s"); !ok {
			return 0, false
		}
	} else if v.ShortTag() != "!!int" {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 32)
	return n, err == nil
}

// sizeNode reads a byte size: a whole number, or one with a unit (B, KiB,
// MiB, GiB, TiB, or KB, MB, GB, TB in powers of 1000).
func sizeNode(v *yaml.Node) (uint64, bool) {
	if v.Kind != yaml.ScalarNode || isNull(v) {
		return 0, false
	}
	s := strings.TrimSpace(v.Value)
	mult := uint64(1)
	for _, u := range []struct {
		suffix string
		mult   uint64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}} {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(rest), u.mult
			break
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n > (1<<62)/mult {
		return 0, false
	}
	return n * mult, true
}
