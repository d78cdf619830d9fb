package sluice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/keytable"
	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/local"
	"github.com/sluicehq/sluice/priority"
)

// Limiter throttles keys to a set of limits, deciding in its backend (in process by
// default). Its methods are safe for concurrent use. Make one with New; the zero value
// decides nothing (Allow answers false, the other methods backend.ErrClosed), as does a
// closed limiter.
type Limiter struct {
	shape    atomic.Pointer[shape] // the limits in force; nil for the zero value
	be       backend.Backend
	ownsBE   bool
	clock    clock.Clock
	margin   time.Duration
	maxWait  time.Duration
	failMode backend.FailMode
	rampFrom time.Time // WithRampStart; zero: ramps start with New
	observer func(Event)
	log      *slog.Logger
	localOpt []local.Option

	// penalties remembers the penalties issued through this limiter, so that callers
	// already holding a reservation made before one re-queue behind it. Wait skips the
	// lookup while it is empty.
	penalties *keytable.Table[penState]
	penSweep  atomic.Int64 // entries past which Penalize forgets the ended penalties
	penMu     sync.Mutex   // one such sweep at a time
	maxPen    int64        // most entries in penalties (WithMaxKeys)

	fairness    Fairness
	fairnessSet bool         // by WithFairness; else the backend's default (New)
	placeRTT    atomic.Int64 // a place's round trip to the backend, smoothed, in ns (placesFor)
	roomsMu     sync.Mutex
	rooms       map[string]*room // the keys waited on, each with its waiters and places
	waitSeq     atomic.Uint64
	expired     atomic.Int64 // permits not used: past their time by more than the margin

	// The classes (priority.go): the headroom decisions that do not wait keep for higher
	// classes, and when each class last asked for each key (made on the first call that
	// carries a class; nil while none did, or when the backend cannot keep headroom).
	headroom    priority.Headroom
	headroomSet bool
	seen        atomic.Pointer[keytable.Table[classSeen]]
	seenOnce    sync.Once
	seenMu      sync.Mutex // one sweep of seen at a time
	maxSeen     int
	board       backend.ClassBoard // the backend's board of classes across processes, if it has one (set with seen)
	// classesOut: calls name classes, and the backend keeps their headroom itself from
	// each call's class (backend.Capabilities.Classes): seen stays nil.
	classesOut atomic.Bool
}

// Decision is the answer to a request for permits. Being throttled is a normal result,
// not an error.
type Decision struct {
	// Allowed reports whether the permits were granted.
	Allowed bool
	// Delay is how long to wait before using granted permits (a reservation); 0 when they
	// may be used at once.
	Delay time.Duration
	// Remaining is how many permits could still be granted at once.
	Remaining int64
	// RetryAfter is, when denied, how long until the same request would be granted.
	RetryAfter time.Duration
	// ResetAfter is how long until the key is back to its full burst.
	ResetAfter time.Duration
}

func decisionOf(r gcra.Result) Decision {
	return Decision{
		Allowed:    r.Allowed,
		Delay:      time.Duration(r.Delay),
		Remaining:  r.Remaining,
		RetryAfter: time.Duration(r.RetryAfter),
		ResetAfter: time.Duration(r.ResetAfter),
	}
}

// shape is a limiter's limits, and what it derives from them; SetLimits swaps it whole.
type shape struct {
	limits  Limits
	core    []gcra.Limit    // limits tightened by the margin, in the core's units (ramps over)
	allower backend.Allower // the backend's fast path, when it has one and it applies
	ref     allowerRef      // allower, when it takes the limit by reference
	local   *local.Backend  // allower, when it is the in-process backend: called directly (Allow)
	// expireAfter is how late a permit may be handed to its user (see expiredAt and
	// expireAfter).
	expireAfter int64
	margin      time.Duration
	// A ramp runs from rampStart (clock Nanotime) to rampEnd; rampEnd is 0 without one.
	rampStart, rampEnd int64
}

