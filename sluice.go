package sluice

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/local"
)

// Errors callers can branch on.
var (
	// ErrThrottled: the request was not granted within the bound the caller set (a
	// pessimistic call, or a wait longer than allowed). Errors wrapping it are
	// *ThrottledError values carrying RetryAfter.
	ErrThrottled = errors.New("sluice: throttled")
	// ErrCostExceedsBurst: more permits than the smallest burst can ever grant at once.
	ErrCostExceedsBurst = gcra.ErrCostExceedsBurst
	// ErrClosed: the limiter has been closed.
	ErrClosed = backend.ErrClosed
	// ErrTooManyKeys: the backend holds its maximum number of keys.
	ErrTooManyKeys = backend.ErrTooManyKeys
	// ErrUnavailable wraps a backend failure that the fail mode answered with a denial.
	ErrUnavailable = backend.ErrUnavailable
	// ErrUnsupported: the backend cannot do what was asked (see Limiter.Reset).
	ErrUnsupported = backend.ErrUnsupported
)

// ThrottledError is a denial reported as an error (Wait, Do, Wrap). It matches
// ErrThrottled with errors.Is.
type ThrottledError struct {
	Key        string
	RetryAfter time.Duration // when the same request could be granted at once
}

func (e *ThrottledError) Error() string {
	return fmt.Sprintf("sluice: throttled: key %q: retry after %v", e.Key, e.RetryAfter)
}

// Is reports whether target is ErrThrottled.
func (e *ThrottledError) Is(target error) bool { return target == ErrThrottled }

// FailMode says what a limiter answers when its backend cannot decide (a store or peers
// unreachable, a key cap reached): see docs/concepts.md, "Fail modes". The limiter itself
// answers FailClosed (the default) or FailOpen; FailLocal is a backend's (the lease mode's
// default, the redis mode's WithFailLocal), and a limiter set to it answers a failure its
// backend could not absorb as FailClosed.
type FailMode = backend.FailMode

// Fail modes.
const (
	FailDefault = backend.FailDefault // FailClosed, for a limiter
	FailClosed  = backend.FailClosed
	FailOpen    = backend.FailOpen
	FailLocal   = backend.FailLocal
)

// ParseFailMode reads "closed", "open" or "local".
func ParseFailMode(s string) (FailMode, error) { return backend.ParseFailMode(s) }

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

// DefaultMargin is the jitter tolerance a limiter uses unless WithMargin says otherwise:
// zero, so decisions conform to the limit exactly as given. A pool that calls a strict API
// over a network should set a margin at least as large as the spread of the delay between
// a decision and the API seeing the request (see WithMargin).
const DefaultMargin = 0

// Limiter throttles keys to a set of limits, deciding in its backend (in process by
// default). Its methods are safe for concurrent use. Make one with New; the zero value is
// not usable.
type Limiter struct {
	limits   Limits
	core     []gcra.Limit
	maxCost  int64
	be       backend.Backend
	allower  backend.Allower // be's fast path, when it has one and it applies
	ownsBE   bool
	clock    clock.Clock
	margin   time.Duration
	maxWait  time.Duration
	failMode FailMode
	observer Observer
	localOpt []local.Option

	// penalties remembers the penalties issued through this limiter (key -> penalty), so
	// that callers already holding a reservation made before one re-queue behind it.
	penalties sync.Map
	npen      atomic.Int64 // entries in penalties: Wait skips the lookup when zero
	penSweep  atomic.Int64 // entries past which Penalize forgets the ended penalties
	penMu     sync.Mutex   // one such sweep at a time
	maxPen    int64        // most entries in penalties (WithMaxKeys)
}

// minPenaltySweep is the fewest remembered penalties that make Penalize sweep the ended
// ones.
const minPenaltySweep = 1024

// penalty is a hold issued at `issued` until `until` (limiter clock Nanotime).
type penalty struct{ issued, until int64 }

// Option configures a Limiter.
type Option interface{ apply(*Limiter) }

type optionFunc func(*Limiter)

func (f optionFunc) apply(l *Limiter) { f(l) }

// WithBackend makes the limiter decide in b instead of in process. The limiter does not
// close b: its owner does.
func WithBackend(b backend.Backend) Option {
	return optionFunc(func(l *Limiter) { l.be = b })
}

