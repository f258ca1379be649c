package bpf

import (
	"fmt"
	"time"

	"github.com/cilium/ebpf"

	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/tiers"
)

// SetFleetOthers writes the sums of the other fleet members' last reported
// R̂ (docs/design.md §12), packets per window, into the program (maps.h
// tl_fleet_others_in, tl_fleet_others): in, their in-budget R̂, and total,
// their R̂ of all selected packets, in and over budget. From the next
// packet on, the smooth shape judges an in-budget packet on this member's
// R̂_in + in, and an over-budget one on the share of P(R̂_tot + total) −
// P(R̂_in + in), against the table the policy was compiled for
// (fleet.max, tiers.Policy.TableMax). Each sum above tiers.MaxFleetOthers
// is written as that, and in as at most total. 0, 0 is the plain smooth
// shape, and what a loaded program starts with: the agent writes the sums
// at each report, and 0, 0 when it leaves the fleet or applies a fallback
// policy. The sums hold until the next write (SetFleetView with
// ViewForever); the agent writes them with SetFleetView, whose view
// expires.
//
// The two are two aligned 8-byte stores, not one: a packet judged
// between them reads one new sum and one old. They are written in the
// order that keeps the pair a packet can read at in ≤ total (the total
// first when it grows, else the in-budget sum first), so that such a
// packet is judged as at a report between the two, for the time between
// the stores; the race is accepted (maps.h).
func (l *Limiter) SetFleetOthers(in, total uint64) error {
	if err := l.setSums(in, total); err != nil {
		return err
	}
	if l.objs.TlFleetExpiry == nil || l.objs.TlFleetStale == nil {
		return nil // an earlier build: its sums never expire
	}
	return l.setExpiry(ViewForever)
}

// setSums writes the two sums in SetFleetOthers's order.
func (l *Limiter) setSums(in, total uint64) error {
	if l.objs.TlFleetOthers == nil || l.objs.TlFleetOthersIn == nil {
		return fmt.Errorf("%w: the loaded object has no fleet sums", ErrPolicy)
	}
	total = min(total, tiers.MaxFleetOthers)
	in = min(in, total)
	var old uint64
	if err := l.objs.TlFleetOthers.Get(&old); err != nil {
		return fmt.Errorf("read tl_fleet_others: %w", err)
	}
	setIn := func() error {
		if err := l.objs.TlFleetOthersIn.Set(in); err != nil {
			return fmt.Errorf("set tl_fleet_others_in: %w", err)
		}
		return nil
	}
	setTot := func() error {
		if err := l.objs.TlFleetOthers.Set(total); err != nil {
			return fmt.Errorf("set tl_fleet_others: %w", err)
		}
		return nil
	}
	first, second := setIn, setTot
	if total >= old {
		first, second = setTot, setIn
	}
	if err := first(); err != nil {
		return err
	}
	return second()
}

// SetFleetOwn writes what the next sums SetFleetOthers writes answer
// (docs/design.md §12, "The fleet's first second"; maps.h tl_fleet_own):
// this member's base, its own R̂_in and R̂_tot at its last regular report
// (kept through reports at a poll), packets per window, and
// the fleet's member count the store returned, this member included.
// During its own onset the program judges on the others' sums scaled by
// its rise since the report (tiers.FleetOthersNow), or, with own below
// tiers.SmoothOnsetMin, on the equal-share prior, and latches an onset on
// tiers.FleetLatchMin(members) packets since its rate's reference. The agent calls it
// before SetFleetOthers at each answer; 0, 0, 0 (what a loaded program
// starts with, and what it writes in fallback) is the plain fleet. Each
// estimate is written as at most 2^48 − 1, in as at most total. Returns
// ErrPolicy when the loaded object has no such variables.
func (l *Limiter) SetFleetOwn(in, total, members uint64) error {
	v := l.objs.LimiterVariables
	if v.TlFleetOwn == nil || v.TlFleetOwnIn == nil || v.TlFleetInv == nil || v.TlFleetInvIn == nil || v.TlFleetMembers == nil || v.TlFleetLatchMin == nil {
		return fmt.Errorf("%w: the loaded object has no fleet rise", ErrPolicy)
	}
	total = min(total, 1<<48-1)
	in = min(in, total)
	for _, w := range []struct {
		name string
		v    *ebpf.Variable
		x    uint64
	}{
		{"tl_fleet_own_in", v.TlFleetOwnIn, in}, {"tl_fleet_inv_in", v.TlFleetInvIn, tiers.FleetRiseInv(in)},
		{"tl_fleet_own", v.TlFleetOwn, total}, {"tl_fleet_inv", v.TlFleetInv, tiers.FleetRiseInv(total)},
		{"tl_fleet_members", v.TlFleetMembers, members},
		{"tl_fleet_latch_min", v.TlFleetLatchMin, tiers.FleetLatchMin(members)},
	} {
		if err := w.v.Set(w.x); err != nil {
			return fmt.Errorf("set %s: %w", w.name, err)
		}
	}
	return nil
}

