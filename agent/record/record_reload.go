package record

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// A reload changes the shed record live (DESIGN.md §10), in two steps
// around the program's own change (Limiter.Apply, which takes the new rate
// and snaplen):
//
//   - prepare, before: opens what the new settings need and can fail at —
//     the sample reader when sampling is on for the first time, a new
//     record dir (made, and written once) — so that a value the agent
//     cannot use refuses the reload with nothing changed.
//   - commit, after: swaps them in. Samples the ring holds are read by the
//     same reader and written whole into the old dir or the new one; the
//     open episode goes on, its reports to the new events destination,
//     while the old destination's sender sends what it had queued and
//     ends; the tracker's ticker takes the new window.
//
// Turning sampling off keeps the reader: the ring just stays empty.

// Change is one reload's change to the shed record; nil when the
// record was not started (its methods do nothing then).
type Change struct {
	e *Episodes
	p tiers.Policy
	// rd reads samples for a recorder made by commit: sampling is on for
	// the first time.
	rd sampleReader
	// setDir: commit gives the recorder dir (nil: memory only).
	setDir bool
	dir    *pcapDir
}

// ErrDir is returned by Prepare when a new record.dir cannot be made or
// written: the reload is refused and the old policy, record dir included,
// keeps running.
var ErrDir = errors.New("record dir not usable")

// Prepare prepares the shed record's part of reloading p: nil when the
// record was not started (e nil). Returns ErrDir for a new record dir that
// cannot be made or written, and the reader's error when sampling turns on
// and its ring cannot be read.
func (e *Episodes) Prepare(p tiers.Policy) (*Change, error) {
	if e == nil {
		return nil, nil
	}
	e.mu.Lock()
	old, rec := e.record, e.rec
	e.mu.Unlock()
	c := &Change{e: e, p: p}
	if rec == nil && p.Record.Samples == 0 {
		return c, nil // nothing to read nor write yet
	}
	// A fresh recorder needs its dir; a running one a changed dir.
	c.setDir = rec == nil || p.Record.Dir != old.Dir
	if c.setDir && p.Record.Dir != "" {
		d, err := reloadDir(p.Record, e.ifname)
		if err != nil {
			return nil, err
		}
		c.dir = d
	}
	if rec == nil {
		rd, err := e.lim.Samples()
		if err != nil {
			return nil, err
		}
		c.rd = rd
	}
	return c, nil
}

// reloadDir opens a reload's new record dir: made, and a file created and
// removed in it, so that a dir the agent cannot write refuses the reload.
func reloadDir(r tiers.Record, ifname func(int) string) (*pcapDir, error) {
	d, err := newPcapDir(r.Dir, r.MaxBytes, max(r.Snaplen, 1), ifname)
	if err != nil {
		return nil, fmt.Errorf("%w: record.dir %s: %w", ErrDir, r.Dir, err)
	}
	f, err := os.CreateTemp(r.Dir, ".probe-*")
	if err != nil {
		return nil, fmt.Errorf("%w: record.dir %s: %w", ErrDir, r.Dir, err)
	}
	f.Close()
	os.Remove(f.Name())
	return d, nil
}

// Abort undoes Prepare: the reload was refused.
func (c *Change) Abort() {
	if c != nil && c.rd != nil {
		c.rd.Close()
	}
}

// Commit swaps the prepared change in, once the program runs the new
// policy.
func (c *Change) Commit() {
	if c == nil {
		return
	}
	e, p := c.e, c.p
	e.mu.Lock()
	defer e.mu.Unlock()
	if c.rd != nil {
		rec, err := newRecorder(e.log, c.rd)
		if err != nil {
			c.rd.Close()
			e.log.Error("shed record: sampling not started; shedding goes on unrecorded", "error", err)
			c.setDir = false
		} else {
			e.rec = rec
			go rec.run()
			context.AfterFunc(e.ctx, rec.close)
		}
	}
	switch {
	case e.rec == nil:
	case c.setDir:
		e.rec.setDir(c.dir)
	default:
		if err := e.rec.setLimits(p.Record.MaxBytes, p.Record.Snaplen); err != nil {
			e.log.Warn("shed record: remove the oldest files beyond the new max_bytes", "dir", p.Record.Dir, "error", err)
		}
	}
	c.events()
	window, every := e.window, e.every
	e.setPolicy(p)
	if e.window != window {
		select {
		case e.retick <- struct{}{}:
		default:
		}
	}
	if next := time.Now().Add(e.every); e.cur.Open && e.nextSummary.After(next) {
		e.nextSummary = next
	}
	if p.Record != e.record || p.Events != e.evcfg || e.window != window || e.every != every {
		e.log.Info("shed record: reloaded", "samples", p.Record.Samples, "snaplen", p.Record.Snaplen, "dir", p.Record.Dir,
			"max_bytes", p.Record.MaxBytes, "events", p.Events.Syslog(), "summary_every", e.every, "window", e.window)
	}
	e.record, e.evcfg = p.Record, p.Events
}

// events swaps the events sender when events.syslog changed; e.mu held.
func (c *Change) events() {
	e, ev := c.e, c.p.Events
	if ev.Network == e.evcfg.Network && ev.Addr == e.evcfg.Addr && ev.Framing == e.evcfg.Framing {
		return
	}
	if e.send != nil {
		e.send.stop()
		e.send = nil
	}
	if ev.Network != "" {
		e.send = newEventSender(e.log, ev.Network, ev.Addr, &e.events)
		e.send.framing = ev.Framing
		go e.send.run(e.ctx)
	}
}
