package sim

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/gcra"
)

// mode is how members get permits. The engine owns demand, goroutines, the network, the
// API and the metrics; a mode decides, calling the real cores (package gcra; the lease
// allocation and member of lease/allot, the gossip core of gossip/hits, the adaptive
// controller).
type mode interface {
	name() string
	// acquire starts getting a permit for goroutine g of member m; it ends, maybe after
	// events of the mode's own, in e.permit or e.denied.
	acquire(e *engine, m, g int32)
	// handle runs the mode's own events.
	handle(e *engine, ev *event)
	// penalize reports a 429 that asks to wait until `until`.
	penalize(e *engine, m int32, until int64)
	// left is told that member m leaves, gracefully or not, before it is taken out.
	left(e *engine, m int32, graceful bool)
}

// permitChecker is a mode that judges, when a goroutine's permit falls due (perhaps late,
// after a pause), whether it may still be used; if not, the goroutine acquires again.
type permitChecker interface {
	permitOK(e *engine, ev *event) bool
}

// storeRestarter is a mode whose store can restart empty (the store_restart event).
type storeRestarter interface {
	storeRestart(e *engine)
}

// apiDelayer is a mode that draws its requests' way to the API itself, when it grants them
// (the ideal mode): sendToAPI asks it whether goroutine g's request is lost and, if not,
// its delay, instead of drawing them.
type apiDelayer interface {
	apiDelay(e *engine, m, g int32) (lost bool, latency int64)
}

// pauseObserver is a mode told when member m's process is paused (m.paused is set): its
// events wait for the process from then on; and when it resumes (m.paused is 0 again).
type pauseObserver interface {
	paused(e *engine, m int32)
	resumed(e *engine, m int32)
}

// leaseReporter is a mode that adds figures of its own to the report.
type leaseReporter interface {
	leaseReport(e *engine) *LeaseReport
}

// ModeNames lists the modes the simulator knows.
// (adaptive takes a strategy: adaptive:heroku, adaptive:cubic, adaptive:sre; plain
// adaptive is the default, sluice. adaptive:seed, adaptive:heroku's former name, still
// reads for one release: see FormerModeName.)
// (strict is the strict mode as the library defaults it, sluice.FairProcesses: each member
// holds a few places in the store's line at a time, whatever its goroutines; strict:waiters
// is sluice.FairWaiters: each goroutine its own place. strict:processes, strict's former
// name for the first, still reads for one release: see FormerModeName.)
// (ideal is the reference no real system can beat, the others' yardstick: see idealMode.)
func ModeNames() []string {
	return []string{"local", "strict", "strict:waiters", "lease", "gossip", "adaptive", "ideal"}
}

// CheckMode returns an error naming the known modes when name is not one of them.
func CheckMode(name string) error {
	if slices.Contains(ModeNames(), name) {
		return nil
	}
	if _, ok, err := parseAdaptive(name); ok {
		return err
	}
	if _, ok := FormerModeName(name); ok {
		return nil
	}
	if name == "central" {
		return fmt.Errorf("unknown mode %q: it is called strict now, as in sluice demo and serve", name)
	}
	return fmt.Errorf("unknown mode %q (known: %s)", name, strings.Join(ModeNames(), ", "))
}

func newMode(name string, sc *Scenario) mode {
	if now, ok := FormerModeName(name); ok && !strings.HasPrefix(name, adaptivePrefix) {
		name = now
	}
	switch name {
	case "local":
		return newLocalMode(sc)
	case "strict":
		return centralMode{lines: procLines{}}
	case "strict:waiters":
		return centralMode{}
	case "lease":
		return newLeaseMode(sc)
	case "gossip":
		return newGossipMode(sc)
	case "ideal":
		return newIdealMode()
	}
	if s, ok, err := parseAdaptive(name); ok && err == nil {
		return newAdaptiveMode(name, s)
	}
	return nil
}

