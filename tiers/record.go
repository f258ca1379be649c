package tiers

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"time"
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
	// Framing is how reports are framed over TCP: FramingOctetCounted
	// (also when empty) or FramingLF.
	Framing string
}

// The framings of events.framing, for a tcp:// events.syslog.
const (
	// FramingOctetCounted prefixes each message with its length and a
	// space (RFC 6587 §3.4.1): what rsyslog and syslog-ng take, and any
	// message; the default.
	FramingOctetCounted = "octet-counted"
	// FramingLF ends each message with a line feed, non-transparent
	// framing (RFC 6587 §3.4.2): what receivers that frame by newline
	// take (Fluent Bit, Logstash, Filebeat).
	FramingLF = "lf"
)

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
