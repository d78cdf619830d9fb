package sluice

import (
	"log/slog"
	"math"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/local"
)

// Option configures a Limiter, in New. Every option is a function (With...) returning one.
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

// WithMargin sets the jitter tolerance J, the safety margin of docs/concepts.md, "The
// jitter tolerance". The API sees each request later than the limiter decided it, by a
// varying delay. With a margin, decisions conform to a tightened limit. With Burst > 1,
// ceil(J/T) permits of the burst are kept in reserve, T being the limit's interval
// (Period/Rate): this costs nearly nothing. With Burst = 1, permits are spaced T + J
// apart, which costs J/T of the rate. A permit must then reach the API within J of its
// time (see Reservation.Wait).
//
// The default is zero: decisions conform to the limits exactly as given. A pool that
// calls a strict API over a network should set a margin at least as large as the spread
// of the delay between a decision and the API seeing the request.
//
// A margin that costs a limit more than a tenth of its rate (with burst 1, a margin above a
// tenth of the interval: WithMargin(time.Second) turns 100/s burst=1 into about 1/s) is
// logged as a warning (WithLogger), with the burst that would keep the whole rate.
func WithMargin(j time.Duration) Option {
	return optionFunc(func(l *Limiter) { l.margin = j })
}

// WithLogger sets where the limiter logs its warnings (a margin that costs a limit much of
// its rate); default slog.Default(). It logs nothing else.
func WithLogger(log *slog.Logger) Option { return optionFunc(func(l *Limiter) { l.log = log }) }

// WithMaxWait bounds how far ahead Reserve reserves and how long Wait and Do wait. The
// bound is back pressure instead of an unbounded queue, as in the Redis permit design
// (docs/concepts.md, "Where each design came from"). Zero or less means no bound beyond
// the context's deadline (the default).
func WithMaxWait(d time.Duration) Option {
	return optionFunc(func(l *Limiter) { l.maxWait = d })
}

// WithFailMode sets what the limiter answers when its backend cannot decide (a store or
// peers unreachable, a key cap reached): see docs/concepts.md, "Fail modes". The limiter
// itself answers backend.FailClosed (the default) or backend.FailOpen. backend.FailLocal
// is a backend's own mode: the lease mode's default, and strict.WithFailLocal on Redis. A
// limiter set to it answers a failure its backend could not absorb as FailClosed.
func WithFailMode(m backend.FailMode) Option {
	return optionFunc(func(l *Limiter) { l.failMode = m })
}

// Fairness says how a limiter shares a key among the callers that wait on it (Wait, WaitN
// for one permit, Do and Transport). Whatever it is, the permits a key grants conform to
// its limits: it only says who gets them. See docs/concepts.md, "Fair waiting".
type Fairness int

const (
	// FairWaiters (the default of a backend in the process: local, lease, gossip): each
	// waiter holds its own place in the key's line, in the backend, so that waiters are
	// served in the order they came, across every process that shares the backend.
	// Waiters of one limiter that carry a member (WithMember) are served by member
	// instead: fairly between members, whatever each one's number of waiters, and a
	// member whose waits end before its turn is owed it for its next.
	FairWaiters Fairness = iota
	// FairProcesses (the default of a backend whose line every process shares: the
	// strict mode, a daemon; backend.Capabilities.SharedLine): the limiter holds a few
	// places in the key's line at a time, whatever its number of waiters, and serves its
	// own waiters from them in turn (by member, then in arrival order). Processes sharing
	// a key then get equal parts of it, round robin, however many goroutines each one has.
	// It holds one place where a permit's interval is longer than two of its round trips
	// to the line (a tight limit: exact turns), and as many as the permits two round
	// trips last otherwise (a fast limit: one process is not held to a permit a round
	// trip), at most 64.
	FairProcesses
)

// WithFairness sets how the limiter shares a key among its waiters (default: FairProcesses
// where the backend's line is shared by every process, FairWaiters otherwise).
func WithFairness(f Fairness) Option {
	return optionFunc(func(l *Limiter) { l.fairness, l.fairnessSet = f, true })
}

// WithRampStart makes the ramps of the limits given to New start at t instead of when
// New is called: a process that replaces a limiter (a daemon reloading its rules) keeps
// the ramp where it was. A t in the future starts them then. A backend that ramps limits
// itself (backend.Capabilities.SharedRamps: the lease mode, whose record keeps when the
// ramp began) ignores it.
func WithRampStart(t time.Time) Option { return optionFunc(func(l *Limiter) { l.rampFrom = t }) }

// WithObserver sets a hook told of every decision, wait, penalty, settlement, expired
// permit and backend error, so library users get metrics without the daemon (see Event).
// It is called synchronously on the caller's goroutine, possibly from many goroutines at
// once: it must be safe for concurrent use and fast (count, do not block).
func WithObserver(observe func(Event)) Option {
	return optionFunc(func(l *Limiter) { l.observer = observe })
}

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

// CallOption configures one call of Do, or every call of a function Wrap returns. It is a
// type of its own, not an Option, so that the compiler refuses an option of the limiter
// (WithBackend, WithMargin...) in a call, where it would mean nothing, and the reverse.
type CallOption interface{ applyCall(*callConfig) }

type callConfig struct {
	pessimistic bool
	maxWait     time.Duration
	cost        int64
}

type callOptionFunc func(*callConfig)

func (f callOptionFunc) applyCall(c *callConfig) { f(c) }

// Pessimistic makes the call run only if a permit is available now, and fail with a
// *ThrottledError (ErrThrottled) otherwise: a pessimistic throttle, which drops the call
// instead of waiting. Pair it with Retry for jittered back-off.
func Pessimistic() CallOption { return callOptionFunc(func(c *callConfig) { c.pessimistic = true }) }

// MaxWait makes the call wait for its permit at most d (the optimistic throttle with a
// bound); a permit further ahead fails with ErrThrottled at once, taking nothing. It
// narrows the limiter's own maximum wait and the context's deadline.
func MaxWait(d time.Duration) CallOption {
	return callOptionFunc(func(c *callConfig) { c.maxWait = d })
}

// Cost makes each call take n permits (default 1). When the real cost is known only after
// the call, take an estimate here and settle it inside the call with
// ReservationFromContext(ctx).Settle.
func Cost(n int64) CallOption { return callOptionFunc(func(c *callConfig) { c.cost = n }) }