// coreAt is the core in force at now: sh.core, or while a ramp runs the ramp's limits,
// each carrying its ramp (gcra.Limit.Rise) so that a backend that books permits ahead
// spaces each at the ramp's pace where it falls.
func (sh *shape) coreAt(now int64) []gcra.Limit {
	if sh.rampEnd == 0 || now >= sh.rampEnd {
		return sh.core
	}
	c := limitconv.CoreRising(sh.limits, sh.margin, time.Duration(now-sh.rampStart))
	for i := range c {
		c[i].Origin = sh.core[i].Origin
	}
	return c
}

// ramping reports whether sh has a ramp that has not ended at now.
func (sh *shape) ramping(now int64) bool { return sh.rampEnd != 0 && now < sh.rampEnd }

// allowerRef is a backend.Allower that also takes the limit by reference, as the local
// and lease modes' backends do: a limit copied onto the stack for each call is part of the
// fast path's cost.
type allowerRef interface {
	AllowOneRef(ctx context.Context, key string, l *gcra.Limit) (bool, error)
}

// unavailableRetry is the RetryAfter of a failure's denial when the backend gives no hint.
const unavailableRetry = 100 * time.Millisecond

// New returns a limiter that applies limits to every key.
func New(limits Limits, opts ...Option) (*Limiter, error) {
	if err := limits.Validate(); err != nil {
		return nil, err
	}
	l := &Limiter{clock: clock.Default, maxPen: local.DefaultMaxKeys, penalties: keytable.New[penState]()}
	for _, o := range opts {
		o.apply(l)
	}
	if l.failMode == backend.FailDefault {
		l.failMode = backend.FailClosed
	}
	if !l.headroomSet {
		l.headroom = priority.DefaultHeadroom
	}
	if err := l.headroom.Validate(); err != nil {
		return nil, err
	}
	if l.log == nil {
		l.log = slog.Default()
	}
	if l.be == nil {
		l.be = local.New(append([]local.Option{local.WithClock(l.clock)}, l.localOpt...)...)
		l.ownsBE = true
	}
	if !l.fairnessSet && backend.CapabilitiesOf(l.be).SharedLine {
		l.fairness = FairProcesses // processes share the key's line: share it by process
	}
	if err := l.supports(limits); err != nil {
		if l.ownsBE {
			l.be.Close()
		}
		return nil, err
	}
	l.shape.Store(l.newShape(limits, nil))
	return l, nil
}

// MustNew is New that panics on error, for limits fixed in code.
func MustNew(limits Limits, opts ...Option) *Limiter {
	l, err := New(limits, opts...)
	if err != nil {
		panic(err)
	}
	return l
}

// supports returns an error wrapping backend.ErrUnsupported if the backend cannot decide
// limits: a windowed quota or a ramp it does not say it decides (backend.Capabilities), or
// a windowed quota beside a rate where it decides windows only beside windows.
func (l *Limiter) supports(limits Limits) error { return limitconv.Supports(l.be, limits) }

// newShape derives a shape from limits (valid), warning of a margin that costs much of a
// limit's rate. Windows are placed on the Unix time of the limiter's clock; ramps start
// now, or when prev's did if it ramps alike.
func (l *Limiter) newShape(limits Limits, prev *shape) *shape {
	now := l.clock.Nanotime()
	// A backend that ramps the limits itself, from its shared state, is given the limits as
	// they are once the ramps are over, with their ramps.
	shared := backend.CapabilitiesOf(l.be).SharedRamps
	core := limitconv.Core(limits, l.margin)
	if shared {
		core = limitconv.CoreRamped(limits, l.margin)
	}
	sh := &shape{limits: limits, core: core, margin: l.margin}
	origin := l.clock.Now().UnixNano() - now
	for i := range sh.core {
		if sh.core[i].Window > 0 {
			sh.core[i].Origin = origin
		}
	}
	if a, ok := l.be.(backend.Allower); ok && len(sh.core) == 1 {
		sh.allower = a
		sh.ref, _ = a.(allowerRef)
		sh.local, _ = a.(*local.Backend)
	}
	if shared {
		return l.finishShape(limits, sh)
	}
	if over := limitconv.RampOver(limits); over > 0 {
		sh.rampStart = now
		switch {
		case prev != nil && limitconv.SameRamps(prev.limits, limits):
			sh.rampStart = prev.rampStart
		case prev == nil && !l.rampFrom.IsZero():
			sh.rampStart = now - int64(l.clock.Now().Sub(l.rampFrom))
		}
		sh.rampEnd = gcra.AddSat(sh.rampStart, int64(over))
	}
	return l.finishShape(limits, sh)
}

