package tiers

import (
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

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
//	events: {syslog: tcp://siem:601, framing: lf}
func (ps *yamlParser) events(key string, v *yaml.Node, e *Events) error {
	if isNull(v) {
		return nil
	}
	var framing *yaml.Node
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
		{"framing", func(key string, v *yaml.Node) error {
			switch {
			case isNull(v):
				e.Framing = ""
			case v.Kind != yaml.ScalarNode || (v.Value != FramingOctetCounted && v.Value != FramingLF):
				return typeErr(key, v, FramingOctetCounted+" or "+FramingLF)
			default:
				e.Framing, framing = v.Value, v
			}
			return nil
		}},
	})
	if err == nil && framing != nil && e.Network != "tcp" {
		return valueErr(key+".framing", framing, ErrRecord, "framing applies to a tcp:// syslog only (a UDP datagram is one message)")
	}
	return err
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

// sizeNode reads a byte size: a whole number, or one with a unit
// (ParseSize); false for anything else, for 0 and for one past 2^62.
func sizeNode(v *yaml.Node) (uint64, bool) {
	if v.Kind != yaml.ScalarNode || isNull(v) {
		return 0, false
	}
	n, _, err := ParseSize(v.Value)
	return n, err == nil && n <= 1<<62
}
