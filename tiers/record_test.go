package tiers

import (
	"testing"
	"time"
)

func TestParseRecord(t *testing.T) {
	def := Record{Samples: DefaultRecordSamples, Snaplen: RecordSnapMax, MaxBytes: DefaultRecordMaxBytes}
	defEv := Events{SummaryEvery: DefaultSummaryEvery}
	for _, c := range []struct {
		src  string
		want Record
		ev   Events
	}{
		{"max: 1000", def, defEv},
		{"record: {samples: 50/s}", Record{Samples: 50, Snaplen: 256, MaxBytes: 256 << 20}, defEv},
		{"record: {samples: 0}", Record{Snaplen: 256, MaxBytes: 256 << 20}, defEv},
		{"record:\n  samples: 7\n  snaplen: 64\n  dir: /var/lib/tierlimit/shed/\n  max_bytes: 2GiB",
			Record{Samples: 7, Snaplen: 64, Dir: "/var/lib/tierlimit/shed", MaxBytes: 2 << 30}, defEv},
		{"record: {max_bytes: 5MB}", Record{Samples: 100, Snaplen: 256, MaxBytes: 5e6}, defEv},
		{"record: {max_bytes: 1048576}", Record{Samples: 100, Snaplen: 256, MaxBytes: 1 << 20}, defEv},
		{"record:", def, defEv},
		{"events: {syslog: udp://127.0.0.1:514}", def, Events{Network: "udp", Addr: "127.0.0.1:514", SummaryEvery: 10 * time.Second}},
		{"events: {syslog: 'tcp://[2001:db8::1]:601', summary_every: 1m}", def, Events{Network: "tcp", Addr: "[2001:db8::1]:601", SummaryEvery: time.Minute}},
		{"events: {syslog: tcp://siem.example:6514, summary_every: 1s}", def, Events{Network: "tcp", Addr: "siem.example:6514", SummaryEvery: time.Second}},
		{"events: {syslog: tcp://siem.example:5170, framing: lf}", def, Events{Network: "tcp", Addr: "siem.example:5170", SummaryEvery: 10 * time.Second, Framing: FramingLF}},
		{"events: {framing: octet-counted, syslog: tcp://siem.example:601}", def, Events{Network: "tcp", Addr: "siem.example:601", SummaryEvery: 10 * time.Second, Framing: FramingOctetCounted}},
	} {
		p, err := ParseYAML([]byte(c.src))
		if err != nil {
			t.Errorf("%q: %v", c.src, err)
			continue
		}
		if p.Record != c.want || p.Events != c.ev {
			t.Errorf("%q: record %+v events %+v, want %+v %+v", c.src, p.Record, p.Events, c.want, c.ev)
		}
		tab := mustCompile(t, p)
		if tab.Record.Samples != c.want.Samples || tab.Record.Snaplen != c.want.Snaplen {
			t.Errorf("%q: compiled %+v", c.src, tab.Record)
		}
	}
}

func TestParseRecordInvalid(t *testing.T) {
	for _, c := range []struct {
		src  string
		want error
		key  string
		line int
	}{
		{"max: 1000\nrecord:\n  samples: 100/m", ErrType, "record.samples", 3},
		{"max: 1000\nrecord:\n  samples: -1", ErrType, "record.samples", 3},
		{"max: 1000\nrecord:\n  samples: 100001/s", ErrRecord, "record.samples", 3},
		{"max: 1000\nrecord:\n  snaplen: 257", ErrRecord, "record.snaplen", 3},
		{"max: 1000\nrecord:\n  snaplen: 0", ErrRecord, "record.snaplen", 3},
		{"max: 1000\nrecord:\n  snaplen: 1k", ErrType, "record.snaplen", 3},
		{"max: 1000\nrecord:\n  dir: shed", ErrRecord, "record.dir", 3},
		{"max: 1000\nrecord:\n  max_bytes: 1KiB", ErrRecord, "record.max_bytes", 3},
		{"max: 1000\nrecord:\n  max_bytes: lots", ErrType, "record.max_bytes", 3},
		{"max: 1000\nrecord:\n  size: 1", ErrUnknownKey, "record.size", 3},
		{"max: 1000\nrecord: [1]", ErrType, "record", 2},
		{"max: 1000\nevents:\n  syslog: http://x:1", ErrRecord, "events.syslog", 3},
		{"max: 1000\nevents:\n  syslog: udp://x", ErrRecord, "events.syslog", 3},
		{"max: 1000\nevents:\n  syslog: udp://x:70000", ErrRecord, "events.syslog", 3},
		{"max: 1000\nevents:\n  syslog: udp://x:514/path", ErrRecord, "events.syslog", 3},
		{"max: 1000\nevents:\n  summary_every: 10", ErrType, "events.summary_every", 3},
		{"max: 1000\nevents:\n  summary_every: 100ms", ErrRecord, "events.summary_every", 3},
		{"max: 1000\nevents:\n  syslog: tcp://siem:601\n  framing: newline", ErrType, "events.framing", 4},
		{"max: 1000\nevents:\n  syslog: udp://siem:514\n  framing: lf", ErrRecord, "events.framing", 4},
		{"max: 1000\nevents:\n  every: 1s", ErrUnknownKey, "events.every", 3},
	} {
		_, err := ParseYAML([]byte(c.src))
		t.Run(c.src, func(t *testing.T) { checkConfigError(t, err, c.want, c.key, c.line) })
	}
	p := Default()
	p.Record.Snaplen = 300
	checkConfigError(t, p.Validate(), ErrRecord, "record.snaplen", 0)
	p = Default()
	p.Record.Dir = "rel"
	checkConfigError(t, p.Validate(), ErrRecord, "record.dir", 0)
}

// The record's group masks are the sources' prefixes, or the defaults.
func TestCompileRecordMasks(t *testing.T) {
	p := Default()
	if r := mustCompile(t, p).Record; r.PrefixV4 != 32 || r.PrefixV6 != 64 || r.Mask4 != 0xffffffff || r.Mask6 != [4]uint32{0xffffffff, 0xffffffff, 0, 0} {
		t.Errorf("default record masks %+v", r)
	}
	p.Sources = Sources{Budget: Pct(10), PrefixV4: 24, PrefixV6: 48}
	tab := mustCompile(t, p)
	if r := tab.Record; r.PrefixV4 != 24 || r.Mask4 != tab.Sources.Mask4 || r.Mask6 != tab.Sources.Mask6 {
		t.Errorf("record masks %+v, sources %+v", r, tab.Sources)
	}
}