// finishShape completes sh: how late a permit may be handed to its user, and a warning
// of a margin that costs much of a limit's rate.
func (l *Limiter) finishShape(limits Limits, sh *shape) *shape {
	sh.expireAfter = expireAfter(limits, sh.core, l.margin)
	for i, lim := range limits {
		if kept := float64(limitconv.Interval(lim)) / float64(sh.core[i].T); kept < 0.9 {
			l.log.Warn("sluice: the margin costs a limit much of its rate: with a burst this small, permits are spaced by the interval plus the margin",
				"limit", lim.String(), "margin", l.margin, "rate_kept", fmt.Sprintf("%.1f%%", 100*kept),
				"burst_keeping_the_rate", (int64(l.margin)+int64(limitconv.Interval(lim))-1)/int64(limitconv.Interval(lim))+1)
		}
	}
	return sh
}

// expireAfter is how late a permit may be handed to its user: the lateness its limits
// tolerate, less half the margin kept for the trip to the API, and never more than the
// margin. A limit whose permits the margin spaces (burst 1) tolerates the margin. A limit
// whose burst holds the margin in reserve tolerates the reserve's whole tokens: k =
// ceil(margin / interval) intervals, at least the margin. Windowed quotas count permits,
// not their spacing: they tolerate any lateness. docs/concepts.md, "The jitter tolerance",
// works the cases through.
func expireAfter(limits Limits, core []gcra.Limit, margin time.Duration) int64 {
	m := int64(margin)
	after := m
	for i, lim := range limits {
		if lim.Window {
			continue
		}
		t := int64(limitconv.Interval(lim))
		tolerance := m // the margin spaces the permits
		if core[i].T <= t && t > 0 {
			tolerance = (m + t - 1) / t * t // a reserve of whole tokens
		}
		after = min(after, tolerance-m/2)
	}
	return after
}

// SetLimits changes the limits of every key, from the next decision on, safely while
// other goroutines decide (as x/time/rate's SetLimit). A ramp starts when its limit takes
// effect (New or SetLimits), and goes on from where it was when SetLimits keeps it (the
// same ramps on the same rates). Each key keeps its state, which says when the key is
// next due. That permit comes on time under the new limits, neither sooner nor later, and
// the new limits space the ones after it: raising 1/s to 10/s, a key that just took a
// permit gets the next a second later, then ten a second. Permits already reserved stay
// reserved, and settle under the limits they were granted under. The margin applies to
// the new limits as to the first. It returns an error, and changes nothing, if limits are
// not valid.
func (l *Limiter) SetLimits(limits Limits) error {
	if l.shape.Load() == nil {
		return errZero
	}
	if err := limits.Validate(); err != nil {
		return err
	}
	if err := l.supports(limits); err != nil {
		return err
	}
	l.shape.Store(l.newShape(limits, l.shape.Load()))
	return nil
}

// Limits returns the limits in force, as given (before any margin); nil for a zero Limiter.
func (l *Limiter) Limits() Limits {
	if sh := l.shape.Load(); sh != nil {
		return sh.limits
	}
	return nil
}

// rampStart returns when the ramps of the limits in force started (on the limiter's
// clock's wall time), and false if none of them ramps or the backend ramps them itself
// (backend.Capabilities.SharedRamps: the lease mode, whose record keeps when the ramp
// began).
func (l *Limiter) rampStart() (time.Time, bool) {
	sh := l.shape.Load()
	if sh == nil || sh.rampEnd == 0 {
		return time.Time{}, false
	}
	return l.clock.Now().Add(-time.Duration(l.clock.Nanotime() - sh.rampStart)), true
}

// Close closes the backend if the limiter made it. Later calls return backend.ErrClosed.
func (l *Limiter) Close() error {
	if l.ownsBE {
		return l.be.Close()
	}
	return nil
}

