package sim

import (
	"slices"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/gossip/hits"
)

// gossipMode: each member runs the gossip core (package hits, as the daemons do), decides
// alone, and reports its hits at each sync over the simulated network (the store link's
// latency and loss): to every other member in a pool of up to MeshMax, over each key's
// tree in a larger one (hits.Node.Sync); a partition cuts its members from the others. A
// crashed member falls silent; one that leaves is let go at once. Over trees the nodes
// learn a crash or a partition from the membership, modelled here as memberlist's failure
// detection (gossipDetect, gossipRejoin).
//
// A report on its way to a member whose node is running waits in that member's inbox
// rather than in the event queue: the node receives it, at its own arrival time, just
// before the node's next call (a decision, a report, a penalty, a change of membership,
// or a report that came through the queue), which is when the queue would have delivered
// it. All-to-all reports are members² messages an interval (about 10 million a virtual
// second for 1,000 members): each an event of its own cost most of the mode's run, in
// the queue and in reading a node cold from memory for every message; an inbox costs a
// few slots, and each node receives its reports in a batch, warm. What the nodes decide
// is the same, but for a report that arrives at the very nanosecond of another event of
// its member: it is received first (the queue ordered such ties by when they were
// scheduled). A report to a member without a running node (it has not decided yet, or
// it rejoined) or paused goes through the queue as before.
type gossipMode struct {
	cfg   hits.Config
	nodes []*hits.Node
	inc   []uint32    // the member incarnation each node was made for
	msgs  []gossipMsg // reports in flight, by slot
	free  []int32
	slots []int32 // a tick's parts' slots (reused)

	inbox [][]inboxMsg // per member: reports on their way to its node, by arrival time
	head  []int        // per member: the first of its inbox not yet received
	// open: per member, whether reports to it go to its inbox: it is present, its node
	// running and its process not paused. A tick reads it for every member (a byte each,
	// where the member's own record is a cache miss).
	open []bool

	byName map[string]int32 // member indexes by name: the owners requests are forwarded to
	lines  procLines        // each member's line to the keys' owners

	entries     []hits.ClassEntry // classes messages in flight, by slot (gossip_classes.go)
	freeEntries []int32

	// The membership's failure detection, for pools that report over trees (the nodes do
	// not hear every peer, so they learn a peer's crash or a partition from it, as the
	// daemon does from memberlist): sides is the partition it last saw, and a membership
	// event is due at memberAt (0: none).
	sides    []bool
	memberAt int64
}

// gossipDetect is how long the membership takes to declare a crashed or cut-off member
// dead (memberlist's failure detection as the daemon sets it: about two seconds), and
// gossipRejoin how long it takes to count a healed one again (the daemon's rejoin round).
const (
	gossipDetect = 2_000_000_000
	gossipRejoin = 1_000_000_000
)

// inboxMsg is a report's part on its way to a member's node: it arrives at at.
type inboxMsg struct {
	at   int64
	slot int32
}

// gossipMsg is one part of a member's report, decoded once for all the members it is
// sent to (hits.Decode is a function of the part's bytes alone, and Receive reads the
// reports without changing them): refs of them have it still on its way.
type gossipMsg struct {
	reports   []hits.Report
	malformed bool
	refs      int
}

func newGossipMode(sc *Scenario) *gossipMode {
	g := &gossipMode{cfg: hits.DefaultConfig(), lines: procLines{}}
	if sc.Gossip.Interval > 0 {
		g.cfg.Interval = sc.Gossip.Interval.D()
		g.cfg.LostAfter = 5 * g.cfg.Interval
	}
	if sc.Gossip.Hold > 0 {
		g.cfg.Hold = sc.Gossip.Hold.D()
	}
	g.cfg.Policy, _ = hits.ParsePolicy(sc.Gossip.Policy) // checked when the scenario was read
	return g
}

func (*gossipMode) name() string { return "gossip" }

const gossipTag = "k"

// gossipPacket is the most a report's part holds: the daemon's datagram part.
const gossipPacket = 1200

