// Package tiers parses, validates and compiles a tierlimit policy. The
// pure-Go reference model of the XDP limiter that the BPF tests compare
// against is its subpackage tiers/model. It needs no kernel support and
// touches nothing outside memory.
//
// The semantics are those of the seed's Java tiered limiter (count requests
// per window, look the count up in a precompiled table, drop at random at the
// tier's rate), made exact in docs/design.md §2.
package tiers

import (
	"net/netip"
	"time"
)

// Mode is what the limiter does with a packet whose tier says drop.
type Mode uint8

const (
	// ModeEnforce drops packets (the seed's limiter.switch=true).
	ModeEnforce Mode = iota
	// ModeDryRun computes every verdict, counts would_drop, and passes.
	ModeDryRun
	// ModeOff passes everything but still counts the window and the tiers
	// (the seed's limiter.switch=false).
	ModeOff
)

// Proto is an L4 protocol that a select rule matches, by IANA number.
type Proto uint8

const (
	// ProtoTCP is TCP (IANA protocol 6); its rules count SYNs by default.
	ProtoTCP Proto = 6
	// ProtoUDP is UDP (IANA protocol 17); its rules count every datagram.
	ProtoUDP Proto = 17
)

// Count says which packets of a selected flow enter the window (a Rule's
// count: packets or syn), and what a policy counts of them (Policy.Count:
// packets or bytes, docs/design.md §2).
type Count uint8

const (
	// CountPackets counts every packet (every UDP datagram, every TCP segment).
	CountPackets Count = iota
	// CountSYN counts only TCP connection attempts (SYN without ACK); other
	// segments of the rule pass uncounted. Valid for tcp only.
	CountSYN
	// CountBytes makes a policy count bytes of syslog payload: each
	// selected UDP datagram weighs its UDP payload length (what the
	// collector's socket receives), and max, the tiers, the source budgets,
	// the auto bounds and the fleet's max and sums are in bytes. Valid for
	// Policy.Count only.
	CountBytes
)

// PortRange is an inclusive range of L4 destination ports, 1..65535.
type PortRange struct {
	First, Last uint16
}

// Rule selects traffic to be counted: an L4 protocol, destination ports and,
// optionally, destination prefixes. An empty Dests matches any destination.
//
// Local adds the host's own addresses to Dests (`dests: local`, what Parse
// gives a rule without dests, docs/design.md §2). tiers cannot know them: the
// agent resolves them (WithLocal), following them as they come and go. A
// Local rule never resolved, with no Dests, matches any destination, as
// it does for the program's own tests, which judge frames to any address.
type Rule struct {
	Proto Proto
	Ports []PortRange
	Dests []netip.Prefix
	Local bool
	// LocalDests are the host's destinations of a Local rule, as WithLocal
	// resolved them; they match as Dests do.
	LocalDests []netip.Prefix
	Count      Count
}

// LocalDest is one of the host's own destinations, for `dests: local`
// (docs/design.md §2): a prefix of the local routing table, and whether Linux
// takes it as unicast (a local route: an address of the host or an AnyIP
// prefix). Only a unicast destination can take TCP: Linux answers no SYN
// to a broadcast or multicast one (tcp_v4_conn_request: RTCF_BROADCAST,
// RTCF_MULTICAST) nor to an IPv6 multicast or anycast one
// (tcp_v6_conn_request: ipv6_unicast_destination wants RTF_LOCAL), and no
// connection has such an address.
type LocalDest struct {
	Prefix  netip.Prefix
	Unicast bool
}

// UnicastDests returns prefixes as LocalDests that are all unicast: the
// host's own addresses, when a caller knows no more of them.
func UnicastDests(prefixes ...netip.Prefix) []LocalDest {
	out := make([]LocalDest, len(prefixes))
	for i, pf := range prefixes {
		out[i] = LocalDest{Prefix: pf, Unicast: true}
	}
	return out
}

// WithLocal returns p with the host's destinations local as the
// LocalDests of every Local rule: all of them for a UDP rule, the unicast
// ones for a TCP rule (LocalDest), so that a TCP flood to a broadcast
// address, which Linux discards, is not counted. p is not changed. With no
// local destinations a Local rule stays as it was.
func (p Policy) WithLocal(local []LocalDest) Policy {
	q := p
	q.Select = make([]Rule, len(p.Select))
	for i, r := range p.Select {
		if r.Local {
			r.LocalDests = nil
			for _, d := range local {
				if d.Unicast || r.Proto != ProtoTCP {
					r.LocalDests = append(r.LocalDests, d.Prefix)
				}
			}
		}
		q.Select[i] = r
	}
	return q
}

// Tier is one step of the policy. At is a percent of Policy.Max (> 0, may
// exceed 100); Drop is the drop percent in [0, 100].
type Tier struct {
	At   Percent
	Drop Percent
}

// Policy is a parsed and validated tierlimit policy.
type Policy struct {
	Mode Mode
	// Window is the length of a counting window (the seed's one second).
	Window time.Duration
	// Shape is how a window's passes are spread (docs/design.md §9): the zero
	// value is ShapeOrdinal, the seed's rule; Parse defaults to
	// ShapeSmooth.
	Shape Shape
	// Max is the number of selected packets per window the host is meant
	// to handle (the seed's limiter.max); in bytes under CountBytes.
	Max uint64
	// Count is what the window counts (docs/design.md §2): CountPackets
	// (the zero value, the seed's) or CountBytes, the bytes of syslog
	// payload. Every count of the policy is in this unit: Max, the tiers'
	// thresholds, Sources, Auto's bounds and Fleet.Max.
	Count Count
	// Tiers in strictly increasing At order.
	Tiers []Tier
	// Select lists the rules; a packet matching any rule is selected.
	Select []Rule
	// Exempt lists source prefixes that always pass and are never counted
	// in the window.
	Exempt []netip.Prefix
	// Severity configures severity-aware shedding of UDP syslog (docs/design.md
	// §7); nil turns it off.
	Severity *Severity
	// Sources sets per-source budgets (fair shedding, docs/design.md §6); the
	// zero value is off.
	Sources Sources
	// Auto, when not nil, makes Max adaptive (`max: auto`, docs/design.md §8):
	// the agent moves Max within Auto's bounds; Max is the max in force.
	Auto *AutoMax
	// Record is what the program samples of shed packets and where the
	// agent keeps them (docs/design.md §10); the zero value samples nothing,
	// Parse defaults to DefaultRecordSamples in memory.
	Record Record
	// Events is where episode reports go (docs/design.md §10).
	Events Events
	// Fleet, when not nil, shares one budget across collectors
	// (docs/design.md §12): the table is compiled for Fleet.Max
	// (TableMax), and Max is kept for the fallback.
	Fleet *Fleet
}
