package main

import (
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// Comparison with the model: the expected passed count of a flood's timeline.

// xdpModel is the expected passed count from the program's own count of
// each window: last_count when a window opened, and count for the last.
func xdpModel(tab tiers.Table, samples []sample) float64 {
	var sum float64
	prev := samples[0].opened
	for _, s := range samples[1:] {
		if s.opened > prev+1 {
			// A window opened and closed between two samples: unseen.
			return 0
		}
		if s.opened == prev+1 && prev > samples[0].opened {
			sum += tab.Expected(s.lastCount).Passed
		}
		prev = s.opened
	}
	return sum + tab.Expected(samples[len(samples)-1].count).Passed
}

// timeline is a cumulative count over time, piecewise linear between
// samples.
type timeline []point

type point struct {
	t time.Duration
	c uint64
}

func timelineOf(samples []sample, f func(sample) uint64) timeline {
	tl := make(timeline, len(samples))
	for i, s := range samples {
		tl[i] = point{s.t, f(s)}
	}
	return tl
}

// duration is from the first packet to the sample that shows the last.
func (tl timeline) duration() time.Duration {
	final, end := tl[len(tl)-1].c, tl[len(tl)-1].t
	for _, p := range tl {
		if p.c == final {
			end = p.t
			break
		}
	}
	return end - tl.firstPacket()
}

// firstPacket is the time of the sample before the one that first shows
// traffic.
func (tl timeline) firstPacket() time.Duration {
	for i := 1; i < len(tl); i++ {
		if tl[i].c > tl[0].c {
			return tl[i-1].t
		}
	}
	return tl[0].t
}

// at is the count at t, interpolated.
func (tl timeline) at(t time.Duration) float64 {
	if t <= tl[0].t {
		return float64(tl[0].c)
	}
	for i := 1; i < len(tl); i++ {
		if t <= tl[i].t {
			a, b := tl[i-1], tl[i]
			f := float64(t-a.t) / float64(b.t-a.t)
			return float64(a.c) + f*(float64(b.c)-float64(a.c))
		}
	}
	return float64(tl[len(tl)-1].c)
}

// model applies the window rule to the timeline of frames that reached the
// collector (a window opens at the first packet after the current one's
// end; the flood is continuous, so at that end) and sums tiers.Expected
// over the windows. With samples every 5 ms it can misplace a boundary by
// 5 ms of traffic, which moves the expectation only for a window that is
// not saturated (fewer than T_last packets).
func (tl timeline) model(tab tiers.Table, window time.Duration) (float64, int) {
	total := float64(tl[len(tl)-1].c)
	start := tl.firstPacket()
	var sum float64
	n := 0
	for {
		from := tl.at(start)
		if from >= total-0.5 {
			break
		}
		to := tl.at(start + window)
		sum += tab.Expected(uint64(to - from + 0.5)).Passed
		n++
		start += window
	}
	return sum, n
}
