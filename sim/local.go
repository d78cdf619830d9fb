package sim

import (
	"math"

	"github.com/sluicehq/sluice/priority"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/fairq"
	"github.com/sluicehq/sluice/internal/limitconv"
)

// localMode is the local mode: decisions in process, with no store and no coordination.
//
// By default (local.processes: one) every member is a group of goroutines of one process,
// as sluice demo --mode local is: one limiter on local.share of the limit, whose waiting
// room for the key is the limiter's own (package internal/fairq, as sluice.Limiter.Wait
// keeps it, sluice.FairWaiters): each waiter takes a place in the key's line within
// client.max_wait, and a place that comes due goes to the highest class waiting, and
// within a class to the member owed most (each member's goroutines name it, as
// sluice.WithMember does), its waiters in arrival order. With local.processes: each, every
// member is a process of its own deciding alone on local.share of the limit.
type localMode struct {
	proc *localProc // the one process; nil: each member a process of its own
}

func newLocalMode(sc *Scenario) localMode {
	if !sc.Local.oneProcess() {
		return localMode{}
	}
	return localMode{proc: &localProc{room: fairq.NewLedger[gcra.Ticket](0, false), tickAt: -1}}
}

// localProc is the one process: its limiter's state and the key's waiting room.
type localProc struct {
	tats []int64 // the limiter's GCRA state of the key (e.local)
	hold int64   // the end of the key's latest penalty
	// when the critical and the standard class last asked, and the limiter's first
	// decision on the key, each plus one (0: never): the headroom of Allow (allow)
	seenC, seenS, born int64
	room               *fairq.Ledger[gcra.Ticket]
	in                 [][]bool // by member and goroutine: waits in the room
	// tickAt is when the tick scheduled for the room's next place is due (-1: none).
	tickAt int64
}

func (localMode) name() string { return "local" }

// waiterID names goroutine g of member mi in the room.
func waiterID(mi, g int32) uint64 { return uint64(mi)<<32 | uint64(uint32(g)) }

func splitWaiter(id uint64) (mi, g int32) { return int32(id >> 32), int32(uint32(id)) }

func (l localMode) acquire(e *engine, mi, g int32) {
	m := e.members[mi]
	p := l.proc
	if p == nil {
		res, _, err := decide(m.tats, e.local, e.now, 1, e.maxWait)
		e.decided(mi, g, res, err)
		return
	}
	if len(p.tats) != len(e.local) {
		p.tats = resize(p.tats, len(e.local))
	}
	if e.maxWait == 0 {
		p.allow(e, mi, g)
		return
	}
	if p.in == nil {
		p.in = make([][]bool, len(e.members))
	}
	if p.in[mi] == nil {
		p.in[mi] = make([]bool, len(m.gs))
	}
	id := waiterID(mi, g)
	p.room.Enter()
	_ = p.room.JoinClass(id, m.name, fairq.Class(1-m.class)) // ids are unique
	p.in[mi][g] = true
	if act, _ := p.room.Turn(id, true, e.now, e.now, math.MaxInt64); act == fairq.Take {
		p.take(e, id)
	}
	p.dispatch(e)
}

// allow decides for a pessimistic client (client.max_wait 0) as Allow does, not through the
// waiting room: now or never, under the limit less the headroom its class keeps for a
// higher class the process saw asking recently (where the scenario names a class: the
// limiter's keepFor), or refused until that class is no longer recent.
func (p *localProc) allow(e *engine, mi, g int32) {
	ls := e.local
	if e.classes {
		class := priority.Class(e.members[mi].class)
		if p.born == 0 {
			p.born = e.now + 1
		}
		switch class {
		case priority.Critical:
			p.seenC = e.now + 1
		case priority.Standard:
			p.seenS = e.now + 1
		}
		var ok bool
		var retry int64
		if ls, ok, retry = headroomLimits(e.local, class, p.seenC, p.seenS, p.born, e.now, keepAll, &e.classBuf); !ok {
			e.denied(mi, g, retry)
			return
		}
	}
	res, tk, err := decide(p.tats, ls, e.now, 1, 0)
	e.members[mi].tickets[g] = tk
	e.decided(mi, g, res, err)
}

