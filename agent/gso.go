package agent

import "fmt"

// countSuperPackets tells the program which interfaces run it in generic
// mode, where a frame can be a UDP GSO/GRO super-packet that the program
// counts as the datagrams it carries (bpf.Limiter.SetSKBIfaces).
func (a *Agent) countSuperPackets() error {
	var generic []int
	for _, att := range a.attached {
		if att.Mode == string(XDPGeneric) {
			generic = append(generic, att.Index)
		}
	}
	if err := a.lim.SetSKBIfaces(generic); err != nil {
		return fmt.Errorf("generic-mode interfaces: %w", err)
	}
	return nil
}
