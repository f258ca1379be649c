package main

import (
	"context"
	"fmt"
	"time"
)

// sweepPoint is one window of the sweep: a burst of frames that all fall
// in one window, and what the collector processed of it.
type sweepPoint struct {
	Method  method  `json:"method"`
	Offered uint64  `json:"offered"` // frames that reached the collector in the window
	Passed  uint64  `json:"passed"`  // messages the collector processed
	Model   float64 `json:"model"`   // tiers.Expected(Offered).Passed
}

// sweepLoads are the offered loads of the sweep as fractions of max: dense
// around the tier boundaries (0.7, 0.8, 1.0) and up to 3x.
var sweepLoads = []float64{0.3, 0.6, 0.7, 0.75, 0.8, 0.9, 1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0}

var sweepLoadsQuick = []float64{0.5, 0.9, 2.0}

// sweep offers each load as one burst in its own window (the burst takes
// well under a window at trafgen's speed, and the next starts more than a
// window later), for method m, and returns one point per load.
func sweep(ctx context.Context, cfg *floodConfig, m method, loads []float64) ([]sweepPoint, error) {
	c := *cfg
	c.source = "trafgen"
	b, err := setup(ctx, &c, m)
	if err != nil {
		return nil, fmt.Errorf("sweep %s: setup: %w", m, err)
	}
	defer b.close()
	tab, err := tierTable(&c)
	if err != nil {
		return nil, err
	}
	var pts []sweepPoint
	lastEnd := time.Now().Add(-time.Hour)
	for _, f := range loads {
		n := uint64(f*float64(c.max) + 0.5)
		// A new window: the previous burst ended more than a window ago.
		if err := sleepCtx(ctx, time.Until(lastEnd.Add(c.window+150*time.Millisecond))); err != nil {
			return nil, err
		}
		st0, err := b.recv.stats()
		if err != nil {
			return nil, err
		}
		s0, err := b.sample(time.Now())
		if err != nil {
			return nil, err
		}
		samples, t0, err := b.flood(ctx, n)
		if err != nil {
			return nil, fmt.Errorf("sweep %s: %w", m, err)
		}
		if d := samples[len(samples)-1].t; d > c.window*8/10 {
			return nil, fmt.Errorf("sweep %s: a burst of %d took %v, too long for one window", m, n, d)
		}
		st1, err := b.settle(ctx, t0)
		if err != nil {
			return nil, err
		}
		lastEnd = time.Now()
		s1, err := b.sample(t0)
		if err != nil {
			return nil, err
		}
		off := s1.arrived - s0.arrived
		p := sweepPoint{Method: m, Offered: off, Passed: st1.Processed - st0.Processed, Model: tab.Expected(off).Passed}
		if b.lim != nil {
			// The program's own count of the window, exact.
			p.Offered = s1.count
			p.Model = tab.Expected(s1.count).Passed
		}
		fmt.Fprintf(c.log, "sweep %-9s offered %6d passed %6d model %8.1f\n", m, p.Offered, p.Passed, p.Model)
		pts = append(pts, p)
	}
	return pts, nil
}