// node returns member mi's node, making it (and starting its reports) when it (re)joined.
func (g *gossipMode) node(e *engine, mi int32) *hits.Node {
	if len(g.nodes) < len(e.members) {
		g.nodes = append(g.nodes, make([]*hits.Node, len(e.members)-len(g.nodes))...)
		g.inc = append(g.inc, make([]uint32, len(e.members)-len(g.inc))...)
		g.inbox = append(g.inbox, make([][]inboxMsg, len(e.members)-len(g.inbox))...)
		g.head = append(g.head, make([]int, len(e.members)-len(g.head))...)
		g.open = append(g.open, make([]bool, len(e.members)-len(g.open))...)
	}
	m := e.members[mi]
	if g.nodes[mi] == nil || g.inc[mi] != m.inc {
		n, err := hits.New(m.name, uint64(m.inc)+1, g.cfg, e.now)
		if err != nil {
			panic(err) // the settings were checked
		}
		g.discard(mi) // reports to an earlier node of the member (none: it left)
		g.nodes[mi], g.inc[mi] = n, m.inc
		g.open[mi] = m.paused == 0
		// The membership: the newcomer learns the pool, the pool learns of it (memberlist's
		// join, modelled as instant).
		for j, o := range e.members {
			if int32(j) != mi && o.present {
				n.Join(o.name, e.now)
				if p := g.nodes[j]; p != nil && g.inc[j] == o.inc {
					g.deliver(e, int32(j))
					p.Join(m.name, e.now)
				}
			}
		}
		phase := m.jit.Int64N(int64(g.cfg.Interval))
		e.schedule(event{at: e.now + phase, kind: evGossipTick, m: mi, op: m.inc})
	}
	return g.nodes[mi]
}

// running returns member mi's node if it is running (made for the member's incarnation
// now), or nil.
func (g *gossipMode) running(e *engine, mi int32) *hits.Node {
	if int(mi) < len(g.nodes) && g.nodes[mi] != nil && g.inc[mi] == e.members[mi].inc {
		return g.nodes[mi]
	}
	return nil
}

// ready returns member mi's node (made if need be) with every report that arrived for it
// by now received: what the node knows when the queue would have run its call.
func (g *gossipMode) ready(e *engine, mi int32) *hits.Node {
	n := g.node(e, mi)
	g.deliver(e, mi)
	return n
}

// deliver has member mi's node receive the reports in its inbox that arrived by now, in
// the order they arrived (at their arrival times).
func (g *gossipMode) deliver(e *engine, mi int32) {
	in, h := g.inbox[mi], g.head[mi]
	if h == len(in) || in[h].at > e.now {
		return
	}
	n := g.nodes[mi]
	for ; h < len(in) && in[h].at <= e.now; h++ {
		g.receive(e, mi, n, in[h].at, in[h].slot)
	}
	switch {
	case h == len(in):
		g.inbox[mi], g.head[mi] = in[:0], 0
	case h >= 256 && h >= len(in)/2:
		g.inbox[mi], g.head[mi] = in[:copy(in, in[h:])], 0
	default:
		g.head[mi] = h
	}
}

// receive has node n (member mi's) receive the report in slot s at at, and lets the slot
// go once every member it was sent to has it. What the node relays down a tree goes now.
func (g *gossipMode) receive(e *engine, mi int32, n *hits.Node, at int64, s int32) {
	msg := &g.msgs[s]
	rs, malformed := msg.reports, msg.malformed
	if msg.refs--; msg.refs == 0 {
		g.drop(s)
	}
	if n == nil {
		return
	}
	if malformed {
		n.CountMalformed()
		return
	}
	for i := range rs {
		n.Receive(at, &rs[i])
	}
	if rel := n.Relays(); rel != nil {
		g.send(e, mi, rel)
	}
}

// post puts the report in slot s into member to's inbox, arriving at at.
func (g *gossipMode) post(to int32, at int64, s int32) {
	in := append(g.inbox[to], inboxMsg{at: at, slot: s})
	// In order of arrival, ties in the order sent: the latest sent goes after every
	// report that arrives no later (a few at most: latencies differ by less than a
	// sync interval).
	k := len(in) - 1
	for k > g.head[to] && in[k-1].at > at {
		in[k] = in[k-1]
		k--
	}
	in[k] = inboxMsg{at: at, slot: s}
	g.inbox[to] = in
}

