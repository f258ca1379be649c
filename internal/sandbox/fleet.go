package sandbox

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Fleet is the network of a fleet of collectors (docs/design.md §12): a
// store namespace holding a bridge, and members, each a Pair whose
// collector namespace is joined to the bridge by a veth of its own. The
// store listens on StoreAddr; member i's collector namespace has
// MemberAddrs[i] on its link to the bridge. The addresses (10.77.0.0/24)
// exist only inside the namespaces.
type Fleet struct {
	Store       *NS
	StoreAddr   netip.Addr
	Members     []*Pair
	MemberAddrs []netip.Addr
}

// fleetBridge is the bridge's name inside the store namespace.
const fleetBridge = "tlbr0"

// NewFleet creates the store namespace and members member pairs, named
// prefix-<random>, joined as Fleet says. On error nothing is left behind;
// the caller removes a Fleet with Close.
func NewFleet(prefix string, members int) (_ *Fleet, err error) {
	if members < 1 || members > 200 {
		return nil, fmt.Errorf("fleet sandbox: %d members, want 1 to 200", members)
	}
	f := &Fleet{StoreAddr: netip.MustParseAddr("10.77.0.1")}
	if f.Store, err = NewNS(prefix); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	err = f.Store.Do(func() error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: fleetBridge}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("add bridge: %w", err)
		}
		return setAddrUp(fleetBridge, f.StoreAddr.String()+"/24")
	})
	if err != nil {
		return nil, fmt.Errorf("store namespace %s: %w", f.Store.Name, err)
	}
	for i := range members {
		p, err := NewPair(prefix)
		if err != nil {
			return nil, err
		}
		f.Members = append(f.Members, p)
		addr := netip.AddrFrom4([4]byte{10, 77, 0, byte(i + 2)})
		f.MemberAddrs = append(f.MemberAddrs, addr)
		if err := f.join(p, addr); err != nil {
			return nil, fmt.Errorf("member %d: %w", i, err)
		}
	}
	return f, nil
}

// join links p's collector namespace to the store's bridge, with addr on
// its end: a veth made in the store namespace, one end moved.
func (f *Fleet) join(p *Pair, addr netip.Addr) error {
	id := RandHex(3)
	storeIf, memberIf := "tlsf"+id, "tlcf"+id
	err := f.Store.Do(func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: storeIf}, PeerName: memberIf}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth: %w", err)
		}
		br, err := netlink.LinkByName(fleetBridge)
		if err != nil {
			return err
		}
		l, err := netlink.LinkByName(storeIf)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(l, br); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		peer, err := netlink.LinkByName(memberIf)
		if err != nil {
			return err
		}
		h, err := netns.GetFromName(p.Coll.Name)
		if err != nil {
			return err
		}
		defer h.Close()
		return netlink.LinkSetNsFd(peer, int(h))
	})
	if err != nil {
		return err
	}
	return p.Coll.Do(func() error { return setAddrUp(memberIf, addr.String()+"/24") })
}

// setAddrUp adds addr (CIDR) to the link name, without DAD, and sets it up.
func setAddrUp(name, cidr string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		return err
	}
	a.Flags |= unix.IFA_F_NODAD
	if err := netlink.AddrAdd(l, a); err != nil {
		return fmt.Errorf("add %s to %s: %w", cidr, name, err)
	}
	return netlink.LinkSetUp(l)
}

// Close deletes the members' namespaces and the store's, and with them
// every link.
func (f *Fleet) Close() error {
	var errs []error
	for _, p := range f.Members {
		errs = append(errs, p.Close())
	}
	if f.Store != nil {
		errs = append(errs, f.Store.Delete())
	}
	return errors.Join(errs...)
}

// Names lists every namespace the fleet made, for leftover checks.
func (f *Fleet) Names() []string {
	var out []string
	if f.Store != nil {
		out = append(out, f.Store.Name)
	}
	for _, p := range f.Members {
		out = append(out, p.Coll.Name, p.Send.Name, p.CollIf, p.SendIf)
	}
	return out
}