// decided ends goroutine g's acquire with a decision made in the member: a permit, or a
// denial with when to retry (none on an error).
func (e *engine) decided(mi, g int32, res gcra.Result, err error) {
	switch {
	case err != nil:
		e.denied(mi, g, 0)
	case res.Allowed:
		e.permit(mi, g, e.now+res.Delay)
	default:
		e.denied(mi, g, res.RetryAfter)
	}
}

// centralMode is the strict mode: every decision is made at the simulated store, one round
// trip away, with its time-outs and fail modes. With lines (strict, the library's default
// sluice.FairProcesses), each member holds at most a few places in the store's line (as
// the library's placesFor counts them: the permits two of its round trips last, at least
// one), each for one goroutine, and its other goroutines wait in the member's line
// (arrival order) until a place's permit is due or denied: the members share the store's
// line by turns, whatever their goroutines. Without (strict:waiters, sluice.FairWaiters),
// each goroutine asks on its own.
type centralMode struct {
	lines procLines // by member; nil: each goroutine asks on its own
}

// procLines are the members' own lines (the library's sluice.FairProcesses, where a
// backend's line is shared by every process: backend.Capabilities.SharedLine): each member
// holds at most a few places in the shared line, each for one goroutine, and its other
// goroutines wait in the member's line (arrival order) until a place's permit is due or
// denied. The strict mode's store and the gossip mode's key owners keep such a line.
type procLines map[int32]*procLine

// procLine is a member's own line.
type procLine struct {
	inc    uint32  // the member's incarnation it belongs to
	held   int     // places the member's goroutines hold (asked, or wait for their permits)
	rtt    int64   // the member's round trip to the line, smoothed (as the library's)
	sent   []int64 // when each goroutine last asked
	parked fifo[parkedG]
}

// places is how many places the member may hold: as sluice's placesFor, the permits two
// round trips last at the tightest limit's rate, at least one, at most 64.
func (ln *procLine) places(e *engine) int {
	var t int64
	for _, c := range e.core {
		t = max(t, c.T)
	}
	if ln.rtt <= 0 || t <= 0 {
		return 1
	}
	return int(min(64, max(1, (2*ln.rtt+t-1)/t)))
}

type parkedG struct {
	g  int32
	op uint32
}

// line returns member mi's line, new for each incarnation.
func (ls procLines) line(e *engine, mi int32) *procLine {
	m := e.members[mi]
	ln := ls[mi]
	if ln == nil || ln.inc != m.inc {
		ln = &procLine{inc: m.inc}
		ls[mi] = ln
	}
	return ln
}

// admit takes a place for goroutine g of member mi, or parks it (false) until one is free.
func (ls procLines) admit(e *engine, mi, g int32) bool {
	m := e.members[mi]
	ln := ls.line(e, mi)
	if ln.held >= ln.places(e) {
		ln.parked.push(parkedG{g, m.ops[g]})
		return false
	}
	ln.held++
	if len(ln.sent) < len(m.gs) {
		ln.sent = make([]int64, len(m.gs))
	}
	ln.sent[g] = e.now
	return true
}

// answered: goroutine g of member mi has the line's answer: its round trip counts.
func (ls procLines) answered(e *engine, mi, g int32) {
	if ln := ls.line(e, mi); int(g) < len(ln.sent) {
		d := e.now - ln.sent[g]
		if ln.rtt > 0 {
			d = ln.rtt + (d-ln.rtt)/8
		}
		ln.rtt = d
	}
}

// release ends the member's hold on a place (its permit is due, or it was denied) and
// has the first parked goroutine still waiting ask again, through acquire.
func (ls procLines) release(e *engine, mi int32, acquire func(e *engine, mi, g int32)) {
	ln := ls.line(e, mi)
	ln.held = max(ln.held-1, 0)
	m := e.members[mi]
	for ln.parked.len() > 0 && ln.held < ln.places(e) {
		p := *ln.parked.front()
		ln.parked.pop()
		if m.present && m.ops[p.g] == p.op {
			acquire(e, mi, p.g)
		}
	}
}