// FleetOthers reads back the sums SetFleetOthers wrote: the in-budget sum
// and the total.
func (l *Limiter) FleetOthers() (in, total uint64, err error) {
	if l.objs.TlFleetOthers == nil || l.objs.TlFleetOthersIn == nil {
		return 0, 0, fmt.Errorf("%w: the loaded object has no fleet sums", ErrPolicy)
	}
	if err := l.objs.TlFleetOthersIn.Get(&in); err != nil {
		return 0, 0, fmt.Errorf("read tl_fleet_others_in: %w", err)
	}
	if err := l.objs.TlFleetOthers.Get(&total); err != nil {
		return 0, 0, fmt.Errorf("read tl_fleet_others: %w", err)
	}
	return in, total, nil
}

// FleetEstimate returns this member's own live R̂ (docs/design.md §12),
// packets per window, in budget and in all: the estimates that the
// program would judge a selected packet arriving now on, the packet itself
// and the others' sums left out (tiers.LiveEstimates, model.Model.EstimateAt),
// read from the window and the per-CPU overflow counts. It is what a
// member reports to the fleet. total counts every selected packet, in and
// over budget; in only the in-budget ones, on the same onset (latched on
// all selected packets), and is at most total; without per-source budgets
// the two are equal. The window is read through Window and
// tiers.WindowNow: its expiry, and its ticks as the program counts them;
// under the tick gate they are read from the clock (now − start_ns over
// the tick), within one tick of the program's jiffies. Returns ErrPolicy
// when no policy is applied.
func (l *Limiter) FleetEstimate() (in, total uint64, err error) {
	slot, err := l.activeSlot()
	if err != nil {
		return 0, 0, err
	}
	var set LimiterTlSettings
	if err := l.objs.Settings.Lookup(slot, &set); err != nil {
		return 0, 0, fmt.Errorf("read settings: %w", err)
	}
	if set.TableLen == 0 {
		return 0, 0, fmt.Errorf("%w: no policy applied", ErrPolicy)
	}
	w, err := l.Window()
	if err != nil {
		return 0, 0, err
	}
	if w.Opened == 0 {
		return 0, 0, nil
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, 0, fmt.Errorf("read the clock: %w", err)
	}
	ticks := max(set.SmTicks, 1)
	ws := tiers.WindowNow(uint64(ts.Nano()), w.Counts(), tiers.WindowPolicy{
		Window: time.Duration(set.WindowNs), Ticks: ticks, TickNs: l.TickNs(), Gate: set.WindowJiffies != 0})
	st := tiers.SmoothState{Elapsed: ws.ElapsedTicks, Ticks: ticks, Gap: w.Gap, Prev: w.LastCount + w.LastEx}
	n := w.Count + w.Ex
	prevIn, nIn := w.LastCount, w.Count
	var prof tiers.Profiles
	if set.SrcBudget == 0 {
		prevIn, nIn = st.Prev, n // every selected packet is in budget
	} else if prof, err = l.profiles(w.Opened); err != nil {
		return 0, 0, err
	}
	lat, err := l.liveLatch(&set, w, n, nIn, uint64(ts.Nano()))
	if err != nil {
		return 0, 0, err
	}
	in, total = tiers.LiveEstimates(st, n, prevIn, nIn, lat, ws.Expired, ws.ElapsedTicks-min(ws.ElapsedTicks, ticks), prof)
	return in, total, nil
}

