package bpf_test

import (
	"context"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestWindowTickSourceSwitch is issue 43: a restart that switches the
// smooth estimate's tick source (the kernel's tick under the tick gate ↔
// the clock's 2^22 ns) keeps the pinned window in progress, whose start
// tick was read in the other source. The first refresh of the reloaded
// program must read the window's elapsed ticks in its own source (window.h
// window_start_tick): its multiplier (1 / the elapsed fraction) is the one
// for the ticks that really passed, and its in-budget rate reference lies
// within the window, in the new source's ticks; the next window's gap is
// counted from the old window's start read so too. Each packet runs on one
// CPU, so that the per-CPU memo the reload finds is the one the first
// program left.
func TestWindowTickSourceSwitch(t *testing.T) {
	testenv.Require(t)
	tick := kernelTick(t)
	if tick == 0 {
		t.Skip("the kernel's tick is unknown: no tick gate to switch to or from")
	}
	t.Run("gate to clock", func(t *testing.T) { tickSourceSwitch(t, tick, 0) })
	t.Run("clock to gate", func(t *testing.T) { tickSourceSwitch(t, 0, tick) })
}

func tickSourceSwitch(t *testing.T, from, to uint64) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var one unix.CPUSet
	one.Set(0)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	pin := testenv.PinPath(t)
	if err := os.MkdirAll(pin, 0o700); err != nil {
		t.Fatal(err)
	}
	pol := ordinalDefault()
	pol.Shape = tiers.ShapeSmooth
	pol.Window, pol.Max = 6*time.Second, 1_000_000
	pol.Sources = tiers.Sources{BudgetPackets: 1000, PrefixV4: 32, PrefixV6: 64}
	frame := testenv.UDP4(t, 514)

	first := loadPinned(t, pin, from, pol)
	first.run(frame)
	var w bpf.LimiterTlWindow
	if err := first.l.WindowMap().Lookup(uint32(0), &w); err != nil {
		t.Fatal(err)
	}
	first.l.Close()
	time.Sleep(300 * time.Millisecond)

	second := loadPinned(t, pin, to, pol)
	before := monotonicNow(t)
	second.run(frame)
	after := monotonicNow(t)
	var w2 bpf.LimiterTlWindow
	if err := second.l.WindowMap().Lookup(uint32(0), &w2); err != nil {
		t.Fatal(err)
	}
	if w2.Opened != w.Opened || w2.StartNs != w.StartNs || w2.Count != 2 {
		t.Fatalf("the reload did not keep the window in progress: opened %d→%d, start %d→%d, count %d", w.Opened, w2.Opened, w.StartNs, w2.StartNs, w2.Count)
	}
	if win, err := second.l.Window(); err != nil {
		t.Fatal(err)
	} else if to == 0 && win.StartTick != w.StartNs>>tiers.SmoothTickShift {
		t.Errorf("Limiter.Window reads the start tick as %d, want the clock's %d", win.StartTick, w.StartNs>>tiers.SmoothTickShift)
	}
	c := second.smoothCPU()
	j := second.tab.Settings.SmoothTicks
	// The elapsed ticks the refresh may read, in the new source's ticks.
	var eLo, eHi, startLo, startHi uint64
	if to == 0 {
		eLo = before>>tiers.SmoothTickShift - w.StartNs>>tiers.SmoothTickShift
		eHi = after>>tiers.SmoothTickShift - w.StartNs>>tiers.SmoothTickShift
		startLo, startHi = w.StartNs>>tiers.SmoothTickShift, w.StartNs>>tiers.SmoothTickShift
	} else {
		eLo, eHi = (before-w.StartNs)/to-2, (after-w.StartNs)/to+2
		startLo, startHi = c.Tick-eHi, c.Tick-eLo
	}
	multLo, multHi := smoothMult(eHi, j), smoothMult(eLo, j)
	t.Logf("window of %d ticks, %d to %d elapsed: multiplier %d (want %d..%d), rate reference at tick %d (window start %d..%d, now %d)",
		j, eLo, eHi, c.Mult, multLo, multHi, c.RefTick, startLo, startHi, c.Tick)
	if c.Mult < multLo || c.Mult > multHi {
		t.Errorf("after the switch the estimate's multiplier is %d, want %d..%d (%d to %d of %d ticks elapsed)", c.Mult, multLo, multHi, eLo, eHi, j)
	}
	if c.RefTick+1 < startLo || c.RefTick > c.Tick || c.CandTick > c.Tick {
		t.Errorf("after the switch the rate's reference ticks are %d and %d, outside the window's %d..%d", c.RefTick, c.CandTick, startLo, c.Tick)
	}

	// The next window opens 600 ms after this one's end: its gap is
	// those ticks, counted from the old window's start in the new source
	// (window_open).
	time.Sleep(time.Duration(w.StartNs + uint64(pol.Window) + uint64(600*time.Millisecond) - monotonicNow(t)))
	before = monotonicNow(t)
	second.run(frame)
	after = monotonicNow(t)
	var w3 bpf.LimiterTlWindow
	if err := second.l.WindowMap().Lookup(uint32(0), &w3); err != nil {
		t.Fatal(err)
	}
	if w3.Opened != w.Opened+1 {
		t.Fatalf("the window did not open: opened %d, want %d", w3.Opened, w.Opened+1)
	}
	var gapLo, gapHi uint64
	if to == 0 {
		end := w.StartNs>>tiers.SmoothTickShift + j
		gapLo, gapHi = before>>tiers.SmoothTickShift-end, after>>tiers.SmoothTickShift-end
	} else {
		per := uint64(pol.Window) / second.tab.Settings.WindowTicks
		gapLo, gapHi = (before-w.StartNs)/per-j-2, (after-w.StartNs)/per-j+2
	}
	t.Logf("the next window's gap: %d ticks (want %d..%d)", w3.Gap, gapLo, gapHi)
	if w3.Gap < gapLo || w3.Gap > gapHi {
		t.Errorf("the window after the switch has a gap of %d ticks, want %d..%d", w3.Gap, gapLo, gapHi)
	}
}

// loadPinned loads the limiter on the maps pinned at pin with tick
// source tickNs (0: the clock) and applies p.
func loadPinned(t *testing.T, pin string, tickNs uint64, p tiers.Policy) *harness {
	t.Helper()
	l, err := bpf.Load(bpf.Options{PinPath: pin, TickNs: tickNs})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{tb: t, l: l}
	t.Cleanup(func() { l.Close() })
	tab, err := tiers.Compile(p, tickNs)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Apply(context.Background(), tab); err != nil {
		t.Fatal(err)
	}
	h.p, h.tab = p, tab
	return h
}

// smoothMult is smooth.h sm_refresh's multiplier at e of j ticks elapsed:
// 1 / f, f the elapsed fraction (2e + 1) / 2j, fixed point.
func smoothMult(e, j uint64) uint64 {
	e = min(e, j)
	f := min(((2*e+1)<<(tiers.SmoothFracBits-1))/j, 1<<tiers.SmoothFracBits)
	return (1 << (2 * tiers.SmoothFracBits)) / max(f, tiers.SmoothMinFrac)
}
