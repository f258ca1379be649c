package bpf

import "github.com/cilium/ebpf"

// LoadObject is Load of the BPF object at path: an earlier build whose
// maps this loader still reads and writes (testdata/layout-1, whose
// settings are today's), for the benchmarks that run today's program
// beside it.
func LoadObject(opts Options, path string) (*Limiter, error) {
	spec, err := ebpf.LoadCollectionSpec(path)
	if err != nil {
		return nil, err
	}
	return load(opts, spec)
}

// ZeroWindow writes a window of zeroes, of whatever size l's object
// declares (an earlier build's struct tl_window may be shorter than
// today's): no window is open, so the next selected packet opens one,
// as after Window expired with no history.
func (l *Limiter) ZeroWindow() error {
	return l.objs.Window.Put(uint32(0), make([]byte, l.objs.Window.ValueSize()))
}