// take takes a place in the key's line for the room, for waiter id, within client.max_wait
// (as the limiter's maximum wait bounds its places). A waiter refused one waits for the
// places the room holds, served by member, while it holds any (fairq.Ledger.Refused);
// otherwise it leaves the room, and its goroutine backs off. It reports whether the
// waiter has a place (or left): false when it stays without one.
func (p *localProc) take(e *engine, id uint64) bool {
	res, tk, err := decide(p.tats, e.local, e.now, 1, e.maxWait)
	ok := err == nil && res.Allowed
	var gone bool
	if ok || err != nil {
		gone = p.room.Took(id, tk, e.now+res.Delay, ok)
	} else if gone = p.room.Refused(id, e.now+res.RetryAfter); !gone {
		return false
	}
	if gone {
		mi, g := splitWaiter(id)
		p.in[mi][g] = false
		p.exit(e)
		if err != nil {
			res.RetryAfter = 0
		}
		e.denied(mi, g, res.RetryAfter)
	}
	return true
}

// exit counts a waiter out of the room; the last one out gives back the places left, the
// latest first.
func (p *localProc) exit(e *engine) {
	spare, _ := p.room.Exit()
	for _, tk := range spare {
		p.giveBack(e, tk)
	}
}

// giveBack cancels a place (its reservation): the key's newest grant gives its permit
// back (gcra.Adjust), any other gives nothing.
func (p *localProc) giveBack(e *engine, tk gcra.Ticket) {
	_, _ = gcra.Adjust(p.tats, e.local, e.now, tk, 0, p.hold)
}

// dispatch serves the places due: each to the waiter the room picks, and a place that
// expired (every waiter was paused past the margin) or that nobody waits for is given
// back. Waiters short of a place then take one. It schedules a tick for the next place.
func (p *localProc) dispatch(e *engine) {
	for {
		short := false
		for {
			out, id, tk := p.room.Pop(e.now, p.maxLate(e))
			if out == fairq.NotDue {
				break
			}
			switch out {
			case fairq.Served:
				mi, g := splitWaiter(id)
				p.in[mi][g] = false
				e.members[mi].tickets[g] = tk
				e.permit(mi, g, e.now)
				p.exit(e)
			case fairq.Expired:
				short = true
				p.giveBack(e, tk)
			case fairq.Spare:
				p.giveBack(e, tk)
			}
		}
		if !p.refill(e, short) {
			break
		}
	}
	if at, ok := p.room.Next(); ok && at > e.now && (p.tickAt < 0 || at < p.tickAt) {
		// (A place due and not served waits for a waiter that is not paused: resumed
		// dispatches it.)
		p.tickAt = at
		e.schedule(event{at: at, kind: evLocalTick, m: -1})
	}
}

// refill has waiters take the places the room lacks (one expired, or waiters stay without
// one while the line was full), as the limiter's waiters do when they wake after a place
// is served; it reports whether one was taken. It looks only when the room may lack one:
// a place expired (short), or a waiter stays without one.
func (p *localProc) refill(e *engine, short bool) bool {
	if !short && p.room.Waiting() <= p.room.Places() {
		return false
	}
	took := false
	for mi, gs := range p.in {
		for g, in := range gs {
			if !in || e.members[mi].paused > e.now {
				continue
			}
			id := waiterID(int32(mi), int32(g))
			if act, _ := p.room.Turn(id, false, e.now, 0, math.MaxInt64); act != fairq.Take {
				return took
			}
			if !p.take(e, id) {
				return took // the line is full: it stays without a place
			}
			took = true
		}
	}
	return took
}

