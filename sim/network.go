package sim

// The network model: latency, loss and partitions between the members and the store.

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

// latencyOf returns a function that draws l's latencies as latency does, with the
// distribution's kind read once: for the many messages of a gossip member's report.
func (e *engine) latencyOf(l *Link) func() int64 {
	if d := &l.Latency; d.Kind == "uniform" {
		lo, span := int64(d.Min), float64(d.Max-d.Min)
		return func() int64 { return lo + int64(e.rng.Float64()*span) }
	}
	return func() int64 { return e.latency(l) }
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
