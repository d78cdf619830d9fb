package sim

import (
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/internal/measure"
	"github.com/sluicehq/sluice/priority"
	"github.com/sluicehq/sluice/referee"
)

// gslot is one of a member's goroutines: what its request's events read, 32 bytes (a pool
// of thousands of goroutines keeps them in the CPU's cache). Its operation, which every
// event of it reads, is the member's ops[g] (4 bytes: the events of a goroutine waiting
// for a permit read nothing else of it); its ticket and the API's verdict are the
// member's tickets[g] and verdicts[g].
type gslot struct {
	busy    bool
	hasTk   bool  // holds a store reservation not yet used (the member's tickets[g])
	arrival int64 // when the request it handles arrived
	sent    int64 // when its request left for the API
	cost    int64 // its request's cost in tokens (a referee with token limits)
}

// member is one simulated worker process. The fields nearly every event reads come first,
// sharing cache lines.
type member struct {
	present bool
	inc     uint32 // incarnation: bumped on crash, leave and join
	paused  int64  // paused until this time (0: running)
	gs      []gslot
	ops     []uint32 // goroutine g's operation, bumped for every new one: older events for it are stale
	free    []int32  // idle goroutines

	queue   []int64 // arrival times of waiting requests (a ring; its length a power of two)
	qhead   int
	qlen    int
	backlog int64 // backlog requests not yet taken (they arrived at join)

	demand *Demand
	// rng draws its arrivals from pcg, and jit its back-offs' jitter (and a gossip
	// member's phase) from jpcg: two streams, so that its arrivals are the same whatever
	// the mode does with them, and the modes are compared on the same arrivals. All are
	// held in the member, beside what the same events read, rather than allocations away.
	rng   rand.Rand
	pcg   rand.PCG
	jit   rand.Rand
	jpcg  rand.PCG
	costs *rand.PCG // draws the tokens of its requests (reseeded at each join)
	debt  gcra.Debt // fail_mode local: what the fallback admitted, to charge back (as strict.Backend's ledger)

	granted, rejected, dropped int64
	cleared                    int64 // when its backlog was all answered (0: not yet)

	tickets  []gcra.Ticket     // the reservation goroutine g holds, if gs[g].hasTk
	verdicts []referee.Verdict // the API's answer to goroutine g's request, on its way back (observer modes)

	name   string
	group  int
	class  int8 // its calls' priority.Class
	joined int64
	on     bool // onoff: in an on spell
	times  int  // times: next index

	cls memberClasses // strict mode: what its limiter knows of the classes across members

	tats  []int64 // local mode: the member's own GCRA state
	hold  int64   // local mode: end of its penalty
	ftats []int64 // fail_mode local: the fallback GCRA state

	spanStart float64 // start of the open demand span (seconds), -1 if none
	spans     []measure.Span
}

// classCounts is one priority class's part of a run.
type classCounts struct {
	arrivals, accepted int64
	waits              hist
}

// engine runs one scenario under one mode.
type engine struct {
	sc     *Scenario
	mode   mode
	now    int64
	end    int64
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

	members  []*member
	byName   map[string][]int32
	observer bool // the mode is an answerObserver: the members keep the API's verdicts
	// the mode as a permitChecker and an answerObserver, nil if it is not one (asked once,
	// not at every event)
	checker permitChecker
	answers answerObserver
	delayer apiDelayer

	tickets     []gcra.Ticket // carried by the store's messages in flight (putTicket)
	freeTickets []int32

	storeTats    []int64
	storeHold    int64
	board        [2]int64                   // the store's board of classes: when critical and standard were last posted, plus one
	classBuf     [gcra.MaxLimits]gcra.Limit // the limits a lower class's request keeps headroom under (classLimits)
	storeDown    int64                      // down until
	partitionGen []uint32
	partitioned  []bool

	// ideal is a perfect throttle fed the same arrivals: no latency, an unbounded queue,
	// the limit in force. It admits idealN of them by the end: utilization's denominator.
	ideal     []int64
	idealCore []gcra.Limit
	idealN    int64
	idealLast int64 // when the ideal throttle's latest grant may be used
	windowed  bool  // the limits hold a windowed quota
	// with token limits: the ideal's state under them, and the costs it draws (the same
	// draws as the members')
	idealTok     []int64
	idealTokCore []gcra.Limit
	idealCosts   *rand.PCG
	idealTokN    int64 // the tokens of the requests the ideal admits
	acceptedTok  int64 // the tokens of the requests the referee accepted

	// counters
	arrivals, sent, accepted, rejected, dropped int64
	gossipBytes                                 int64 // the gossip mode's report bytes, at each receiver
	storeOps, messages, timeouts, failOpen      int64
	waits                                       hist
	// classes: the scenario names a priority; byClass then counts each class's part,
	// indexed by 1 - priority.Class (critical, standard, sheddable).
	classes    bool
	byClass    [3]classCounts
	series     []bucket
	cb         *bucket // now's sample (bucket)
	nextSample int64   // when the next sample starts
	sample     int64
	// A ramp runs from rampStart to rampEnd (0: none running); the limits follow it in
	// steps of rampStep, the next at rampNext.
	rampStart, rampEnd, rampNext int64
	eventLog                     []eventRecord
	progress                     func(float64)
	nevents                      uint64
	// done, when it closes, cuts the run short (looked at every checkEvery events):
	// interrupted, the run ends where it is, and the report covers what was measured.
	done        <-chan struct{}
	interrupted bool
}

