// Package limitconv turns limits as people write them (package sluice's Limit and Limits:
// RATE/PERIOD, a burst, a windowed quota, a ramp) into the GCRA core's units (package
// gcra), and checks them against what a backend decides. It is the one implementation of
// these conversions: the limiter of package sluice calls it, and so do the daemon, the
// simulator, the referee and the tests, with the root package's limits.
//
// Package sluice imports this package, which therefore cannot name the root's types: its
// functions take any type laid out as sluice.Limit is (Fields, with R laid out as
// sluice.Ramp is). The root's calls make the compiler check that the layouts agree, and
// callers pass sluice.Limit and sluice.Limits as they are.
package limitconv

import (
	"fmt"
	"math"
	"math/bits"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
)

// RampFields is the layout of sluice.Ramp: Rate permits per Period at the start of a ramp,
// the limit's own rate Over later; the zero value is no ramp.
type RampFields = struct {
	Rate   int64
	Period time.Duration
	Over   time.Duration
}

// Fields is the layout of sluice.Limit, whose Ramp field has type R: Rate permits per
// Period, Burst (0 means Rate), a windowed quota (Window) or a ramp (Ramp).
type Fields[R ~RampFields] = struct {
	Rate   int64
	Period time.Duration
	Burst  int64
	Window bool
	Ramp   R
}

// fields returns l's fields in plain types.
func fields[L ~Fields[R], R ~RampFields](l L) (Fields[R], RampFields) {
	f := Fields[R](l)
	return f, RampFields(f.Ramp)
}

// Burst is l's burst with the default applied: Burst, or Rate when Burst is 0.
func Burst[L ~Fields[R], R ~RampFields](l L) int64 {
	f, _ := fields(l)
	if f.Burst == 0 {
		return f.Rate
	}
	return f.Burst
}

// Interval is l's emission interval T = Period/Rate, rounded up to a whole nanosecond
// (down for a windowed quota, so that Rate intervals fit in its window); 0 if Rate is not
// positive.
func Interval[L ~Fields[R], R ~RampFields](l L) time.Duration {
	f, _ := fields(l)
	if f.Rate <= 0 {
		return 0
	}
	if f.Window {
		return time.Duration(int64(f.Period) / f.Rate)
	}
	return time.Duration((int64(f.Period) + f.Rate - 1) / f.Rate)
}

// Core returns ls in the GCRA core's units, each tightened by a jitter tolerance margin
// (docs/concepts.md): with a burst above one, ceil(margin/T) permits of the burst are held
// in reserve; with a burst of one (or once the reserve would take the whole burst),
// permits are spaced T plus the rest of the margin apart. A zero margin gives the limits
// exactly.
//
// A windowed quota ignores the margin (a permit decided just before a window's end may be
// counted by the API in the next window: keep such a pool's quota a little under the
// API's). A ramp is not applied: Core is the limits once their ramps are over (see CoreAt
// and CoreRamped).
func Core[L ~Fields[R], R ~RampFields](ls []L, margin time.Duration) []gcra.Limit {
	out := make([]gcra.Limit, len(ls))
	for i, l := range ls {
		out[i] = core(l, margin)
	}
	return out
}

// core is one limit of Core.
func core[L ~Fields[R], R ~RampFields](l L, margin time.Duration) gcra.Limit {
	f, _ := fields(l)
	if f.Window {
		t := int64(Interval(l))
		return gcra.Limit{T: t, Tau: f.Rate * t, Window: int64(f.Period)}
	}
	return tightened(int64(Interval(l)), Burst(l), margin)
}

// CoreAt is Core at `elapsed` into the limits' ramps (since the limits took effect): each
// ramp's rate rises linearly from its start to its limit's, and the burst with it (never
// below one permit); the interval is rounded up, so a ramped limit never exceeds the line.
// A limit without a ramp, or whose ramp is over, is as Core gives it.
func CoreAt[L ~Fields[R], R ~RampFields](ls []L, margin, elapsed time.Duration) []gcra.Limit {
	out := make([]gcra.Limit, len(ls))
	for i, l := range ls {
		out[i] = coreAt(l, margin, elapsed)
	}
	return out
}

// coreAt is one limit of CoreAt: its Rise's limit at elapsed (gcra.Rise.At, the
// arithmetic every strict store applies), or for a ramp too large for a Rise's exact
// doubles the same formula with the burst capped at gcra.MaxTau.
func coreAt[L ~Fields[R], R ~RampFields](l L, margin, elapsed time.Duration) gcra.Limit {
	f, r := fields(l)
	if r == (RampFields{}) || elapsed >= r.Over || f.Window {
		return core(l, margin)
	}
	elapsed = max(elapsed, 0)
	if rs := riseOf(l, margin, elapsed); rs.Valid() {
		t, tau := rs.At(0)
		return gcra.Limit{T: t, Tau: tau}
	}
	r0 := float64(r.Rate) / float64(r.Period) // permits a nanosecond
	r1 := float64(f.Rate) / float64(f.Period)
	rate := r0 + (r1-r0)*float64(elapsed)/float64(r.Over)
	t := max(int64(math.Ceil(1/rate)), int64(Interval(l)))
	b := max(1, int64(math.Floor(float64(Burst(l))*rate/r1)))
	b = min(b, gcra.MaxTau/t)
	return tightened(t, b, margin)
}

