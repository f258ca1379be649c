package bpf

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/internal/testenv"
)

// fakeKernel is a Prober whose kernel lacks what is listed, and records
// what was asked.
type fakeKernel struct {
	noBTF    bool
	lacks    map[string]bool // "helper:FnLoop", "map:LRUHash", "prog:XDP"
	probeErr error           // returned for everything else when set (an inconclusive probe)
	asked    map[string]bool
}

func (k *fakeKernel) answer(key string) error {
	if k.asked == nil {
		k.asked = map[string]bool{}
	}
	k.asked[key] = true
	if k.lacks[key] {
		return fmt.Errorf("%s: %w", key, ebpf.ErrNotSupported)
	}
	return k.probeErr
}

func (k *fakeKernel) prober() Prober {
	return Prober{
		ProgramType: func(pt ebpf.ProgramType) error { return k.answer("prog:" + pt.String()) },
		MapType:     func(mt ebpf.MapType) error { return k.answer("map:" + mt.String()) },
		Helper:      func(_ ebpf.ProgramType, fn asm.BuiltinFunc) error { return k.answer("helper:" + fn.String()) },
		KernelBTF: func() error {
			if k.noBTF {
				return fmt.Errorf("no /sys/kernel/btf/vmlinux: %w", ebpf.ErrNotSupported)
			}
			return nil
		},
	}
}

// TestKernelFeatureMessage: a kernel that lacks a feature the program
// needs gets one line naming the feature and the first Linux version that
// has it (the newest such version when several lack); nothing missing, or
// a probe that cannot tell, lets the load go on.
func TestKernelFeatureMessage(t *testing.T) {
	const prefix = "the kernel lacks a BPF feature tierlimit needs: this kernel (Linux 5.15.0-91-generic) lacks "
	for _, c := range []struct {
		name string
		k    fakeKernel
		want string // "" for no error
	}{
		{"Ubuntu 22.04's 5.15: no bpf_loop", fakeKernel{lacks: map[string]bool{"helper:FnLoop": true}},
			prefix + "the bpf_loop helper in XDP programs; tierlimit needs Linux 5.17 or later"},
		{"no LRU hash", fakeKernel{lacks: map[string]bool{"map:LRUHash": true}},
			prefix + "the map type BPF_MAP_TYPE_LRU_HASH; tierlimit needs Linux 4.10 or later"},
		{"no per-CPU array", fakeKernel{lacks: map[string]bool{"map:PerCPUArray": true}},
			prefix + "the map type BPF_MAP_TYPE_PERCPU_ARRAY; tierlimit needs Linux 4.6 or later"},
		{"no LPM trie", fakeKernel{lacks: map[string]bool{"map:LPMTrie": true}},
			prefix + "the map type BPF_MAP_TYPE_LPM_TRIE; tierlimit needs Linux 4.11 or later"},
		{"several: the newest is named", fakeKernel{lacks: map[string]bool{"map:LPMTrie": true, "helper:FnLoop": true, "helper:FnJiffies64": true}},
			prefix + "the bpf_loop helper in XDP programs; tierlimit needs Linux 5.17 or later (3 needed features are missing in all; that kernel has them)"},
		{"no XDP at all", fakeKernel{lacks: map[string]bool{"prog:XDP": true}},
			prefix + "BPF programs of type XDP; tierlimit needs Linux 4.8 or later"},
		{"no kernel BTF", fakeKernel{noBTF: true},
			prefix + "kernel BTF (/sys/kernel/btf/vmlinux); tierlimit needs a kernel built with CONFIG_DEBUG_INFO_BTF=y"},
		{"nothing missing", fakeKernel{}, ""},
		{"probes cannot tell", fakeKernel{probeErr: unix.EPERM}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec, err := LoadLimiter()
			if err != nil {
				t.Fatal(err)
			}
			err = checkKernel(spec, c.k.prober(), "5.15.0-91-generic")
			if c.want == "" {
				if err != nil {
					t.Fatalf("error %q, want none", err)
				}
				return
			}
			var kf *KernelFeatureError
			if err == nil || !errors.As(err, &kf) || !errors.Is(err, ErrKernelFeature) {
				t.Fatalf("error %v, want a *KernelFeatureError", err)
			}
			if got := err.Error(); got != c.want || strings.Contains(got, "\n") {
				t.Errorf("message\n%q\nwant\n%q", got, c.want)
			}
		})
	}
}

