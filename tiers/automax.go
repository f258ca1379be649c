package tiers

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
)

// ErrAuto: the auto block (docs/design.md §8) is inconsistent: floor, start and
// ceiling not in order, one of them outside [1, MaxPackets], an auto block
// without max: auto, max: auto in a policy that selects no UDP port (its
// signal is UDP receive-buffer drops), or an auto.netns that is empty or not
// an absolute path.
var ErrAuto = errors.New("bad auto settings")

// DefaultAutoStart is the max an adaptive policy starts from when its auto
// block sets no start: the seed's max, in packets per window.
const DefaultAutoStart = 40000

// AutoMax are the bounds of an adaptive max (`max: auto`, docs/design.md §8). The
// agent moves Policy.Max within [Floor, Ceiling] from the collector sockets'
// receive-buffer drops; Policy.Max holds the max in force, Start when parsed.
// All three are packets per window (bytes under count: bytes).
type AutoMax struct {
	// Start is the max when the agent starts (default DefaultAutoStart).
	Start uint64
	// Floor is the lowest max (default Start/40, at least 1).
	Floor uint64
	// Ceiling is the highest max (default 5 × Start, at most MaxPackets).
	Ceiling uint64
	// NetNS is the network namespace whose collector sockets the agent
	// reads the signal in (`auto.netns`), an absolute path such as
	// /proc/PID/ns/net or /run/netns/NAME; "" is the agent's own.
	NetNS string
}

// String returns "start=40000 floor=1000 ceiling=200000", with
// " netns=PATH" when NetNS is set.
func (a AutoMax) String() string {
	s := fmt.Sprintf("start=%d floor=%d ceiling=%d", a.Start, a.Floor, a.Ceiling)
	if a.NetNS != "" {
		s += " netns=" + a.NetNS
	}
	return s
}

// DefaultAutoStartBytes is the start of an adaptive max under count:
// bytes: DefaultAutoStart lines of 1000 bytes, 40 MB per window.
const DefaultAutoStartBytes = DefaultAutoStart * 1000

// defaults fills in the bounds that the file left out (0), for a policy
// that counts c.
func (a *AutoMax) defaults(c Count) {
	if a.Start == 0 {
		a.Start = DefaultAutoStart
		if c == CountBytes {
			a.Start = DefaultAutoStartBytes
		}
	}
	if a.Floor == 0 {
		a.Floor = max(1, a.Start/40)
	}
	if a.Ceiling == 0 {
		a.Ceiling = MaxPackets
		if a.Start <= MaxPackets/5 {
			a.Ceiling = 5 * a.Start
		}
	}
}

// checkRange checks that each bound is a count of packets (bytes when c is
// CountBytes); keys are named as in YAML ("auto.floor").
func (a AutoMax) checkRange(c Count) error {
	for _, f := range []struct {
		key string
		v   uint64
	}{{"auto.start", a.Start}, {"auto.floor", a.Floor}, {"auto.ceiling", a.Ceiling}} {
		if err := checkPackets(f.key, f.v, ErrAuto, c); err != nil {
			return err
		}
	}
	return nil
}

// validate checks the bounds' order and that p.Max lies within them
// (checkRange has checked their range).
func (a AutoMax) validate(p Policy) error {
	if a.NetNS != "" && !filepath.IsAbs(a.NetNS) {
		return configErr("auto.netns", a.NetNS, ErrAuto, "want an absolute path to a network namespace, such as /proc/PID/ns/net or /run/netns/NAME")
	}
	if a.Floor > a.Start {
		return configErr("auto.floor", strconv.FormatUint(a.Floor, 10), ErrAuto, "floor must be at most start (%d)", a.Start)
	}
	if a.Start > a.Ceiling {
		return configErr("auto.ceiling", strconv.FormatUint(a.Ceiling, 10), ErrAuto, "ceiling must be at least start (%d)", a.Start)
	}
	if p.Max < a.Floor || p.Max > a.Ceiling {
		return configErr("max", strconv.FormatUint(p.Max, 10), ErrAuto, "an adaptive max must be within floor %d and ceiling %d", a.Floor, a.Ceiling)
	}
	for _, r := range p.Select {
		if r.Proto == ProtoUDP {
			return nil
		}
	}
	return configErr("max", "auto", ErrAuto, "max: auto needs a udp select rule: its signal is the receive-buffer drops of the UDP sockets on the selected ports")
}

// WithMax returns a copy of p with max m, for the agent's adaptive max.
func (p Policy) WithMax(m uint64) Policy {
	q := p.Clone()
	q.Max = m
	return q
}
