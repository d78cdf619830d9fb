package sim

// The members' demand: joins, arrivals of requests, on/off spells, and their goroutines.

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/internal/measure"
)

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
		m.ops[g]++
		m.gs[g].busy = false
		m.gs[g].hasTk = false
		m.free = append(m.free, int32(g))
	}
	clear(m.tats)
	clear(m.ftats)
	m.cleared = 0
	// The tokens of its requests: the same draws for the member and the ideal throttle.
	m.costs.Seed(e.sc.Seed^uint64(mi)<<32^uint64(m.inc), 0x636f7374) // "cost"
	if e.idealCosts != nil {
		e.idealCosts.Seed(e.sc.Seed^uint64(mi)<<32^uint64(m.inc), 0x636f7374)
	}
	m.hold, m.debt = 0, gcra.Debt{}
	m.cls = memberClasses{uses: m.cls.uses} // a new process knows nothing of the classes
	d := m.demand
	switch d.Pattern {
	case "backlog":
		m.backlog = d.N
		e.idealAdmit(d, d.N)
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
// With token limits, the ideal draws the requests' costs as the members do: for a
// backlog, the very draws its member will make, in order; for arrivals, draws from the
// same distribution.
func (e *engine) idealAdmit(d *Demand, n int64) {
	for ; n > 0; n-- {
		at, cost := e.now, int64(0)
		if e.idealTokCore != nil {
			cost = d.Tokens.draw(e.idealCosts)
			res, tk, err := gcra.Decide(e.idealTok, e.idealTokCore, e.now, cost, math.MaxInt64)
			if err != nil || !res.Allowed || tk.At > e.end {
				return
			}
			at = tk.At
		}
		core := e.idealCore
		if limitconv.RampOver(e.limits) > 0 {
			// A ramp: the limit as of the latest grant (a backlog's are decided all at once
			// here, ahead of their time), so the ideal follows the ramp a permit behind.
			core = limitconv.CoreAt(e.limits, 0, time.Duration(max(at, e.idealLast)-e.rampStart))
		}
		res, tk, err := decide(e.ideal, core, at, 1, math.MaxInt64)
		if err != nil || !res.Allowed || tk.At > e.end || tk.At == e.end && e.windowed {
			// Every later one is later still. A window that opens as the run ends (a day's
			// run, a daily quota) is not the run's: its whole count would come at that instant.
			return
		}
		e.idealLast = tk.At
		e.idealN++
		e.idealTokN += cost
		b := &e.series[min(tk.At/e.sample, int64(len(e.series)-1))]
		b.ideal++
		b.idealTok += cost
	}
}

// draw returns one request's cost in tokens (1 when the demand names none).
func (t TokenRange) draw(src *rand.PCG) int64 {
	if t.Max <= 0 {
		return 1
	}
	return t.Min + int64(src.Uint64()%uint64(t.Max-t.Min+1))
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
	if e.classes {
		e.byClass[1-m.class].arrivals++
	}
	e.idealAdmit(m.demand, 1)
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
	m.queue[(m.qhead+m.qlen)&(len(m.queue)-1)] = at
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
	m.ops[g]++
	s.hasTk = false
	switch {
	case m.qlen > 0:
		s.arrival = m.queue[m.qhead]
		m.qhead = (m.qhead + 1) & (len(m.queue) - 1)
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
	s.cost = m.demand.Tokens.draw(m.costs)
	e.mode.acquire(e, mi, g)
}
