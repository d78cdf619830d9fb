package adaptive

import (
	"math"
	"time"
)

// sluiceStrategy is the Sluice strategy (see Sluice), for each limit whose rate L the
// answers name (or Config.Limit does). From how the remaining count moves between its own
// answers, it estimates what the whole pool spends. It moves its own pace so that the pool
// brings the count back to a small reserve, and drifts towards an equal share. A 429
// halves the pace, once per event, and holds the client back for its Retry-After.
// Requests do not hold slots far ahead (see Wait): a pace that changes applies at once.
// docs/adaptive.md, "The strategies", gives the estimate, the target, the correction, and
// the rules for equal shares and for room.
type sluiceStrategy struct {
	q        [nQuotas]sluiceQuota
	lastSend int64
	sent     bool
	countMax float64 // with no rate known: the most the count has shown, plus one
	// waitMax is, when the answers name no rate and carry no count, the longest wait a
	// refusal named in milliseconds, in seconds (under maxWait): at most the limit's
	// interval (see unknownLimit)
	waitMax float64
	// blind is the slot of a request sent before anything was learned (or since a restart
	// after idle), while its answer has not come (see awaitFirst); blind.cost is 0 when
	// there is none.
	blind sluiceSlot
}

type sluiceQuota struct {
	pace    float64    // units a second; 0 before the first answer
	base    float64    // the pace without the spare being spent
	slot    sluiceSlot // the last slot reserved under this limit
	updated int64      // when the pace last changed (the sent time of that answer)
	idle    float64    // the base before a restart after idle, until the next answer
	held    bool       // a request waited for its slot under this limit since the last answer
	// early is the most a request on a burst too small to count in reached the API before
	// its permit (a refusal's short Retry-After), nanoseconds: its requests are spaced by it
	// on top of the round trip (see next)
	early int64
	// rebuild is when the client started from an empty limit (its first answer found
	// nothing left), until the reserve is rebuilt (0: not rebuilding; see learn)
	rebuild int64
	// sending is what the client sends under this limit, units a second, decayed over
	// Horizon (see sends), as of sendingAt
	sending   float64
	sendingAt int64
	phase     sluicePhase
	// contended: a refusal told of another client's slot (see observe); a burst too small
	// to count in then grows back slowly
	contended bool
	hist      [16]sample
	n, head   int
}

// sluicePhase is where a limit's pace stands: growing from its start, or steady.
type sluicePhase uint8

const (
	// steady: the pace follows the pool's spending (the correction, the equal-share step).
	steady sluicePhase = iota
	// slowStart: from a client's first answer (and after a restart after idle) until the
	// count first falls to the reserve or a request is refused, the pace also doubles
	// every Horizon while there is room, as TCP's slow start doubles its window every
	// round trip.
	slowStart
)

// sluiceSlot is a slot reserved: when, for what cost, and its jitter (the next slot
// follows it by cost / pace × jitter, at the pace of the moment).
type sluiceSlot struct {
	at     int64
	cost   float64
	jitter float64
	probe  bool // reserved before the pace was known: the next follows by probe
	free   bool // given back (its request's context ended first): the next request's
}

// sample is the remaining count an answer reported, and when its request was sent.
type sample struct {
	t int64
	r float64
}

// growth is how much a client's pace grows while room is left, per time constant, as a
// part of the limit's rate.
const growth = 0.2

// restartHalving is how many Horizons quiet halve a client's pace. A pace is grown only
// while used (see learn), so a quiet client's pace is one it used; it once halved every
// Horizon (RFC 2861), and a client whose Poisson demand paused for two seconds came
// back at a quarter of its pace and waited seconds for it to grow back.
const restartHalving = 16

// rebuildRate is the part of the limit's rate at which a pool that started from an empty
// limit rebuilds its reserve.
const rebuildRate = 0.025

// minSamples is the fewest of its own earlier answers a client measures the pool over.
const minSamples = 3

// probe is the pause between the requests of a client that knows nothing yet.
const probe = 100 * time.Millisecond

// firstAnswerWait is how long a client that knows nothing waits for the answer to its one
// request before it sends another (TCP's initial retransmission time-out, RFC 6298): an
// answer that never comes (a request that failed) does not stop the client.
const firstAnswerWait = time.Second

