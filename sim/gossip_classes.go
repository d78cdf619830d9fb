package sim

// The classes across members in the gossip mode (docs/priorities.md, "The gossip mode's
// board of classes"): the key's board of classes is kept at its owner by the members'
// nodes (hits.Node.BoardOwner, Post, Posted, Classes, as the daemons keep it), each
// member's limiter posts its callers' class to it and reads it before a lower class
// decides, in messages over the store link's network (the daemons' own), and a lower
// class's places in the owner's line, or its decisions, keep the headroom of a higher
// class asking at another member (the limiter's keepFor, keepPlace).

import (
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/gossip/hits"
	"github.com/sluicehq/sluice/priority"
)

// Keep codes: what a forwarded request keeps of the burst (evGossipAsk's val, bits 32 up):
// nothing, the standard class's headroom or the sheddable class's.
const (
	keptNone int64 = iota
	keptStandard
	keptSheddable
)

// classLimits returns the limits member mi's request decides under, as its limiter
// computes them: e.core, or e.core less the headroom its class keeps for a higher class
// the limiter knows to be recent, and the code of that headroom for a forwarded request.
// ok is false (keepAll) when the headroom leaves nothing: retry says when the higher class
// stops being recent. On the way it posts the member's class on the key's board (at most
// every quarter of the time a class stays recent) and, for a lower class, reads the board
// (at most every boardEvery): its own if the member keeps it, otherwise what the owner
// last told, asking it again.
func (g *gossipMode) classLimits(e *engine, mi int32, n *hits.Node, keep keepMode) (ls []gcra.Limit, code int64, ok bool, retry int64) {
	m := e.members[mi]
	c := &m.cls
	if !c.uses || !n.MayRoute(gossipTag) {
		return e.core, keptNone, true, 0 // by shares: no headroom kept (hits.Node.DecideKept)
	}
	recent := recentFor(e.core)
	if c.born == 0 {
		c.born = e.now + 1
	}
	class := priority.Class(m.class)
	post := func(last *int64) {
		if *last != 0 && e.now-(*last-1) < recent/4 {
			return
		}
		*last = e.now + 1
		if owner := n.BoardOwner(gossipTag); owner == "" {
			_ = n.Post(gossipTag, class, recent, e.now)
		} else if p, ok := hits.PostEntry(gossipTag, class, recent); ok {
			g.sendClasses(e, mi, owner, p)
		}
	}
	switch class {
	case priority.Critical:
		post(&c.postedC)
		return e.core, keptNone, true, 0
	case priority.Standard:
		post(&c.postedS)
	}
	if keep == keepNone {
		return e.core, keptNone, true, 0
	}
	if c.readAt == 0 || e.now-(c.readAt-1) >= boardEvery {
		c.readAt = e.now + 1
		ago := [2]int64{}
		ago[0], ago[1] = n.Posted(gossipTag, e.now)
		for i, v := range []*int64{&c.viewC, &c.viewS} {
			if ago[i] >= 0 {
				*v = max(*v, e.now-ago[i]+1)
			}
		}
		if owner := n.BoardOwner(gossipTag); owner != "" {
			g.sendClasses(e, mi, owner, hits.ClassEntry{Tag: gossipTag, Flags: hits.FlagRead})
		}
	}
	frac, until := headroomFrac(e.core, class, c.viewC, c.viewS, c.born, e.now)
	ls, ok, retry = keptLimits(e.core, frac, until, e.now, keep, &e.classBuf)
	switch {
	case !ok || &ls[0] == &e.core[0]:
		code = keptNone
	case frac == priority.DefaultHeadroom.Sheddable:
		code = keptSheddable
	default:
		code = keptStandard
	}
	return ls, code, ok, retry
}

// keptOf returns the limits a forwarded request of keep code decides under at its owner.
func (e *engine) keptOf(code int64) []gcra.Limit {
	frac := 0.0
	switch code {
	case keptStandard:
		frac = priority.DefaultHeadroom.Standard
	case keptSheddable:
		frac = priority.DefaultHeadroom.Sheddable
	}
	ls, _, _ := keptLimits(e.core, frac, 0, 0, keepPlace, &e.classBuf)
	return ls
}

// sendClasses sends a classes message of one entry from member mi to the member named
// to, over the store link's network.
func (g *gossipMode) sendClasses(e *engine, mi int32, to string, entry hits.ClassEntry) {
	t := g.member(e, to)
	e.messages++
	e.bucket().messages++
	if t < 0 || !e.members[t].present || e.partitioned[t] != e.partitioned[mi] || e.lost(&e.sc.Network.Store) {
		return
	}
	var slot int32
	if k := len(g.freeEntries); k > 0 {
		slot = g.freeEntries[k-1]
		g.freeEntries = g.freeEntries[:k-1]
		g.entries[slot] = entry
	} else {
		g.entries = append(g.entries, entry)
		slot = int32(len(g.entries) - 1)
	}
	e.schedule(event{at: e.now + e.latency(&e.sc.Network.Store), kind: evGossipClasses, m: t, op: e.members[t].inc, val: int64(mi), val2: int64(slot)})
}

// classes: member ev.m's node receives a classes message from member ev.val, and answers
// a read with its board.
func (g *gossipMode) classes(e *engine, ev *event) {
	entry := g.entries[ev.val2]
	g.entries[ev.val2] = hits.ClassEntry{}
	g.freeEntries = append(g.freeEntries, int32(ev.val2))
	from := int32(ev.val)
	m := e.members[ev.m]
	if !m.present || ev.op != m.inc || e.partitioned[ev.m] != e.partitioned[from] {
		return
	}
	for _, r := range g.ready(e, ev.m).Classes([]hits.ClassEntry{entry}, e.now) {
		g.sendClasses(e, ev.m, e.members[from].name, r)
	}
}