// discard drops member mi's inbox: its node is gone (the member left or crashed), and
// reports to it arrive nowhere.
func (g *gossipMode) discard(mi int32) {
	if int(mi) >= len(g.inbox) {
		return
	}
	in := g.inbox[mi]
	for _, x := range in[g.head[mi]:] {
		g.receive(nil, mi, nil, x.at, x.slot)
	}
	g.inbox[mi], g.head[mi] = in[:0], 0
}

// paused: member mi's process is paused. Its node receives what arrived so far, and the
// reports still on their way go through the queue, which holds them, as every event of a
// paused process, until it resumes.
func (g *gossipMode) paused(e *engine, mi int32) {
	if g.running(e, mi) == nil {
		return
	}
	g.open[mi] = false
	g.deliver(e, mi)
	in := g.inbox[mi]
	for _, x := range in[g.head[mi]:] {
		e.schedule(event{at: x.at, kind: evGossipMsg, m: mi, op: e.members[mi].inc, val: int64(x.slot)})
	}
	g.inbox[mi], g.head[mi] = in[:0], 0
}

// resumed: member mi's process runs again; reports to its node go to its inbox again.
func (g *gossipMode) resumed(e *engine, mi int32) {
	g.open[mi] = g.running(e, mi) != nil
}

// acquire decides at the member, or forwards the request to the key's owner when the
// member's node routes it there (hits.Node.Route): over the store link's network (the
// daemons' own), with the store's time-out for an answer that does not come.
//
// A key decided at an owner is one line that every member shares (gossip.Backend's
// backend.Capabilities.SharedLine): each member holds a few places in it, as the library's
// sluice.FairProcesses does, whoever the owner is (procLines).
//
// A member whose calls name a class decides under the limits its limiter computes from
// the key's board of classes (classLimits): its places in the line, or its decisions that
// do not wait, keep the headroom of a higher class asking at another member.
func (g *gossipMode) acquire(e *engine, mi, gi int32) {
	n := g.ready(e, mi)
	o, routed := n.Route(gossipTag, e.core)
	if routed && !g.lines.admit(e, mi, gi) {
		return // parked in the member's line
	}
	keep := keepPlace // sluice.FairProcesses's places: the backend's line is shared
	if e.maxWait == 0 {
		keep = keepAll // a pessimistic client decides now or never
	}
	ls, code, ok, retry := g.classLimits(e, mi, n, keep)
	if !ok {
		if routed {
			g.release(e, mi)
		}
		e.denied(mi, gi, retry)
		return
	}
	if o != "" {
		g.forward(e, mi, gi, o, code)
		return
	}
	var res gcra.Result
	var tk gcra.Ticket
	err := n.DecideKept(&res, &tk, gossipTag, e.core, ls, e.now, 1, e.maxWait)
	if routed {
		g.lines.answered(e, mi, gi)
		if err != nil || !res.Allowed {
			g.release(e, mi)
		}
	}
	e.decided(mi, gi, res, err)
}

// release ends member mi's hold on a place in an owner's line.
func (g *gossipMode) release(e *engine, mi int32) { g.lines.release(e, mi, g.acquire) }

// permitOK releases the member's place as its permit falls due (the permit is used).
func (g *gossipMode) permitOK(e *engine, ev *event) bool {
	if ln := g.lines[ev.m]; ln != nil && ln.held > 0 {
		g.release(e, ev.m)
	}
	return true
}

// forward sends goroutine gi's request to the member named owner, keeping the headroom
// code says (classLimits).
func (g *gossipMode) forward(e *engine, mi, gi int32, owner string, code int64) {
	to := g.member(e, owner)
	ask := event{kind: evGossipAsk, m: to, g: gi, op: e.members[mi].ops[gi], val: int64(mi) | code<<32, val2: e.now}
	e.messages++
	e.bucket().messages++
	if to < 0 || e.partitioned[to] != e.partitioned[mi] || e.lost(&e.sc.Network.Store) {
		g.late(e, &ask)
		return
	}
	ask.at = e.now + e.latency(&e.sc.Network.Store)
	e.schedule(ask)
}

// member returns the index of the member named name (-1: none).
func (g *gossipMode) member(e *engine, name string) int32 {
	if len(g.byName) != len(e.members) {
		g.byName = make(map[string]int32, len(e.members))
		for i, m := range e.members {
			g.byName[m.name] = int32(i)
		}
	}
	if i, ok := g.byName[name]; ok {
		return i
	}
	return -1
}

