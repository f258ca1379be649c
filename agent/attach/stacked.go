package attach

import (
	"errors"
	"fmt"
	"strings"

	"github.com/vishvananda/netlink"
)

// ErrStacked is returned by Resolve when two of the interfaces are stacked on
// each other, so that one packet crosses both XDP hooks and would be
// counted twice (docs/design.md §2: each datagram is counted once).
var ErrStacked = errors.New("interfaces are stacked")

// stackedKinds are the link kinds whose frames are the frames of their
// parent (IFLA_LINK), tag and all: the parent's hook sees every packet the
// upper device then receives again. Tunnels (vxlan, gre, ipip, geneve) are
// not among them: their parent sees the encapsulated packet, which the
// program does not select. A veth's IFLA_LINK is its peer, not a parent.
var stackedKinds = map[string]bool{
	"vlan": true, "macvlan": true, "macvtap": true, "ipvlan": true, "ipvtap": true,
}

// masterKinds are the masters whose ports hand every received frame on to
// the master device, which receives it again.
var masterKinds = map[string]bool{"bond": true, "team": true, "bridge": true}

// stackEdge says how upper sits on lower.
type stackEdge struct {
	upper, lower netlink.Link
	how          string
}

// checkStacked returns ErrStacked, naming both interfaces and the chain
// between them, when one of links sits (directly or through other devices)
// on another: a vlan, macvlan, macvtap, ipvlan or ipvtap on its parent, or
// a bond, team or bridge over its port. It reads every link in nh's
// namespace to follow chains through devices that are not in links.
func checkStacked(nh *netlink.Handle, links []netlink.Link) error {
	all, err := nh.LinkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	return stacked(all, links)
}

// stacked is checkStacked on a list of all links.
func stacked(all, links []netlink.Link) error {
	byIndex := make(map[int]netlink.Link, len(all))
	for _, l := range all {
		byIndex[l.Attrs().Index] = l
	}
	// up[i] lists the devices directly stacked on link i.
	up := map[int][]stackEdge{}
	for _, l := range all {
		a := l.Attrs()
		if p, ok := byIndex[a.ParentIndex]; ok && a.ParentIndex != a.Index && stackedKinds[l.Type()] {
			up[p.Attrs().Index] = append(up[p.Attrs().Index], stackEdge{upper: l, lower: p, how: article(l.Type()) + " on"})
		}
		if m, ok := byIndex[a.MasterIndex]; ok && masterKinds[m.Type()] {
			up[a.Index] = append(up[a.Index], stackEdge{upper: m, lower: l, how: "the " + m.Type() + " master of"})
		}
	}
	chosen := map[int]netlink.Link{}
	for _, l := range links {
		chosen[l.Attrs().Index] = l
	}
	for _, l := range links {
		// Breadth first over everything above l, with the edge that
		// reached each device, to name the chain.
		via := map[int]stackEdge{}
		queue := []int{l.Attrs().Index}
		for len(queue) > 0 {
			i := queue[0]
			queue = queue[1:]
			for _, e := range up[i] {
				u := e.upper.Attrs().Index
				if _, seen := via[u]; seen || u == l.Attrs().Index {
					continue
				}
				via[u] = e
				if top, ok := chosen[u]; ok {
					return stackedErr(l, top, via)
				}
				queue = append(queue, u)
			}
		}
	}
	return nil
}

// stackedErr words the chain from top down to bottom.
func stackedErr(bottom, top netlink.Link, via map[int]stackEdge) error {
	chain := ""
	for i := top.Attrs().Index; i != bottom.Attrs().Index; {
		e := via[i]
		if chain != "" {
			chain += ", "
		}
		chain += fmt.Sprintf("%s is %s %s", e.upper.Attrs().Name, e.how, e.lower.Attrs().Name)
		i = e.lower.Attrs().Index
	}
	return fmt.Errorf("%w: %s and %s (%s): every packet %s receives crosses the XDP hook of %s first and would be counted twice; attach to one of them",
		ErrStacked, bottom.Attrs().Name, top.Attrs().Name, chain, top.Attrs().Name, bottom.Attrs().Name)
}

// article puts "a" or "an" before a link kind.
func article(kind string) string {
	if strings.ContainsRune("aeiou", rune(kind[0])) {
		return "an " + kind
	}
	return "a " + kind
}