// Allow reports whether one permit for key is available now, and takes it if so. It
// answers false as well when no permit could be decided: after Close, on a zero Limiter,
// and when the backend failed and the fail mode is closed (the default). A caller that
// must tell those apart from being throttled calls AllowN(ctx, key, 1), whose error says
// (backend.ErrClosed, or a *backend.UnavailableError with when to retry).
func (l *Limiter) Allow(ctx context.Context, key string) bool {
	sh := l.shape.Load()
	if sh == nil {
		return false
	}
	if sh.allower != nil && l.observer == nil && (sh.rampEnd == 0 || !sh.ramping(l.clock.Nanotime())) &&
		(!priority.Named() && l.seen.Load() == nil || l.keepsNothing(ctx, key, sh.core)) {
		var ok bool
		var err error
		switch {
		case sh.local != nil:
			ok, err = sh.local.AllowOneRef(ctx, key, &sh.core[0])
		case sh.ref != nil:
			ok, err = sh.ref.AllowOneRef(ctx, key, &sh.core[0])
		default:
			ok, err = sh.allower.AllowOne(ctx, key, sh.core[0])
		}
		if err != nil {
			g, _ := l.failed(key, 1, err)
			return g.Allowed
		}
		return ok
	}
	d, _ := l.AllowN(ctx, key, 1)
	return d.Allowed
}

// AllowN takes n permits for key if they are available now. The error is non-nil for a
// bad request (gcra.ErrCostExceedsBurst), a closed or zero limiter (backend.ErrClosed), or
// a backend failure answered by FailClosed. Such a failure matches backend.ErrUnavailable,
// and comes with a denial whose RetryAfter says when to ask again: the backend's hint (see
// backend.UnavailableError), or 100ms. FailOpen answers failures with an allowance and no
// error.
func (l *Limiter) AllowN(ctx context.Context, key string, n int64) (Decision, error) {
	g, err := l.decide(ctx, key, n, 0)
	return decisionOf(g.Result), err
}

// Reserve reserves n permits for key, for now or for later within the limiter's maximum
// wait. The returned reservation says when the permits may be used (Delay); the caller
// must wait that long (Reservation.Wait does), and may Cancel or Settle it. A denial (the
// permits are further ahead than the bound) is a reservation with Allowed false and a nil
// error.
func (l *Limiter) Reserve(ctx context.Context, key string, n int64) (*Reservation, error) {
	md := time.Duration(math.MaxInt64)
	if l.maxWait > 0 {
		md = l.maxWait
	}
	return l.reserve(ctx, key, n, md)
}

// ReserveWithin is Reserve with its own bound: permits further ahead than maxWait are
// denied (0 is pessimistic: now or not at all). The limiter's own maximum wait, if set,
// still applies.
func (l *Limiter) ReserveWithin(ctx context.Context, key string, n int64, maxWait time.Duration) (*Reservation, error) {
	md := max(maxWait, 0)
	if l.maxWait > 0 {
		md = min(md, l.maxWait)
	}
	return l.reserve(ctx, key, n, md)
}

func (l *Limiter) reserve(ctx context.Context, key string, n int64, maxDelay time.Duration) (*Reservation, error) {
	return l.reserveKeeping(ctx, key, n, maxDelay, keepAll)
}

// reserveKeeping is reserve, keeping the headroom keep says (see keepFor).
func (l *Limiter) reserveKeeping(ctx context.Context, key string, n int64, maxDelay time.Duration, keep keeping) (*Reservation, error) {
	sh := l.shape.Load()
	if sh == nil {
		return &Reservation{l: l, key: key, done: true}, errZero
	}
	core := sh.core
	if sh.rampEnd != 0 {
		core = sh.coreAt(l.clock.Nanotime())
	}
	g, err := l.decideKeeping(ctx, core, key, n, maxDelay, keep)
	// The delay counts from the backend's now, which is no later than the answer's arrival:
	// counting it from the arrival puts the permit at or after its slot, never before.
	r := &Reservation{l: l, key: key, Decision: decisionOf(g.Result), core: core, ticket: g.Ticket, at: l.clock.Nanotime()}
	if err != nil || !g.Allowed || g.Ticket.N == 0 {
		r.done = true
	}
	return r, err
}