// liveLatch reads the CPUs' latches of the onset from the recent rate
// (smooth.h sm_latch, sm_recent) as a packet now would: of each CPU
// latched in this window, E of all selected packets a (n, the window's
// count) since its origin on the clock while the CPU reads it so (in the
// tiers.SmoothClockTicks ticks after its latch, as of its last tick), else since its reference times its per-tick multiplier;
// with budgets, the live in-budget rate likewise (on the clock as
// tiers.SmoothClockLive reads it), plus the spent budgets
// (exh_in, at most nIn). The most over the CPUs (each reads the host's
// whole count).
func (l *Limiter) liveLatch(set *LimiterTlSettings, w Window, n, nIn, now uint64) (tiers.LiveLatch, error) {
	var cpus []LimiterTlSmoothCpu
	if err := l.objs.SmoothCpu.Lookup(uint32(0), &cpus); err != nil {
		return tiers.LiveLatch{}, fmt.Errorf("read smooth_cpu: %w", err)
	}
	var raw LimiterTlWindow
	if err := l.objs.Window.Lookup(uint32(0), &raw); err != nil {
		return tiers.LiveLatch{}, fmt.Errorf("read window: %w", err)
	}
	exh := min(raw.ExhIn, nIn)
	live := nIn - exh
	var lat tiers.LiveLatch
	for _, c := range cpus {
		if c.Lat == 0 || c.Id != w.Opened+1 {
			continue
		}
		var e, el uint64
		if c.Clock != 0 && now > c.O_ns {
			e = tiers.SmoothClockRate(sinceCount(n, c.O_a), now-c.O_ns, set.WindowNs)
			el = tiers.SmoothClockLive(sinceCount(live, c.O_m), now-c.O_ns, set.WindowNs)
		} else {
			e = sinceCount(n, c.RefA) * c.K_rate >> 16
			el = sinceCount(live, c.RefN) * c.K_rate >> 16
		}
		ein := e
		if set.SrcBudget != 0 {
			ein = exh + el
		}
		lat = tiers.LiveLatch{Latched: true, E: max(lat.E, e), EIn: max(lat.EIn, ein)}
	}
	return lat, nil
}

// sinceCount is x − ref, or 0 when ref is past x (model.since).
func sinceCount(x, ref uint64) uint64 {
	if d := x - ref; int64(d) > 0 {
		return d
	}
	return 0
}

// FleetPoll returns this member's own live R̂_tot, as FleetEstimate does:
// what the fleet controller polls every report/10 between its reports, to
// report at once when it more than doubled (docs/design.md §12, "The
// fleet's first second"). A few map reads and a clock read; no write.
func (l *Limiter) FleetPoll() (uint64, error) {
	_, total, err := l.FleetEstimate()
	return total, err
}

// profiles reads the in-budget profiles of window id (Cur) and of the one
// before it (Prev) from smooth_prof (smooth_prof.h): each the samples its
// tag names it by, from the first on, as tiers.SmoothProfile holds them.
func (l *Limiter) profiles(id uint64) (tiers.Profiles, error) {
	var p LimiterTlSmoothProf
	if err := l.objs.SmoothProf.Lookup(uint32(0), &p); err != nil {
		return tiers.Profiles{}, fmt.Errorf("read smooth_prof: %w", err)
	}
	read := func(id uint64) (out tiers.SmoothProfile) {
		b := id & 1
		for out.Known < tiers.SmoothProfN && p.Tag[b][out.Known] == id+1 {
			out.At[out.Known] = p.At[b][out.Known]
			out.Known++
		}
		return out
	}
	prof := tiers.Profiles{Cur: read(id)}
	if id > 0 {
		prof.Prev = read(id - 1)
	}
	return prof, nil
}
