package bpf

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"
)

// ErrKernelFeature is returned by Load when the running kernel lacks a
// feature the program needs (*KernelFeatureError): loading would fail in
// the verifier with a long log that names no kernel version.
var ErrKernelFeature = errors.New("the kernel lacks a BPF feature tierlimit needs")

// KernelFeatureError names the missing feature and the first Linux version
// that has it. When several are missing it names the one that needs the
// newest kernel: that version has them all.
type KernelFeatureError struct {
	// Feature is what is missing ("the bpf_loop helper in XDP programs").
	Feature string
	// Since is the first Linux version that has it ("5.17"); "" when a
	// kernel option, not a version, provides it (Needs says which).
	Since string
	// Needs is what provides it when Since is "".
	Needs string
	// Release is the running kernel's (uname -r).
	Release string
	// Missing is how many needed features the kernel lacks, this one
	// included.
	Missing int
}

func (e *KernelFeatureError) Error() string {
	need := e.Needs
	if e.Since != "" {
		need = "Linux " + e.Since + " or later"
	}
	more := ""
	if e.Missing > 1 {
		more = fmt.Sprintf(" (%d needed features are missing in all; that kernel has them)", e.Missing)
	}
	return fmt.Sprintf("%v: this kernel (Linux %s) lacks %s; tierlimit needs %s%s",
		ErrKernelFeature, e.Release, e.Feature, need, more)
}

func (e *KernelFeatureError) Unwrap() error { return ErrKernelFeature }

// Prober asks the running kernel for a feature. Each returns nil when the
// kernel has it, an error wrapping ebpf.ErrNotSupported when it lacks it,
// and any other error when the probe could not tell (the load then says
// what fails). The zero Prober is not usable; KernelProber probes.
type Prober struct {
	ProgramType func(ebpf.ProgramType) error
	MapType     func(ebpf.MapType) error
	Helper      func(ebpf.ProgramType, asm.BuiltinFunc) error
	KernelBTF   func() error
}

// KernelProber probes the running kernel with cilium/ebpf's features
// package (cached per process) and its kernel BTF.
var KernelProber = Prober{
	ProgramType: features.HaveProgramType,
	MapType:     features.HaveMapType,
	Helper:      features.HaveProgramHelper,
	KernelBTF: func() error {
		_, err := btf.LoadKernelSpec()
		return err
	},
}

// kernelProber is what Load probes with; tests replace it.
var kernelProber = KernelProber

// Since which Linux version each program type, map type and helper the
// program may use exists (the kernel's bpf documentation, "BPF Features by
// Linux Kernel Version"). A type or helper missing here is still probed,
// and named without a version. The ring buffer is listed for when a map
// of it lands.
var (
	programSince = map[ebpf.ProgramType]string{ebpf.XDP: "4.8"}
	mapSince     = map[ebpf.MapType]string{
		ebpf.Hash: "3.19", ebpf.Array: "3.19", ebpf.PerCPUArray: "4.6", ebpf.LRUHash: "4.10",
		ebpf.LRUCPUHash: "4.10", ebpf.LPMTrie: "4.11", ebpf.RingBuf: "5.8",
	}
	helperSince = map[asm.BuiltinFunc]string{
		asm.FnMapLookupElem: "3.19", asm.FnMapUpdateElem: "3.19", asm.FnMapDeleteElem: "3.19",
		asm.FnKtimeGetNs: "4.1", asm.FnGetPrandomU32: "4.1", asm.FnGetSmpProcessorId: "4.1",
		asm.FnJiffies64: "5.5", asm.FnLoop: "5.17",
	}
	helperNames = map[asm.BuiltinFunc]string{
		asm.FnMapLookupElem: "bpf_map_lookup_elem", asm.FnMapUpdateElem: "bpf_map_update_elem",
		asm.FnMapDeleteElem: "bpf_map_delete_elem", asm.FnKtimeGetNs: "bpf_ktime_get_ns",
		asm.FnGetPrandomU32: "bpf_get_prandom_u32", asm.FnGetSmpProcessorId: "bpf_get_smp_processor_id",
		asm.FnJiffies64: "bpf_jiffies64", asm.FnLoop: "bpf_loop",
	}
	mapNames = map[ebpf.MapType]string{
		ebpf.Hash: "BPF_MAP_TYPE_HASH", ebpf.Array: "BPF_MAP_TYPE_ARRAY", ebpf.PerCPUArray: "BPF_MAP_TYPE_PERCPU_ARRAY",
		ebpf.LRUHash: "BPF_MAP_TYPE_LRU_HASH", ebpf.LRUCPUHash: "BPF_MAP_TYPE_LRU_PERCPU_HASH",
		ebpf.LPMTrie: "BPF_MAP_TYPE_LPM_TRIE", ebpf.RingBuf: "BPF_MAP_TYPE_RINGBUF",
	}
)

