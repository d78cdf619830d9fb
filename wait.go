package sluice

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/internal/fairq"
)

// Wait blocks until one permit for key is available and takes it, or returns an error:
// ctx's error if it ends first (its place in the key's line goes to the limiter's other
// waiters, or is given back when none is left: see Reservation.Cancel for what that gives
// back), or a *ThrottledError if the permit lies beyond ctx's deadline or the limiter's
// maximum wait (nothing is taken).
//
// The limiter's waiters on a key are served in arrival order, or fairly between members
// when their contexts carry one (WithMember); see WithFairness and docs/concepts.md, "Fair
// waiting". A waiter whose permit expires as it is handed over (the process was paused
// past the margin: ErrPermitExpired) waits for the next instead.
func (l *Limiter) Wait(ctx context.Context, key string) error {
	_, err := l.WaitN(ctx, key, 1)
	return err
}

// WaitN is Wait for n permits. It returns the reservation, which may be settled once the
// real cost is known. Waits for one permit go through the key's waiting room (as Wait);
// waits for more reserve their own place in arrival order.
//
// While the backend is unavailable and says when to try again (a
// *backend.UnavailableError) and the limiter fails closed, WaitN waits too: it asks again
// after the error's RetryAfter, as long as its context and maximum wait allow, and returns
// the error when they do not.
func (l *Limiter) WaitN(ctx context.Context, key string, n int64) (*Reservation, error) {
	if n == 1 && l.shape.Load() != nil {
		return l.waitFair(ctx, key, l.waitBound(ctx), l.maxWait)
	}
	r, err := l.reserveWaiting(ctx, key, n, l.waitBound(ctx))
	if err != nil {
		return r, err
	}
	if !r.Allowed {
		return r, &ThrottledError{Key: key, RetryAfter: r.RetryAfter}
	}
	return r, r.Wait(ctx)
}

