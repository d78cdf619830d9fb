package sim

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/measure"
	"github.com/sluicehq/sluice/referee"
)

// kind is what an event does.
type kind uint8

const (
	evArrival      kind = iota // a request of member m arrives (open-loop demand)
	evStart                    // goroutine g of member m takes the next request
	evPermit                   // g's permit is due: send the request to the API
	evAPIArrive                // the API receives g's request
	evAPIReply                 // g receives the API's answer (val: 1 accepted, 0 rejected; val2: retry-after)
	evRetry                    // g asks again after a back-off
	evStoreReq                 // the store receives g's request
	evStoreReply               // g receives the store's answer
	evStoreTimeout             // g gives up on the store's answer
	evStoreCharge              // the store receives a charge-back of val permits
	evStorePenalty             // the store receives a penalty until val
	evOnOff                    // an on/off member toggles
	evScenario                 // scenario event number val
	evResume                   // a paused member resumes
	evHeal                     // member m's partition heals (val: the partition's generation)
	evLeaseTick                // lease mode: member m's renewal timer (op: incarnation)
	evLeaseReq                 // lease mode: the store receives a request (val: message slot)
	evLeaseReply               // lease mode: member m receives the store's answer (val: message slot)
	evLeaseTimeout             // lease mode: member m gives up on a request (g: limit, val2: nonce)
)

// event is one thing that happens at a time. Events are values in a slice heap: the hot
// loop allocates nothing per event.
type event struct {
	at   int64
	seq  uint64
	kind kind
	m    int32
	g    int32
	op   uint32 // the goroutine's operation (or member's incarnation) the event belongs to
	val  int64
	val2 int64
	res  gcra.Result
	tk   gcra.Ticket
}

// eventQueue holds pending events: their payloads in reusable slots, and a 4-ary
// min-heap of small entries ordered by (at, seq), so that sifting moves 24 bytes, not a
// whole event. Nothing is allocated per event once the slots have grown.
type eventQueue struct {
	heap  []heapEntry
	slots []event
	free  []int32
}

type heapEntry struct {
	at   int64
	seq  uint64
	slot int32
}

func (q *eventQueue) len() int { return len(q.heap) }

func less(a, b *heapEntry) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

