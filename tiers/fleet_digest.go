package tiers

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// FleetDigest returns a digest of what a fleet's members must agree on to
// judge as one limiter (docs/design.md §12, "Agreement"): the table
// compiled for fleet.max (each tier's first packet and drop threshold, as
// Compile encodes them) the shape and, under count: bytes, the unit. 16 lowercase hex digits, the first
// 8 bytes of a SHA-256; "" without a fleet. The window, fleet.max and ttl
// are compared apart, so a difference can be named; the host's own
// selectors, severity and budgets are the member's alone and left out.
func (p Policy) FleetDigest() string {
	if p.Fleet == nil {
		return ""
	}
	h := sha256.New()
	var b [8]byte
	put := func(v uint64) {
		binary.BigEndian.PutUint64(b[:], v)
		h.Write(b[:])
	}
	put(uint64(p.Shape))
	if p.Count == CountBytes {
		put(0xb17e5) // the unit; packet policies keep their earlier digest
	}
	put(uint64(len(p.Tiers)))
	for _, t := range p.Tiers {
		put(thresholdOf(p.TableMax(), t.At.micro))
		put(uint64(dropThreshold(t.Drop.micro)))
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}