// reserveWaiting is reserve for callers that wait (Wait, Do): a backend failure answered
// closed is waited out, asking again after the error's RetryAfter, for as long as the wait
// bound allows (the limiter's maximum wait, the context's deadline). bound is that bound
// at the start; each retry asks for what is left of it.
func (l *Limiter) reserveWaiting(ctx context.Context, key string, n int64, bound time.Duration) (*Reservation, error) {
	if l.shape.Load() == nil {
		return l.reserve(ctx, key, n, 0) // errZero
	}
	start := l.clock.Nanotime()
	for {
		r, err := l.reserve(ctx, key, n, max(bound-time.Duration(l.clock.Nanotime()-start), 0))
		hint, ok := backend.RetryAfter(err)
		if !ok || hint > bound-time.Duration(l.clock.Nanotime()-start) {
			return r, err // a decision, another error, or the bound ends before the retry
		}
		if l.clock.Sleep(ctx, hint) != nil { // each failure was observed (EventError)
			return r, err // the context ended: the backend's failure says more than ctx's
		}
	}
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

type memberKey struct{}

// WithMember returns a copy of ctx that names the member a wait is made for: a worker, a
// tenant, a client. A limiter's waiters on one key are served fairly between members (each
// member waiting gets an equal part of the permits, however many of its goroutines wait),
// and a member whose wait ends before its turn (its deadline passed) is owed what it
// waited for, up to two permits, when it waits again. Waits without a member are each
// their own, served in arrival order.
func WithMember(ctx context.Context, member string) context.Context {
	return context.WithValue(ctx, memberKey{}, member)
}

func memberOf(ctx context.Context) string {
	m, _ := ctx.Value(memberKey{}).(string)
	return m
}

// room is the waiting room of one key: the waiters of this limiter (fairq decides whom
// to serve) and the places in the key's line the limiter holds for them, each a
// reservation handed to a waiter when it comes due. A waiter that gives up leaves its
// place to the others (or to the next to come); the places nobody waits for any more are
// given back when the last waiter goes.
type room struct {
	key       string
	mu        sync.Mutex
	q         *fairq.Room
	slots     []*Reservation // places held, earliest first
	chans     map[uint64]chan served
	reserving int           // reservations being made for the room
	added     chan struct{} // closed when a place is added
	refs      int           // waiters in WaitN for this room
}

type served struct {
	r   *Reservation
	err error
}

// roomOf returns key's room, counting the caller in.
func (l *Limiter) roomOf(key string) *room {
	l.roomsMu.Lock()
	defer l.roomsMu.Unlock()
	if l.rooms == nil {
		l.rooms = map[string]*room{}
	}
	rm := l.rooms[key]
	if rm == nil {
		rm = &room{key: key, q: fairq.New(0), chans: map[uint64]chan served{}}
		l.rooms[key] = rm
	}
	rm.refs++
	return rm
}

// leaveRoom counts the caller out of key's room; the last one out gives back the places
// the room still holds (the latest first, so that each is the key's newest grant in turn
// when nobody else took one since) and drops the room.
func (l *Limiter) leaveRoom(ctx context.Context, key string, rm *room) {
	l.roomsMu.Lock()
	rm.refs--
	if rm.refs > 0 {
		l.roomsMu.Unlock()
		return
	}
	delete(l.rooms, key)
	l.roomsMu.Unlock()
	rm.mu.Lock()
	spare := rm.slots
	rm.slots = nil
	rm.mu.Unlock()
	for _, r := range slices.Backward(spare) {
		_ = r.Cancel(context.WithoutCancel(ctx))
	}
}

// due is when r's permits may be used, on the limiter's clock.
func (r *Reservation) due() int64 { return r.at + int64(r.Delay) }

// waitFair is WaitN for one permit: the caller waits in key's room until a place comes due
// and the room serves it, within bound (the limiter's maximum wait and the context's
// deadline, as waitBound gives them); maxWait (> 0) is the part of the bound on the
// limiter's clock, which a timer enforces (the context enforces its own deadline).
//
// A permit that expires as it is handed over (the waiter was not scheduled in time: see
// ErrPermitExpired) is given back and the waiter waits again, within the same bounds.
func (l *Limiter) waitFair(ctx context.Context, key string, bound, maxWait time.Duration) (*Reservation, error) {
	start := l.clock.Nanotime()
	for {
		r, err := l.waitTurn(ctx, key, bound, maxWait)
		if err != ErrPermitExpired {
			return r, err
		}
		spent := time.Duration(l.clock.Nanotime() - start)
		bound = max(bound-spent, 0)
		if maxWait > 0 {
			maxWait = max(maxWait-spent, 1)
		}
	}
}

// waitTurn is one wait of waitFair: until a place is served to the caller.
func (l *Limiter) waitTurn(ctx context.Context, key string, bound, maxWait time.Duration) (*Reservation, error) {
	member := memberOf(ctx)
	rm := l.roomOf(key)
	defer l.leaveRoom(ctx, key, rm)
	id := l.waitSeq.Add(1)
	ch := make(chan served, 1)
	start := l.clock.Nanotime()

	rm.mu.Lock()
	_ = rm.q.Join(id, member) // ids are unique
	rm.chans[id] = ch
	rm.mu.Unlock()

	// Each waiter sleeps on the clock until the room's next place comes due, then serves
	// the places due (the first awake does). Every waiter wakes for every place, so that a
	// place is served on time whoever waits and whoever left; it costs a wake-up per waiter
	// per permit. Each waiter holds one timer of the limiter's clock, so that virtual-time
	// drivers see it asleep.
	end := int64(-1) // the maximum wait's end on the limiter's clock
	if maxWait > 0 {
		end = start + int64(maxWait)
	}
	var err error
	var expect time.Duration // the wait first expected, for the observer
	first := true
wait:
	for ; ; first = false {
		// The room holds a place for each of its waiters (FairWaiters), or one
		// (FairProcesses); a waiter that finds one missing takes it.
		rm.mu.Lock()
		need := len(rm.slots)+rm.reserving < rm.q.Waiting()
		if l.fairness == FairProcesses {
			need = len(rm.slots)+rm.reserving == 0 && rm.q.Waiting() > 0
		}
		if need {
			// Busy until its place is taken: a place that comes due meanwhile goes to a
			// waiter that can take it at once, not to this one, which could not until its
			// reservation returns (in the lease mode, not before a renewal covers it).
			rm.reserving++
			rm.q.Busy(id, true)
		} else if first && len(rm.slots) > 0 && time.Duration(rm.slots[0].due()-start) > bound {
			// Even the next place lies beyond the bound: refuse at once.
			rm.q.Leave(id)
			delete(rm.chans, id)
			wait := time.Duration(rm.slots[0].due() - start)
			rm.mu.Unlock()
			return &Reservation{l: l, key: key, done: true, Decision: Decision{RetryAfter: wait}}, &ThrottledError{Key: key, RetryAfter: wait}
		}
		rm.mu.Unlock()
		if need {
			// Without a member, the place a newcomer takes is its own turn: refuse it,
			// taking nothing, if it lies beyond the bound (as Reserve would). Otherwise the
			// turn is not known yet, and the bound ends the wait.
			rbound := time.Duration(-1)
			if first && member == "" && l.fairness == FairWaiters {
				rbound = bound
			}
			r, err := l.reserveFor(ctx, key, rbound, first)
			rm.mu.Lock()
			rm.reserving--
			rm.q.Busy(id, false)
			if err == nil && r.Allowed {
				rm.add(r)
				rm.mu.Unlock()
			} else {
				rm.wake() // those waiting for this place take their own
				left := rm.q.Leave(id)
				delete(rm.chans, id)
				rm.mu.Unlock()
				if left { // not served meanwhile from a place that came due
					if err == nil {
						err = &ThrottledError{Key: key, RetryAfter: r.RetryAfter}
					}
					l.observe(Event{Kind: EventWait, Key: key, N: 1, Wait: expect, Err: err})
					return r, err
				}
			}
			l.dispatch(ctx, rm)
		}
		rm.mu.Lock()
		at := int64(-1)
		var added chan struct{}
		if len(rm.slots) > 0 {
			at = rm.slots[0].due()
		} else { // a place is being taken: wait for it
			if rm.added == nil {
				rm.added = make(chan struct{})
			}
			added = rm.added
		}
		rm.mu.Unlock()
		if first && at > l.clock.Nanotime() {
			expect = time.Duration(at - l.clock.Nanotime())
			l.observe(Event{Kind: EventWait, Key: key, N: 1, Wait: expect})
		}
		if end >= 0 && (at < 0 || end < at) {
			at = end
		}
		var tc <-chan time.Time
		var t clock.Timer
		if at >= 0 {
			t = l.clock.NewTimer(time.Duration(at - l.clock.Nanotime()))
			tc = t.C()
		}
		select {
		case s := <-ch:
			if t != nil {
				t.Stop()
			}
			if s.err != nil {
				return s.r, s.err
			}
			return s.r, s.r.Wait(ctx)
		case <-ctx.Done():
			err = ctx.Err()
		case <-added:
			if t != nil {
				t.Stop()
			}
			continue
		case <-tc:
			if end >= 0 && l.clock.Nanotime() >= end {
				err = &ThrottledError{Key: key}
				break wait
			}
			l.dispatch(ctx, rm)
			continue
		}
		if t != nil {
			t.Stop()
		}
		break
	}
	rm.mu.Lock()
	left := rm.q.Leave(id)
	delete(rm.chans, id)
	rm.mu.Unlock()
	if !left { // served as it gave up: the place goes to the next waiter
		if s := <-ch; s.r != nil {
			rm.mu.Lock()
			rm.add(s.r)
			rm.mu.Unlock()
			l.dispatch(ctx, rm)
		}
	}
	l.observe(Event{Kind: EventWait, Key: key, N: 1, Wait: expect, Err: err})
	r := &Reservation{l: l, key: key, done: true}
	if te, ok := err.(*ThrottledError); ok {
		r.RetryAfter = te.RetryAfter
	}
	return r, err
}

// reserveFor takes a place in key's line for the room: within bound (< 0: the limiter's
// maximum wait alone), waiting out an unavailable backend as Wait does if wait is set.
func (l *Limiter) reserveFor(ctx context.Context, key string, bound time.Duration, wait bool) (*Reservation, error) {
	md := time.Duration(1<<63 - 1)
	if l.maxWait > 0 {
		md = l.maxWait
	}
	if bound >= 0 {
		md = min(md, bound)
	}
	if !wait {
		return l.reserve(ctx, key, 1, md)
	}
	return l.reserveWaiting(ctx, key, 1, md)
}

// add inserts the place r in due order. The caller holds rm.mu.
func (rm *room) add(r *Reservation) {
	i, _ := slices.BinarySearchFunc(rm.slots, r.due(), func(s *Reservation, due int64) int {
		if s.due() <= due {
			return -1
		}
		return 1
	})
	rm.slots = slices.Insert(rm.slots, i, r)
	rm.wake()
}

// wake wakes the waiters waiting for a place to be taken. The caller holds rm.mu.
func (rm *room) wake() {
	if rm.added != nil {
		close(rm.added)
		rm.added = nil
	}
}

// dispatch serves the places that have come due, each to the waiter the room's rule
// picks among those free to take it (not still taking a place in line: fairq.Busy); when
// every waiter is busy the place stays, to be served when the first comes back (it
// dispatches then). A place past due by more than the margin allows (expiredAt) has
// expired: used now, its permit could reach the API too close to the next (see
// WithMargin), so it is given back and observed (EventExpired), and its waiter waits for
// the next place.
func (l *Limiter) dispatch(ctx context.Context, rm *room) {
	var cancel []*Reservation
	var expired int64
	rm.mu.Lock()
	now := l.clock.Nanotime()
	for len(rm.slots) > 0 && rm.slots[0].due() <= now {
		r := rm.slots[0]
		rm.slots = rm.slots[1:]
		if l.expiredAt(r.due(), now) {
			l.expire(rm.key, r.n(), r.due(), now)
			expired += r.n()
			cancel = append(cancel, r)
			continue
		}
		id, ok := rm.q.Serve()
		if !ok && rm.q.Waiting() > 0 { // every waiter busy
			rm.slots = slices.Insert(rm.slots, 0, r)
			break
		}
		if !ok {
			cancel = append(cancel, r)
			continue
		}
		ch := rm.chans[id]
		delete(rm.chans, id)
		ch <- served{r: r}
	}
	rm.mu.Unlock()
	for _, r := range cancel {
		_ = r.Cancel(context.WithoutCancel(ctx))
	}
	if expired > 0 {
		l.reportExpired(ctx, rm.key, expired)
	}
}

// reportExpired tells the backend of n permits of key that expired, if it wants to know
// (backend.ExpiryReporter: the daemon's client, so that the daemon counts them), after
// they were given back and outside every lock.
func (l *Limiter) reportExpired(ctx context.Context, key string, n int64) {
	if r, ok := l.be.(backend.ExpiryReporter); ok {
		_ = r.ReportExpired(context.WithoutCancel(ctx), key, n)
	}
}

// expiredAt reports whether a permit due at `due` (limiter clock) is past use at now: more
// late than the margin allows. The margin is the tolerance for the whole delay from the
// permit's time to the API seeing the request, and the limiter sees only the part until
// the waiter has it: half the margin is kept for the rest, the trip to the API (see
// expireAfter; on a loaded machine, permits handed over at the margin's very end reached
// the demo's referee too close to the next one). Without a margin nothing expires (there
// is no tolerance to keep). It is the one rule of every
// waiting path (Reservation.Wait, the rooms, the lease and redis modes through them).
func (l *Limiter) expiredAt(due, now int64) bool {
	sh := l.shape.Load()
	return l.margin > 0 && sh != nil && now-due > sh.expireAfter
}

// expire counts n permits due at `due` that expired at now, and tells the observer.
func (l *Limiter) expire(key string, n, due, now int64) {
	l.expired.Add(n)
	l.observe(Event{Kind: EventExpired, Key: key, N: n, Wait: time.Duration(now - due)})
}

// waiting returns how many callers wait in key's room (for tests).
func (l *Limiter) waiting(key string) int {
	l.roomsMu.Lock()
	rm := l.rooms[key]
	l.roomsMu.Unlock()
	if rm == nil {
		return 0
	}
	rm.mu.Lock()
	defer rm.mu.Unlock()
	return rm.q.Waiting()
}
