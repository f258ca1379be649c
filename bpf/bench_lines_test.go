package bpf_test

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The sampled profile: where a selected path's time goes, by source line
// of bpf/, on a host without a hardware PMU, where bpftool prog profile
// cannot run (profileEntries). The kernel's software clock
// (PERF_COUNT_SW_CPU_CLOCK, an hrtimer) interrupts the thread that drives
// BPF_PROG_TEST_RUN every sampleNs and records the instruction pointer
// it interrupted; each one inside the program's JIT image is given to
// the source line whose JIT line info (bpf_prog_info's jited_line_info,
// one address per BTF line info) is the last at or before the
// instruction the interrupt came after. What a line costs is its share of
// the samples in the program. Interrupts land after the instruction that
// was running: a slow instruction (a lock-prefixed add) shows on its own
// line, or on the next instruction's when the line ends there.

// sampleNs is the software clock's sampling period (10 µs: some 10^5
// samples a second).
const sampleNs = 10_000

// sampleLog starts the lines BenchmarkPeers logs of the sampled profile;
// tierlimit-bench's page quotes them.
const sampleLog = "sampled profile: "

// sampleSeconds is how long each path is sampled.
const sampleSeconds = 3

// sampleTop is how many lines a path's log names.
const sampleTop = 8

// jitLines maps an address of the JIT images of loaded programs (the
// entry point and the program it tail-calls) to the source line of bpf/
// it was compiled from.
type jitLines struct {
	ranges [][2]uint64 // every function's [ksym, ksym+len)
	addrs  []uint64    // the JIT addresses of the line infos, sorted
	lines  []string    // file:line of each, as addrs
	texts  map[string]string
}

// loadJitLines reads the JIT images' bounds and line infos of progs.
// Returns an error when the kernel hides them (kptr_restrict, no BTF).
func loadJitLines(progs ...*ebpf.Program) (*jitLines, error) {
	j := &jitLines{texts: map[string]string{}}
	type pair struct {
		addr uint64
		line string
	}
	var ps []pair
	for _, prog := range progs {
		info, err := prog.Info()
		if err != nil {
			return nil, err
		}
		ksyms, ok := info.JitedKsymAddrs()
		lens, ok2 := info.JitedFuncLens()
		jl, ok3 := info.JitedLineInfos()
		if !ok || !ok2 || !ok3 || len(ksyms) != len(lens) {
			return nil, fmt.Errorf("no JIT symbols or line infos for %s (kptr_restrict, or no BTF)", info.Name)
		}
		lis, err := info.LineInfos()
		if err != nil {
			return nil, fmt.Errorf("line infos of %s: %w", info.Name, err)
		}
		if len(lis) != len(jl) {
			return nil, fmt.Errorf("%s: %d line infos, %d JIT addresses", info.Name, len(lis), len(jl))
		}
		for i, k := range ksyms {
			j.ranges = append(j.ranges, [2]uint64{uint64(k), uint64(k) + uint64(lens[i])})
		}
		for i, l := range lis {
			name := fmt.Sprintf("%s:%d", l.Line.FileName(), l.Line.LineNumber())
			ps = append(ps, pair{jl[i], name})
			if t := strings.TrimSpace(l.Line.Line()); t != "" {
				j.texts[name] = t
			}
		}
	}
	sort.Slice(ps, func(a, b int) bool { return ps[a].addr < ps[b].addr })
	for _, p := range ps {
		j.addrs = append(j.addrs, p.addr)
		j.lines = append(j.lines, p.line)
	}
	return j, nil
}

// line is the source line of the instruction before ip (an interrupt's
// return address), "" outside the images.
func (j *jitLines) line(ip uint64) string {
	in := false
	for _, r := range j.ranges {
		in = in || (ip > r[0] && ip < r[1])
	}
	if !in {
		return ""
	}
	i := sort.Search(len(j.addrs), func(i int) bool { return j.addrs[i] > ip-1 }) - 1
	if i < 0 {
		return ""
	}
	return j.lines[i]
}

// lineShare is one line's share of a program's samples.
type lineShare struct {
	line  string
	share float64
}

