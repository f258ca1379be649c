package testenv

import (
	"testing"

	"github.com/tierlimit/tierlimit/internal/sandbox"
)

// NS is a named network namespace that a test created (sandbox.NS).
type NS = sandbox.NS

// Pair is two namespaces joined by a veth pair (sandbox.Pair): the
// collector side, where tierlimit attaches and a receiver listens, and the
// sender side.
type Pair = sandbox.Pair

// NewNS creates a network namespace with lo up and removes it in
// tb.Cleanup. Register it before anything that runs inside it, so that
// those are cleaned up (stopped) first.
func NewNS(tb testing.TB) *NS {
	tb.Helper()
	ns, err := sandbox.NewNS("tltest")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := ns.Delete(); err != nil {
			tb.Error(err)
		}
	})
	return ns
}

// NewPair creates two namespaces and a veth pair between them, addressed
// and up, and removes all of it in tb.Cleanup.
func NewPair(tb testing.TB) *Pair {
	tb.Helper()
	p, err := sandbox.NewPair("tltest")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := p.Close(); err != nil {
			tb.Error(err)
		}
	})
	return p
}

// Fleet is a store namespace with members joined to it (sandbox.Fleet).
type Fleet = sandbox.Fleet

// NewFleet creates a store namespace and members member pairs joined to
// it (sandbox.NewFleet), and removes all of it in tb.Cleanup.
func NewFleet(tb testing.TB, members int) *Fleet {
	tb.Helper()
	f, err := sandbox.NewFleet("tltest", members)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := f.Close(); err != nil {
			tb.Error(err)
		}
	})
	return f
}