func (s *sluiceStrategy) rate(*Controller) float64 { return s.q[reqQ].pace }

func (s *sluiceStrategy) next(c *Controller, now int64, cost [nQuotas]float64) (int64, Outcome) {
	if wake, ok := s.awaitFirst(now); ok {
		return wake, Wait
	}
	restarted := s.sent && s.restart(c, now)
	at := max(now, c.hold)
	gap := 0.0 // the pause this request takes in the chain: the longest of its limits'
	for i := range s.q {
		q := &s.q[i]
		if cost[i] > 0 && (i == reqQ || c.q[i].known) {
			if qn := q.next(c, i); qn > now {
				at = max(at, qn)
				q.held = true
			}
			if q.pace > 0 {
				gap = max(gap, cost[i]/q.pace*1e9)
			}
		}
	}
	// Nothing learned yet, or nothing learned since a restart after idle: one request
	// until its answer comes (awaitFirst). A pace restarted low would otherwise hold the
	// next request a long interval, which the answer shows was not needed.
	blind := gap == 0 || restarted
	if gap == 0 {
		// One probe at a time until an answer names the limit.
		gap = float64(probe)
	}
	if float64(at-now) > gap*(1+c.cfg.Jitter) {
		// The slots before it are taken: come back when this one can be reserved, at
		// the pace then (a goroutine does not hold a slot far ahead at a pace that may
		// change before it comes).
		return at - int64(gap), Wait
	}
	jit := c.cfg.Jitter
	if k := c.q[reqQ]; k.known && s.q[reqQ].pace >= k.limit {
		// A client at the limit's whole rate has it to itself (or will be refused and
		// halve): the jitter that spreads the clients of a pool would only waste it.
		jit /= 10
	}
	j := 1 + jit*c.random()
	for i := range s.q {
		if cost[i] > 0 && (i == reqQ || c.q[i].known) {
			s.q[i].slot = sluiceSlot{at: at, cost: cost[i], jitter: j, probe: s.q[i].pace <= 0}
			s.q[i].sending = s.q[i].sends(c, at) + cost[i]/c.cfg.Horizon.Seconds()
			s.q[i].sendingAt = max(at, s.q[i].sendingAt)
		}
	}
	if blind {
		s.blind = sluiceSlot{at: at, cost: 1}
	}
	s.lastSend, s.sent = at, true
	return at, Send
}

// awaitFirst reports whether a request must wait, at now, for the answer to the one a
// client sent before it had learned anything (or since it restarted after idle), and when
// to ask again: one request at a time until the first answer teaches the client the
// limit, as TCP starts with a small window (the goroutines of a process that ask at once
// would otherwise send several requests blind, and on a burst of one all but the first
// are refused). It asks again soon (a quarter of the wait so far: the answer's delay is
// unknown), and another request goes after firstAnswerWait.
func (s *sluiceStrategy) awaitFirst(now int64) (int64, bool) {
	b := s.blind
	switch {
	case b.cost == 0 || now >= b.at+int64(firstAnswerWait):
		return 0, false
	case now < b.at:
		return b.at, true // it has not gone yet (a Retry-After holds the client)
	}
	return min(b.at+int64(firstAnswerWait), now+max((now-b.at)/4, int64(time.Millisecond))), true
}

// next is when the slot after the last one reserved begins, at the pace now (a pace
// that changes moves it).
func (q *sluiceQuota) next(c *Controller, i int) int64 {
	sl := q.slot
	var guard int64
	if k := c.q[i]; k.known && k.burst < 2*sl.cost {
		// No burst to absorb it: the next request must not reach the API sooner than the
		// limit allows because its way there was shorter than the last one's (a one-way
		// trip's spread is at most a round trip; and what a refusal said a request was
		// early). Transport also holds a request until the last one's own round trip
		// after it went (Controller.went).
		guard = int64(c.rtt*1e9) + q.early
	}
	switch {
	case sl.cost == 0:
		return math.MinInt64
	case sl.free:
		return sl.at // given back: the next request takes it, and the chain goes on from it
	case q.pace <= 0:
		return sl.at + int64(probe)
	case sl.probe:
		// Reserved before the pace was known: the pace known since spaces the next (a
		// probe's 100 ms would overrun a small limit).
		return sl.at + int64(min(sl.cost/q.pace*1e9, maxPause)) + guard
	}
	return sl.at + int64(min(sl.cost/q.pace*1e9*sl.jitter, maxPause)) + guard
}