// Penalize holds every caller of key back until `until`: nothing is granted before then.
// A worker that got a 429 with Retry-After calls it, and the whole pool that shares the
// backend's state holds back. With several limits, the shortest is drained so that one
// permit is available at `until`.
func (l *Limiter) Penalize(ctx context.Context, key string, until time.Time) error {
	sh := l.shape.Load()
	if sh == nil {
		return errZero
	}
	d := until.Sub(l.clock.Now())
	if d <= 0 {
		return nil
	}
	err := l.be.Penalize(ctx, key, sh.coreAt(l.clock.Nanotime()), d)
	if err == nil { // a penalty the backend refused (at its key cap) holds nothing back
		l.remember(key, l.clock.Nanotime(), d)
	}
	l.observe(Event{Kind: EventPenalty, Key: key, Wait: d, Err: err})
	return err
}

// Reset forgets key: any penalty on it is lifted and its next request is decided as a new
// key's, with its whole burst, for every caller that shares the backend's state. It returns
// backend.ErrUnsupported if the backend cannot forget a key (see backend.Resetter).
func (l *Limiter) Reset(ctx context.Context, key string) error {
	if l.shape.Load() == nil {
		return errZero
	}
	if e := l.penalties.Load(key); e != nil {
		e.Val.p.Store(nil)
		l.penalties.Delete(e)
	}
	r, ok := l.be.(backend.Resetter)
	if !ok {
		return fmt.Errorf("%w: the backend cannot forget a key", backend.ErrUnsupported)
	}
	return r.Reset(ctx, key)
}

// minPenaltySweep is the fewest remembered penalties that make Penalize sweep the ended
// ones.
const minPenaltySweep = 1024

// penalty is a hold issued at `issued` until `until` (limiter clock Nanotime).
type penalty struct{ issued, until int64 }

// penState is a key's latest penalty; nil once it is being forgotten (a caller that finds
// it so takes a fresh entry).
type penState struct{ p atomic.Pointer[penalty] }

// remember records a penalty issued at now for d, for the reservations made before it.
func (l *Limiter) remember(key string, now int64, d time.Duration) {
	p := &penalty{issued: now, until: gcra.AddSat(now, int64(d))}
	for {
		e, loaded := l.penalties.LoadOrStore(key, func(s *penState) { s.p.Store(p) })
		if !loaded {
			if n := int64(l.penalties.Len()); n >= max(minPenaltySweep, l.penSweep.Load()) || n > l.maxPen {
				l.sweepPenalties(now)
			}
			return
		}
		old := e.Val.p.Load()
		if old == nil {
			l.penalties.Delete(e) // being forgotten: take a fresh entry
			continue
		}
		if old.until >= p.until || e.Val.p.CompareAndSwap(old, p) {
			return
		}
	}
}

// forgetPenalty forgets key's penalty p, unless a later one replaced it.
func (l *Limiter) forgetPenalty(e *keytable.Entry[penState], p *penalty) {
	if e.Val.p.CompareAndSwap(p, nil) {
		l.penalties.Delete(e)
	}
}

// sweepPenalties forgets the penalties that have ended and, past the cap, the first ones
// met until a tenth of the cap is free. Only a waiter on the key forgets one otherwise, so
// without this a flood of penalties on ever new keys (a daemon's clients) would grow the
// table for good. Penalize sweeps when the table has doubled since the last sweep or passed
// the cap. That keeps it within about twice the penalties in force, and within the cap,
// at a constant cost per penalty.
func (l *Limiter) sweepPenalties(now int64) {
	if !l.penMu.TryLock() {
		return // another goroutine sweeps
	}
	defer l.penMu.Unlock()
	keep := l.maxPen - l.maxPen/10
	for e := range l.penalties.All() {
		if p := e.Val.p.Load(); p != nil && (p.until <= now || int64(l.penalties.Len()) > keep) {
			l.forgetPenalty(e, p)
		}
	}
	l.penSweep.Store(2 * int64(l.penalties.Len()))
}