// maxLate is how late a place may be served, as the limiter's expireAfter: the lateness
// its limits tolerate less half the margin kept for the trip to the API, never more than
// the margin.
func (p *localProc) maxLate(e *engine) int64 {
	m := e.margin
	if m <= 0 {
		return math.MaxInt64
	}
	after := m
	for i, lim := range e.limits {
		if lim.Window || i >= len(e.local) {
			continue
		}
		t := int64(limitconv.Interval(lim))
		tolerance := m
		if e.local[i].T <= t && t > 0 {
			tolerance = (m + t - 1) / t * t
		}
		after = min(after, tolerance-m/2)
	}
	return after
}

func (l localMode) handle(e *engine, ev *event) {
	if p := l.proc; p != nil && ev.kind == evLocalTick {
		if ev.at == p.tickAt {
			p.tickAt = -1
		}
		p.dispatch(e)
	}
}

// permitOK gives back a permit served to a member paused since, past the margin: the
// limiter's waiter finds it expired, and waits again.
func (l localMode) permitOK(e *engine, ev *event) bool {
	if l.proc == nil || e.now-ev.val <= l.proc.maxLate(e) {
		return true
	}
	l.proc.giveBack(e, e.members[ev.m].tickets[ev.g])
	return false
}

// paused: the member's waiters cannot take a place while it is paused (the room passes
// over them, fairq.Room.Busy); resumed: they can again.
func (l localMode) paused(e *engine, mi int32) { l.busy(e, mi, true) }

func (l localMode) resumed(e *engine, mi int32) {
	l.busy(e, mi, false)
	if l.proc != nil {
		l.proc.dispatch(e)
	}
}

func (l localMode) busy(_ *engine, mi int32, busy bool) {
	if p := l.proc; p != nil && int(mi) < len(p.in) {
		for g, in := range p.in[mi] {
			if in {
				p.room.Busy(waiterID(mi, int32(g)), busy)
			}
		}
	}
}

func (l localMode) penalize(e *engine, mi int32, until int64) {
	if p := l.proc; p != nil {
		gcra.Penalize(p.tats, e.local, e.now, until)
		p.hold = max(p.hold, until)
		return
	}
	m := e.members[mi]
	gcra.Penalize(m.tats, e.local, e.now, until)
	m.hold = max(m.hold, until)
}

// left: a member that leaves or crashes ends its goroutines' waits; the places the room
// holds stay with the other waiters (the process lives on).
func (l localMode) left(e *engine, mi int32, _ bool) {
	p := l.proc
	if p == nil || int(mi) >= len(p.in) {
		return
	}
	for g, in := range p.in[mi] {
		if in {
			p.in[mi][g] = false
			p.room.Leave(waiterID(mi, int32(g)))
			p.exit(e)
		}
	}
	p.dispatch(e)
}

// limitChanged keeps the key's state of each limit that stays at its place in the list.
func (l localMode) limitChanged(e *engine) {
	if p := l.proc; p != nil && len(p.tats) != len(e.local) {
		p.tats = resize(p.tats, len(e.local))
	}
}

// decide is gcra.Decide, made through gcra.DecideOne (the in-process limiter's path, held
// to Decide by gcra's TestDecideOneMatchesDecide) when there is one limit and it is not
// windowed: the same decision and ticket, without the loops over the limits, which were a
// seventh of a large pool's instructions.
func decide(tats []int64, limits []gcra.Limit, now, n, maxDelay int64) (gcra.Result, gcra.Ticket, error) {
	if len(limits) != 1 || limits[0].Window > 0 {
		return gcra.Decide(tats, limits, now, n, maxDelay)
	}
	tat, res, err := gcra.DecideOne(tats[0], limits[0], now, n, maxDelay)
	if err != nil || !res.Allowed {
		return res, gcra.Ticket{}, err
	}
	tats[0] = tat
	return res, gcra.TicketOne(n, now+res.Delay, tat), nil
}