// sampledProfile drives prog on frame for d on this thread, sampled by
// the software clock, and returns the program's samples by source line,
// most first, and the program's share of all samples of the thread in
// the kernel (the rest is BPF_PROG_TEST_RUN's own loop and the syscall).
func sampledProfile(prog *ebpf.Program, frame []byte, d time.Duration, tail ...*ebpf.Program) ([]lineShare, float64, error) {
	j, err := loadJitLines(append([]*ebpf.Program{prog}, tail...)...)
	if err != nil {
		return nil, 0, err
	}
	// The event counts this thread only: the test runs must stay on it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	attr := unix.PerfEventAttr{
		Type:        unix.PERF_TYPE_SOFTWARE,
		Config:      unix.PERF_COUNT_SW_CPU_CLOCK,
		Sample:      sampleNs,
		Sample_type: unix.PERF_SAMPLE_IP,
		Bits:        unix.PerfBitDisabled | unix.PerfBitExcludeUser | unix.PerfBitExcludeHv,
	}
	attr.Size = uint32(unsafe.Sizeof(attr))
	fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return nil, 0, fmt.Errorf("perf_event_open of the software clock: %w", err)
	}
	defer unix.Close(fd)
	const dataPages = 256
	page := unix.Getpagesize()
	mem, err := unix.Mmap(fd, 0, (1+dataPages)*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, 0, fmt.Errorf("mmap of the sample ring: %w", err)
	}
	defer unix.Munmap(mem)
	meta := (*unix.PerfEventMmapPage)(unsafe.Pointer(&mem[0]))
	ring := mem[page:]
	counts := map[string]int{}
	in, all := 0, 0
	// drain reads the records the kernel wrote since the last call
	// (perf_event_open(2): a perf_event_header, then for a
	// PERF_RECORD_SAMPLE of PERF_SAMPLE_IP the ip), which may wrap the
	// ring's end, and hands the ring's space back.
	var rec [16]byte
	drain := func() {
		head := atomic.LoadUint64(&meta.Data_head)
		tail := meta.Data_tail
		for tail < head {
			for i := range rec {
				rec[i] = ring[(tail+uint64(i))%uint64(len(ring))]
			}
			typ := binary.NativeEndian.Uint32(rec[0:])
			size := uint64(binary.NativeEndian.Uint16(rec[6:]))
			if size < 8 {
				break // cannot happen: a header is 8 bytes
			}
			if typ == unix.PERF_RECORD_SAMPLE && size >= 16 {
				all++
				if l := j.line(binary.NativeEndian.Uint64(rec[8:])); l != "" {
					counts[l]++
					in++
				}
			}
			tail += size
		}
		atomic.StoreUint64(&meta.Data_tail, tail)
	}
	if err := unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_ENABLE, 0); err != nil {
		return nil, 0, err
	}
	for end := time.Now().Add(d); time.Now().Before(end); {
		// 2^16 packets: a few ms, under the ring's 256 pages of samples.
		if _, err := runExact(prog, frame, 1<<16); err != nil {
			return nil, 0, err
		}
		drain()
	}
	if err := unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_DISABLE, 0); err != nil {
		return nil, 0, err
	}
	drain()
	if in == 0 {
		return nil, 0, fmt.Errorf("no sample fell in the program (%d samples in all)", all)
	}
	shares := make([]lineShare, 0, len(counts))
	for l, c := range counts {
		shares = append(shares, lineShare{l, float64(c) / float64(in)})
	}
	slices.SortFunc(shares, func(a, b lineShare) int {
		if a.share != b.share {
			if a.share > b.share {
				return -1
			}
			return 1
		}
		return strings.Compare(a.line, b.line)
	})
	for i := range shares {
		if t := j.texts[shares[i].line]; t != "" {
			shares[i].line += " `" + t + "`"
		}
	}
	return shares, float64(in) / float64(all), nil
}

// sampleEntries logs the sampled profile of each of es named in profiled
// (sampleLog): its sampleTop costliest lines, and reports
// <name>-prog-share, the program's share of the thread's kernel time.
func sampleEntries(b *testing.B, es []peerEntry) {
	b.Helper()
	for _, e := range es {
		if !slices.Contains(profiled, e.name) {
			continue
		}
		var tail []*ebpf.Program
		if e.h != nil {
			tail = append(tail, e.h.l.JudgeProgram())
		}
		shares, inProg, err := sampledProfile(e.prog, e.frame, sampleSeconds*time.Second, tail...)
		if err != nil {
			b.Logf("%sskipped: %s: %v", sampleLog, e.name, err)
			return
		}
		var top []string
		for _, s := range shares[:min(sampleTop, len(shares))] {
			top = append(top, fmt.Sprintf("%.1f%% %s", 100*s.share, s.line))
		}
		b.Logf("%s%s: %s", sampleLog, e.name, strings.Join(top, "; "))
		b.ReportMetric(inProg, e.name+"-prog-share")
	}
}
