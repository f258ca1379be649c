// Package sandbox makes throwaway network namespaces joined by a veth
// pair, for `tierlimit demo` and the tests. Nothing is created in the
// caller's namespace: the veth is made inside the first namespace and one
// end is moved to the second. Linux only; needs CAP_NET_ADMIN and
// CAP_SYS_ADMIN (root).
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/internal/sysutil"
)

// NS is a named network namespace, bind-mounted at /run/netns/Name.
type NS struct {
	Name string
	// Path is the bind mount, for nsenter --net=Path. Enter only the network
	// namespace: ip netns exec also remounts /sys, hiding /sys/fs/bpf pins.
	Path string
}

// NewNS creates a namespace named prefix-<random hex> with lo up. The
// caller deletes it with Delete.
func NewNS(prefix string) (*NS, error) {
	name := prefix + "-" + RandHex(4)
	err := sysutil.OnThreadIn(netns.None(), "", func() error {
		h, err := netns.NewNamed(name)
		if err != nil {
			return err
		}
		return h.Close()
	})
	if err != nil {
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	ns := &NS{Name: name, Path: "/run/netns/" + name}
	if err := ns.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		ns.Delete()
		return nil, fmt.Errorf("netns %s: set lo up: %w", name, err)
	}
	return ns, nil
}

// Delete removes the namespace. Its interfaces go with it once no process
// runs in it any more.
func (ns *NS) Delete() error {
	if err := netns.DeleteNamed(ns.Name); err != nil {
		return fmt.Errorf("delete netns %s: %w", ns.Name, err)
	}
	return nil
}

// Do runs fn on an OS thread that is inside the namespace, for calls that
// act on the caller's namespace (netlink, XDP attach by ifindex, sockets).
// Goroutines that fn starts do not inherit the namespace; sockets it opens
// stay in it.
func (ns *NS) Do(fn func() error) error {
	h, err := netns.GetFromName(ns.Name)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", ns.Name, err)
	}
	defer h.Close()
	return sysutil.OnThreadIn(h, "netns "+ns.Name, fn)
}

// Command is name with args run inside the namespace through nsenter.
func (ns *NS) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + ns.Path, "--", name}, args...)...)
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

// NewPair creates two namespaces named prefix-<random>, and a veth pair
// between them, addressed and up. On error nothing is left behind; the
// caller removes a Pair with Close.
func NewPair(prefix string) (_ *Pair, err error) {
	p := &Pair{
		CollAddr:  netip.MustParseAddr("198.51.100.1"),
		SendAddr:  netip.MustParseAddr("198.51.100.2"),
		CollAddr6: netip.MustParseAddr("2001:db8:51::1"),
		SendAddr6: netip.MustParseAddr("2001:db8:51::2"),
	}
	if p.Coll, err = NewNS(prefix); err != nil {
		return nil, err
	}
	if p.Send, err = NewNS(prefix); err != nil {
		p.Coll.Delete()
		return nil, err
	}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	id := RandHex(3)
	p.CollIf, p.SendIf = "tlc"+id, "tls"+id
	err = p.Coll.Do(func() error {
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
		return nil, fmt.Errorf("veth pair: %w", err)
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
				addr.Flags |= unix.IFA_F_NODAD // no DAD: usable at once (0x80 is IFA_F_PERMANENT)
				if err := netlink.AddrAdd(l, addr); err != nil {
					return fmt.Errorf("add %s: %w", a, err)
				}
			}
			return netlink.LinkSetUp(l)
		})
		if err != nil {
			return nil, fmt.Errorf("configure %s in %s: %w", side.ifname, side.ns.Name, err)
		}
	}
	return p, nil
}

// Close deletes both namespaces, and with them the veth pair.
func (p *Pair) Close() error {
	var errs []error
	for _, ns := range []*NS{p.Coll, p.Send} {
		if ns != nil {
			errs = append(errs, ns.Delete())
		}
	}
	return errors.Join(errs...)
}

// RandHex returns n random bytes in hex, for unique names.
func RandHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