func (s *sluiceStrategy) cancel(_ *Controller, at int64, cost [nQuotas]float64) {
	if s.blind.cost > 0 && at == s.blind.at {
		s.blind = sluiceSlot{} // the blind request was not sent: the next may go
	}
	if at != s.lastSend {
		return // a later slot was reserved since: this one's place stays taken
	}
	for i := range s.q {
		if cost[i] > 0 && s.q[i].slot.cost > 0 {
			// The last slot reserved: the next request in line takes it, at its time (a
			// slot given back is not a reset of the pace: the chain goes on from it).
			s.q[i].slot.free = true
		}
	}
}

// restart: a client quiet for two of its own slots or more starts again gently (RFC
// 2861's restart after idle): others have taken up its pace meanwhile, and what it
// measured of the pool is old. (A client held back by its goroutines, all waiting for
// answers, is not quiet: the gap must also exceed Horizon.) Its pace halves for every
// restartHalving Horizons quiet, down to a sixteenth of the limit, and it starts slowly
// again (slowStart): the answers raise it as fast as there is room. If the first answer
// after it finds the limit full (nobody spent from it for a refill's time), nobody took up
// its pace: it is the pace before again. It reports whether a limit's pace restarted.
func (s *sluiceStrategy) restart(c *Controller, now int64) bool {
	restarted := false
	gap := float64(now - s.lastSend)
	for i := range s.q {
		q, k := &s.q[i], &c.q[i]
		if q.pace <= 0 || !k.known || gap <= max(2e9/q.pace*unit(c, i), float64(c.cfg.Horizon)) {
			continue
		}
		halving := float64(c.cfg.Horizon)
		if k.burst >= 4*unit(c, i) {
			// A burst too small to count in halves every Horizon still: its clients
			// learn of each other by refusals alone.
			halving *= restartHalving
			q.phase = slowStart
		}
		q.idle = max(q.idle, q.base)
		q.base = max(q.base*math.Exp2(-gap/halving), min(q.base, k.limit/16))
		q.pace = q.base
		q.n = 0 // the history no longer says what the pool spends now
		// The request that restarts goes at once, as the first one did: the slot after the
		// last one at the pace restarted low would hold it for a long interval, which its
		// answer, the first news in a while, may show was not needed. The others wait for
		// that answer (awaitFirst).
		q.slot = sluiceSlot{}
		restarted = true
	}
	return restarted
}

// sends is what the client sends under this limit, units a second, at t: its slots'
// costs, each decayed with the time since it over Horizon. (Just after a request it is at
// least that request's cost over Horizon: it says little of a client slower than one
// request per Horizon, and the cut that uses it does not bite there.)
func (q *sluiceQuota) sends(c *Controller, t int64) float64 {
	if t <= q.sendingAt {
		return q.sending
	}
	return q.sending * math.Exp(-float64(t-q.sendingAt)/float64(c.cfg.Horizon))
}

// unit is what one request costs under limit i: one request, or the mean token cost.
func unit(c *Controller, i int) float64 {
	if i == tokQ {
		return max(c.meanCost, 1)
	}
	return 1
}