// late schedules the asking goroutine's time-out for a forwarded request that gets no
// answer in time (only those that get none schedule one).
func (g *gossipMode) late(e *engine, ask *event) {
	e.schedule(event{at: ask.val2 + int64(e.sc.Store.Timeout), kind: evStoreTimeout, m: int32(uint32(ask.val)), g: ask.g, op: ask.op})
}

// ask: the owner decides a forwarded request and answers it.
func (g *gossipMode) ask(e *engine, ev *event) {
	from := int32(uint32(ev.val))
	if !e.members[ev.m].present || e.partitioned[ev.m] != e.partitioned[from] {
		g.late(e, ev) // no answer: the asking goroutine times out
		return
	}
	var res gcra.Result
	var tk gcra.Ticket
	err := g.ready(e, ev.m).DecideKept(&res, &tk, gossipTag, e.core, e.keptOf(ev.val>>32), e.now, 1, e.maxWait)
	if err != nil {
		res = gcra.Result{}
	}
	ans := event{kind: evGossipAnswer, m: from, g: ev.g, op: ev.op, ok: res.Allowed, val2: res.RetryAfter}
	if res.Allowed {
		ans.val2 = res.Delay
	}
	e.messages++
	e.bucket().messages++
	ans.at = e.now + e.latency(&e.sc.Network.Store)
	if e.lost(&e.sc.Network.Store) || ans.at > ev.val2+int64(e.sc.Store.Timeout) {
		g.late(e, ev) // the grant, if any, is never used (as a crashed member's is)
		return
	}
	e.schedule(ans)
}

func (g *gossipMode) handle(e *engine, ev *event) {
	m := e.members[ev.m]
	switch ev.kind {
	case evGossipTick:
		if !m.present || ev.op != m.inc {
			return
		}
		n := g.ready(e, ev.m)
		g.send(e, ev.m, n.Sync(e.now))
		if !n.Meshed() {
			g.watch(e)
		}
		e.schedule(event{at: e.now + int64(g.cfg.Interval), kind: evGossipTick, m: ev.m, op: m.inc})
	case evGossipAsk:
		g.ask(e, ev)
	case evGossipAnswer:
		if e.stale(ev) {
			return
		}
		g.lines.answered(e, ev.m, ev.g)
		if ev.ok {
			// The delay counts from the answer's arrival, as at a forwarding daemon.
			e.permit(ev.m, ev.g, e.now+ev.val2)
		} else {
			g.release(e, ev.m)
			e.denied(ev.m, ev.g, ev.val2)
		}
	case evStoreTimeout:
		if e.stale(ev) {
			return
		}
		e.timeouts++
		e.members[ev.m].ops[ev.g]++ // a late answer no longer applies
		g.release(e, ev.m)
		e.denied(ev.m, ev.g, 0)
	case evGossipMsg:
		var n *hits.Node
		if m.present && ev.op == m.inc {
			n = g.ready(e, ev.m)
		}
		g.receive(e, ev.m, n, e.now, int32(ev.val))
	case evGossipMembership:
		g.membership(e)
	case evGossipClasses:
		g.classes(e, ev)
	}
}

// send sends member mi's reports over the store link's network: each to its To, or, for
// a report to every peer, to every member on mi's side of any partition.
func (g *gossipMode) send(e *engine, mi int32, rs []hits.Report) {
	part := e.partitioned[mi]
	link := &e.sc.Network.Store
	latency := e.latencyOf(link)
	sent := int64(0)
	for k := range rs {
		r := &rs[k]
		// In parts of a datagram's size, as the daemon sends them (a part is allocated at
		// its full size: parts of a mebibyte made the mode's runs a hundred times slower).
		parts, _ := hits.Encode(r, gossipPacket)
		slots, size := g.slots[:0], int64(0)
		for _, p := range parts {
			rs, err := hits.Decode(p)
			slots = append(slots, g.put(gossipMsg{reports: rs, malformed: err != nil}))
			size += int64(len(p))
		}
		g.slots = slots
		to := func(t int32) {
			inbox := g.open[t]
			o := e.members[t]
			if t == mi || e.partitioned[t] != part || !inbox && !o.present {
				return
			}
			e.gossipBytes += size
			for _, s := range slots {
				sent++
				if e.lost(link) {
					continue
				}
				g.msgs[s].refs++
				at := e.now + latency()
				if inbox {
					g.post(t, at, s)
				} else {
					e.schedule(event{at: at, kind: evGossipMsg, m: t, op: o.inc, val: int64(s)})
				}
			}
		}
		if r.To == "" {
			for t := range e.members {
				to(int32(t))
			}
		} else if t := g.member(e, r.To); t >= 0 && int(t) < len(g.open) {
			to(t)
		}
		for _, s := range slots {
			if g.msgs[s].refs == 0 {
				g.drop(s) // sent to nobody, or lost on every way
			}
		}
	}
	e.messages += sent
	e.bucket().messages += sent
}

