package sim

import "github.com/sluicehq/sluice/gcra"

// idealMode is the reference no real system can beat, which every other mode is compared
// with on the same arrivals: one central GCRA decision, with no store and no latency to it,
// under the exact limits the referee holds (no margin; a ramp followed in the steps of
// utilization's ideal throttle) and the token limits, if any; a FIFO of waiters per member, the members served in turn (round robin, which is max-min
// fair: a member that asks for less than the others gets all it asks for, the rest is
// shared equally); nobody is ever denied (the queue is unbounded, whatever max_wait says).
//
// It decides each permit for the instant its request will reach the API: it knows the
// request's network delay (and whether it will be lost) before the request leaves, as a
// throttle inside the API itself would, and sends it that long before its permit's time.
// Requests reach the API at the times they were granted for, under the same limits, so the
// referee agrees with every one of them: no violation (but for a limit changed, or a
// member paused, between a decision and its request's arrival: a paused member's permit
// that falls due while it sleeps is given up and asked for again, never sent late). They
// may reach it in another order than they were granted (a later grant with a shorter
// way): the referee judges them in the order of their times, which a GCRA (and a window)
// accepts whenever it accepts them in any other order, leaving a state no fuller (swap two
// grants out of order: each is still allowed, the later state no later), so the ideal
// never waits for a slow request's way before it grants the next.
type idealMode struct {
	tats  []int64 // the central state of the limits on requests (e.idealCore)
	ttats []int64 // and of the token limits (e.idealTokCore), if any

	lines  []fifo[waiter] // each member's waiters, in the order they asked
	turn   fifo[int32]    // the members with waiters, in turn: the first is served next
	inTurn []bool

	// next is the waiter being served: taken from its line, its network delay drawn,
	// waiting for the limit to allow its permit at the API (a tick at its departure).
	next    waiter
	hasNext bool
	ticking bool   // a tick is scheduled for next
	tickGen uint32 // a tick of an older generation is stale (the limit changed, a penalty)
	// delays[m][g] is the delay drawn for the request of member m's goroutine g granted
	// last, which sendToAPI gives it (apiDelay)
	delays [][]int64
}

// fifo is a queue on a slice: pushed at the back, taken from the front, its room reused
// once half of it has been taken.
type fifo[T any] struct {
	s []T
	h int
}

func (q *fifo[T]) len() int { return len(q.s) - q.h }

func (q *fifo[T]) push(v T) {
	if q.h > 0 && q.h >= len(q.s)/2 {
		q.s = q.s[:copy(q.s, q.s[q.h:])]
		q.h = 0
	}
	q.s = append(q.s, v)
}

// front is the first element; the queue must not be empty.
func (q *fifo[T]) front() *T { return &q.s[q.h] }

func (q *fifo[T]) pop() {
	if q.h++; q.h == len(q.s) {
		q.s, q.h = q.s[:0], 0
	}
}

// waiter is a goroutine waiting for a permit; lat is its request's delay to the API (once
// drawn, when it is next; -1: the request will be lost).
type waiter struct {
	m, g int32
	op   uint32
	lat  int64
}

// idealLost marks a delay whose request is lost on the way.
const idealLost = -1

func newIdealMode() *idealMode { return &idealMode{} }

func (*idealMode) name() string { return "ideal" }

// setup sizes the mode's state to the engine's members, on the first request.
func (im *idealMode) setup(e *engine) {
	im.tats = make([]int64, len(e.idealCore))
	im.ttats = make([]int64, len(e.idealTokCore))
	im.lines = make([]fifo[waiter], len(e.members))
	im.inTurn = make([]bool, len(e.members))
	im.delays = make([][]int64, len(e.members))
	for i, m := range e.members {
		im.delays[i] = make([]int64, len(m.gs))
	}
}

func (im *idealMode) acquire(e *engine, mi, g int32) {
	if im.lines == nil {
		im.setup(e)
	}
	im.lines[mi].push(waiter{m: mi, g: g, op: e.members[mi].ops[g]})
	if !im.inTurn[mi] {
		im.inTurn[mi] = true
		im.turn.push(mi)
	}
	im.serve(e)
}

// valid reports whether a waiter still waits (its member did not leave, its goroutine
// did not give up).
func (*idealMode) valid(e *engine, w *waiter) bool {
	m := e.members[w.m]
	return m.present && m.ops[w.g] == w.op
}