// bucket is one sample of the time series.
type bucket struct {
	accepted, rejected, arrivals, sent, storeOps, messages int64
	queued, live                                           int64
	saturated                                              bool
	capacity                                               float64 // permits the limit in force allowed in the bucket (at its rate)
	ideal, idealTok                                        int64   // what the ideal throttle admits in the bucket (requests, tokens): a run cut short counts those before its end
}

type eventRecord struct {
	at, end int64 // end: when the event's effect stops (an outage's end), at for instant ones
	what    string
	store   bool // an event of the store's (an outage, a restart): nothing to a mode without one
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
	e.answers, e.observer = m.(answerObserver)
	e.checker, _ = m.(permitChecker)
	e.delayer, _ = m.(apiDelayer)
	e.setLimits(sc.Limit.Limits)
	e.maxWait = int64(sc.Client.MaxWait)
	e.margin = int64(sc.Client.Margin)
	opts := []referee.Option{referee.WithMaxTokens(1), referee.WithStyle(sc.Referee.style)}
	if sc.Referee.Tokens != nil {
		opts = append(opts, referee.WithCostLimits(sc.Referee.Tokens.Limits))
		e.idealTokCore = limitconv.Core(sc.Referee.Tokens.Limits, 0)
		e.idealTok = make([]int64, len(e.idealTokCore))
		e.idealCosts = rand.NewPCG(0, 0)
	}
	ref, err := referee.New(sc.Limit.Limits, opts...)
	if err != nil {
		panic(err) // the scenario's limits were validated
	}
	e.ref = ref
	e.series = make([]bucket, max(1, int((e.end+e.sample-1)/e.sample)))
	e.cb, e.nextSample = &e.series[0], e.sample
	e.storeTats = make([]int64, len(e.core))
	idx := int32(0)
	for gi := range sc.Members {
		g := &sc.Members[gi]
		class, _ := priority.Parse(g.Priority) // validated
		e.classes = e.classes || g.Priority != ""
		for k := 1; k <= g.Count; k++ {
			mb := &member{
				name:      g.Name + strconv.Itoa(k),
				group:     gi,
				class:     int8(class),
				cls:       memberClasses{uses: g.Priority != ""},
				demand:    &g.Demand,
				costs:     rand.NewPCG(0, 0),
				gs:        make([]gslot, g.Goroutines),
				ops:       make([]uint32, g.Goroutines),
				tickets:   make([]gcra.Ticket, g.Goroutines),
				queue:     make([]int64, 16),
				tats:      make([]int64, len(e.core)),
				ftats:     make([]int64, len(e.core)),
				spanStart: -1,
			}
			mb.pcg.Seed(sc.Seed, uint64(idx)+1)
			mb.rng = *rand.New(&mb.pcg)
			mb.jpcg.Seed(sc.Seed^0x6a6974746572, uint64(idx)+1) // "jitter"
			mb.jit = *rand.New(&mb.jpcg)
			if e.observer {
				mb.verdicts = make([]referee.Verdict, g.Goroutines)
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

// rampStep is how often a ramp's limits are recomputed: the members, the store and the
// ideal throttle decide under the ramp's limit as of at most this long ago (a lease's
// renewal, in the real modes, is a few times longer).
const rampStep = int64(100 * time.Millisecond)

// setLimits (re)computes the members' and the store's limits. A ramp starts now, unless
// the limits before ramped alike (then it goes on).
func (e *engine) setLimits(ls sluice.Limits) {
	prev := e.limits
	e.setCores(ls)
	if over := limitconv.RampOver(ls); over > 0 {
		if prev == nil || !limitconv.SameRamps(prev, ls) {
			e.rampStart = e.now
		}
		e.rampEnd = e.rampStart + int64(over)
		e.applyRamp(e.now)
	} else {
		e.rampEnd = 0
	}
}

// applyRamp sets the limits in force at t of a running ramp. The store's limits carry
// the ramp (gcra.Limit.Rise, from t: a decision in the step after t follows it up to a
// step behind), so that it spaces a booking at the ramp's pace where the booking falls, as
// the strict mode's stores do.
func (e *engine) applyRamp(t int64) {
	el := time.Duration(t - e.rampStart)
	e.core = limitconv.CoreRising(e.limits, e.sc.Client.Margin.D(), el)
	e.idealCore = limitconv.CoreAt(e.limits, 0, el)
	e.local = localShare(e.core, e.sc.Local.Share)
	e.fallback = gcra.ShareOf(e.core, wholeIfZero(e.sc.Store.FallbackShare))
	if t >= e.rampEnd {
		e.rampEnd = 0
	}
	e.rampNext = t - t%rampStep + rampStep
}

// setCores computes the limits' cores, ramps over.
func (e *engine) setCores(ls sluice.Limits) {
	e.limits = ls
	e.windowed = limitconv.Windowed(ls)
	e.idealCore = limitconv.Core(ls, 0)
	if len(e.ideal) != len(e.idealCore) {
		e.ideal = resize(e.ideal, len(e.idealCore))
	}
	e.core = limitconv.Core(ls, e.sc.Client.Margin.D())
	e.local = localShare(e.core, e.sc.Local.Share)
	e.fallback = gcra.ShareOf(e.core, wholeIfZero(e.sc.Store.FallbackShare))
}

// localShare is the local mode's limits: local.share of core; the whole limit is core
// itself, a ramp's Rise and all (the limiter's own, which books each permit at the ramp's
// pace where it falls).
func localShare(core []gcra.Limit, share float64) []gcra.Limit {
	if wholeIfZero(share) == 1 {
		return core
	}
	return gcra.ShareOf(core, share)
}

// wholeIfZero reads a scenario's share: 0 (unset) is the whole limit.
func wholeIfZero(share float64) float64 {
	if share <= 0 {
		return 1
	}
	return share
}

func (e *engine) schedule(ev event) {
	e.events.push(&ev)
}

// checkEvery is how many events the engine handles between two looks at done: about a
// millisecond of a large pool's run.
const checkEvery = 1 << 12

// run processes events until the end of the scenario, or until done closes.
func (e *engine) run() {
	next := uint64(1 << 16)
	for e.events.len() > 0 {
		if e.done != nil && e.nevents%checkEvery == 0 && closed(e.done) {
			e.interrupt()
			return
		}
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

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// interrupt ends a run cut short at now, as if it had been meant to end there: the time
// series ends with the sample in progress, and utilization's ideal throttle counts what it
// admitted by now (exactly to the start of that sample, in proportion to its part within
// it).
func (e *engine) interrupt() {
	e.interrupted = true
	e.end = e.now
	b := min(e.now/e.sample, int64(len(e.series)-1))
	e.closeBucket(int(b))
	e.series = e.series[:b+1]
	var n, tok float64
	for i := range e.series[:b] {
		n += float64(e.series[i].ideal)
		tok += float64(e.series[i].idealTok)
	}
	part := float64(e.now-b*e.sample) / float64(e.sample)
	e.idealN = int64(math.Round(n + part*float64(e.series[b].ideal)))
	e.idealTokN = int64(math.Round(tok + part*float64(e.series[b].idealTok)))
}

// advance moves time forward, closing the time-series buckets on the way.
func (e *engine) advance(t int64) {
	if t >= e.nextSample || t < e.now {
		for b := e.now / e.sample; b < t/e.sample && b < int64(len(e.series)); b++ {
			e.closeBucket(int(b))
		}
		e.cb = &e.series[min(t/e.sample, int64(len(e.series)-1))]
		e.nextSample = (t/e.sample + 1) * e.sample
	}
	e.now = t
	if e.rampEnd != 0 && t >= e.rampNext {
		e.applyRamp(t)
	}
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
	if over := limitconv.RampOver(e.limits); over > 0 && int64(b)*e.sample < e.rampStart+int64(over) {
		// A ramp: the rate of the ideal's limit at the bucket's middle (the plots' limit
		// line follows the ramp).
		mid := int64(b)*e.sample + e.sample/2
		rate = math.Inf(1)
		for _, c := range limitconv.CoreAt(e.limits, 0, time.Duration(mid-e.rampStart)) {
			rate = math.Min(rate, 1e9/float64(c.T))
		}
	}
	s.capacity = rate * float64(e.sample) / 1e9
	s.saturated = q > live || float64(s.arrivals) >= s.capacity
}

// bucket returns the time series' sample of now.
func (e *engine) bucket() *bucket { return e.cb }

// stale reports whether a goroutine event no longer applies.
func (e *engine) stale(ev *event) bool {
	m := e.members[ev.m]
	return !m.present || ev.g < 0 || m.ops[ev.g] != ev.op
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
			if e.checker != nil && !e.checker.permitOK(e, ev) {
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
			if p, ok := e.mode.(pauseObserver); ok {
				p.resumed(e, ev.m)
			}
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
				if p, ok := e.mode.(pauseObserver); ok {
					p.paused(e, mi)
				}
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
		if lc, ok := e.mode.(limitChanger); ok {
			lc.limitChanged(e)
		}
		if len(e.storeTats) != len(e.core) {
			e.storeTats = resize(e.storeTats, len(e.core))
			for _, m := range e.members {
				m.tats = resize(m.tats, len(e.core))
				m.ftats = resize(m.ftats, len(e.core))
			}
		}
	}
	e.eventLog = append(e.eventLog, eventRecord{at: e.now, end: end, what: what, store: se.StoreOutage != nil || se.StoreRestart})
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
		m.ops[g]++
		m.gs[g].busy = false
	}
	m.dropped += abandoned
	e.dropped += abandoned
	m.qlen, m.backlog = 0, 0
}
