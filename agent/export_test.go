package agent

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierlimit/tierlimit/bpf"
)

// MapReads counts the map reads of a collector from CollectorCountingReads
// and keeps the Stats each read returned.
type MapReads struct {
	mu    sync.Mutex
	stats []bpf.Stats
	other int // reads of the window, the policy and the source table
}

// Take returns the Stats reads since the last Take and the number of other
// map reads, and starts counting again.
func (r *MapReads) Take() (stats []bpf.Stats, other int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	stats, other = r.stats, r.other
	r.stats, r.other = nil, 0
	return stats, other
}

type countingReader struct {
	lim *bpf.Limiter
	r   *MapReads
}

func (c countingReader) Stats() (bpf.Stats, error) {
	st, err := c.lim.Stats()
	c.r.mu.Lock()
	c.r.stats = append(c.r.stats, st)
	c.r.mu.Unlock()
	return st, err
}

func (c countingReader) count() {
	c.r.mu.Lock()
	c.r.other++
	c.r.mu.Unlock()
}

func (c countingReader) Active() (bpf.Active, error) { c.count(); return c.lim.Active() }
func (c countingReader) Window() (bpf.Window, error) { c.count(); return c.lim.Window() }
func (c countingReader) TopSources(n int) ([]bpf.SourceGroup, error) {
	c.count()
	return c.lim.TopSources(n)
}

// CollectorCountingReads returns a's collector, reading the maps through a
// counter of its reads.
func CollectorCountingReads(a *Agent) (prometheus.Collector, *MapReads) {
	r := &MapReads{}
	return newCollector(a, countingReader{lim: a.lim, r: r}), r
}