func (q *eventQueue) push(e *event) {
	var slot int32
	if n := len(q.free); n > 0 {
		slot = q.free[n-1]
		q.free = q.free[:n-1]
		q.slots[slot] = *e
	} else {
		slot = int32(len(q.slots))
		q.slots = append(q.slots, *e)
	}
	q.heap = append(q.heap, heapEntry{at: e.at, seq: e.seq, slot: slot})
	h := q.heap
	i := len(h) - 1
	x := h[i]
	for i > 0 {
		p := (i - 1) / 4
		if !less(&x, &h[p]) {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = x
}

// pop removes the earliest event and copies it into *out.
func (q *eventQueue) pop(out *event) {
	h := q.heap
	top := h[0]
	n := len(h) - 1
	x := h[n]
	q.heap = h[:n]
	h = h[:n]
	if n > 0 {
		i := 0
		for {
			l := 4*i + 1
			if l >= n {
				break
			}
			m := l
			for c := l + 1; c < l+4 && c < n; c++ {
				if less(&h[c], &h[m]) {
					m = c
				}
			}
			if !less(&h[m], &x) {
				break
			}
			h[i] = h[m]
			i = m
		}
		h[i] = x
	}
	*out = q.slots[top.slot]
	q.free = append(q.free, top.slot)
}

// gslot is one of a member's goroutines.
type gslot struct {
	op      uint32 // bumped for every new operation: older events for it are stale
	busy    bool
	arrival int64 // when the request it handles arrived
	ticket  gcra.Ticket
	hasTk   bool // holds a store reservation not yet used
}

// member is one simulated worker process.
type member struct {
	name    string
	group   int
	demand  *Demand
	rng     *rand.Rand
	present bool
	inc     uint32 // incarnation: bumped on crash, leave and join
	paused  int64  // paused until this time (0: running)
	joined  int64
	on      bool // onoff: in an on spell
	times   int  // times: next index

	queue   []int64 // arrival times of waiting requests (a ring)
	qhead   int
	qlen    int
	backlog int64 // backlog requests not yet taken (they arrived at join)

	gs   []gslot
	free []int32 // idle goroutines

	tats  []int64   // local mode: the member's own GCRA state
	hold  int64     // local mode: end of its penalty
	ftats []int64   // fail_mode local: the fallback GCRA state
	debt  gcra.Debt // fail_mode local: what the fallback admitted, to charge back (as redis.Backend's ledger)

	granted, rejected, dropped int64
	spanStart                  float64 // start of the open demand span (seconds), -1 if none
	spans                      []measure.Span
}

// engine runs one scenario under one mode.
type engine struct {
	sc     *Scenario
	mode   mode
	now    int64
	end    int64
	seq    uint64
	events eventQueue
	cur    event      // the event being handled
	rng    *rand.Rand // network

	limits   sluice.Limits
	core     []gcra.Limit // the members' view, tightened by the margin
	local    []gcra.Limit // local mode: each member's share
	fallback []gcra.Limit // fail_mode local: a cut-off member's share
	ref      *referee.Referee
	maxWait  int64
	margin   int64

	members []*member
	byName  map[string][]int32

	storeTats    []int64
	storeHold    int64
	storeDown    int64 // down until
	partitionGen []uint32
	partitioned  []bool

	// ideal is a perfect throttle fed the same arrivals: no latency, an unbounded queue,
	// the limit in force. It admits idealN of them by the end: utilization's denominator.
	ideal     []int64
	idealCore []gcra.Limit
	idealN    int64

	// counters
	arrivals, sent, accepted, rejected, dropped int64
	storeOps, messages, timeouts, failOpen      int64
	waits                                       hist
	series                                      []bucket
	sample                                      int64
	eventLog                                    []eventRecord
	progress                                    func(float64)
	nevents                                     uint64
}

// bucket is one sample of the time series.
type bucket struct {
	accepted, rejected, arrivals, sent, storeOps, messages int64
	queued, live                                           int64
	saturated                                              bool
	capacity                                               float64 // permits the limit in force allowed in the bucket (at its rate)
}

type eventRecord struct {
	at, end int64 // end: when the event's effect stops (an outage's end), at for instant ones
	what    string
}

func newEngine(sc *Scenario, m mode) *engine {
	e := &engine{
		sc:     sc,
		mode:   m,
		end:    int64(sc.Duration),
		rng:    rand.New(rand.NewPCG(sc.Seed, 0x6e6574)), // "net"
		sample: int64(sc.Sample),
		byName: map[string][]int32{},
	}
	e.setLimits(sc.Limit.Limits)
	e.maxWait = int64(sc.Client.MaxWait)
	e.margin = int64(sc.Client.Margin)
	ref, _ := referee.New(sc.Limit.Limits, referee.WithMaxTokens(1))
	e.ref = ref
	e.series = make([]bucket, max(1, int((e.end+e.sample-1)/e.sample)))
	e.storeTats = make([]int64, len(e.core))
	idx := int32(0)
	for gi := range sc.Members {
		g := &sc.Members[gi]
		for k := 1; k <= g.Count; k++ {
			mb := &member{
				name:      g.Name + strconv.Itoa(k),
				group:     gi,
				demand:    &g.Demand,
				rng:       rand.New(rand.NewPCG(sc.Seed, uint64(idx)+1)),
				gs:        make([]gslot, g.Goroutines),
				queue:     make([]int64, 16),
				tats:      make([]int64, len(e.core)),
				ftats:     make([]int64, len(e.core)),
				spanStart: -1,
			}
			e.members = append(e.members, mb)
			e.byName[mb.name] = []int32{idx}
			e.byName[g.Name] = append(e.byName[g.Name], idx)
			e.byName["all"] = append(e.byName["all"], idx)
			e.schedule(event{at: int64(g.Join), kind: evScenario, m: idx, val: -1}) // join
			if g.Leave > 0 {
				e.schedule(event{at: int64(g.Leave), kind: evScenario, m: idx, val: -2}) // leave
			}
			idx++
		}
	}
	e.partitioned = make([]bool, len(e.members))
	e.partitionGen = make([]uint32, len(e.members))
	for i := range sc.Events {
		e.schedule(event{at: int64(sc.Events[i].At), kind: evScenario, m: -1, val: int64(i)})
	}
	return e
}

// setLimits (re)computes the members' and the store's limits.
func (e *engine) setLimits(ls sluice.Limits) {
	e.limits = ls
	e.idealCore = ls.Core(0)
	if len(e.ideal) != len(e.idealCore) {
		e.ideal = resize(e.ideal, len(e.idealCore))
	}
	e.core = ls.Core(e.sc.Client.Margin.D())
	e.local = gcra.ShareOf(e.core, wholeIfZero(e.sc.Local.Share))
	e.fallback = gcra.ShareOf(e.core, wholeIfZero(e.sc.Store.FallbackShare))
}

// wholeIfZero reads a scenario's share: 0 (unset) is the whole limit.
func wholeIfZero(share float64) float64 {
	if share <= 0 {
		return 1
	}
	return share
}

func (e *engine) schedule(ev event) {
	e.seq++
	ev.seq = e.seq
	e.events.push(&ev)
}

// run processes events until the end of the scenario.
func (e *engine) run() {
	next := uint64(1 << 16)
	for e.events.len() > 0 {
		// The event lives in the engine, not on the stack: a pointer to a local would
		// escape through the mode interface and cost an allocation per event.
		e.events.pop(&e.cur)
		if e.cur.at > e.end {
			break
		}
		e.advance(e.cur.at)
		e.handle(&e.cur)
		e.nevents++
		if e.progress != nil && e.nevents >= next {
			next += 1 << 16
			e.progress(float64(e.now) / float64(e.end))
		}
	}
	e.advance(e.end)
	if e.end%e.sample != 0 || e.end == 0 {
		e.closeBucket(len(e.series) - 1) // the last, partial sample
	}
}

// advance moves time forward, closing the time-series buckets on the way.
func (e *engine) advance(t int64) {
	for b := e.now / e.sample; b < t/e.sample && b < int64(len(e.series)); b++ {
		e.closeBucket(int(b))
	}
	e.now = t
}

func (e *engine) closeBucket(b int) {
	var q, live int64
	for _, m := range e.members {
		if m.present {
			live++
			q += int64(m.qlen) + m.backlog
			for i := range m.gs {
				if m.gs[i].busy {
					q++
				}
			}
		}
	}
	s := &e.series[b]
	s.queued, s.live = q, live
	// Demand exceeded the limit in the bucket if requests were still waiting at its end
	// beyond the goroutines' own, or if more arrived than the limit allows.
	_, rate := measure.Capacity(e.limits, 0)
	s.capacity = rate * float64(e.sample) / 1e9
	s.saturated = q > live || float64(s.arrivals) >= s.capacity
}

func (e *engine) bucket() *bucket {
	b := int(e.now / e.sample)
	if b >= len(e.series) {
		b = len(e.series) - 1
	}
	return &e.series[b]
}

// stale reports whether a goroutine event no longer applies.
func (e *engine) stale(ev *event) bool {
	m := e.members[ev.m]
	return !m.present || ev.g < 0 || m.gs[ev.g].op != ev.op
}

func (e *engine) handle(ev *event) {
	if ev.kind == evScenario {
		e.scenarioEvent(ev)
		return
	}
	if ev.m >= 0 && ev.kind != evStoreReq && ev.kind != evStoreCharge && ev.kind != evStorePenalty && ev.kind != evAPIArrive && ev.kind != evHeal && ev.kind != evLeaseReq {
		m := e.members[ev.m]
		if m.paused > e.now && ev.kind != evArrival {
			// A paused process runs nothing: its events wait for it.
			d := *ev
			d.at = m.paused
			e.schedule(d)
			return
		}
	}
	switch ev.kind {
	case evArrival:
		e.arrival(ev)
	case evOnOff:
		e.onOff(ev)
	case evStart:
		if !e.stale(ev) {
			e.startNext(ev.m, ev.g)
		}
	case evRetry:
		if !e.stale(ev) {
			e.mode.acquire(e, ev.m, ev.g)
		}
	case evPermit:
		if !e.stale(ev) {
			if pc, ok := e.mode.(permitChecker); ok && !pc.permitOK(e, ev) {
				e.mode.acquire(e, ev.m, ev.g) // the permit expired (a pause): ask again
			} else {
				e.sendToAPI(ev.m, ev.g)
			}
		}
	case evAPIArrive:
		e.apiArrive(ev)
	case evAPIReply:
		if !e.stale(ev) {
			e.apiReply(ev)
		}
	case evResume:
		m := e.members[ev.m]
		if m.present && ev.op == m.inc {
			m.paused = 0
			e.wake(ev.m)
		}
	case evHeal:
		if e.partitionGen[ev.m] == uint32(ev.val) {
			e.partitioned[ev.m] = false
		}
	default:
		e.mode.handle(e, ev)
	}
}

// --- demand ---

func (e *engine) join(mi int32) {
	m := e.members[mi]
	if m.present {
		return
	}
	m.present = true
	m.inc++
	m.paused = 0
	m.joined = e.now
	m.qhead, m.qlen, m.backlog = 0, 0, 0
	m.free = m.free[:0]
	for g := range m.gs {
		m.gs[g].op++
		m.gs[g].busy = false
		m.gs[g].hasTk = false
		m.free = append(m.free, int32(g))
	}
	clear(m.tats)
	clear(m.ftats)
	m.hold, m.debt = 0, gcra.Debt{}
	d := m.demand
	switch d.Pattern {
	case "backlog":
		m.backlog = d.N
		e.idealAdmit(d.N)
		e.openSpan(m, math.Inf(1))
		e.wake(mi)
	case "onoff":
		m.on = false
		e.schedule(event{at: e.now, kind: evOnOff, m: mi, op: m.inc})
	case "times":
		m.times = 0
		e.openSpan(m, math.Inf(1))
		e.nextArrival(mi)
	default:
		e.openSpan(m, d.Rate)
		e.nextArrival(mi)
	}
}

// idealAdmit feeds n requests arriving now to the ideal throttle, counting those it would
// admit by the end of the run.
func (e *engine) idealAdmit(n int64) {
	for ; n > 0; n-- {
		res, tk, err := gcra.Decide(e.ideal, e.idealCore, e.now, 1, math.MaxInt64)
		if err != nil || !res.Allowed || tk.At > e.end {
			return // every later one is later still
		}
		e.idealN++
	}
}

func (e *engine) openSpan(m *member, demand float64) {
	e.closeSpan(m)
	m.spanStart = float64(e.now) / 1e9
	m.spans = append(m.spans, measure.Span{Start: m.spanStart, Demand: demand})
}

func (e *engine) closeSpan(m *member) {
	if m.spanStart < 0 {
		return
	}
	m.spans[len(m.spans)-1].End = float64(e.now) / 1e9
	m.spanStart = -1
}

// nextArrival schedules member mi's next open-loop arrival.
func (e *engine) nextArrival(mi int32) {
	m := e.members[mi]
	d := m.demand
	var gap float64 // seconds
	switch d.Pattern {
	case "constant":
		gap = 1 / d.Rate
	case "poisson", "onoff":
		gap = m.rng.ExpFloat64() / d.Rate
	case "diurnal":
		// Thinning: candidates at the peak rate, kept with probability rate(t)/peak.
		peak := d.Rate * (1 + d.Swing)
		t := float64(e.now) / 1e9
		for {
			t += m.rng.ExpFloat64() / peak
			r := d.Rate * (1 + d.Swing*math.Sin(2*math.Pi*(t+d.Phase.D().Seconds())/d.Period.D().Seconds()))
			if m.rng.Float64()*peak <= r {
				break
			}
		}
		gap = t - float64(e.now)/1e9
	case "times":
		if m.times >= len(d.Times) {
			e.closeSpan(m)
			return
		}
		at := m.joined + int64(d.Times[m.times])
		m.times++
		e.schedule(event{at: at, kind: evArrival, m: mi, op: m.inc})
		return
	default:
		return
	}
	e.schedule(event{at: e.now + max(1, int64(gap*1e9)), kind: evArrival, m: mi, op: m.inc})
}

func (e *engine) arrival(ev *event) {
	m := e.members[ev.m]
	if !m.present || ev.op != m.inc {
		return
	}
	if m.demand.Pattern == "onoff" && !m.on {
		return
	}
	e.arrivals++
	e.bucket().arrivals++
	e.idealAdmit(1)
	e.enqueue(m, e.now)
	e.nextArrival(ev.m)
	if m.paused <= e.now {
		e.wake(ev.m)
	}
}

func (e *engine) onOff(ev *event) {
	m := e.members[ev.m]
	if !m.present || ev.op != m.inc {
		return
	}
	m.on = !m.on
	mean := m.demand.Off.D()
	if m.on {
		mean = m.demand.On.D()
		e.openSpan(m, m.demand.Rate)
		e.nextArrival(ev.m)
	} else {
		e.closeSpan(m)
	}
	e.schedule(event{at: e.now + max(1, int64(m.rng.ExpFloat64()*float64(mean))), kind: evOnOff, m: ev.m, op: m.inc})
}

func (e *engine) enqueue(m *member, at int64) {
	if m.qlen == len(m.queue) {
		q := make([]int64, 2*len(m.queue))
		for i := 0; i < m.qlen; i++ {
			q[i] = m.queue[(m.qhead+i)%len(m.queue)]
		}
		m.queue, m.qhead = q, 0
	}
	m.queue[(m.qhead+m.qlen)%len(m.queue)] = at
	m.qlen++
}

// wake gives waiting requests to idle goroutines.
func (e *engine) wake(mi int32) {
	m := e.members[mi]
	for len(m.free) > 0 && (m.qlen > 0 || m.backlog > 0) {
		g := m.free[len(m.free)-1]
		m.free = m.free[:len(m.free)-1]
		e.startNext(mi, g)
	}
}

// startNext makes goroutine g take the next request, or go idle.
func (e *engine) startNext(mi, g int32) {
	m := e.members[mi]
	s := &m.gs[g]
	s.op++
	s.hasTk = false
	switch {
	case m.qlen > 0:
		s.arrival = m.queue[m.qhead]
		m.qhead = (m.qhead + 1) % len(m.queue)
		m.qlen--
	case m.backlog > 0:
		s.arrival = e.now // a backlog is an endless supply: waits count from pick-up
		m.backlog--
		if m.backlog == 0 {
			e.closeSpan(m)
		}
	default:
		s.busy = false
		if !slices.Contains(m.free, g) {
			m.free = append(m.free, g)
		}
		return
	}
	s.busy = true
	e.mode.acquire(e, mi, g)
}

// --- outcomes of acquiring ---

// permit makes goroutine g send its request to the API at time at.
func (e *engine) permit(mi, g int32, at int64) {
	m := e.members[mi]
	e.schedule(event{at: max(at, e.now), kind: evPermit, m: mi, g: g, op: m.gs[g].op, val: at})
}

// denied handles a request that got no permit: retry after a jittered back-off (at least
// retryAfter), or drop it.
func (e *engine) denied(mi, g int32, retryAfter int64) {
	m := e.members[mi]
	s := &m.gs[g]
	if e.sc.Client.OnDeny == "drop" {
		m.dropped++
		e.dropped++
		e.startNext(mi, g)
		return
	}
	b := e.sc.Client.Backoff
	d := max(retryAfter, int64(b.Base))
	d = min(d, max(int64(b.Max), retryAfter))
	d += int64(float64(d) * b.Jitter * m.rng.Float64())
	e.schedule(event{at: e.now + d, kind: evRetry, m: mi, g: g, op: s.op})
}

func (e *engine) sendToAPI(mi, g int32) {
	m := e.members[mi]
	s := &m.gs[g]
	s.hasTk = false
	e.sent++
	e.bucket().sent++
	e.waits.add(e.now - s.arrival)
	e.messages++
	e.bucket().messages++
	if e.lost(&e.sc.Network.API) {
		// The request never arrives; the goroutine gives up after the store time-out.
		e.schedule(event{at: e.now + int64(e.sc.Store.Timeout), kind: evStart, m: mi, g: g, op: s.op})
		return
	}
	e.schedule(event{at: e.now + e.latency(&e.sc.Network.API), kind: evAPIArrive, m: mi, g: g, op: s.op})
}

func (e *engine) apiArrive(ev *event) {
	d, _ := e.ref.Judge("api", 1, e.now)
	b := e.bucket()
	reply := *ev
	reply.kind = evAPIReply
	reply.at = e.now + e.latency(&e.sc.Network.API)
	if d.Allowed {
		e.accepted++
		b.accepted++
		reply.val = 1
	} else {
		e.rejected++
		b.rejected++
		reply.val2 = int64(d.RetryAfter)
	}
	e.schedule(reply)
}

func (e *engine) apiReply(ev *event) {
	m := e.members[ev.m]
	if ev.val == 1 {
		m.granted++
	} else {
		m.rejected++
		if ev.val2 > 0 {
			e.mode.penalize(e, ev.m, e.now+ev.val2)
		}
	}
	e.startNext(ev.m, ev.g)
}

// --- network ---

// latency draws one message's latency on a link.
func (e *engine) latency(l *Link) int64 {
	d := &l.Latency
	switch d.Kind {
	case "fixed":
		return int64(d.Value)
	case "uniform":
		return int64(d.Min) + int64(e.rng.Float64()*float64(d.Max-d.Min))
	case "exp":
		return int64(d.Min) + int64(e.rng.ExpFloat64()*float64(d.Mean))
	case "normal":
		return max(int64(d.Min), int64(float64(d.Mean)+e.rng.NormFloat64()*float64(d.SD)))
	}
	return 0
}

func (e *engine) lost(l *Link) bool { return l.Loss > 0 && e.rng.Float64() < l.Loss }

// toStore sends a message from member mi to the store; it reports whether it will arrive.
func (e *engine) toStore(ev event) bool {
	e.messages++
	e.bucket().messages++
	if e.partitioned[ev.m] || e.lost(&e.sc.Network.Store) {
		return false
	}
	ev.at = e.now + e.latency(&e.sc.Network.Store)
	e.schedule(ev)
	return true
}

// fromStore sends the store's reply to member mi, unless it is lost or would arrive after
// the member's deadline; it reports whether it will arrive.
func (e *engine) fromStore(ev event, deadline int64) bool {
	e.messages++
	e.bucket().messages++
	if e.partitioned[ev.m] || e.lost(&e.sc.Network.Store) {
		return false
	}
	ev.at = e.now + e.latency(&e.sc.Network.Store)
	if ev.at > deadline {
		return false
	}
	e.schedule(ev)
	return true
}

func (e *engine) storeUp() bool { return e.now >= e.storeDown }

// --- scenario events ---

func (e *engine) scenarioEvent(ev *event) {
	switch ev.val {
	case -1:
		e.join(ev.m)
		return
	case -2:
		e.leave(ev.m, true)
		return
	}
	se := &e.sc.Events[ev.val]
	what := ""
	end := e.now + int64(se.For)
	targets := func(ts Targets) []int32 {
		var out []int32
		for _, t := range ts {
			out = append(out, e.byName[t]...)
		}
		return out
	}
	switch {
	case len(se.Crash) > 0:
		what = "crash " + strings.Join(se.Crash, ",")
		for _, mi := range targets(se.Crash) {
			e.leave(mi, false)
		}
	case len(se.Leave) > 0:
		what = "leave " + strings.Join(se.Leave, ",")
		for _, mi := range targets(se.Leave) {
			e.leave(mi, true)
		}
	case len(se.Join) > 0:
		what = "join " + strings.Join(se.Join, ",")
		for _, mi := range targets(se.Join) {
			e.join(mi)
		}
	case len(se.Pause) > 0:
		what = "pause " + strings.Join(se.Pause, ",") + " for " + se.For.D().String()
		for _, mi := range targets(se.Pause) {
			m := e.members[mi]
			if m.present {
				m.paused = e.now + int64(se.For)
				e.schedule(event{at: m.paused, kind: evResume, m: mi, op: m.inc})
			}
		}
	case se.StoreOutage != nil:
		what = "store outage for " + se.StoreOutage.D().String()
		e.storeDown = e.now + int64(*se.StoreOutage)
		end = e.storeDown
	case len(se.Partition) > 0:
		what = "partition " + strings.Join(se.Partition, ",")
		if se.For > 0 {
			what += " for " + se.For.D().String()
		}
		for _, mi := range targets(se.Partition) {
			e.partitioned[mi] = true
			e.partitionGen[mi]++
			if se.For > 0 {
				e.schedule(event{at: e.now + int64(se.For), kind: evHeal, m: mi, val: int64(e.partitionGen[mi])})
			}
		}
	case se.Heal:
		what = "heal"
		clear(e.partitioned)
	case se.StoreRestart:
		what = "store restart"
		if r, ok := e.mode.(storeRestarter); ok {
			r.storeRestart(e)
		}
	case se.Limit != nil:
		what = "limit " + se.Limit.String()
		e.setLimits(se.Limit.Limits)
		e.ref.SetLimits(se.Limit.Limits)
		if len(e.storeTats) != len(e.core) {
			e.storeTats = resize(e.storeTats, len(e.core))
			for _, m := range e.members {
				m.tats = resize(m.tats, len(e.core))
				m.ftats = resize(m.ftats, len(e.core))
			}
		}
	}
	e.eventLog = append(e.eventLog, eventRecord{at: e.now, end: end, what: what})
}

func resize(s []int64, n int) []int64 {
	out := make([]int64, n)
	copy(out, s)
	return out
}

// leave takes a member out: gracefully (reserved permits are given back, in the modes that
// can) or by a crash (nothing is given back; requests already sent still arrive).
func (e *engine) leave(mi int32, graceful bool) {
	m := e.members[mi]
	if !m.present {
		return
	}
	e.mode.left(e, mi, graceful)
	e.closeSpan(m)
	m.present = false
	m.inc++
	abandoned := int64(m.qlen) // a backlog is an endless supply: not counted
	for g := range m.gs {
		if m.gs[g].busy {
			abandoned++
		}
		m.gs[g].op++
		m.gs[g].busy = false
	}
	m.dropped += abandoned
	e.dropped += abandoned
	m.qlen, m.backlog = 0, 0
}
