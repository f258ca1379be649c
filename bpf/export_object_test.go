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
