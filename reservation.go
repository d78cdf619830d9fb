package sluice

import (
	"context"
	"sync"
	"time"

	"github.com/sluicehq/sluice/gcra"
)

// Reservation is a grant of permits, possibly for later. Its Decision says whether it was
// granted and when the permits may be used. It can be cancelled (the permits were not
// used) or settled to the real cost once known (an LLM API reports its token count in
// the response). Its methods are safe for concurrent use; Cancel and Settle act once.
type Reservation struct {
	Decision

	l      *Limiter
	key    string
	at     int64 // limiter clock's Nanotime when the decision arrived; Delay counts from it
	mu     sync.Mutex
	ticket gcra.Ticket
	done   bool

	core []gcra.Limit // the limits it was decided under (SetLimits may change the limiter's)
}

// n returns the permits the reservation holds (its cost, after any settlement).
func (r *Reservation) n() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ticket.N
}

// Slot returns when the permits may be used, as the backend decided it: nanoseconds in
// the backend's own time base (Redis TIME for the strict mode on Redis, the process's
// monotonic clock for the local one). Decisions of one backend can be audited against
// each other with it: the slots of all grants of a key conform to its limits exactly.
// Not so for the lease mode's permits decided at the store (a limit too small to share
// out, a borrow): the member slots them on its own clock from when it sent its request,
// up to a store round trip before the store booked them, so their slots may sit that much
// early against each other; their use counts from the answer and is never early (audit
// the permits' use there: docs/lease.md). Zero for a denial.
func (r *Reservation) Slot() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.Allowed {
		return 0
	}
	return r.ticket.At
}

// TimeToAct returns when the permits may be used, on the limiter's clock.
func (r *Reservation) TimeToAct() time.Time {
	return r.l.clock.Now().Add(time.Duration(r.at + int64(r.Delay) - r.l.clock.Nanotime()))
}

// Wait blocks until the permits may be used. If ctx ends first it cancels the reservation
// (giving the permits back) and returns ctx's error. A denied reservation returns a
// *ThrottledError at once.
//
// If the key is penalized through the same limiter after the reservation was made (a
// worker got a 429), the reservation is given back and taken anew behind the penalty, so
// permits promised before the 429 do not all land at the API when it ends. The new
// reservation is bounded as the first was; if it cannot be had, Wait returns a
// *ThrottledError.
//
// With a margin (WithMargin), a permit must reach the API within the margin of its time.
// If Wait would return later than the margin allows, because its caller or its machine
// was paused, the permit has expired. Wait then gives it back (Cancel), tells the
// observer (EventExpired) and returns ErrPermitExpired, and the caller may ask again. The
// lateness allowed is what the limit tolerates less half the margin, kept for the trip to
// the API, and at most the margin: half the margin with burst 1 (docs/concepts.md, "The
// jitter tolerance").
func (r *Reservation) Wait(ctx context.Context) error {
	if !r.Allowed {
		return &ThrottledError{Key: r.key, RetryAfter: r.RetryAfter}
	}
	for {
		left := time.Duration(r.at + int64(r.Delay) - r.l.clock.Nanotime())
		if left > 0 {
			r.l.observe(Event{Kind: EventWait, Key: r.key, N: r.n(), Wait: left})
			if err := r.l.clock.Sleep(ctx, left); err != nil {
				_ = r.Cancel(context.WithoutCancel(ctx))
				r.l.observe(Event{Kind: EventWait, Key: r.key, N: r.n(), Wait: left, Err: err})
				return err
			}
		}
		if now := r.l.clock.Nanotime(); r.l.expiredAt(r.due(), now) {
			n := r.n()
			r.l.expire(r.key, n, r.due(), now)
			_ = r.Cancel(context.WithoutCancel(ctx))
			r.l.reportExpired(ctx, r.key, n)
			return ErrPermitExpired
		} else if !r.l.penalizedSince(r.key, r.at, now) {
			return nil
		}
		if err := r.requeue(ctx); err != nil {
			return err
		}
	}
}

// requeue gives the reservation back and takes a new one for the same cost. It holds the
// reservation's lock throughout, as Settle does, so that a concurrent Cancel or Settle acts
// on the old ticket before or on the new one after, never on the old one a second time (a
// second refund of a ticket can take back the permits of the grant that replaced it).
func (r *Reservation) requeue(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return nil // settled or cancelled meanwhile: the caller owns what happens next
	}
	_ = r.l.be.Adjust(context.WithoutCancel(ctx), r.key, r.core, r.ticket, 0)
	core := r.l.shape.Load().coreAt(r.l.clock.Nanotime())
	g, err := r.l.decideIn(ctx, core, r.key, r.ticket.N, r.l.waitBound(ctx))
	r.Decision = decisionOf(g.Result)
	r.core, r.ticket = core, g.Ticket
	r.at = r.l.clock.Nanotime()
	if err != nil {
		r.done = true
		return err
	}
	if !g.Allowed {
		r.done = true
		return &ThrottledError{Key: r.key, RetryAfter: r.RetryAfter}
	}
	return nil
}

// Cancel gives the permits back: they were not used. Only the key's newest grant gives
// anything back (nothing granted or penalized on the key since, see gcra.Adjust): a
// reservation others were stacked on keeps its place, so that their permits are never
// granted twice. It is a no-op on a denied, cancelled or settled reservation.
func (r *Reservation) Cancel(ctx context.Context) error { return r.Settle(ctx, 0) }

// Settle adjusts the reservation to its real cost n: less refunds the difference when it
// is the key's newest grant (as Cancel), more charges the difference at once. Only the
// first Cancel or Settle acts.
func (r *Reservation) Settle(ctx context.Context, n int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done || n == r.ticket.N {
		r.done = true
		return nil
	}
	r.done = true
	err := r.l.be.Adjust(ctx, r.key, r.core, r.ticket, n)
	if err == nil {
		r.ticket.N = n
	}
	r.l.observe(Event{Kind: EventSettle, Key: r.key, N: n, Err: err})
	return err
}
