package license

import "time"

// Clock is the license manager's time as the guard reads it: Now, and
// Scale, the license time that passes in a real duration (the guard's
// windows run on the real clock, the program's). Real is the system's;
// Compressed runs a whole day in seconds, for tests and demos.
type Clock interface {
	Now() time.Time
	Scale(real time.Duration) time.Duration
}

// Real is the system's clock.
type Real struct{}

// Now is time.Now.
func (Real) Now() time.Time { return time.Now() }

// Scale is d itself.
func (Real) Scale(d time.Duration) time.Duration { return d }

// Compressed is a clock that runs Factor times faster than the real one
// from Origin, the license time at the real time it was made: a factor
// of 3600 runs a day in 24 s.
type Compressed struct {
	origin time.Time
	start  time.Time
	factor float64
}

// NewCompressed returns a clock that shows origin now and runs factor
// times faster than the real clock (factor ≥ 1).
func NewCompressed(origin time.Time, factor float64) *Compressed {
	return &Compressed{origin: origin, start: time.Now(), factor: max(factor, 1)}
}

// Now is origin + factor × the real time since the clock was made.
func (c *Compressed) Now() time.Time {
	return c.origin.Add(time.Duration(float64(time.Since(c.start)) * c.factor))
}

// Scale is factor × d.
func (c *Compressed) Scale(d time.Duration) time.Duration {
	return time.Duration(float64(d) * c.factor)
}
