package gcra

import (
	"errors"
	"fmt"
	"math"
)

// MaxLimits is the most limits one key may carry (a per-second, per-minute, per-hour and
// per-day limit, as real APIs stack them). A fixed bound keeps tickets free of allocation.
const MaxLimits = 4

// MaxTau bounds a limit's burst tolerance (Burst*T) so that now+Tau never overflows an
// int64 of Unix nanoseconds: about 36 years.
const MaxTau = int64(1) << 60

// MaxTAT bounds every time the core computes (a TAT, the end of a penalty): about the
// year 2189 in Unix nanoseconds. A key held back until then is held back for good.
// Saturating there, rather than at math.MaxInt64, leaves room for every sum a decision
// makes (t + n×T <= MaxTAT + MaxTau).
const MaxTAT = math.MaxInt64 - 2*MaxTau

// AddSat returns a + b, saturated to the range of int64 instead of wrapping around.
func AddSat(a, b int64) int64 {
	s := a + b
	switch {
	case a > 0 && b > 0 && s < 0:
		return math.MaxInt64
	case a < 0 && b < 0 && s >= 0:
		return math.MinInt64
	}
	return s
}

// MulSat returns a × b for a, b >= 0, saturated at math.MaxInt64.
func MulSat(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

// After returns the time d after now (a penalty's end, a charge's TAT), saturated at
// MaxTAT: a duration too long for an int64 of nanoseconds holds back for good rather than
// wrapping into the past.
func After(now, d int64) int64 { return min(AddSat(now, d), MaxTAT) }

// Errors returned by the core. The sluice package re-exports them.
var (
	// ErrCostExceedsBurst: a request for more permits than the smallest burst of its limits
	// can never be granted, so it is refused rather than left to wait for ever.
	ErrCostExceedsBurst = errors.New("sluice: cost exceeds burst")
	// ErrInvalidCost: a negative cost.
	ErrInvalidCost = errors.New("sluice: negative cost")
	// ErrInvalidLimits: no limits, more than MaxLimits, or a limit with T <= 0 or Tau < T.
	ErrInvalidLimits = errors.New("sluice: invalid limits")
)

// Limit is one rate limit in core units: an emission interval T (nanoseconds per permit)
// and a burst tolerance Tau = Burst*T. The zero value is invalid.
//
// With Window > 0 it is instead a quota of Burst permits per fixed window of that many
// nanoseconds, aligned to multiples of Window since the Unix epoch, with T =
// floor(Window/Burst): see the package documentation, "Fixed windows".
type Limit struct {
	T      int64 // emission interval in nanoseconds, > 0
	Tau    int64 // burst tolerance in nanoseconds, a multiple of T in [T, MaxTau]
	Window int64 // 0 for GCRA; else the window's length in nanoseconds, >= Tau and <= MaxTau
	Origin int64 // with Window: the Unix time in nanoseconds of the caller's now = 0
	Ramp   Ramp  // the zero value: no ramp, or one the caller applies itself (see Ramp)
	// Rise, when not nil, is the ramp this limit is at a point of (T and Tau are the
	// limit in force at now): Decide spaces a booking at the limit in force where it
	// falls (see Rise). Owned by the caller, read only.
	Rise *Rise
}

// Ramp is a limit's ramp-up for a backend that applies it itself from shared state (the
// lease mode, whose allocation ramps the whole pool together): the limit starts at one
// permit every T0 nanoseconds (T0 >= T) and its rate rises linearly to its own, 1/T, over
// Over nanoseconds from when the shared state of the limit was made. The zero value is no
// ramp. The functions of this package ignore it: a caller that ramps a limit itself
// passes the limit in force at each decision instead, without a Ramp.
type Ramp struct {
	T0   int64 // the interval at the start, >= T
	Over int64 // how long the rate takes to rise to 1/T, > 0
}

// IsZero reports whether r is no ramp.
func (r Ramp) IsZero() bool { return r == Ramp{} }

// Burst is the number of permits the limit grants at once after an idle spell.
func (l Limit) Burst() int64 { return l.Tau / l.T }

// Keeping returns l for a decision that must leave keep (a fraction, 0 to 1) of the burst
// unspent: its tolerance less keep × Burst permits, rounded up to whole permits, so that a
// grant leaves at least that many at its slot. ok is false when that leaves less than one
// permit: the decision can grant nothing. A limit that keeps permits loses its Rise: it
// is decided at the limit in force at now. A windowed quota is returned as it is (its
// tolerance is part of its windows' arithmetic: see the package documentation).
func (l Limit) Keeping(keep float64) (kept Limit, ok bool) {
	if keep <= 0 || l.Window > 0 || l.T <= 0 {
		return l, true
	}
	k := int64(math.Ceil(min(keep, 1) * float64(l.Burst())))
	if k >= l.Burst() {
		return l, false
	}
	l.Tau -= k * l.T
	l.Rise = nil // the ramp's later limits do not keep the reserve: decided at now's limit
	return l, true
}

// Share is the limit scaled to a share (0 < share <= 1) of its rate and burst: T / share,
// rounded up, and the burst times share, rounded down but at least one permit (a share of
// a limit never exceeds it, and can always grant one permit).
func (l Limit) Share(share float64) Limit {
	t := int64(math.Ceil(float64(l.T) / share))
	burst := max(1, int64(math.Floor(float64(l.Burst())*share)))
	if l.Window > 0 { // a share of a quota: its count per window, as long as the window
		t = min(t, l.Window)
		burst = max(1, min(burst, l.Window/t))
		return Limit{T: t, Tau: burst * t, Window: l.Window, Origin: l.Origin}
	}
	t = min(t, MaxTau/burst)
	return Limit{T: t, Tau: burst * t}
}

// Validate reports whether l can be used by Decide.
func (l Limit) Validate() error {
	if l.T <= 0 || l.Tau < l.T || l.Tau > MaxTau || l.Window < 0 || (l.Window > 0 && (l.Window < l.Tau || l.Window > MaxTau)) {
		return fmt.Errorf("%w: T=%d Tau=%d Window=%d", ErrInvalidLimits, l.T, l.Tau, l.Window)
	}
	if !l.Ramp.IsZero() && (l.Ramp.T0 < l.T || l.Ramp.Over <= 0) {
		return fmt.Errorf("%w: ramp from T0=%d over %d (T=%d)", ErrInvalidLimits, l.Ramp.T0, l.Ramp.Over, l.T)
	}
	if l.Rise != nil && (l.Window > 0 || !l.Rise.Valid()) {
		return fmt.Errorf("%w: rise %+v (T=%d Window=%d)", ErrInvalidLimits, *l.Rise, l.T, l.Window)
	}
	return nil
}

// ValidateLimits checks a set of limits for one key.
func ValidateLimits(ls []Limit) error {
	if len(ls) == 0 || len(ls) > MaxLimits {
		return fmt.Errorf("%w: %d limits, want 1 to %d", ErrInvalidLimits, len(ls), MaxLimits)
	}
	for _, l := range ls {
		if err := l.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// MaxCost is the largest cost the limits can ever grant: the smallest burst among them.
func MaxCost(ls []Limit) int64 {
	m := int64(math.MaxInt64)
	for _, l := range ls {
		m = min(m, l.Burst())
	}
	return m
}

// Result is one decision. Durations are nanoseconds relative to the decision's now.
type Result struct {
	// Allowed reports whether the permits were granted (possibly for later use, see Delay).
	Allowed bool
	// Delay is how long the caller must wait before using granted permits (a reservation);
	// 0 when they may be used at once. Zero when denied.
	Delay int64
	// RetryAfter is, when denied, how long until the same request would be granted at once;
	// 0 when allowed.
	RetryAfter int64
	// ResetAfter is how long until the key is back to its full burst.
	ResetAfter int64
	// Remaining is how many permits could still be granted at once after this decision,
	// the smallest over the key's limits.
	Remaining int64
}

// Ticket records a grant so that it can later be cancelled or settled. It is a value:
// copying it is cheap and it holds no reference to the key's state.
type Ticket struct {
	N        int64            // permits granted (and charged)
	At       int64            // when they may be used: now + Delay
	TatAfter [MaxLimits]int64 // each limit's TAT right after the grant
}

// Decide decides n permits at time now for a key whose state is tats (one TAT per limit,
// the zero value meaning a fresh key). maxDelay bounds how far ahead permits may be
// reserved: 0 is pessimistic (deny rather than reserve), a positive value grants
// reservations whose Delay is at most maxDelay (bounded optimism).
//
// On a grant, tats is updated in place; on a denial it is left untouched, so a denial by
// one limit consumes nothing from the others. n = 0 is a query: it is always allowed and
// changes nothing. The caller owns tats and must serialize calls on the same key.
// len(tats) must equal len(limits); the limits must be valid (see ValidateLimits).
func Decide(tats []int64, limits []Limit, now, n, maxDelay int64) (Result, Ticket, error) {
	if n < 0 {
		return Result{}, Ticket{}, ErrInvalidCost
	}
	var delay int64
	var ts [MaxLimits]int64 // each limit's emission interval for this booking (see Rise)
	for i, l := range limits {
		if n > l.Tau/l.T {
			return Result{}, Ticket{}, ErrCostExceedsBurst
		}
		var w int64
		w, ts[i] = waitAt(tats[i], l, now, n)
		delay = max(delay, w)
	}
	if n == 0 {
		delay = 0
	}
	if delay > maxDelay {
		res := Result{RetryAfter: delay, Remaining: math.MaxInt64}
		for i, l := range limits {
			rem, reset := status(tats[i], l, now)
			res.Remaining = min(res.Remaining, rem)
			res.ResetAfter = max(res.ResetAfter, reset)
		}
		return res, Ticket{}, nil
	}
	res := Result{Allowed: true, Delay: delay, Remaining: math.MaxInt64}
	tk := Ticket{N: n, At: now + delay}
	for i, l := range limits {
		if n > 0 && l.Rise != nil {
			tats[i] = max(tats[i], tk.At) + n*ts[i]
		} else if n > 0 {
			tats[i] = take(tats[i], l, tk.At, n)
		}
		tk.TatAfter[i] = tats[i]
		rem, reset := status(tats[i], l, now)
		res.Remaining = min(res.Remaining, rem)
		res.ResetAfter = max(res.ResetAfter, reset)
	}
	return res, tk, nil
}

// DecideOne is Decide for a key with a single limit, without slices: it returns the new TAT
// (equal to tat when denied). It is the hot path of the in-process limiter.
func DecideOne(tat int64, l Limit, now, n, maxDelay int64) (int64, Result, error) {
	if n < 0 {
		return tat, Result{}, ErrInvalidCost
	}
	if n > 1 && n > l.Tau/l.T {
		return tat, Result{}, ErrCostExceedsBurst
	}
	if l.Window > 0 || l.Rise != nil {
		tats := [1]int64{tat}
		res, _, err := Decide(tats[:], []Limit{l}, now, n, maxDelay)
		return tats[0], res, err
	}
	t := max(tat, now)
	delay := Wait(tat, l, now, n)
	if n == 0 {
		return tat, Result{Allowed: true, ResetAfter: t - now, Remaining: max(0, (now+l.Tau-t)/l.T)}, nil
	}
	if delay > maxDelay {
		return tat, Result{RetryAfter: delay, ResetAfter: t - now, Remaining: max(0, (now+l.Tau-t)/l.T)}, nil
	}
	t = max(tat, now+delay) + n*l.T
	return t, Result{Allowed: true, Delay: delay, ResetAfter: t - now, Remaining: max(0, (now+l.Tau-t)/l.T)}, nil
}

// AllowOne is DecideOne for one permit taken now or not at all, without the decision's
// details: the in-process limiter's fastest path (no division). It returns the new TAT
// and whether the permit was granted.
func AllowOne(tat int64, l Limit, now int64) (int64, bool) {
	if l.Window > 0 {
		if at, after := windowSlot(tat, l, now, 1); at == now {
			return after, true
		}
		return tat, false
	}
	t := max(tat, now)
	if t+l.T-l.Tau > now {
		return tat, false
	}
	return t + l.T, true
}

// Adjust settles a grant to its real cost newN at time now. newN = 0 cancels it (the
// permits were never used). newN < t.N refunds the difference. newN > t.N charges the
// difference at once (the API has already counted it), saturating at MaxTAT: a count too
// large to represent holds the key back for good. It returns the updated ticket.
//
// A refund is given only by the newest grant on the key, before its slot has passed. For
// each limit whose TAT still equals the ticket's TatAfter (nothing was granted, charged or
// penalized on it since) while now < TatAfter, the TAT goes back by the refund, as if the
// grant had been for newN. Any other limit gives nothing back. A grant that others were
// stacked on cannot give its place back: they were promised slots on top of it. Refunds
// are therefore safe but may be nothing. docs/architecture.md, "Decisions made while
// building, and why", says why no rule that gives back more is safe.
//
// holdUntil is the end of the key's latest penalty (0 if none): a refund never reopens a
// key before it (see Penalize).
func Adjust(tats []int64, limits []Limit, now int64, t Ticket, newN, holdUntil int64) (Ticket, error) {
	if newN < 0 {
		return t, ErrInvalidCost
	}
	for i, l := range limits {
		switch {
		case newN > t.N && l.Window > 0:
			// The API counted the difference in the window it saw it in: fill that window
			// (the latest the key counts in, or now's), never beyond its count.
			top := tats[i] == t.TatAfter[i]
			e, counted := windowOf(tats[i], l, now)
			base := e
			if counted {
				base = tats[i]
			}
			tats[i] = max(tats[i], min(AddSat(base, MulSat(newN-t.N, l.T)), e+l.Tau))
			if top {
				t.TatAfter[i] = tats[i]
			}
		case newN > t.N:
			top := tats[i] == t.TatAfter[i]
			tats[i] = max(tats[i], After(max(tats[i], now), MulSat(newN-t.N, l.T)))
			if top {
				t.TatAfter[i] = tats[i] // still the newest: a later refund may come off the top
			}
		case newN < t.N:
			passed := now >= t.TatAfter[i] // GCRA: its slot has passed
			if l.Window > 0 {
				passed = t.TatAfter[i] <= l.WindowEnd(now) // its window has ended
			}
			if tats[i] != t.TatAfter[i] || passed || t.TatAfter[i] >= MaxTAT {
				continue // not the newest grant, its slot or window has passed, or its size was lost to saturation
			}
			tats[i] -= MulSat(t.N-newN, l.MinT()) // never more than the grant took (a Rise's)
			t.TatAfter[i] = tats[i]
		}
	}
	Penalize(tats, limits, now, holdUntil)
	t.N = newN
	return t, nil
}

// Penalize holds the key back until `until`: no request is granted before it. It drains the
// limit with the smallest tolerance so that at `until` one permit is available and the key
// goes on at that limit's rate, as a strict API whose Retry-After names its next permit
// would. The other limits keep their state. It is a no-op when until <= now. The caller
// keeps `until` while it is in the future and passes it to Adjust, so that a refund
// cannot reopen the key early.
func Penalize(tats []int64, limits []Limit, now, until int64) {
	if until <= now || len(limits) == 0 {
		return
	}
	until = min(until, MaxTAT)
	k := PenaltyLimit(limits)
	l := limits[k]
	if l.Window > 0 {
		// Only windows: the window holding until is counted full, so the next permit comes
		// at its end (no earlier than until, later by up to a window).
		tats[k] = max(tats[k], min(l.WindowEnd(until), MaxTAT)+l.Tau)
		return
	}
	tats[k] = max(tats[k], until+l.Tau-l.T)
}

// PenaltyLimit is the index of the limit a penalty drains: the first GCRA limit with the
// smallest tolerance, or the first window limit with the smallest if every limit is one.
// limits must not be empty.
func PenaltyLimit(limits []Limit) int {
	k := 0
	for i, l := range limits {
		if (l.Window > 0) == (limits[k].Window > 0) && l.Tau < limits[k].Tau || l.Window == 0 && limits[k].Window > 0 {
			k = i
		}
	}
	return k
}

// Idle reports whether the state is indistinguishable from a fresh key at now (every TAT in
// the past), so it may be forgotten without changing any later decision.
func Idle(tats []int64, now int64) bool {
	for _, t := range tats {
		if t > now {
			return false
		}
	}
	return true
}

// Level is how much of the limit's burst tolerance is left at now for a key whose TAT is
// tat, in nanoseconds (permits × T): Tau when the key is idle, less as permits are taken,
// negative when permits are booked beyond the burst (reservations ahead).
func Level(tat int64, l Limit, now int64) int64 { return l.Tau - (max(tat, now) - now) }

// AtLevel is the TAT that leaves level nanoseconds of l's tolerance at now (Level's
// inverse). A level above Tau is Tau (a bucket holds at most its burst); a negative one, a
// debt, puts the TAT beyond now + Tau.
func AtLevel(l Limit, now, level int64) int64 { return now + l.Tau - min(level, l.Tau) }

// Wait is how long a request of n permits must wait at now, for a key whose TAT is tat,
// before it conforms to l: 0 if it may be granted at once (Decide's Delay, or its
// RetryAfter when denied).
func Wait(tat int64, l Limit, now, n int64) int64 {
	if l.Window > 0 {
		at, _ := windowSlot(tat, l, now, n)
		return at - now
	}
	return max(0, max(tat, now)+n*l.T-l.Tau-now)
}

// waitAt is Wait for a booking under l that may carry a Rise, and the emission interval
// the booking is spaced at: with a Rise, the limit in force where the booking falls (see
// spacing), and never a slot before that point.
func waitAt(tat int64, l Limit, now, n int64) (wait, t int64) {
	if l.Rise == nil {
		return Wait(tat, l, now, n), l.T
	}
	t, tau, x := spacing(tat, l, now)
	return max(x, max(tat, now)+n*t-tau) - now, t
}

// TicketOne is the ticket of a grant of n permits, usable at `at`, under one limit whose
// TAT became tatAfter.
func TicketOne(n, at, tatAfter int64) Ticket {
	t := Ticket{N: n, At: at}
	t.TatAfter[0] = tatAfter
	return t
}

// Debt is what a process admitted without the shared state (a fail mode that decides on a
// local share while the store is cut off), per limit: a GCRA state under the real limits
// in which every permit is pushed through at its time, never refused. What a limit is
// still owed at now is its TAT beyond now: an hourly quota is owed nearly every permit of
// a short outage, a per-second limit almost none (they are in the past, as they are for
// the API). The zero value owes nothing.
type Debt [MaxLimits]int64

// Push records n permits used at `at` under limits.
func (d *Debt) Push(limits []Limit, at, n int64) {
	for i, l := range limits {
		d[i] = After(max(d[i], at), MulSat(n, l.T))
	}
}

// Owed returns, for each of the first k limits, what is still owed at now (nanoseconds of
// the limit's tolerance, to charge to the shared state), and whether anything is.
func (d *Debt) Owed(now int64, k int) (owed [MaxLimits]int64, any bool) {
	for i := range k {
		owed[i] = max(0, d[i]-now)
		any = any || owed[i] > 0
	}
	return owed, any
}

// Merge adds o, a debt that could not be charged, to d, recorded since: an upper bound of
// the two (the later one plus what the earlier still owes at now).
func (d *Debt) Merge(o *Debt, k int, now int64) {
	for i := range k {
		d[i] = After(max(d[i], o[i]), max(0, min(d[i], o[i])-now))
	}
}

// ChargeOwed charges what a Debt owed (Debt.Owed) to the shared state tats at now: each
// limit's TAT goes to max(TAT, now) + owed, as a settlement's charge does (see Adjust).
func ChargeOwed(tats []int64, now int64, owed *[MaxLimits]int64) {
	for i := range tats {
		if owed[i] > 0 {
			tats[i] = max(tats[i], After(max(tats[i], now), owed[i]))
		}
	}
}

// ShareOf is each of limits scaled to share of its rate and burst (Limit.Share), in a new
// slice: the limits a process decides on alone with a share of the whole.
func ShareOf(limits []Limit, share float64) []Limit {
	out := make([]Limit, len(limits))
	for i, l := range limits {
		out[i] = l.Share(share)
	}
	return out
}