// TestKernelRequirements: what is probed is what the program uses: the
// bpf_loop helper and the map types that need more than the oldest
// kernels, and no kfunc (bpf_cast_to_kern_ctx and bpf_rdonly_cast are weak:
// SetSKBIfaces checks them for the generic path); the ring buffer only if
// the program has one.
func TestKernelRequirements(t *testing.T) {
	spec, err := LoadLimiter()
	if err != nil {
		t.Fatal(err)
	}
	var k fakeKernel
	if err := checkKernel(spec, k.prober(), "x"); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"prog:XDP", "helper:FnLoop", "helper:FnJiffies64", "map:LRUHash", "map:PerCPUArray", "map:LPMTrie"} {
		if !k.asked[key] {
			t.Errorf("%s not probed (probed %v)", key, k.asked)
		}
	}
	ringbuf := false
	for _, m := range spec.Maps {
		ringbuf = ringbuf || m.Type == ebpf.RingBuf
	}
	if k.asked["map:RingBuf"] != ringbuf {
		t.Errorf("ring buffer probed %v, the program has one: %v", k.asked["map:RingBuf"], ringbuf)
	}
	for key := range k.asked {
		if _, ok := strings.CutPrefix(key, "helper:"); ok && strings.Contains(strings.ToLower(key), "cast") {
			t.Errorf("kfunc probed as a helper: %s", key)
		}
	}
}

// TestKernelProbesForReal: this kernel has everything the program needs,
// and the real probes name a helper that no kernel has: the path from
// cilium/ebpf's features package to the message works on a real kernel.
func TestKernelProbesForReal(t *testing.T) {
	testenv.Require(t)
	spec, err := LoadLimiter()
	if err != nil {
		t.Fatal(err)
	}
	if err := checkKernel(spec, KernelProber, kernelRelease()); err != nil {
		t.Fatalf("this kernel: %v", err)
	}
	ps := spec.Programs["tierlimit"].Copy()
	ps.Instructions = asm.Instructions{asm.BuiltinFunc(9999).Call(), asm.Return()}
	fake := &ebpf.CollectionSpec{Programs: map[string]*ebpf.ProgramSpec{"tierlimit": ps}, Maps: map[string]*ebpf.MapSpec{}}
	err = checkKernel(fake, KernelProber, kernelRelease())
	var kf *KernelFeatureError
	if !errors.As(err, &kf) || !strings.Contains(kf.Feature, "BuiltinFunc(9999)") || kf.Needs != "a newer kernel" {
		t.Errorf("a helper no kernel has: %v (%+v)", err, kf)
	}
	t.Logf("%v", err)
}

// TestLoadRefusesMissingFeature: Load probes before it loads, so a kernel
// without bpf_loop gets the one line, not the verifier's log (no bpf(2)
// call comes before the refusal: it needs no root).
func TestLoadRefusesMissingFeature(t *testing.T) {
	k := fakeKernel{lacks: map[string]bool{"helper:FnLoop": true}}
	defer func(p Prober) { kernelProber = p }(kernelProber)
	kernelProber = k.prober()
	l, err := Load(Options{})
	if err == nil {
		l.Close()
	}
	var kf *KernelFeatureError
	if !errors.As(err, &kf) || kf.Since != "5.17" || strings.Contains(err.Error(), "verifier") {
		t.Fatalf("Load on a kernel without bpf_loop: %v, want the *KernelFeatureError naming Linux 5.17", err)
	}
}