func (c centralMode) name() string {
	if c.lines != nil {
		return "strict"
	}
	return "strict:waiters"
}

// release ends the member's hold on its place, with lines.
func (c centralMode) release(e *engine, mi int32) {
	if c.lines != nil {
		c.lines.release(e, mi, c.acquire)
	}
}

// permitOK releases the member's place as its permit falls due (the permit is used).
func (c centralMode) permitOK(e *engine, ev *event) bool {
	c.release(e, ev.m)
	return true
}

func (c centralMode) acquire(e *engine, mi, g int32) {
	m := e.members[mi]
	if c.lines != nil && !c.lines.admit(e, mi, g) {
		return
	}
	ev := event{kind: evStoreReq, m: mi, g: g, op: m.ops[g]}
	if owed, any := m.debt.Owed(e.now, len(e.core)); any {
		// Piggy-back the charge-back: per limit, what the fallback admitted that the
		// limit has not earned back yet (gcra.Debt, as the strict mode's ledger on Redis).
		ev.charged = true
		ev.val = int64(e.putTicket(gcra.Ticket{TatAfter: owed}))
	}
	ev.val2 = e.now // sent at: the member gives up at val2 + timeout
	if !e.toStore(ev) {
		if ev.charged {
			e.dropTicket(ev.val)
		}
		e.giveUp(&ev)
	}
}

// giveUp schedules the member's time-out for a request that will get no answer in time.
// (Only requests that get none schedule one: the simulator knows, and saves an event per
// request.)
func (e *engine) giveUp(req *event) {
	e.schedule(event{at: req.val2 + int64(e.sc.Store.Timeout), kind: evStoreTimeout, m: req.m, g: req.g, op: req.op})
}

func (c centralMode) handle(e *engine, ev *event) {
	switch ev.kind {
	case evStoreReq:
		if !e.storeUp() || e.partitioned[ev.m] {
			if ev.charged {
				e.dropTicket(ev.val)
			}
			e.giveUp(ev) // no answer: the member times out
			return
		}
		e.storeOps++
		e.bucket().storeOps++
		if ev.charged {
			e.storeCharge(&e.tickets[ev.val])
			e.dropTicket(ev.val)
		}
		keep := keepPlace // sluice.FairProcesses's places
		switch {
		case e.maxWait == 0:
			keep = keepAll // a pessimistic client decides now or never
		case c.lines == nil:
			keep = keepNone // sluice.FairWaiters: a place for each waiter
		}
		var res gcra.Result
		var tk gcra.Ticket
		ls, ok, retry := e.classLimits(ev.m, ev.val2, keep)
		if ok {
			var err error
			if res, tk, err = decide(e.storeTats, ls, e.now, 1, e.maxWait); err != nil {
				res = gcra.Result{}
			}
		} else {
			res = gcra.Result{RetryAfter: retry}
		}
		// The answer: granted with a delay and the ticket, or denied with a retry-after.
		reply := *ev
		reply.kind = evStoreReply
		reply.ok = res.Allowed
		reply.val2 = res.RetryAfter
		if res.Allowed {
			reply.val2 = res.Delay
			reply.val = int64(e.putTicket(tk))
		}
		if !e.fromStore(reply, ev.val2+int64(e.sc.Store.Timeout)) {
			// The answer is lost, or comes after the member gave up: the grant, if any,
			// is never used (as a crashed member's is).
			if reply.ok {
				e.dropTicket(reply.val)
			}
			e.giveUp(ev)
		}
	case evStoreReply:
		if e.stale(ev) {
			if ev.ok {
				e.dropTicket(ev.val)
			}
			return
		}
		m := e.members[ev.m]
		if ev.charged {
			m.debt = gcra.Debt{} // the store has it now
		}
		if c.lines != nil {
			c.lines.answered(e, ev.m, ev.g)
		}
		s := &m.gs[ev.g]
		if ev.ok {
			m.tickets[ev.g], s.hasTk = e.tickets[ev.val], true
			e.dropTicket(ev.val)
			// The delay counts from the answer's arrival, as sluice.Reservation does.
			e.permit(ev.m, ev.g, e.now+ev.val2)
		} else {
			c.release(e, ev.m)
			e.denied(ev.m, ev.g, ev.val2)
		}
	case evStoreTimeout:
		if e.stale(ev) {
			return
		}
		e.timeouts++
		m := e.members[ev.m]
		m.ops[ev.g]++ // a late answer no longer applies
		switch e.sc.Store.FailMode {
		case "open":
			e.failOpen++
			e.permit(ev.m, ev.g, e.now)
		case "local":
			res, _, err := decide(m.ftats, e.fallback, e.now, 1, e.maxWait)
			if err == nil && res.Allowed {
				m.debt.Push(e.core, e.now+res.Delay, 1)
				e.permit(ev.m, ev.g, e.now+res.Delay)
			} else {
				c.release(e, ev.m)
				e.denied(ev.m, ev.g, res.RetryAfter)
			}
		default:
			c.release(e, ev.m)
			e.denied(ev.m, ev.g, 0)
		}
	case evStorePenalty:
		if e.storeUp() {
			e.storeOps++
			gcra.Penalize(e.storeTats, e.core, e.now, ev.val)
			e.storeHold = max(e.storeHold, ev.val)
		}
	}
}

