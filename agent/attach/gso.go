package attach

import (
	"fmt"
	"strings"
)

// countSuperPackets tells the program which interfaces run it in generic
// mode, where a frame can be a UDP GSO/GRO super-packet that the program
// counts as the datagrams it carries (bpf.Limiter.SetSKBIfaces). Where the
// kernel cannot show it the segment count, generic mode is refused
// (bpf.ErrSuperPackets): it would count a super-packet as one datagram.
func (a *host) countSuperPackets(attached []*Attachment) error {
	var (
		generic []int
		names   []string
	)
	for _, att := range attached {
		if att.Mode == string(XDPGeneric) {
			generic = append(generic, att.Index)
			names = append(names, att.Iface)
		}
	}
	if err := a.lim.SetSKBIfaces(generic); err != nil {
		return fmt.Errorf("generic XDP mode on %s: %w; attach in native mode (--xdp-mode native) where the driver allows", strings.Join(names, ", "), err)
	}
	return nil
}
