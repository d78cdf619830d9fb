package sluice

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/fairq"
	"github.com/sluicehq/sluice/priority"
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
	return l.reserveWaitingKeeping(ctx, key, n, bound, keepAll)
}

// reserveWaitingKeeping is reserveWaiting, keeping the headroom keep says (see keepFor).
func (l *Limiter) reserveWaitingKeeping(ctx context.Context, key string, n int64, bound time.Duration, keep keeping) (*Reservation, error) {
	if l.shape.Load() == nil {
		return l.reserve(ctx, key, n, 0) // errZero
	}
	start := l.clock.Nanotime()
	for {
		r, err := l.reserveKeeping(ctx, key, n, max(bound-time.Duration(l.clock.Nanotime()-start), 0), keep)
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
// waited for, up to two permits, when it waits again. A member's waiter whose place would
// lie beyond the maximum wait (WithMaxWait) is not refused while the room holds places: it
// is served by member from them. Waits without a member are each their own, served in
// arrival order.
func WithMember(ctx context.Context, member string) context.Context {
	return context.WithValue(ctx, memberKey{}, member)
}

func memberOf(ctx context.Context) string {
	m, _ := ctx.Value(memberKey{}).(string)
	return m
}

// room is the waiting room of one key: its ledger, and the channels that hand the places
// over. The ledger (fairq) knows the waiters of this limiter, whom to serve, and the
// places in the key's line the limiter holds for them. Each place is a reservation, handed
// to a waiter when it comes due. A waiter that gives up leaves its place to the others (or
// to the next to come). The places nobody waits for any more are given back when the last
// waiter goes.
type room struct {
	key   string
	mu    sync.Mutex
	q     *fairq.Ledger[*Reservation]
	chans map[uint64]chan *Reservation // each waiter's, until it is served or leaves
	added chan struct{}                // closed when a place is added, or fails to be
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
		rm = &room{key: key, q: fairq.NewLedger[*Reservation](0, l.fairness == FairProcesses), chans: map[uint64]chan *Reservation{}}
		l.rooms[key] = rm
	}
	rm.mu.Lock()
	rm.q.Enter()
	rm.mu.Unlock()
	return rm
}

// leaveRoom counts the caller out of key's room; the last one out gives back the places
// the room still holds (the latest first, so that each is the key's newest grant in turn
// when nobody else took one since) and drops the room.
func (l *Limiter) leaveRoom(ctx context.Context, key string, rm *room) {
	l.roomsMu.Lock()
	rm.mu.Lock()
	spare, last := rm.q.Exit()
	rm.mu.Unlock()
	if last {
		delete(l.rooms, key)
	}
	l.roomsMu.Unlock()
	for _, r := range spare {
		_ = r.Cancel(context.WithoutCancel(ctx))
	}
}

// due is when r's permits may be used, on the limiter's clock.
func (r *Reservation) due() int64 { return r.at + int64(r.Delay) }

// waitFair is WaitN for one permit: the caller waits in key's room until a place comes due
// and the room serves it. It waits within bound: the limiter's maximum wait and the
// context's deadline, as waitBound gives them. maxWait (> 0) is the part of the bound on
// the limiter's clock, which a timer enforces; the context enforces its own deadline.
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

// waiter is a caller of waitTurn in a room.
type waiter struct {
	rm     *room
	id     uint64
	ch     chan *Reservation // the place served to it
	member string
	start  int64         // when it came, on the limiter's clock
	end    int64         // its maximum wait's end on the limiter's clock; -1: none
	bound  time.Duration // how long it may wait (waitBound)
	expect time.Duration // the wait it first expected, for the observer
}

// waitTurn is one wait of waitFair: until a place is served to the caller. At each turn
// the room's ledger says whether the caller takes a place in line for the room, is
// refused, or sleeps on the clock until the next place comes due (or one is added), when
// the first awake serves the places due (dispatch). Every waiter wakes for every place, so
// that a place is served on time whoever waits and whoever left; it costs a wake-up per
// waiter per permit. Each waiter holds one timer of the limiter's clock, so that
// virtual-time drivers see it asleep.
func (l *Limiter) waitTurn(ctx context.Context, key string, bound, maxWait time.Duration) (*Reservation, error) {
	w := &waiter{rm: l.roomOf(key), id: l.waitSeq.Add(1), ch: make(chan *Reservation, 1), member: memberOf(ctx),
		start: l.clock.Nanotime(), end: -1, bound: bound}
	defer l.leaveRoom(ctx, key, w.rm)
	if maxWait > 0 {
		w.end = w.start + int64(maxWait)
	}
	w.rm.mu.Lock()
	_ = w.rm.q.JoinClass(w.id, w.member, fairClass(priority.Of(ctx))) // ids are unique
	w.rm.chans[w.id] = w.ch
	w.rm.mu.Unlock()
	for first := true; ; first = false {
		if r, done, err := l.turn(ctx, w, first); done {
			return r, err
		}
		at, added := w.rm.next()
		if now := l.clock.Nanotime(); first && at > now {
			w.expect = time.Duration(at - now)
			l.observe(Event{Kind: EventWait, Key: key, N: 1, Wait: w.expect})
		}
		r, err := l.sleep(ctx, w, added, at)
		if r != nil {
			return r, r.Wait(ctx)
		}
		if err != nil {
			return l.giveUp(ctx, w, err)
		}
	}
}

// turn asks the room's ledger what w does next, and does it. When w is refused, or could
// not take a place in line and left the room (see takePlace), w is done with r and err.
// Otherwise it goes on to sleep.
func (l *Limiter) turn(ctx context.Context, w *waiter, first bool) (r *Reservation, done bool, err error) {
	places := 0
	if l.fairness == FairProcesses {
		places = l.placesFor()
	}
	w.rm.mu.Lock()
	if places > 0 {
		w.rm.q.SetPlaces(places)
	}
	act, wait := w.rm.q.Turn(w.id, first, l.clock.Nanotime(), w.start, int64(w.bound))
	if act == fairq.Refuse {
		delete(w.rm.chans, w.id)
	}
	w.rm.mu.Unlock()
	switch act {
	case fairq.Refuse: // even the next place lies beyond the bound: refuse at once
		te := &ThrottledError{Key: w.rm.key, RetryAfter: time.Duration(wait)}
		return &Reservation{l: l, key: w.rm.key, done: true, Decision: Decision{RetryAfter: te.RetryAfter}}, true, te
	case fairq.Take:
		// Without a member, the place a newcomer takes is its own turn: refuse it, taking
		// nothing, if it lies beyond the bound (as Reserve would). Otherwise the turn is not
		// known yet, and the bound ends the wait.
		rbound := time.Duration(-1)
		if first && w.member == "" && l.fairness == FairWaiters {
			rbound = w.bound
		}
		if r, gone, err := l.takePlace(ctx, w, rbound, first); gone {
			l.observe(Event{Kind: EventWait, Key: w.rm.key, N: 1, Wait: w.expect, Err: err})
			return r, true, err
		}
	}
	return nil, false, nil
}

// takePlace takes a place in the key's line for the room, for waiter w (fairq.Take):
// within rbound (< 0: the limiter's maximum wait alone), waiting out an unavailable
// backend as Wait does on the waiter's first turn. gone reports that no place was had and
// the waiter, not served meanwhile, left the room: its wait ends with r and err.
func (l *Limiter) takePlace(ctx context.Context, w *waiter, rbound time.Duration, first bool) (r *Reservation, gone bool, err error) {
	sent := l.clock.Nanotime()
	keep, pctx := keepNone, ctx
	if seen := l.seen.Load() != nil; l.fairness == FairProcesses && (seen || l.classesOut.Load()) {
		// A place in a line every process shares is of the room's highest class waiting,
		// and keeps that class's headroom for higher ones, seen here or in other
		// processes (keepPlace): the other processes' rooms cannot see this one's. A
		// backend that keeps the headroom itself (Capabilities.Classes: the daemon) is
		// told the class, and keeps it there.
		if seen {
			keep = keepPlace
		}
		w.rm.mu.Lock()
		c, ok := w.rm.q.Highest()
		w.rm.mu.Unlock()
		if ok {
			pctx = priority.With(ctx, classOf(c))
		}
	}
	r, err = l.reserveFor(pctx, w.rm.key, rbound, first, keep)
	if err == nil {
		l.notePlaceRTT(l.clock.Nanotime() - sent)
	}
	ok := err == nil && r.Allowed
	w.rm.mu.Lock()
	if ok || err != nil {
		gone = w.rm.q.Took(w.id, r, r.due(), ok)
	} else {
		// The line is full within the bound: a member's waiter waits for the places the
		// room holds (served by member), an anonymous one is refused (fairq.Refused).
		gone = w.rm.q.Refused(w.id, l.clock.Nanotime()+int64(r.RetryAfter))
	}
	if gone {
		delete(w.rm.chans, w.id)
	}
	w.rm.wake() // those waiting for this place take their own, or it
	w.rm.mu.Unlock()
	if gone {
		if err == nil {
			err = &ThrottledError{Key: w.rm.key, RetryAfter: r.RetryAfter}
		}
		return r, true, err
	}
	l.dispatch(ctx, w.rm)
	return nil, false, nil
}

// reserveFor takes a place in key's line for the room: within bound (< 0: the limiter's
// maximum wait alone), waiting out an unavailable backend as Wait does if wait is set,
// keeping the headroom keep says (keepNone or keepPlace).
func (l *Limiter) reserveFor(ctx context.Context, key string, bound time.Duration, wait bool, keep keeping) (*Reservation, error) {
	md := time.Duration(1<<63 - 1)
	if l.maxWait > 0 {
		md = l.maxWait
	}
	if bound >= 0 {
		md = min(md, bound)
	}
	if !wait {
		return l.reserveKeeping(ctx, key, 1, md, keep)
	}
	return l.reserveWaitingKeeping(ctx, key, 1, md, keep)
}

// next returns when the room's next place is due, or -1 and a channel closed when a place
// is added while one is being taken.
func (rm *room) next() (at int64, added chan struct{}) {
	rm.mu.Lock()
	defer rm.mu.Unlock()
	if at, ok := rm.q.Next(); ok {
		return at, nil
	}
	if rm.added == nil {
		rm.added = make(chan struct{})
	}
	return -1, rm.added
}

// sleep waits until at (< 0: until a place is added), or until w's maximum wait ends:
// it returns the place served to w, or the error that ends its wait (its context's, or a
// *ThrottledError at the end), or neither when w must look again (a place was added, or
// came due and was dispatched).
func (l *Limiter) sleep(ctx context.Context, w *waiter, added chan struct{}, at int64) (*Reservation, error) {
	if w.end >= 0 && (at < 0 || w.end < at) {
		at = w.end
	}
	var tc <-chan time.Time
	if at >= 0 {
		t := l.clock.NewTimer(time.Duration(at - l.clock.Nanotime()))
		defer t.Stop()
		tc = t.C()
	}
	select {
	case r := <-w.ch:
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-added:
		return nil, nil
	case <-tc:
		if w.end >= 0 && l.clock.Nanotime() >= w.end {
			return nil, &ThrottledError{Key: w.rm.key}
		}
		l.dispatch(ctx, w.rm)
		return nil, nil
	}
}

// giveUp ends w's wait, which err ended: w leaves the room, and a place served to it as it
// gave up goes to the next waiter.
func (l *Limiter) giveUp(ctx context.Context, w *waiter, err error) (*Reservation, error) {
	rm := w.rm
	rm.mu.Lock()
	left := rm.q.Leave(w.id)
	delete(rm.chans, w.id)
	rm.mu.Unlock()
	if !left { // served as it gave up
		if r := <-w.ch; r != nil {
			rm.mu.Lock()
			rm.q.Put(r, r.due())
			rm.wake()
			rm.mu.Unlock()
			l.dispatch(ctx, rm)
		}
	}
	l.observe(Event{Kind: EventWait, Key: rm.key, N: 1, Wait: w.expect, Err: err})
	r := &Reservation{l: l, key: rm.key, done: true}
	if te, ok := err.(*ThrottledError); ok {
		r.RetryAfter = te.RetryAfter
	}
	return r, err
}

// wake wakes the waiters waiting for a place to be taken. The caller holds rm.mu.
func (rm *room) wake() {
	if rm.added != nil {
		close(rm.added)
		rm.added = nil
	}
}

// dispatch serves the places that have come due. Each goes to the waiter the room's rule
// picks among those free to take it (not still taking a place in line). When every waiter
// is busy the place stays, to be served when the first comes back (it dispatches then). A
// place past due by more than the margin allows (maxLate) has expired: used now, its
// permit could reach the API too close to the next (see WithMargin). So it is given back
// and observed (EventExpired), and its waiter waits for the next place.
func (l *Limiter) dispatch(ctx context.Context, rm *room) {
	var cancel []*Reservation
	var expired int64
	rm.mu.Lock()
	now, maxLate := l.clock.Nanotime(), l.maxLate()
	for {
		out, id, r := rm.q.Pop(now, maxLate)
		if out == fairq.NotDue {
			break
		}
		switch out {
		case fairq.Served:
			ch := rm.chans[id]
			delete(rm.chans, id)
			ch <- r
		case fairq.Expired:
			l.expire(rm.key, r.n(), r.due(), now)
			expired += r.n()
			cancel = append(cancel, r)
		case fairq.Spare:
			cancel = append(cancel, r)
		}
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

// maxLate is how late a permit may be handed to its user, on the limiter's clock. A
// permit later than that has expired. The margin is the tolerance for the whole delay from
// the permit's time to the API seeing the request. The limiter sees only the part until
// the waiter has the permit, so half the margin is kept for the trip to the API (see
// expireAfter, and docs/concepts.md, "The jitter tolerance", for why). Without a margin
// nothing expires (there is no tolerance to keep): math.MaxInt64.
func (l *Limiter) maxLate() int64 {
	if sh := l.shape.Load(); l.margin > 0 && sh != nil {
		return sh.expireAfter
	}
	return math.MaxInt64
}

// expiredAt reports whether a permit due at `due` (limiter clock) is past use at now
// (maxLate). It is the one rule of every waiting path (Reservation.Wait, the rooms, the
// lease mode and the strict mode on Redis through them).
func (l *Limiter) expiredAt(due, now int64) bool { return now-due > l.maxLate() }

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

// maxPlaces is the most places a FairProcesses limiter holds in a key's line at once.
const maxPlaces = 64

// placesFor is how many places a FairProcesses room holds in a key's line: the permits two
// round trips to the line last at the tightest limit's rate (so that one process's
// waiters are not held to one permit a round trip), at least one (a limit whose interval
// is longer: the processes take exact turns), at most maxPlaces.
func (l *Limiter) placesFor() int {
	sh := l.shape.Load()
	rtt := l.placeRTT.Load()
	if sh == nil || rtt <= 0 {
		return 1
	}
	core := sh.core
	if sh.rampEnd != 0 {
		core = sh.coreAt(l.clock.Nanotime())
	}
	var t int64 // the longest interval: the tightest rate
	for _, c := range core {
		t = max(t, c.T)
	}
	if t <= 0 {
		return 1
	}
	return int(min(maxPlaces, max(1, (2*rtt+t-1)/t)))
}

// notePlaceRTT folds a place's round trip (d ns) into the smoothed one (an eighth of the
// news at a time, as TCP's smoothed round trip).
func (l *Limiter) notePlaceRTT(d int64) {
	for {
		old := l.placeRTT.Load()
		nu := d
		if old > 0 {
			nu = old + (d-old)/8
		}
		if l.placeRTT.CompareAndSwap(old, nu) {
			return
		}
	}
}
