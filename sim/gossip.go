package sim

import (
	"github.com/sluicehq/sluice/gossip/hits"
)

// gossipMode: each member runs the gossip core (package hits, as the daemons do), decides
// alone, and reports its hits to every other member at each sync over the simulated
// network (the store link's latency and loss); a partition cuts its members from the
// others. A crashed member falls silent; one that leaves is let go at once.
type gossipMode struct {
	cfg   hits.Config
	nodes []*hits.Node
	inc   []uint32    // the member incarnation each node was made for
	msgs  []gossipMsg // reports in flight, by slot
	free  []int32
	slots []int32 // a tick's parts' slots (reused)
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
	g := &gossipMode{cfg: hits.DefaultConfig()}
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
	}
	m := e.members[mi]
	if g.nodes[mi] == nil || g.inc[mi] != m.inc {
		n, err := hits.New(m.name, uint64(m.inc)+1, g.cfg, e.now)
		if err != nil {
			panic(err) // the settings were checked
		}
		g.nodes[mi], g.inc[mi] = n, m.inc
		// The membership: the newcomer learns the pool, the pool learns of it (memberlist's
		// join, modelled as instant).
		for j, o := range e.members {
			if int32(j) != mi && o.present {
				n.Join(o.name, e.now)
				if p := g.nodes[j]; p != nil && g.inc[j] == o.inc {
					p.Join(m.name, e.now)
				}
			}
		}
		phase := m.jit.Int64N(int64(g.cfg.Interval))
		e.schedule(event{at: e.now + phase, kind: evGossipTick, m: mi, op: m.inc})
	}
	return g.nodes[mi]
}

func (g *gossipMode) acquire(e *engine, mi, gi int32) {
	res, _, err := g.node(e, mi).Decide(gossipTag, e.core, e.now, 1, e.maxWait)
	e.decided(mi, gi, res, err)
}

func (g *gossipMode) handle(e *engine, ev *event) {
	m := e.members[ev.m]
	switch ev.kind {
	case evGossipTick:
		if !m.present || ev.op != m.inc {
			return
		}
		r := g.node(e, ev.m).Report(e.now)
		// In parts of a datagram's size, as the daemon sends them (a part is allocated at
		// its full size: parts of a mebibyte made the mode's runs a hundred times slower).
		parts, _ := hits.Encode(&r, gossipPacket)
		slots := g.slots[:0]
		for _, p := range parts {
			rs, err := hits.Decode(p)
			slots = append(slots, g.put(gossipMsg{reports: rs, malformed: err != nil}))
		}
		g.slots = slots
		for to := range e.members {
			t := int32(to)
			if t == ev.m || !e.members[to].present || e.partitioned[t] != e.partitioned[ev.m] {
				continue
			}
			for _, s := range slots {
				e.messages++
				e.bucket().messages++
				if e.lost(&e.sc.Network.Store) {
					continue
				}
				g.msgs[s].refs++
				e.schedule(event{at: e.now + e.latency(&e.sc.Network.Store), kind: evGossipMsg, m: t, op: e.members[to].inc, val: int64(s)})
			}
		}
		for _, s := range slots {
			if g.msgs[s].refs == 0 {
				g.drop(s) // sent to nobody, or lost on every way
			}
		}
		e.schedule(event{at: e.now + int64(g.cfg.Interval), kind: evGossipTick, m: ev.m, op: m.inc})
	case evGossipMsg:
		s := int32(ev.val)
		msg := &g.msgs[s]
		rs, malformed := msg.reports, msg.malformed
		if msg.refs--; msg.refs == 0 {
			g.drop(s)
		}
		if !m.present || ev.op != m.inc {
			return
		}
		n := g.node(e, ev.m)
		if malformed {
			n.CountMalformed()
			return
		}
		for i := range rs {
			n.Receive(e.now, &rs[i])
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
	_ = g.node(e, mi).Penalize(gossipTag, e.core, e.now, until)
}

// left: a graceful leave is announced (the membership does): the others let its share go
// at once. A crash is not: they hear nothing more and hold its share.
func (g *gossipMode) left(e *engine, mi int32, graceful bool) {
	if !graceful || int(mi) >= len(g.nodes) || g.nodes[mi] == nil {
		return
	}
	name := g.nodes[mi].Name()
	for i, n := range g.nodes {
		if n != nil && int32(i) != mi && e.members[i].present {
			n.Leave(name, e.now, true)
		}
	}
}