// CoreRising is CoreAt with each limit whose ramp runs at elapsed carrying the ramp
// (gcra.Limit.Rise), for a backend that spaces bookings at the limit in force where each
// falls (the strict mode's stores): a booking far ahead on a ramp is then spaced at the
// ramp's pace there, not at now's. A ramp whose numbers a Rise cannot hold exactly
// (gcra.Rise.Valid) is left without one: its bookings are spaced at now's limit, as
// CoreAt's.
func CoreRising[L ~Fields[R], R ~RampFields](ls []L, margin, elapsed time.Duration) []gcra.Limit {
	out := CoreAt(ls, margin, elapsed)
	for i, l := range ls {
		f, r := fields(l)
		if r == (RampFields{}) || elapsed >= r.Over || f.Window {
			continue
		}
		if rs := riseOf(l, margin, max(elapsed, 0)); rs.Valid() {
			out[i].Rise = &rs
		}
	}
	return out
}

// riseOf is l's ramp as a gcra.Rise at elapsed into it (l ramps).
func riseOf[L ~Fields[R], R ~RampFields](l L, margin, elapsed time.Duration) gcra.Rise {
	f, r := fields(l)
	return gcra.Rise{
		Elapsed: int64(elapsed), Over: int64(r.Over),
		Rate0: r.Rate, Period0: int64(r.Period),
		Rate: f.Rate, Period: int64(f.Period),
		Burst: Burst(l), Interval: int64(Interval(l)),
		Margin: int64(max(margin, 0)),
	}
}

// CoreRamped is Core with each limit's ramp in core units (gcra.Limit.Ramp), for a backend
// that ramps limits itself (backend.Capabilities.SharedRamps: the lease mode): the ramp
// starts at the part of the core's rate that the ramp's start rate is of the limit's rate
// (the start's interval rounded up: never faster), and rises over the ramp's duration.
func CoreRamped[L ~Fields[R], R ~RampFields](ls []L, margin time.Duration) []gcra.Limit {
	out := Core(ls, margin)
	for i, l := range ls {
		out[i].Ramp = rampOf(l, out[i])
	}
	return out
}

// rampOf is l's ramp in core units for c, l's core limit; the zero gcra.Ramp if l does not
// ramp.
func rampOf[L ~Fields[R], R ~RampFields](l L, c gcra.Limit) gcra.Ramp {
	f, r := fields(l)
	if r == (RampFields{}) || f.Window {
		return gcra.Ramp{}
	}
	start := (int64(r.Period) + r.Rate - 1) / r.Rate // the start's interval
	hi, lo := bits.Mul64(uint64(c.T), uint64(start))
	iv := uint64(Interval(l))
	t0 := int64(math.MaxInt64)
	if hi < iv {
		q, rem := bits.Div64(hi, lo, iv)
		if rem != 0 {
			q++
		}
		if q <= math.MaxInt64 {
			t0 = int64(q)
		}
	}
	return gcra.Ramp{T0: max(t0, c.T), Over: int64(r.Over)}
}

// tightened is the GCRA limit of interval t and burst b, tightened by margin (see Core
// and gcra.Tightened).
func tightened(t, b int64, margin time.Duration) gcra.Limit {
	t, tau := gcra.Tightened(t, b, int64(margin))
	return gcra.Limit{T: t, Tau: tau}
}

// RampOver is how long the longest of the limits' ramps lasts (0 if none ramps).
func RampOver[L ~Fields[R], R ~RampFields](ls []L) time.Duration {
	var d time.Duration
	for _, l := range ls {
		_, r := fields(l)
		d = max(d, r.Over)
	}
	return d
}

// Windowed reports whether any of the limits is a windowed quota.
func Windowed[L ~Fields[R], R ~RampFields](ls []L) bool {
	for _, l := range ls {
		if f, _ := fields(l); f.Window {
			return true
		}
	}
	return false
}

// SameRamps reports whether a and b ramp alike: the same ramps on the same rates, so that
// a ramp of a goes on as b's (a limiter given new limits, a daemon reloading its rules).
func SameRamps[L ~Fields[R], R ~RampFields](a, b []L) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		fa, ra := fields(a[i])
		fb, rb := fields(b[i])
		if ra != rb || fa.Rate != fb.Rate || fa.Period != fb.Period {
			return false
		}
	}
	return true
}

// Supports returns an error wrapping backend.ErrUnsupported if be cannot decide limits: a
// windowed quota or a ramp it does not say it decides (backend.Capabilities), or a windowed
// quota beside a rate where it decides windows only beside windows
// (Capabilities.WindowsAlone). Only be's type matters (its capabilities are constants), so
// a backend not connected yet, or a nil pointer of its type, may be asked: `sluice serve
// --check-config` does so. The limits are named in the error by their String method.
func Supports[L ~Fields[R], R ~RampFields](be backend.Backend, limits []L) error {
	caps := backend.CapabilitiesOf(be)
	if caps.WindowsAlone && Windowed(limits) {
		for _, lim := range limits {
			if f, _ := fields(lim); !f.Window {
				return fmt.Errorf("%w: this backend decides windowed quotas only beside other windowed quotas, not beside %v", backend.ErrUnsupported, lim)
			}
		}
	}
	for _, lim := range limits {
		f, r := fields(lim)
		if f.Window && !caps.Windows {
			return fmt.Errorf("%w: a windowed quota (%v) is decided by the local, strict and lease modes only", backend.ErrUnsupported, lim)
		}
		if r != (RampFields{}) && !caps.Ramps {
			return fmt.Errorf("%w: a ramp (%v) is decided by the local, strict and lease modes only", backend.ErrUnsupported, lim)
		}
	}
	return nil
}