// WithClock sets the clock used for waits and, for the default backend, for decisions
// (default clock.Default).
func WithClock(c clock.Clock) Option { return optionFunc(func(l *Limiter) { l.clock = c }) }

// WithMargin sets the jitter tolerance J, the safety margin of docs/concepts.md (default
// DefaultMargin, zero). The API sees each request later than the limiter decided it, by a
// varying delay; decisions then conform to a tightened limit: with Burst > 1, ceil(J/T)
// permits of the burst are kept in reserve (nearly free); with Burst = 1, permits are
// spaced T + J apart (costing J/T of the rate). A permit must then be used within J of
// its time.
func WithMargin(j time.Duration) Option {
	return optionFunc(func(l *Limiter) { l.margin = j })
}

// WithMaxWait bounds how far ahead Reserve reserves and how long Wait and Do wait (seed
// 000's bound on reserved permits: back pressure instead of an unbounded queue). Zero or
// less means no bound beyond the context's deadline (the default).
func WithMaxWait(d time.Duration) Option {
	return optionFunc(func(l *Limiter) { l.maxWait = d })
}

// WithFailMode sets what the limiter answers when its backend fails (default FailClosed).
func WithFailMode(m FailMode) Option { return optionFunc(func(l *Limiter) { l.failMode = m }) }

// WithObserver sets a hook told of every decision, wait, penalty and backend error.
func WithObserver(o Observer) Option { return optionFunc(func(l *Limiter) { l.observer = o }) }

// WithMaxKeys caps the keys the default in-process backend holds (default
// local.DefaultMaxKeys); new keys past the cap, when none is idle, follow the fail mode.
// It also caps the penalties the limiter remembers to re-queue reservations behind (see
// Reservation.Wait), whatever the backend: past it the oldest are forgotten (the backend
// still holds every key back; only a reservation made before a forgotten penalty is not
// re-queued). n <= 0 means no cap.
func WithMaxKeys(n int) Option {
	return optionFunc(func(l *Limiter) {
		l.localOpt = append(l.localOpt, local.WithMaxKeys(n))
		l.maxPen = int64(n)
		if n <= 0 {
			l.maxPen = math.MaxInt64
		}
	})
}