// watch schedules the membership's news when the partition changed since it last looked
// (over trees only: all-to-all, the nodes find silent peers themselves).
func (g *gossipMode) watch(e *engine) {
	if len(g.sides) == len(e.partitioned) && slices.Equal(g.sides, e.partitioned) {
		return
	}
	cut := false
	for i, p := range e.partitioned {
		if p && (i >= len(g.sides) || !g.sides[i]) {
			cut = true
		}
	}
	g.sides = append(g.sides[:0], e.partitioned...)
	g.announce(e, cut)
}

// announce schedules the membership's news: after gossipDetect when a member may have
// crashed or been cut off, gossipRejoin when one came back.
func (g *gossipMode) announce(e *engine, dead bool) {
	d := int64(gossipRejoin)
	if dead {
		d = gossipDetect
	}
	if at := e.now + d; g.memberAt == 0 || at < g.memberAt || g.memberAt < e.now {
		g.memberAt = at
		e.schedule(event{at: at, kind: evGossipMembership})
	}
}

// membership tells every running node which members are alive and reachable (Join) and
// which are not (Leave, not graceful: held for the hold), as memberlist does the daemon.
func (g *gossipMode) membership(e *engine) {
	if e.now != g.memberAt {
		return // superseded by an earlier one
	}
	g.memberAt = 0
	for i := range e.members {
		n := g.running(e, int32(i))
		if n == nil || !e.members[i].present {
			continue
		}
		g.deliver(e, int32(i))
		for j, o := range e.members {
			switch {
			case j == i:
			case o.present && e.partitioned[j] == e.partitioned[i]:
				n.Join(o.name, e.now)
			default:
				n.Leave(o.name, e.now, false)
			}
		}
	}
}

// put keeps a message in flight and returns its slot.
func (g *gossipMode) put(msg gossipMsg) int32 {
	if k := len(g.free); k > 0 {
		s := g.free[k-1]
		g.free = g.free[:k-1]
		g.msgs[s] = msg
		return s
	}
	g.msgs = append(g.msgs, msg)
	return int32(len(g.msgs) - 1)
}

// drop frees a message's slot once nobody has it on its way.
func (g *gossipMode) drop(s int32) {
	g.msgs[s] = gossipMsg{}
	g.free = append(g.free, s)
}

func (g *gossipMode) penalize(e *engine, mi int32, until int64) {
	_ = g.ready(e, mi).Penalize(gossipTag, e.core, e.now, until)
}

// left: a graceful leave is announced (the membership does): the others let its share go
// at once. A crash is not: they hear nothing more and hold its share.
func (g *gossipMode) left(e *engine, mi int32, graceful bool) {
	if int(mi) < len(g.open) {
		g.open[mi] = false
	}
	g.discard(mi) // what was still on its way arrives after it left: nowhere
	if n := g.running(e, mi); !graceful && n != nil && !n.Meshed() {
		g.announce(e, true)
	}
	if !graceful || int(mi) >= len(g.nodes) || g.nodes[mi] == nil {
		return
	}
	name := g.nodes[mi].Name()
	for i, n := range g.nodes {
		if n != nil && int32(i) != mi && e.members[i].present {
			if g.running(e, int32(i)) != nil {
				g.deliver(e, int32(i))
			}
			n.Leave(name, e.now, true)
		}
	}
}
