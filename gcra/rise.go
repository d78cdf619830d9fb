package gcra

import "math"

// MaxExact is the largest integer a double holds exactly (2^53): the bound on a Rise's
// numbers, so that the Redis script, whose numbers are doubles, computes it exactly as
// this package does.
const MaxExact = int64(1) << 53

// Rise is a ramp that the decision applies itself, slot by slot (the strict mode's, in a
// store shared by processes that each ramp from their own start): the limit rises from
// Rate0 permits per Period0 to Rate per Period over Over nanoseconds, its burst scaled with
// its rate (never below one permit), tightened by Margin (see Tightened); Elapsed is how
// far into the ramp the decision's now is. A Limit that carries one is the limit in force
// at now (At(0)), and Decide spaces a permit booked later at the limit in force where the
// permit's booking falls (docs/strict.md, "Ramps"). Every number is at most MaxExact, and
// 0 < Rate0/Period0 <= Rate/Period (Valid).
type Rise struct {
	Elapsed, Over   int64 // how far into the ramp now is; how long the ramp lasts
	Rate0, Period0  int64 // the start: Rate0 permits per Period0 nanoseconds
	Rate, Period    int64 // the end: the limit's own rate
	Burst, Interval int64 // the limit's own burst and emission interval (Period/Rate, rounded up)
	Margin          int64 // the jitter tolerance the limit is tightened by
}

// Valid reports whether r can be applied exactly: positive rates and lengths, numbers
// within MaxExact, a start no faster than the end, a burst at the start's interval within
// MaxExact, and Elapsed before the end.
func (r *Rise) Valid() bool {
	for _, v := range [...]int64{r.Over, r.Rate0, r.Period0, r.Rate, r.Period, r.Burst, r.Interval} {
		if v <= 0 || v > MaxExact {
			return false
		}
	}
	t0 := (r.Period0 + r.Rate0 - 1) / r.Rate0
	// An interval at most 2×t0 + Margin (t0 rounded up, and the margin's spacing), times
	// a cost at most Burst, stays exact.
	return r.Elapsed >= 0 && r.Elapsed < r.Over && r.Margin >= 0 && r.Margin <= MaxExact/4 &&
		r.Interval >= (r.Period+r.Rate-1)/r.Rate && t0 >= r.Interval && t0 <= MaxExact/4 &&
		r.Burst <= MaxExact/(2*t0+r.Margin)
}

// At returns the limit's emission interval and tolerance d >= 0 nanoseconds after the
// decision's now: at Elapsed + d into the ramp, its rate rises linearly from the start's
// to the end's, the interval is rounded up (never faster than the line) and no shorter
// than Interval, the burst is the limit's scaled by the rate, rounded down (at least one
// permit), and the margin tightens them (Tightened). From Over on, it is the limit's own.
// The arithmetic is in doubles where it divides rates, each operation alone (no fused
// multiply-add), so that the Redis script computes the very same numbers (sluice.lua,
// "rise").
func (r *Rise) At(d int64) (t, tau int64) {
	e := r.Elapsed + min(max(d, 0), r.Over)
	if e >= r.Over {
		return Tightened(r.Interval, r.Burst, r.Margin)
	}
	r0 := float64(r.Rate0) / float64(r.Period0) // permits a nanosecond
	r1 := float64(r.Rate) / float64(r.Period)
	rise := float64(float64(r1-r0) * float64(e))
	rate := float64(r0 + float64(rise/float64(r.Over)))
	t = max(int64(math.Ceil(float64(1/rate))), r.Interval)
	b := max(1, int64(math.Floor(float64(float64(float64(r.Burst)*rate)/r1))))
	return Tightened(t, b, r.Margin)
}

// Tightened is the limit of emission interval t and burst b tightened by a jitter
// tolerance margin: with a burst above one, ceil(margin/t) permits of the burst are held in
// reserve; with a burst of one (or once the reserve would take the whole burst), permits
// are spaced t plus the rest of the margin apart. A zero margin gives t and b×t.
func Tightened(t, b, margin int64) (tt, tau int64) {
	m := max(margin, 0)
	if m == 0 {
		return t, b * t
	}
	if k := (m + t - 1) / t; k < b {
		return t, (b - k) * t
	}
	t2 := t + m - (b-1)*t
	return t2, t2
}

// spacing is limit l's emission interval and tolerance for a booking on a key whose TAT
// is tat, at now, and the earliest the booking's slot may be: without a Rise, l's own
// and now; with one, the limit in force at x = max(now, tat - Tau), no later than any slot
// the booking can get (which is at least tat + n×T - Tau at x's limit, and never before x
// either), so the booking follows the ramp a little behind, never ahead.
func spacing(tat int64, l Limit, now int64) (t, tau, x int64) {
	if l.Rise == nil {
		return l.T, l.Tau, now
	}
	x = max(now, tat-l.Tau)
	t, tau = l.Rise.At(x - now)
	return t, tau, x
}

// MinT is the shortest emission interval l spaces any permit at: T, or with a Rise the
// limit's own interval (the ramp's at its end, before any margin), which a refund gives
// back per permit (Adjust), never more than the grant took.
func (l Limit) MinT() int64 {
	if l.Rise != nil {
		return min(l.T, l.Rise.Interval)
	}
	return l.T
}