// New returns a limiter that applies limits to every key.
func New(limits Limits, opts ...Option) (*Limiter, error) {
	if err := limits.Validate(); err != nil {
		return nil, err
	}
	l := &Limiter{limits: limits, clock: clock.Default, margin: DefaultMargin, maxPen: local.DefaultMaxKeys}
	for _, o := range opts {
		o.apply(l)
	}
	if l.failMode == FailDefault {
		l.failMode = FailClosed
	}
	l.core = limits.Core(l.margin)
	l.maxCost = gcra.MaxCost(l.core)
	if l.be == nil {
		l.be = local.New(append([]local.Option{local.WithClock(l.clock)}, l.localOpt...)...)
		l.ownsBE = true
	}
	if a, ok := l.be.(backend.Allower); ok && len(l.core) == 1 {
		l.allower = a
	}
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

// Limits returns the limits as given (before any margin).
func (l *Limiter) Limits() Limits { return l.limits }

// Backend returns the backend the limiter decides in.
func (l *Limiter) Backend() backend.Backend { return l.be }

// Clock returns the limiter's clock.
func (l *Limiter) Clock() clock.Clock { return l.clock }

// MaxCost returns the most permits one request can be granted (the smallest burst, after
// the margin).
func (l *Limiter) MaxCost() int64 { return l.maxCost }

// Close closes the backend if the limiter made it. Later calls return ErrClosed.
func (l *Limiter) Close() error {
	if l.ownsBE {
		return l.be.Close()
	}
	return nil
}

// Allow reports whether one permit for key is available now, and takes it if so.
func (l *Limiter) Allow(ctx context.Context, key string) bool {
	if l.allower != nil && l.observer == nil {
		ok, err := l.allower.AllowOne(ctx, key, l.core[0])
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
// bad request (ErrCostExceedsBurst), a closed limiter, or a backend failure answered by
// FailClosed (wrapping ErrUnavailable, with a denial); FailOpen answers failures with an
// allowance and no error.
func (l *Limiter) AllowN(ctx context.Context, key string, n int) (Decision, error) {
	g, err := l.decide(ctx, key, int64(n), 0)
	return decisionOf(g.Result), err
}

// Reserve reserves n permits for key, for now or for later within the limiter's maximum
// wait. The returned reservation says when the permits may be used (Delay); the caller
// must wait that long (Reservation.Wait does), and may Cancel or Settle it. A denial (the
// permits are further ahead than the bound) is a reservation with Allowed false and a nil
// error.
func (l *Limiter) Reserve(ctx context.Context, key string, n int) (*Reservation, error) {
	md := time.Duration(math.MaxInt64)
	if l.maxWait > 0 {
		md = l.maxWait
	}
	return l.reserve(ctx, key, int64(n), md)
}

// ReserveWithin is Reserve with its own bound: permits further ahead than maxWait are
// denied (0 is pessimistic: now or not at all). The limiter's own maximum wait, if set,
// still applies.
func (l *Limiter) ReserveWithin(ctx context.Context, key string, n int, maxWait time.Duration) (*Reservation, error) {
	md := max(maxWait, 0)
	if l.maxWait > 0 {
		md = min(md, l.maxWait)
	}
	return l.reserve(ctx, key, int64(n), md)
}

func (l *Limiter) reserve(ctx context.Context, key string, n int64, maxDelay time.Duration) (*Reservation, error) {
	g, err := l.decide(ctx, key, n, maxDelay)
	// The delay counts from the backend's now, which is no later than the answer's arrival:
	// counting it from the arrival puts the permit at or after its slot, never before.
	r := &Reservation{l: l, key: key, Decision: decisionOf(g.Result), ticket: g.Ticket, at: l.clock.Nanotime()}
	if err != nil || !g.Allowed || g.Ticket.N == 0 {
		r.done = true
	}
	return r, err
}

// Wait blocks until one permit for key is available and takes it, or returns an error:
// ctx's error if it ends first (the permit is then cancelled: given back if no grant was
// made on the key since, see Reservation.Cancel), or a *ThrottledError if the permit lies
// beyond ctx's deadline or the limiter's maximum wait (nothing is taken).
func (l *Limiter) Wait(ctx context.Context, key string) error {
	_, err := l.WaitN(ctx, key, 1)
	return err
}

// WaitN is Wait for n permits. It returns the reservation, which may be settled once the
// real cost is known.
func (l *Limiter) WaitN(ctx context.Context, key string, n int) (*Reservation, error) {
	md := l.waitBound(ctx)
	r, err := l.reserve(ctx, key, int64(n), md)
	if err != nil {
		return r, err
	}
	if !r.Allowed {
		return r, &ThrottledError{Key: key, RetryAfter: r.RetryAfter}
	}
	return r, r.Wait(ctx)
}

// waitBound is how long a wait may last: the limiter's maximum, cut to the context's
// deadline.
func (l *Limiter) waitBound(ctx context.Context) time.Duration {
	md := time.Duration(math.MaxInt64)
	if l.maxWait > 0 {
		md = l.maxWait
	}
	if dl, ok := ctx.Deadline(); ok {
		// Context deadlines are real time, whatever the limiter's clock.
		md = min(md, max(time.Until(dl), 0))
	}
	return md
}

// Penalize holds every caller of key back until `until`: nothing is granted before then.
// A worker that got a 429 with Retry-After calls it, and the whole pool that shares the
// backend's state holds back. With several limits, the shortest is drained so that one
// permit is available at `until`.
func (l *Limiter) Penalize(ctx context.Context, key string, until time.Time) error {
	d := until.Sub(l.clock.Now())
	if d <= 0 {
		return nil
	}
	err := l.be.Penalize(ctx, key, l.core, d)
	if err == nil { // a penalty the backend refused (at its key cap) holds nothing back
		l.remember(key, l.clock.Nanotime(), d)
	}
	l.observe(Event{Kind: EventPenalty, Key: key, Wait: d, Err: err})
	return err
}

// Reset forgets key: any penalty on it is lifted and its next request is decided as a new
// key's, with its whole burst, for every caller that shares the backend's state. It returns
// ErrUnsupported if the backend cannot forget a key (see backend.Resetter).
func (l *Limiter) Reset(ctx context.Context, key string) error {
	if v, ok := l.penalties.LoadAndDelete(key); ok && v != nil {
		l.npen.Add(-1)
	}
	r, ok := l.be.(backend.Resetter)
	if !ok {
		return fmt.Errorf("%w: the backend cannot forget a key", ErrUnsupported)
	}
	return r.Reset(ctx, key)
}

// remember records a penalty issued at now for d, for the reservations made before it.
func (l *Limiter) remember(key string, now int64, d time.Duration) {
	p := penalty{issued: now, until: gcra.AddSat(now, int64(d))}
	for {
		v, loaded := l.penalties.LoadOrStore(key, p)
		if !loaded {
			if n := l.npen.Add(1); n >= max(minPenaltySweep, l.penSweep.Load()) || n > l.maxPen {
				l.sweepPenalties(now)
			}
			return
		}
		if old := v.(penalty); old.until >= p.until || l.penalties.CompareAndSwap(key, old, p) {
			return
		}
	}
}

// sweepPenalties forgets the penalties that have ended and, past the cap, the first ones
// met until a tenth of the cap is free. Only a waiter on the key forgets one otherwise, so
// without this a flood of penalties on ever new keys (a daemon's clients) would grow the
// map for good; sweeping when it has doubled since the last sweep or passed the cap keeps
// it within about twice the penalties in force, and within the cap, at a constant cost
// per penalty.
func (l *Limiter) sweepPenalties(now int64) {
	if !l.penMu.TryLock() {
		return // another goroutine sweeps
	}
	defer l.penMu.Unlock()
	keep := l.maxPen - l.maxPen/10
	l.penalties.Range(func(k, v any) bool {
		if (v.(penalty).until <= now || l.npen.Load() > keep) && l.penalties.CompareAndDelete(k, v) {
			l.npen.Add(-1)
		}
		return true
	})
	l.penSweep.Store(2 * l.npen.Load())
}

// penalizedSince reports whether a penalty on key was issued after `since` and is still
// in force at now.
func (l *Limiter) penalizedSince(key string, since, now int64) bool {
	if l.npen.Load() == 0 {
		return false
	}
	v, ok := l.penalties.Load(key)
	if !ok {
		return false
	}
	p := v.(penalty)
	if p.until <= now {
		if l.penalties.CompareAndDelete(key, v) {
			l.npen.Add(-1)
		}
		return false
	}
	return p.issued > since
}

// decide asks the backend and applies the fail mode.
func (l *Limiter) decide(ctx context.Context, key string, n int64, maxDelay time.Duration) (backend.Grant, error) {
	var start int64
	if l.observer != nil {
		start = l.clock.Nanotime()
	}
	g, err := l.be.Decide(ctx, key, backend.Request{Limits: l.core, N: n, MaxDelay: maxDelay})
	if err != nil {
		g, err = l.failed(key, n, err)
	}
	if l.observer != nil {
		l.observer.Observe(Event{Kind: EventDecision, Key: key, N: n, Decision: decisionOf(g.Result),
			Latency: time.Duration(l.clock.Nanotime() - start), Err: err})
	}
	return g, err
}

// failed turns a backend error into the fail mode's answer.
func (l *Limiter) failed(key string, n int64, err error) (backend.Grant, error) {
	switch {
	case errors.Is(err, gcra.ErrCostExceedsBurst), errors.Is(err, gcra.ErrInvalidCost),
		errors.Is(err, gcra.ErrInvalidLimits), errors.Is(err, ErrClosed):
		return backend.Grant{}, fmt.Errorf("sluice: key %q, cost %d: %w", key, n, err)
	}
	l.observe(Event{Kind: EventError, Key: key, N: n, Err: err, FailMode: l.failMode})
	if l.failMode == FailOpen {
		return backend.Grant{Result: gcra.Result{Allowed: true}}, nil
	}
	return backend.Grant{}, fmt.Errorf("%w: key %q: %w", ErrUnavailable, key, err)
}

func (l *Limiter) observe(e Event) {
	if l.observer != nil {
		l.observer.Observe(e)
	}
}
