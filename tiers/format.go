package tiers

import (
	"fmt"
	"strconv"
	"strings"
)

// String returns the config spelling of the mode: "enforce", "dry-run" or
// "off"; "Mode(N)" for an undefined value.
func (m Mode) String() string {
	switch m {
	case ModeEnforce:
		return "enforce"
	case ModeDryRun:
		return "dry-run"
	case ModeOff:
		return "off"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// ParseMode parses the config spelling of a mode ("enforce", "dry-run" or
// "off"), for flags such as run --mode. Returns an error wrapping ErrMode for
// anything else.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "enforce":
		return ModeEnforce, nil
	case "dry-run":
		return ModeDryRun, nil
	case "off":
		return ModeOff, nil
	}
	return 0, fmt.Errorf("%w %q: want enforce, dry-run or off", ErrMode, s)
}

// String returns "tcp", "udp", or "proto(N)" for any other IANA number.
func (p Proto) String() string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	}
	return "proto(" + strconv.Itoa(int(p)) + ")"
}

// String returns "packets", "syn", "bytes", or "Count(N)" for an
// undefined value.
func (c Count) String() string {
	switch c {
	case CountPackets:
		return "packets"
	case CountSYN:
		return "syn"
	case CountBytes:
		return "bytes"
	}
	return "Count(" + strconv.Itoa(int(c)) + ")"
}

// Unit names what a policy that counts c counts: "bytes" for CountBytes,
// else "packets".
func (c Count) Unit() string {
	if c == CountBytes {
		return "bytes"
	}
	return "packets"
}

// String returns the config spelling: "514" for one port, "1000-2000" for a
// range.
func (r PortRange) String() string {
	if r.First == r.Last {
		return strconv.Itoa(int(r.First))
	}
	return strconv.Itoa(int(r.First)) + "-" + strconv.Itoa(int(r.Last))
}

// String returns a compact form for logs: "udp/514",
// "tcp/601,6514 syn", "udp/514,1000-2000 to 10.0.0.0/8".
func (r Rule) String() string {
	var b strings.Builder
	b.WriteString(r.Proto.String())
	b.WriteByte('/')
	b.WriteString(r.PortsString())
	if r.Count == CountSYN {
		b.WriteString(" syn")
	}
	switch {
	case r.Local && len(r.Dests) > 0:
		b.WriteString(" to local, ")
		b.WriteString(prefixesString(r.Dests))
	case r.Local:
		b.WriteString(" to local")
	case len(r.Dests) > 0:
		b.WriteString(" to ")
		b.WriteString(prefixesString(r.Dests))
	}
	return b.String()
}

// PortsString returns the rule's ports joined by commas: "601,6514".
func (r Rule) PortsString() string {
	s := make([]string, len(r.Ports))
	for i, pr := range r.Ports {
		s[i] = pr.String()
	}
	return strings.Join(s, ",")
}

// String returns "at%→drop%", such as "70%→20%".
func (t Tier) String() string {
	return t.At.String() + "→" + t.Drop.String()
}

// String returns the policy on one line for logs, such as
//
//	enforce window=1s max=40000 shape=smooth tiers=[70%→20% 80%→50% 100%→100%] select=[udp/514 to local; tcp/601,6514 syn to local] exempt=[]
func (p Policy) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s window=%s max=%d shape=%s", p.Mode, p.Window, p.Max, p.Shape)
	if p.Count == CountBytes {
		b.WriteString(" count=bytes")
	}
	if p.Auto != nil {
		fmt.Fprintf(&b, " auto=[%s]", p.Auto)
	}
	b.WriteString(" tiers=[")
	for i, t := range p.Tiers {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(t.String())
	}
	b.WriteString("] select=[")
	for i, r := range p.Select {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(r.String())
	}
	b.WriteString("] exempt=[")
	b.WriteString(prefixesString(p.Exempt))
	b.WriteByte(']')
	if s := p.Sources; s.Enabled() {
		fmt.Fprintf(&b, " sources=%s/%d/%d", s, s.PrefixV4, s.PrefixV6)
	}
	if p.Fleet != nil {
		fmt.Fprintf(&b, " fleet=[%s]", p.Fleet)
	}
	return b.String()
}

func prefixesString[P fmt.Stringer](ps []P) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}
