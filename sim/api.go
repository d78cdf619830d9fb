package sim

// The API model: permits granted or denied, requests sent to the referee, its answers.

// permit makes goroutine g send its request to the API at time at.
func (e *engine) permit(mi, g int32, at int64) {
	m := e.members[mi]
	e.schedule(event{at: max(at, e.now), kind: evPermit, m: mi, g: g, op: m.ops[g], val: at})
}

// denied handles a request that got no permit: retry after a jittered back-off (at least
// retryAfter), or drop it.
func (e *engine) denied(mi, g int32, retryAfter int64) {
	m := e.members[mi]
	if e.sc.Client.OnDeny == "drop" {
		m.dropped++
		e.dropped++
		e.startNext(mi, g)
		return
	}
	b := e.sc.Client.Backoff
	d := max(retryAfter, int64(b.Base))
	d = min(d, max(int64(b.Max), retryAfter))
	d += int64(float64(d) * b.Jitter * m.jit.Float64())
	e.schedule(event{at: e.now + d, kind: evRetry, m: mi, g: g, op: m.ops[g]})
}

func (e *engine) sendToAPI(mi, g int32) {
	m := e.members[mi]
	s := &m.gs[g]
	s.hasTk = false
	s.sent = e.now
	e.sent++
	e.bucket().sent++
	e.waits.add(e.now - s.arrival)
	if e.classes {
		e.byClass[1-m.class].waits.add(e.now - s.arrival)
	}
	e.messages++
	e.bucket().messages++
	var lost bool
	var lat int64
	if e.delayer != nil {
		lost, lat = e.delayer.apiDelay(e, mi, g) // drawn when the permit was granted
	} else if lost = e.lost(&e.sc.Network.API); !lost {
		lat = e.latency(&e.sc.Network.API)
	}
	if lost {
		// The request never arrives; the goroutine gives up after the store time-out.
		e.schedule(event{at: e.now + int64(e.sc.Store.Timeout), kind: evStart, m: mi, g: g, op: m.ops[g]})
		return
	}
	e.schedule(event{at: e.now + lat, kind: evAPIArrive, m: mi, g: g, op: m.ops[g], val2: s.cost})
}

func (e *engine) apiArrive(ev *event) {
	v, _ := e.ref.Call("api", ev.val2, e.now)
	if e.observer && !e.stale(ev) {
		e.members[ev.m].verdicts[ev.g] = v // for the mode, as the reply arrives
	}
	b := e.bucket()
	reply := *ev
	reply.kind = evAPIReply
	reply.at = e.now + e.latency(&e.sc.Network.API)
	reply.val, reply.val2 = 0, 0
	if v.Allowed {
		e.accepted++
		e.acceptedTok += ev.val2
		b.accepted++
		if e.classes {
			e.byClass[1-e.members[ev.m].class].accepted++
		}
		reply.val = 1
	} else {
		e.rejected++
		b.rejected++
		reply.val2 = int64(v.RetryAfter)
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
	if e.answers != nil {
		e.answers.answered(e, ev)
	}
	e.startNext(ev.m, ev.g)
	if m.backlog == 0 && m.qlen == 0 && m.cleared == 0 && m.demand.Pattern == "backlog" && len(m.free) == len(m.gs) {
		m.cleared = e.now
	}
}

// answerObserver is a mode that learns from every answer of the API (the adaptive
// mode's clients), told before the goroutine takes its next request.
type answerObserver interface {
	answered(e *engine, ev *event)
}
