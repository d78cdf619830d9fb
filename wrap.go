package sluice

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/sluicehq/sluice/clock"
)

type reservationKey struct{}

// ReservationFromContext returns the reservation Do or Wrap took for the call running with
// ctx, or nil.
func ReservationFromContext(ctx context.Context) *Reservation {
	r, _ := ctx.Value(reservationKey{}).(*Reservation)
	return r
}

// Do runs f once key's permit is granted: Wrap's throttling as a call. By default it
// waits for the permit (optimistic, bounded by the limiter's maximum wait, MaxWait and
// ctx); with Pessimistic it fails with ErrThrottled unless a permit is free now. f's
// context carries the reservation (ReservationFromContext), so f can settle its real
// cost. If waiting fails, f is not called and the reservation is cancelled (see
// Reservation.Cancel for what that gives back).
func (l *Limiter) Do(ctx context.Context, key string, f func(context.Context) error, opts ...CallOption) error {
	c := callConfig{cost: 1}
	for _, o := range opts {
		o.applyCall(&c)
	}
	var r *Reservation
	var err error
	switch {
	case c.pessimistic:
		r, err = l.reserve(ctx, key, c.cost, 0)
	case c.cost == 1 && l.shape.Load() != nil:
		md, mw := l.waitBound(ctx), l.maxWait
		if c.maxWait > 0 {
			md = min(md, c.maxWait)
			if mw <= 0 || c.maxWait < mw {
				mw = c.maxWait
			}
		}
		if r, err = l.waitFair(ctx, key, md, mw); err != nil {
			return err
		}
		return f(context.WithValue(ctx, reservationKey{}, r))
	default:
		md := l.waitBound(ctx)
		if c.maxWait > 0 {
			md = min(md, c.maxWait)
		}
		r, err = l.reserveWaiting(ctx, key, c.cost, md) // waits out an unavailable backend too
	}
	if err != nil {
		return err
	}
	if err := r.Wait(ctx); err != nil {
		return err
	}
	return f(context.WithValue(ctx, reservationKey{}, r))
}

// Wrap turns f into a throttled function with the same signature: every call takes key's
// permit first, as Do does (a decorator: a function in, a throttled function out). A call
// that is throttled returns the zero R and an error matching ErrThrottled.
func Wrap[A, R any](l *Limiter, key string, f func(context.Context, A) (R, error), opts ...CallOption) func(context.Context, A) (R, error) {
	return func(ctx context.Context, a A) (R, error) {
		var out R
		err := l.Do(ctx, key, func(ctx context.Context) error {
			var err error
			out, err = f(ctx, a)
			return err
		}, opts...)
		return out, err
	}
}

// Backoff retries calls that were throttled, with capped exponential back-off and random
// jitter (jitter breaks the spontaneous order in which unlucky pessimistic callers never
// win). The zero value uses the defaults given per field.
type Backoff struct {
	Base     time.Duration  // first back-off; default 50ms
	Max      time.Duration  // cap on one back-off; default 30s
	Jitter   float64        // extra random fraction of each back-off, in [0, 1]; default 0.2
	Attempts int            // calls in all, first included; default 10
	Clock    clock.Clock    // default clock.Default
	Rand     func() float64 // uniform in [0,1); default math/rand/v2
}

// Retry calls f until it returns an error that is not ErrThrottled (nil included), the
// attempts run out (the last error is returned), or ctx ends. Between attempts it sleeps
// the larger of the back-off and the error's RetryAfter, plus jitter.
func (b Backoff) Retry(ctx context.Context, f func(context.Context) error) error {
	attempts := b.Attempts
	if attempts <= 0 {
		attempts = 10
	}
	c := b.Clock
	if c == nil {
		c = clock.Default
	}
	rnd := b.Rand
	if rnd == nil {
		rnd = rand.Float64
	}
	for i := 1; ; i++ {
		err := f(ctx)
		if err == nil || !errors.Is(err, ErrThrottled) || i >= attempts {
			return err
		}
		var retryAfter time.Duration
		var te *ThrottledError
		if errors.As(err, &te) {
			retryAfter = te.RetryAfter
		}
		if err := c.Sleep(ctx, b.delay(i, retryAfter, rnd())); err != nil {
			return err
		}
	}
}

// delay is the sleep after the attempt-th throttled attempt (1 for the first): the
// back-off, Base doubled for each attempt before and capped at Max, or retryAfter if
// longer, plus Jitter times u (uniform in [0, 1)) of it.
func (b Backoff) delay(attempt int, retryAfter time.Duration, u float64) time.Duration {
	base, maxB, jitter := b.Base, b.Max, b.Jitter
	if base <= 0 {
		base = 50 * time.Millisecond
	}
	if maxB <= 0 {
		maxB = 30 * time.Second
	}
	if jitter <= 0 {
		jitter = 0.2
	}
	jitter = min(jitter, 1)
	back := min(base, maxB)
	for i := 1; i < attempt && back < maxB; i++ {
		back = min(back*2, maxB)
	}
	d := max(back, retryAfter)
	return d + time.Duration(float64(d)*jitter*u)
}