// penalizedSince reports whether a penalty on key was issued after `since` and is still
// in force at now.
func (l *Limiter) penalizedSince(key string, since, now int64) bool {
	if l.penalties == nil || l.penalties.Len() == 0 {
		return false
	}
	e := l.penalties.Load(key)
	if e == nil {
		return false
	}
	p := e.Val.p.Load()
	if p == nil {
		return false
	}
	if p.until <= now {
		l.forgetPenalty(e, p)
		return false
	}
	return p.issued > since
}

// decide asks the backend under the limits in force and applies the fail mode.
func (l *Limiter) decide(ctx context.Context, key string, n int64, maxDelay time.Duration) (backend.Grant, error) {
	sh := l.shape.Load()
	if sh == nil {
		return backend.Grant{}, errZero
	}
	core := sh.core
	if sh.rampEnd != 0 {
		core = sh.coreAt(l.clock.Nanotime())
	}
	return l.decideIn(ctx, core, key, n, maxDelay)
}

// decideIn is decide under the core limits given, less the headroom the caller's class
// keeps for higher ones (keepFor).
func (l *Limiter) decideIn(ctx context.Context, core []gcra.Limit, key string, n int64, maxDelay time.Duration) (backend.Grant, error) {
	return l.decideKeeping(ctx, core, key, n, maxDelay, keepAll)
}

// decideKeeping is decideIn, keeping the headroom keep says (see keepFor).
func (l *Limiter) decideKeeping(ctx context.Context, core []gcra.Limit, key string, n int64, maxDelay time.Duration, keep keeping) (backend.Grant, error) {
	var start int64
	if l.observer != nil {
		start = l.clock.Nanotime()
	}
	var g backend.Grant
	var err error
	ok := true // the headroom for a higher class leaves something to grant
	req := backend.Request{Limits: core, N: n, MaxDelay: maxDelay}
	if p := priority.Of(ctx); p != priority.Standard || l.seen.Load() != nil {
		// Declared here: the limits may point into it and escape to the back end, so it
		// is on the heap, and only a decision with classes pays for it.
		var buf [gcra.MaxLimits]gcra.Limit
		if p != priority.Standard {
			l.prioritize()
		}
		req.Limits, ok, g.RetryAfter = l.keepFor(ctx, p, key, core, l.clock.Nanotime(), keep, &buf)
		if ok && &req.Limits[0] != &core[0] {
			req.Core = core // the limits keep headroom: the key's own go beside them
		}
	}
	if ok {
		g, err = l.be.Decide(ctx, key, req)
		if err != nil {
			g, err = l.failed(key, n, err)
		}
	}
	if l.observer != nil {
		l.observer(Event{Kind: EventDecision, Key: key, N: n, Decision: decisionOf(g.Result),
			Latency: time.Duration(l.clock.Nanotime() - start), Err: err})
	}
	return g, err
}

// failed turns a backend error into the fail mode's answer.
func (l *Limiter) failed(key string, n int64, err error) (backend.Grant, error) {
	switch {
	case errors.Is(err, gcra.ErrCostExceedsBurst), errors.Is(err, gcra.ErrInvalidCost),
		errors.Is(err, gcra.ErrInvalidLimits), errors.Is(err, backend.ErrClosed):
		return backend.Grant{}, fmt.Errorf("sluice: key %q, cost %d: %w", key, n, err)
	}
	l.observe(Event{Kind: EventError, Key: key, N: n, Err: err, FailMode: l.failMode})
	if l.failMode == backend.FailOpen {
		return backend.Grant{Result: gcra.Result{Allowed: true}}, nil
	}
	if errors.Is(err, backend.ErrUnavailable) {
		err = fmt.Errorf("sluice: key %q: %w", key, err)
	} else { // backend.ErrTooManyKeys, or a backend's own failure
		err = fmt.Errorf("%w: key %q: %w", backend.ErrUnavailable, key, err)
	}
	hint, ok := backend.RetryAfter(err)
	if !ok {
		hint = unavailableRetry
	}
	// The denial says when to ask again, as a throttled one does: callers that read only
	// the decision (the daemon's answer, RetryAfter headers) do not retry at once.
	return backend.Grant{Result: gcra.Result{RetryAfter: int64(hint)}}, err
}

func (l *Limiter) observe(e Event) {
	if l.observer != nil {
		l.observer(e)
	}
}
