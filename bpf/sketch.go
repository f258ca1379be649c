package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// ErrNoSketch is returned by AdoptSketch when the map it is to adopt from
// holds no source sketch of this layout.
var ErrNoSketch = errors.New("no source sketch of this layout")

// Globals returns the program's map of its zeroed globals (.bss), which
// holds the source sketch (maps.h tl_sketch): the agent pins it beside the
// program (agent/pin.Dir.PinProgram) so that the agent of a restart can
// adopt the sketch (AdoptSketch). It is the Limiter's: do not close it.
// nil for an object without globals.
func (l *Limiter) Globals() *ebpf.Map { return l.bss }

// AdoptSketch copies into l's source sketch (maps.h tl_sketch: the
// program's own, never pinned) the sketch held by old, the globals map
// (Globals) of the program that l's replaces on its links on an agent's
// restart: the groups' counts of the open window carry over, as the pinned
// counters and window do (docs/design.md §4, "Restart"). Call it before
// l's program runs. The packets old's program counts between the copy and
// its replacement are not in l's sketch: each group's count is short by
// at most those (microseconds to milliseconds of its packets; a group over
// budget stays so). The sketch's place in .bss is part of the layout
// (TestLayoutGolden), so the old map of a program of this layout holds it
// where l's does; a migration never carries it. It reads old with one map
// lookup, which CAP_BPF allows. Returns ErrNoSketch when old is no globals
// map large enough to hold it.
func (l *Limiter) AdoptSketch(old *ebpf.Map) error {
	v := l.objs.TlSketch
	if v == nil || l.bss == nil {
		return fmt.Errorf("%w: the loaded object has none", ErrNoSketch)
	}
	off, size := l.sketchOff, v.Size()
	if old.Type() != ebpf.Array || old.MaxEntries() != 1 || old.ValueSize() < off+size {
		return fmt.Errorf("%w: map of type %v, %d entries of %d bytes, where the sketch is bytes %d to %d of one",
			ErrNoSketch, old.Type(), old.MaxEntries(), old.ValueSize(), off, off+size)
	}
	buf := make([]byte, old.ValueSize())
	if err := old.Lookup(uint32(0), buf); err != nil {
		return fmt.Errorf("read the old program's sketch: %w", err)
	}
	if err := v.Set(buf[off : off+size]); err != nil {
		return fmt.Errorf("write the sketch: %w", err)
	}
	return nil
}