// requirement is one feature of the kernel that spec needs.
type requirement struct {
	feature, since, needs string
	probe                 func() error
}

// requirements lists what spec needs of the kernel: kernel BTF (its CO-RE
// relocations), its programs' types, its maps' types and the helpers its
// programs call. The kfuncs of the generic path are weak (SetSKBIfaces
// checks them), so they are not required here.
func requirements(spec *ebpf.CollectionSpec, p Prober) []requirement {
	reqs := []requirement{{
		feature: "kernel BTF (/sys/kernel/btf/vmlinux)", needs: "a kernel built with CONFIG_DEBUG_INFO_BTF=y",
		probe: p.KernelBTF,
	}}
	seen := map[string]bool{}
	add := func(r requirement) {
		if !seen[r.feature] {
			seen[r.feature] = true
			reqs = append(reqs, r)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(spec.Programs)) {
		ps := spec.Programs[name]
		add(requirement{feature: "BPF programs of type " + ps.Type.String(), since: programSince[ps.Type],
			probe: func() error { return p.ProgramType(ps.Type) }})
		for _, ins := range ps.Instructions {
			if !ins.IsBuiltinCall() {
				continue
			}
			fn := asm.BuiltinFunc(ins.Constant)
			add(requirement{feature: fmt.Sprintf("the %s helper in %s programs", helperName(fn), ps.Type), since: helperSince[fn],
				probe: func() error { return p.Helper(ps.Type, fn) }})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(spec.Maps)) {
		mt := spec.Maps[name].Type
		add(requirement{feature: "the map type " + mapName(mt), since: mapSince[mt],
			probe: func() error { return p.MapType(mt) }})
	}
	return reqs
}

// checkKernel probes every requirement of spec and returns a
// *KernelFeatureError naming the missing one that needs the newest kernel;
// nil when none is missing or the probes could not tell.
func checkKernel(spec *ebpf.CollectionSpec, p Prober, release string) error {
	var worst *KernelFeatureError
	missing := 0
	for _, r := range requirements(spec, p) {
		if err := r.probe(); err == nil || !errors.Is(err, ebpf.ErrNotSupported) {
			continue
		}
		missing++
		if worst == nil || newer(r.since, worst.Since) {
			worst = &KernelFeatureError{Feature: r.feature, Since: r.since, Needs: r.needs, Release: release}
		}
	}
	if worst == nil {
		return nil
	}
	if worst.Since == "" && worst.Needs == "" {
		worst.Needs = "a newer kernel"
	}
	worst.Missing = missing
	return worst
}

func kernelRelease() string {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(uts.Release[:])
}

// newer says whether version a is later than b; a requirement without a
// version (a kernel option) ranks above every version, since no upgrade
// of a kernel built without it provides it.
func newer(a, b string) bool {
	if b == "" {
		return false
	}
	if a == "" {
		return true
	}
	return slices.Compare(versionParts(a), versionParts(b)) > 0
}

func versionParts(v string) []int {
	var out []int
	for f := range strings.SplitSeq(v, ".") {
		n, _ := strconv.Atoi(f)
		out = append(out, n)
	}
	return out
}

func helperName(fn asm.BuiltinFunc) string {
	if n, ok := helperNames[fn]; ok {
		return n
	}
	return fn.String()
}

func mapName(mt ebpf.MapType) string {
	if n, ok := mapNames[mt]; ok {
		return n
	}
	return mt.String()
}