// take removes the next waiter in turn from its line: the first of the member whose turn
// it is, which goes to the back of the turn if it has more. It reports false when no one
// waits.
func (im *idealMode) take(e *engine) (waiter, bool) {
	for im.turn.len() > 0 {
		mi := *im.turn.front()
		im.turn.pop()
		line := &im.lines[mi]
		for line.len() > 0 && !im.valid(e, line.front()) {
			line.pop()
		}
		if line.len() == 0 {
			im.inTurn[mi] = false
			continue
		}
		w := *line.front()
		line.pop()
		if line.len() > 0 {
			im.turn.push(mi)
		} else {
			im.inTurn[mi] = false
		}
		return w, true
	}
	return waiter{}, false
}

// serve grants permits to the waiters in turn while the limits allow one for the instant
// its request would reach the API; the first that must wait gets a tick at its departure.
func (im *idealMode) serve(e *engine) {
	for !im.ticking {
		if im.hasNext && !im.valid(e, &im.next) {
			im.hasNext = false
		}
		if !im.hasNext {
			w, ok := im.take(e)
			if !ok {
				return
			}
			// The request's way to the API, drawn as sendToAPI would draw it.
			w.lat = idealLost
			if !e.lost(&e.sc.Network.API) {
				w.lat = e.latency(&e.sc.Network.API)
			}
			im.next, im.hasNext = w, true
		}
		w := &im.next
		if w.lat == idealLost {
			// It never reaches the API: it takes no permit.
			im.hasNext = false
			im.delays[w.m][w.g] = idealLost
			e.permit(w.m, w.g, e.now)
			continue
		}
		at := e.now + w.lat
		if at >= e.end && e.windowed {
			// A window that opens as the run ends is not the run's (as for utilization's
			// ideal throttle): nothing more is granted.
			return
		}
		ok, retry, err := im.decide(e, at, e.members[w.m].gs[w.g].cost)
		if err != nil {
			// More than a burst: no limit ever allows it.
			im.hasNext = false
			e.denied(w.m, w.g, 0)
			continue
		}
		if !ok {
			im.ticking = true
			e.schedule(event{at: at + retry - w.lat, kind: evIdealTick, m: -1, op: im.tickGen})
			return
		}
		im.hasNext = false
		im.delays[w.m][w.g] = w.lat
		e.permit(w.m, w.g, at-w.lat)
	}
}

// decide grants one request of cost tokens at API time at under every limit, or tells how
// long after at it would be granted: as the referee judges, on copies, so that a refusal
// by one limit consumes nothing from the others.
func (im *idealMode) decide(e *engine, at, cost int64) (bool, int64, error) {
	var tats, ttats [gcra.MaxLimits]int64
	n, tn := len(im.tats), len(im.ttats)
	copy(tats[:], im.tats)
	copy(ttats[:], im.ttats)
	res, _, err := gcra.Decide(tats[:n], e.idealCore, at, 1, 0)
	if err != nil {
		return false, 0, err
	}
	allowed, retry := res.Allowed, res.RetryAfter
	if tn > 0 {
		tres, _, err := gcra.Decide(ttats[:tn], e.idealTokCore, at, cost, 0)
		if err != nil {
			return false, 0, err
		}
		allowed, retry = allowed && tres.Allowed, max(retry, tres.RetryAfter)
	}
	if allowed {
		copy(im.tats, tats[:n])
		copy(im.ttats, ttats[:tn])
	}
	return allowed, max(retry, 1), nil
}

func (im *idealMode) handle(e *engine, ev *event) {
	if ev.kind == evIdealTick && ev.op == im.tickGen && im.ticking {
		im.ticking = false
		im.serve(e)
	}
}

// apiDelay is the delay drawn for goroutine g's request when it was granted.
func (im *idealMode) apiDelay(_ *engine, mi, g int32) (bool, int64) {
	d := im.delays[mi][g]
	return d == idealLost, d
}

// permitOK refuses a permit that falls due late (its member was paused): its request
// would miss the instant it was granted for. It is given up, and asked for again.
func (*idealMode) permitOK(e *engine, ev *event) bool { return e.now <= ev.val }

// retick drops the tick scheduled (the limits changed under it) and serves again.
func (im *idealMode) retick(e *engine) {
	im.tickGen++
	im.ticking = false
	im.serve(e)
}

func (im *idealMode) penalize(e *engine, _ int32, until int64) {
	if im.lines == nil {
		return
	}
	gcra.Penalize(im.tats, e.idealCore, e.now, until)
	im.retick(e)
}

// limitChanged keeps each limit's state that stays at the same place in the list, as the
// referee does.
func (im *idealMode) limitChanged(e *engine) {
	if im.lines == nil {
		return
	}
	if len(im.tats) != len(e.idealCore) {
		im.tats = resize(im.tats, len(e.idealCore))
	}
	im.retick(e)
}

func (*idealMode) left(*engine, int32, bool) {}