func (s *sluiceStrategy) observe(c *Controller, a *answer) {
	s.blind = sluiceSlot{} // an answer came: what it taught paces the next request
	for i := range s.q {
		if sl := &s.q[i].slot; sl.cost > 0 && !sl.free && a.sent > sl.at {
			// Its request went later than the last slot reserved (a timer that fired late):
			// the next interval counts from when it went.
			sl.at = a.sent
		}
	}
	if a.newEvent {
		// A refusal halves the pace, whatever the controller knows (the spare being spent
		// on top of the base is dropped too). Before any pace, it halves the one the
		// controller would start at.
		for i := range s.q {
			q := &s.q[i]
			if q.base <= 0 && i == reqQ {
				q.base = 1 // unknownLimit's start
				if k := c.q[i]; k.known {
					q.base = k.limit / 16 // learn's start
					if k.burst < 4 {
						q.base = k.limit // a burst too small to count in: learn's start
					} else if a.retryAfter >= 0 && float64(a.retryAfter)*k.limit <= 2e9 {
						// The limit is empty (the wait is for its next permit): learn's start
						// from an empty limit, halved below. The next request goes when the
						// Retry-After says the next permit comes (the refused one took none).
						q.base, q.rebuild = k.limit, a.now
						q.slot = sluiceSlot{}
					}
				}
				q.updated = a.sent
			}
			q.phase = steady
			k := c.q[i]
			if k.known && (a.retryAfter < 0 || float64(a.retryAfter)*k.limit >= 1e8*unit(c, i)) {
				// Refused for longer than a tenth of the limit's interval: another client
				// holds the slot (a request that only arrived early, its way there shorter
				// than the last one's, is refused for the few milliseconds it was early).
				q.contended = true
			} else if k.known && k.burst < 4*unit(c, i) && i == reqQ && !q.contended {
				// On a burst too small to count in, refused for arriving early (and never
				// for another client's slot): not congestion, noise in the way there. The
				// pace stands; the requests are spaced by what it was early from now on,
				// and the next goes when the Retry-After says (the refused request took no
				// permit).
				q.early = max(q.early, a.retryAfter)
				q.slot = sluiceSlot{}
				q.pace = q.base
				continue
			}
			q.base /= 2
			q.pace = q.base
		}
	}
	if a.throttled && a.retryAfter > 0 && a.retryAfter < int64(maxWait) && !a.retryInSeconds && !c.q[reqQ].known && !c.q[reqQ].seen {
		// Only refusals tell. A refusal's wait is the time until the limit's next permit,
		// so it is at most the limit's interval, and the longest wait bounds the limit's
		// rate from above: no client keeps up a pace above it. (At the end of slow start,
		// a client doubling every second had halved down to it once per event.)
		s.waitMax = max(s.waitMax, float64(a.retryAfter)/1e9)
		if q := &s.q[reqQ]; q.base > 1/s.waitMax {
			q.base, q.pace = 1/s.waitMax, 1/s.waitMax
		}
	}
	if a.throttled {
		// What a refusal reports is left for the next answers: the pool is over the
		// limit, and the halving is the answer to that.
		return
	}
	for i := range s.q {
		if a.remaining[i] >= 0 && c.q[i].known {
			s.q[i].learn(c, i, a.sent, a.remaining[i])
		}
	}
	if !c.q[reqQ].known {
		s.unknownLimit(a)
	}
}

// unknownLimit paces a client whose answers name no rate (and Config.Limit none). Its
// pace starts at one request a second, and a refusal halves it. It grows only while used
// (see learn). With no count in the answers (only refusals tell), it doubles every
// second until its first refusal (slow start). Then it adds refusedStep of the rate its
// refusals' waits bound every interval they taught, and never goes above that rate (see
// observe); by 1% a second if no wait could be read as an interval (see maxWait). With a
// count
// (Heroku's RateLimit-Remaining alone), it follows the count before any refusal: it grows
// by a tenth a second while the count is near the most it has shown (nobody spends it),
// by 1% a second above a tenth of that, and below it (or two requests) each answer cuts
// it by 5%. docs/adaptive.md, "No limit known", gives the figures.
func (s *sluiceStrategy) unknownLimit(a *answer) {
	q := &s.q[reqQ]
	r := a.remaining[reqQ]
	s.countMax = max(s.countMax, r+1)
	if q.base == 0 {
		q.base, q.pace, q.updated, q.phase = 1, 1, a.sent, slowStart
		return
	}
	dt := 0.0
	if a.sent > q.updated {
		dt, q.updated = float64(a.sent-q.updated)/1e9, a.sent
	}
	used := q.held
	q.held = false
	growth := 1.01 // a second
	switch {
	case r >= 0 && r < max(2, s.countMax/10):
		q.base *= 0.95
		q.phase = steady
		growth = 1
	case r < 0 && q.phase == slowStart:
		growth = 2
	case r >= 0.9*s.countMax:
		growth = 1.1
	}
	switch {
	case !used:
	case r < 0 && q.phase == steady && s.waitMax > 0:
		// Only refusals tell, and their waits bound the limit's interval w: every client
		// adds the same step, refusedStep of the rate 1/w, each interval w (additive
		// increase; the halving is the multiplicative decrease, as TCP's AIMD).
		q.base += refusedStep * min(dt, 60) / (s.waitMax * s.waitMax)
	default:
		q.base *= math.Pow(growth, min(dt, 60))
	}
	q.pace = q.base
}

