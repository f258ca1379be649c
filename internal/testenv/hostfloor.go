package testenv

import (
	"encoding/binary"
	"net"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// HostFloorProgram loads an XDP program that makes, on an untagged IPv4
// frame, only the checks docs/design.md §2's "for this host" rule requires of
// any program (bpf/host.h, dests: local), each in its cheapest form, and
// nothing else:
//   - the ingress interface's MAC: ctx->ingress_ifindex, one inlined array
//     lookup of its slot (ifindex & 63, holding ifindex and MAC), the
//     ifindex compared, the unicast bit, 6 bytes compared;
//   - the martian rules' common case: the first octets of the source and
//     destination in 1-223 and not 127;
//   - the destination among the host's addresses, answered by a per-CPU
//     cache that holds it: one inlined lookup and two compares;
//   - with csum, the IPv4 header checksum that ip_rcv_core verifies
//     (ip_fast_csum), for a header without options: five 32-bit words
//     summed and folded to 16 bits.
//
// It returns XDP_PASS when the frame passes every check (so a caller can
// tell that it ran them all), XDP_ABORTED otherwise. It is the floor of
// what those checks add to a program: HostFloorProgram over BareProgram.
// The frame's interface is ifindex, with MAC mac; dst is the destination
// it caches as local.
func HostFloorProgram(tb testing.TB, ifindex uint32, mac net.HardwareAddr, dst net.IP, csum bool) *ebpf.Program {
	tb.Helper()
	ifaces, err := ebpf.NewMap(&ebpf.MapSpec{Name: "floor_ifaces", Type: ebpf.Array, KeySize: 4, ValueSize: 16, MaxEntries: 64})
	if err != nil {
		tb.Fatalf("create the host floor's interfaces: %v", err)
	}
	tb.Cleanup(func() { ifaces.Close() })
	slot := make([]byte, 16)
	binary.LittleEndian.PutUint32(slot, ifindex)
	copy(slot[8:], mac)
	if err := ifaces.Put(ifindex&63, slot); err != nil {
		tb.Fatalf("describe interface %d to the host floor: %v", ifindex, err)
	}
	cache, err := ebpf.NewMap(&ebpf.MapSpec{Name: "floor_dest", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		tb.Fatalf("create the host floor's cache: %v", err)
	}
	tb.Cleanup(func() { cache.Close() })
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		tb.Fatal(err)
	}
	vals := make([][]byte, cpus)
	for i := range vals {
		vals[i] = append(append([]byte{}, dst.To4()...), 1, 0, 0, 0)
	}
	if err := cache.Put(uint32(0), vals); err != nil {
		tb.Fatalf("fill the host floor's cache: %v", err)
	}
	const (
		xdpAborted, xdpPass = 0, 2
		ipOff               = 14 // untagged Ethernet
	)
	// octet jumps to fail unless the byte at ipOff+off is in 1-223 and
	// not 127 (r1 scratch).
	octet := func(off int16) asm.Instructions {
		return asm.Instructions{
			asm.LoadMem(asm.R1, asm.R8, ipOff+off, asm.Byte),
			asm.JEq.Imm(asm.R1, 127, "fail"),
			asm.Sub.Imm(asm.R1, 1),
			asm.And.Imm(asm.R1, 0xff),
			asm.JGE.Imm(asm.R1, 223, "fail"),
		}
	}
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R8, asm.R6, 0, asm.Word), // data
		asm.LoadMem(asm.R9, asm.R6, 4, asm.Word), // data_end
		asm.Mov.Reg(asm.R1, asm.R8),
		asm.Add.Imm(asm.R1, ipOff+20),
		asm.JGT.Reg(asm.R1, asm.R9, "fail"),
		// The interface's slot, its ifindex and MAC.
		asm.LoadMem(asm.R7, asm.R6, 12, asm.Word), // ingress_ifindex
		asm.Mov.Reg(asm.R1, asm.R7),
		asm.And.Imm(asm.R1, 63),
		asm.StoreMem(asm.RFP, -4, asm.R1, asm.Word),
	}
	insns = append(insns, Lookup(ifaces, -4, "fail")...)
	insns = append(insns,
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		asm.JNE.Reg(asm.R1, asm.R7, "fail"),
		asm.LoadMem(asm.R1, asm.R8, 0, asm.Byte),
		asm.And.Imm(asm.R1, 1),
		asm.JNE.Imm(asm.R1, 0, "martians"),
		asm.LoadMem(asm.R1, asm.R8, 0, asm.Word),
		asm.LoadMem(asm.R2, asm.R0, 8, asm.Word),
		asm.JNE.Reg(asm.R1, asm.R2, "fail"),
		asm.LoadMem(asm.R1, asm.R8, 4, asm.Half),
		asm.LoadMem(asm.R2, asm.R0, 12, asm.Half),
		asm.JNE.Reg(asm.R1, asm.R2, "fail"),
	)
	martians := append(octet(12), octet(16)...) // saddr, daddr
	martians[0] = martians[0].WithSymbol("martians")
	insns = append(insns, martians...)
	if csum {
		// Version 4 and IHL 5, then the header's five words summed
		// into r1.
		insns = append(insns,
			asm.LoadMem(asm.R1, asm.R8, ipOff, asm.Byte),
			asm.JNE.Imm(asm.R1, 0x45, "fail"),
			asm.LoadMem(asm.R1, asm.R8, ipOff, asm.Word),
		)
		for w := int16(1); w < 5; w++ {
			insns = append(insns,
				asm.LoadMem(asm.R2, asm.R8, ipOff+4*w, asm.Word),
				asm.Add.Reg(asm.R1, asm.R2),
			)
		}
		fold16 := asm.Instructions{
			asm.Mov.Reg(asm.R2, asm.R1),
			asm.RSh.Imm(asm.R2, 16),
			asm.And.Imm(asm.R1, 0xffff),
			asm.Add.Reg(asm.R1, asm.R2),
		}
		// Five words sum below 2^35: one fold to 32 bits leaves at most
		// 2^32 + 6, and two folds to 16 bits at most 0x10000, which is
		// 0xffff exactly when the sum verifies (the header is not zero).
		insns = append(insns, asm.Mov.Reg(asm.R2, asm.R1), asm.RSh.Imm(asm.R2, 32), asm.LSh.Imm(asm.R1, 32), asm.RSh.Imm(asm.R1, 32), asm.Add.Reg(asm.R1, asm.R2))
		insns = append(insns, fold16...)
		insns = append(insns, fold16...)
		insns = append(insns, asm.JNE.Imm(asm.R1, 0xffff, "fail"))
	}
	insns = append(insns,
		// The destination, against this CPU's cached local address.
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
	)
	insns = append(insns, Lookup(cache, -4, "fail")...)
	insns = append(insns,
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		asm.LoadMem(asm.R2, asm.R8, ipOff+16, asm.Word),
		asm.JNE.Reg(asm.R1, asm.R2, "fail"),
		asm.LoadMem(asm.R1, asm.R0, 4, asm.Word),
		asm.JNE.Imm(asm.R1, 1, "fail"),
		asm.Mov.Imm(asm.R0, xdpPass),
		asm.Return(),
		asm.Mov.Imm(asm.R0, xdpAborted).WithSymbol("fail"),
		asm.Return(),
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "host_floor", Type: ebpf.XDP, Instructions: insns, License: "GPL"})
	if err != nil {
		tb.Fatalf("load the host floor program: %v", err)
	}
	tb.Cleanup(func() { prog.Close() })
	return prog
}
