package bpftest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os/exec"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NS is a named network namespace (/run/netns/Name) that a test created.
type NS struct {
	Name string
	// Path is the bind mount, for nsenter --net=Path. Enter only the network
	// namespace: ip netns exec also remounts /sys, hiding /sys/fs/bpf pins.
	Path string
}

// NewNS creates a network namespace with lo up and removes it in
// tb.Cleanup. Register it before anything that runs inside it, so that
// those are cleaned up (stopped) first.
func NewNS(tb testing.TB) *NS {
	tb.Helper()
	name := "tltest-" + randHex(4)
	err := onLockedThread(func() error {
		h, err := netns.NewNamed(name)
		if err != nil {
			return err
		}
		return h.Close()
	})
	if err != nil {
		tb.Fatalf("create netns %s: %v", name, err)
	}
	ns := &NS{Name: name, Path: "/run/netns/" + name}
	tb.Cleanup(func() {
		if err := netns.DeleteNamed(name); err != nil {
			tb.Errorf("delete netns %s: %v", name, err)
		}
	})
	if err := ns.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		tb.Fatalf("netns %s: set lo up: %v", name, err)
	}
	return ns
}

// Do runs fn on an OS thread that is inside the namespace, for calls that
// act on the caller's namespace (netlink, XDP attach by ifindex, sockets).
// Goroutines that fn starts do not inherit the namespace.
func (ns *NS) Do(fn func() error) error {
	h, err := netns.GetFromName(ns.Name)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", ns.Name, err)
	}
	defer h.Close()
	return onLockedThread(func() error {
		if err := netns.Set(h); err != nil {
			return fmt.Errorf("enter netns %s: %w", ns.Name, err)
		}
		return fn()
	})
}

// Command is name with args run inside the namespace through nsenter.
func (ns *NS) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + ns.Path, "--", name}, args...)...)
}

// onLockedThread runs fn on a locked OS thread and puts the thread back into
// the original network namespace afterwards. If that fails, the thread stays
// locked, so the Go runtime discards it when the goroutine exits.
func onLockedThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("restore netns: %w (after: %v)", err, ferr)
			return // the thread stays locked and dies with the goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Pair is two namespaces joined by a veth pair: the collector side, where
// tierlimit attaches and a receiver listens, and the sender side.
type Pair struct {
	Coll, Send     *NS
	CollIf, SendIf string
	// Addresses on the veth, from the documentation ranges (RFC 5737,
	// RFC 3849); they exist only inside the two namespaces.
	CollAddr, SendAddr   netip.Addr
	CollAddr6, SendAddr6 netip.Addr
}

// NewPair creates two namespaces and a veth pair between them, addressed
// and up, and removes all of it in tb.Cleanup.
func NewPair(tb testing.TB) *Pair {
	tb.Helper()
	p := &Pair{
		Coll:      NewNS(tb),
		Send:      NewNS(tb),
		CollAddr:  netip.MustParseAddr("198.51.100.1"),
		SendAddr:  netip.MustParseAddr("198.51.100.2"),
		CollAddr6: netip.MustParseAddr("2001:db8:51::1"),
		SendAddr6: netip.MustParseAddr("2001:db8:51::2"),
	}
	id := randHex(3)
	p.CollIf, p.SendIf = "tlc"+id, "tls"+id
	// Create the pair inside the collector namespace, then move one end:
	// nothing is ever created in the host's namespace.
	err := p.Coll.Do(func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p.CollIf}, PeerName: p.SendIf}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth: %w", err)
		}
		peer, err := netlink.LinkByName(p.SendIf)
		if err != nil {
			return err
		}
		sh, err := netns.GetFromName(p.Send.Name)
		if err != nil {
			return err
		}
		defer sh.Close()
		return netlink.LinkSetNsFd(peer, int(sh))
	})
	if err != nil {
		tb.Fatalf("veth pair: %v", err)
	}
	for _, side := range []struct {
		ns     *NS
		ifname string
		a4, a6 netip.Addr
	}{{p.Coll, p.CollIf, p.CollAddr, p.CollAddr6}, {p.Send, p.SendIf, p.SendAddr, p.SendAddr6}} {
		err := side.ns.Do(func() error {
			l, err := netlink.LinkByName(side.ifname)
			if err != nil {
				return err
			}
			for _, a := range []string{side.a4.String() + "/24", side.a6.String() + "/64"} {
				addr, err := netlink.ParseAddr(a)
				if err != nil {
					return err
				}
				addr.Flags |= unix.IFA_F_NODAD // no DAD: usable at once
				if err := netlink.AddrAdd(l, addr); err != nil {
					return fmt.Errorf("add %s: %w", a, err)
				}
			}
			return netlink.LinkSetUp(l)
		})
		if err != nil {
			tb.Fatalf("configure %s in %s: %v", side.ifname, side.ns.Name, err)
		}
	}
	return p
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