// storeCharge counts against the shared state what a member admitted on its fallback
// while cut off (gcra.Debt.Owed, carried in the ticket's slots). An hourly quota keeps
// most of that debt; a per-second limit has forgotten nearly all of it, as the API has (the
// charge-back protects windowed quotas, not a strict API's spacing: docs/strict.md).
func (e *engine) storeCharge(owed *gcra.Ticket) {
	gcra.ChargeOwed(e.storeTats, e.now, &owed.TatAfter)
}

// putTicket keeps a ticket that a message to or from the store carries (in event.val), in a
// pool whose slots are reused: events stay small, and only the store's messages carry one.
// The message's handler, or whatever drops it, gives the slot back with dropTicket.
func (e *engine) putTicket(tk gcra.Ticket) int32 {
	if n := len(e.freeTickets); n > 0 {
		i := e.freeTickets[n-1]
		e.freeTickets = e.freeTickets[:n-1]
		e.tickets[i] = tk
		return i
	}
	e.tickets = append(e.tickets, tk)
	return int32(len(e.tickets) - 1)
}

func (e *engine) dropTicket(i int64) { e.freeTickets = append(e.freeTickets, int32(i)) }

// storeRestart: the store lost its state (Redis restarted empty): every key is fresh.
func (centralMode) storeRestart(e *engine) {
	clear(e.storeTats)
	e.board = [2]int64{}
	e.storeHold = 0
}

func (centralMode) penalize(e *engine, mi int32, until int64) {
	e.toStore(event{kind: evStorePenalty, m: mi, val: until})
}

func (centralMode) left(e *engine, mi int32, graceful bool) {
	if !graceful {
		return
	}
	// A graceful leave gives back the reservations not yet used.
	m := e.members[mi]
	for g := range m.gs {
		s := &m.gs[g]
		if s.hasTk && e.storeUp() && !e.partitioned[mi] {
			hold := int64(0)
			if e.storeHold > e.now {
				hold = e.storeHold
			}
			// The cancel travels to the store; the simulator applies it on arrival order
			// only approximately (at once), which can only refund earlier, never later.
			gcra.Adjust(e.storeTats, e.core, e.now, m.tickets[g], 0, hold)
			e.storeOps++
			e.messages++
			s.hasTk = false
		}
	}
}