// refusedStep is the step by which a client that learns from refusals alone raises its
// pace every interval of the limit, as a part of the limit's rate (both as its refusals'
// waits bound them). Counted in intervals, the pool is refused as rarely on a slow limit
// as on a fast one; docs/adaptive.md, "No limit known", gives the figures.
const refusedStep = 0.00008

// maxWait bounds the waits read as the limit's interval. A longer wait may be for a
// window's reset or a penalty, not for the next permit. A wait named in whole seconds
// (which the API may have rounded up) is not read so either.
const maxWait = time.Second

// learn moves the pace under one limit from one answer's remaining count r, its request
// sent at t.
func (q *sluiceQuota) learn(c *Controller, i int, t int64, r float64) {
	if q.n > 0 && t <= q.hist[(q.head+q.n-1)%len(q.hist)].t {
		return // an answer overtaken by a later one's: its count is older news
	}
	k := &c.q[i]
	L, u := k.limit, unit(c, i)
	// The reserve, plus what the pool has on its way at the limit's rate (the answers
	// are a round trip old). It scales with the burst: at most half of what the burst
	// holds above one request, so that a small limit's reserve is not its whole burst. A
	// burst too small to count in (fewer than four requests: the count left, in whole
	// requests, is then mostly noise of the answers' round trips) has none: only
	// refusals tell of others.
	reserve := min(max(k.burst-u, 0)/2, max(L*c.cfg.Reserve.Seconds(), 2*u)+L*c.rtt)
	tiny := k.burst < 4*u
	if tiny {
		reserve = 0
	}
	// Above the reserve by more than this, the spare is spent on top of the pace.
	spend := min(reserve, (k.burst-reserve)/2)
	if q.base == 0 && !tiny && r < u {
		q.rebuild = t // the first answer finds the limit empty
	}
	if q.rebuild != 0 {
		// Started from an empty limit: the reserve aimed at is rebuilt at rebuildRate of the
		// limit's rate, not at once, so that the pool uses most of the limit meanwhile (a
		// reserve of sixteen seconds rebuilt at once took a fifth of the first minute).
		// Nothing is spare until it is whole again.
		if b := rebuildRate * L * float64(t-q.rebuild) / 1e9; b < reserve {
			spend += reserve - b
			reserve = b
		} else {
			q.rebuild = 0
		}
	}
	x := r - reserve
	// The pool's time scale: the time the limit takes to refill the reserve.
	T0 := min(max(c.cfg.Horizon.Seconds(), reserve/L), 600)

	// What the pool spent since the oldest of its answers within T0/2, and at least
	// minSamples back (each answer moves the count by what a request costs: one alone
	// says little). If the refill could have filled the bucket in between, some of it
	// may have gone to waste unseen: the estimate is then a bound (full).
	spent, span, full := 0.0, 0.0, false
	for j := q.n - 1; j >= 0; j-- {
		old := q.hist[(q.head+j)%len(q.hist)]
		d := float64(t-old.t) / 1e9
		if span > 0 && d > T0/2 && q.n-j > minSamples {
			break
		}
		spent, span, full = old.r-r+L*d, d, old.r+L*d >= k.burst-u
	}
	q.push(sample{t, r})
	if q.idle > 0 {
		if r+u >= k.burst-1e-9 {
			q.base = max(q.base, q.idle) // back from idle to a full limit: nobody took its pace up
		}
		q.idle = 0
	}
	// No faster than the estimate is new: acting on it sooner would answer the same news
	// twice. (A burst too small to count in has no estimate: only refusals tell of others.
	// A client refused only for arriving early grows back at the pool's time scale,
	// however far apart its answers; one that met another client's slot, as slowly as its
	// answers come.)
	T := max(T0, 2*span)
	if tiny && !q.contended {
		T = T0
	}
	dt := 0.0
	if q.base > 0 {
		dt = float64(t-q.updated) / 1e9
	}
	if x <= 0 {
		q.phase = steady // the count is down to the reserve: the pool is using the limit
	}
	// A pace the client does not use (none of its requests waited for a slot since the
	// last answer) does not grow, as TCP does not grow a window it does not fill (RFC
	// 7661): clients asking less than their paces would hold them far above what they
	// send, and overrun the limit together when their demand rises.
	used := q.held
	q.held = false
	switch {
	case q.base == 0:
		// The first answer: start low; what is left well above the reserve is spent on
		// top, and the answers raise the pace as fast as there is room. A burst too small
		// to count in (fewer than four requests) found full says no more: nobody spent
		// from it for a refill's time, and only a refusal will tell of others. The client
		// takes the whole rate, as a lone client must to fill it, and halves if refused.
		q.base = L / 16
		if !tiny && r+u >= k.burst-1e-9 {
			// Found full: nobody spent from it for a refill's time. Start at the part of
			// the limit that the count holds above the reserve (several clients that start
			// together find it full only for the first of them).
			q.base = max(q.base, L*x/k.burst)
		}
		if q.rebuild != 0 {
			q.base = L / 2 // from an empty limit: nothing to spend, and nobody's pace to take up
		}
		if !tiny {
			q.phase = slowStart
		}
		if tiny && r+u >= k.burst-1e-9 {
			q.base = L
		}
	case x > 0 && (x > spend || full || r > k.burst-u-1), x >= 0 && reserve == 0:
		if !used {
			break
		}
		// Room, and either much of it or the pool's spending unknown (a burst of one
		// says nothing but refusals): grow with the room, by the same step for every
		// client (growing does not favour the fast).
		q.base += growth * L * room(x, reserve) * min(dt, T) / T
		if q.phase == slowStart {
			// Doubling every Horizon, however far apart the answers of a client that
			// starts slowly.
			q.base *= math.Exp2(min(dt, T0) / T0)
		}
	case span > 0:
		target := L + x/(2*T)
		f := 1 + (target/max(spent/span, L/1000)-1)*min(dt, T)/T
		if r < min(2*u, reserve) {
			f = min(f, 0.85) // next to nothing left: a refusal is imminent
		}
		if !used {
			f = min(f, 1)
		}
		if f < 1 {
			// A cut applies to what the client sends: a pace far above it (a client that
			// asks less than its pace allows) is first brought down to twice that, as Linux
			// grows a window only up to twice what is in flight (RFC 7661 likewise cuts a
			// window not fully used from the part used). Cut by a few percent an answer, such
			// a client did not slow down at all for seconds while the pool overran the limit.
			q.base = min(q.base, max(2*q.sends(c, t), L/1000))
		}
		q.base *= min(max(f, 0.5), 1.5)
	}
	if used {
		q.base += c.cfg.Fairness * L * dt * room(x+reserve, reserve) * (T0 / T)
	}
	// No client can keep up more than the limit's rate: the spare is spent on top.
	q.base = min(max(q.base, L/1000), L)
	q.pace = q.base + max(x-spend, 0)/(c.cfg.Horizon.Seconds()+4*c.rtt)
	q.updated = t
}

// room is x as a part of the reserve, in [0, 1] (with no reserve: 1 if x >= 0).
func room(x, reserve float64) float64 {
	if reserve <= 0 {
		if x >= 0 {
			return 1
		}
		return 0
	}
	return min(max(x/reserve, 0), 1)
}

func (q *sluiceQuota) push(s sample) {
	if q.n == len(q.hist) {
		q.head = (q.head + 1) % len(q.hist)
		q.n--
	}
	q.hist[(q.head+q.n)%len(q.hist)] = s
	q.n++
}
