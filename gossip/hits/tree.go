package hits

import (
	"cmp"
	"math"
	"slices"
)

// Pools of more than Config.MeshMax nodes report over a tree per tag instead of to every
// peer (docs/gossip.md, "Hundreds of daemons"). The tree of a tag is every live node
// ordered by its name's hash, rotated so that the tag's root comes first: the node whose
// name hashes highest with the tag, among the live ones (the tag's owner while the owner
// is live). The node at rank k has the nodes at ranks k×Fanout+1 to k×Fanout+Fanout as
// children. Every interval a node sends its parent its subtree's aggregate for each tag
// it has news of (an up entry: the hits charged in the subtree, cumulative, and the
// subtree's demands as a histogram), and the root sends its children the pool's
// aggregate (a down entry: the pool's hits, and the water level of the shares), which
// each node relays to its own children as it arrives. A node sends Fanout + 1 messages an
// interval at most, whatever the pool's size; liveness comes from the membership (Join and
// Leave), not from hearing every peer.

// member is a live node in a tree's order: slot -1 is this node.
type member struct {
	h    uint64
	slot int
}

// treeTag is a tag's state in its tree at this node.
type treeTag struct {
	ver    uint64 // n.lver the tree was computed at (0: not yet)
	root   bool
	parent int   // the parent's slot (root: -1)
	kids   []int // the children's slots

	up       []kidTag        // what children reported
	fromKids uint64          // hits charged from children's reports, cumulative
	sent     [history]uint64 // the subtree's hits at the last reports, newest first
	sentS    uint64          // the subtree's hits sent up last
	changed  uint64          // the report that last carried a change of the subtree's hits
	remote   uint64          // hits charged from the tree (children and the pool's aggregate)
	agg      aggregate       // the pool's aggregate, last heard (or computed, at the root)
	outRoot  uint64          // the root (its name's hash) of the aggregate
	outGen   uint64          // the root's generation of the tag
	outSeq   uint64          // the aggregate's number: one already heard is not applied or relayed again
	outSeen  uint64          // the pool's hits outside the subtree already charged
	bins     []Bin           // the subtree's demands, at the last report
}

// kidTag is what a child reported about a tag.
type kidTag struct {
	slot int
	seenHits
	bins []Bin
	at   int64
}

// aggregate is the pool's demand for a tag as its root computed it: enough for every node
// to compute its share.
type aggregate struct {
	has    bool
	level  float64 // the water level (permits per second): a node's share is min(demand, level) when demand exceeds the rate
	demand float64 // the pool's demand, permits per second (each node's rounded up)
	nodes  int     // the nodes the leftover is split among
	at     int64
}

// Bin is a bucket of a demand histogram: Count nodes whose demand is at most the bucket's
// upper edge (binEdge(Idx)). Bucket 0 is no demand; bucket i > 0 holds demands up to
// 2^((i-1)/16) thousandths of a permit per second, so a demand is rounded up by at most
// 4.4%: the level computed from the edges is never above the true one.
type Bin struct {
	Idx   uint32
	Count uint32
}

// binOf returns the bucket of a demand in permits per second.
func binOf(d float64) uint32 {
	if d <= 0 {
		return 0
	}
	milli := d * 1000
	if milli <= 1 {
		return 1
	}
	return 1 + uint32(math.Ceil(16*math.Log2(milli)))
}

// binEdge is the upper edge of bucket i, permits per second.
func binEdge(i uint32) float64 {
	if i == 0 {
		return 0
	}
	return math.Exp2(float64(i-1)/16) / 1000
}

// addBins merges b into a (both sorted by Idx) and returns a, sorted.
func addBins(a, b []Bin) []Bin {
	for _, x := range b {
		k, found := slices.BinarySearchFunc(a, x.Idx, func(y Bin, i uint32) int { return int(y.Idx) - int(i) })
		if found {
			a[k].Count += x.Count
		} else {
			a = slices.Insert(a, k, x)
		}
	}
	return a
}

// levelOf returns the demand of the nodes in bins (each at its bucket's upper edge), their
// count, and the water level of rate r among them (r itself when the demand fits).
func levelOf(bins []Bin, r float64) (demand float64, nodes int, level float64) {
	for _, b := range bins {
		demand += binEdge(b.Idx) * float64(b.Count)
		nodes += int(b.Count)
	}
	if demand <= r {
		return demand, nodes, r
	}
	left, rest := r, float64(nodes)
	for _, b := range bins {
		w := binEdge(b.Idx)
		if w*rest > left {
			return demand, nodes, left / rest
		}
		left -= w * float64(b.Count)
		rest -= float64(b.Count)
	}
	return demand, nodes, r
}

// Meshed reports whether the node's pool is small enough to report all-to-all (at most
// MeshMax nodes); otherwise it reports over each tag's tree and learns which peers are
// alive only from the membership (Join and Leave).
func (n *Node) Meshed() bool { return n.Members() <= n.cfg.MeshMax }

func (n *Node) meshed() bool { return n.Meshed() }

// depth is the depth of a tree of the pool (0: a lone root).
func (n *Node) depth() int {
	d, size, level := 0, 1, 1
	for size < n.Members() {
		level *= n.cfg.Fanout
		size += level
		d++
	}
	return d
}

// hist is how many of its own last demands a node keeps count of. All-to-all it counts
// its own demand at the least of its last 3 and reports each (a report reaches every peer
// within an interval). Over a tree it reports the most of its last hist() demands, and
// counts its own at the most of those older than lag() intervals (treeShare).
func (n *Node) hist() int {
	if n.meshed() {
		return history
	}
	return min(maxHistory, n.lag()+4)
}

// lag is how many intervals a demand reported over a tree of depth d may take to be in
// every share it counts in: up to an interval at each of d levels on its way up (each
// parent reports at its own tick), one at the root, one at the node that takes it (the
// way down is relayed at once), and the interval its share is in force: d + 3.
func (n *Node) lag() int { return min(maxHistory-1, n.depth()+3) }

// liveOrder returns this node and its live peers, by name hash.
func (n *Node) liveOrder() []member {
	if n.oVer == n.lver && n.order != nil {
		return n.order
	}
	o := append(n.order[:0], member{h: n.hash, slot: -1})
	for i, p := range n.peers {
		if p != nil && p.lost == 0 {
			o = append(o, member{h: p.hash, slot: i})
		}
	}
	slices.SortFunc(o, func(a, b member) int { return cmp.Compare(a.h, b.h) })
	n.order, n.oVer = o, n.lver
	return o
}

// treeOf returns t's tree state, its place in the tree brought up to date.
func (n *Node) treeOf(t *tag) *treeTag {
	if t.tr == nil {
		t.tr = &treeTag{parent: -1}
	}
	tr := t.tr
	if tr.ver == n.lver && tr.ver != 0 {
		return tr
	}
	o := n.liveOrder()
	root, self, best := 0, 0, uint64(0)
	for i, m := range o {
		if sc := mix(t.hk ^ m.h); i == 0 || sc > best {
			root, best = i, sc
		}
		if m.slot < 0 {
			self = i
		}
	}
	k, size := n.cfg.Fanout, len(o)
	rank := (self - root + size) % size
	tr.root = rank == 0
	tr.parent = -1
	if !tr.root {
		tr.parent = o[(root+(rank-1)/k)%size].slot
	}
	tr.kids = tr.kids[:0]
	for c := rank*k + 1; c <= rank*k+k && c < size; c++ {
		tr.kids = append(tr.kids, o[(root+c)%size].slot)
	}
	tr.ver = n.lver
	return tr
}

// treeTick is a tag's part of a report over its tree, before the node's share is set: the
// root computes the pool's aggregate. A child's last demands count for as long as it is a
// child here, heard or not (one cut off keeps its part, as a lost peer does all-to-all,
// until the membership finds it dead and the trees change), and for LostAfter after it
// last reported otherwise (it moved to another parent); not once its node is let go or
// restarted. Its hits stay counted.
func (n *Node) treeTick(t *tag, now int64, lost int) {
	tr := n.treeOf(t)
	tr.up = slices.DeleteFunc(tr.up, func(k kidTag) bool {
		if k.slot >= len(n.peers) || n.peers[k.slot] == nil || k.epoch != n.epochs[k.slot]+1 {
			return true
		}
		return now-k.at > int64(n.cfg.LostAfter) && !slices.Contains(tr.kids, k.slot)
	})
	s := t.hits + tr.fromKids
	if s != tr.sent[0] {
		tr.changed = n.seq
	}
	copy(tr.sent[1:], tr.sent[:])
	tr.sent[0] = s
	tr.bins = n.subtreeBins(t, tr)
	if !tr.root || t.k == 0 {
		return
	}
	bins := tr.bins
	if lost > 0 && len(bins) > 0 {
		// A lost peer (held, not yet let go) is counted at the largest demand heard.
		bins = addBins(bins, []Bin{{Idx: bins[len(bins)-1].Idx, Count: uint32(lost)}})
		tr.bins = bins
	}
	d, nodes, level := levelOf(bins, t.rate())
	tr.agg = aggregate{has: true, level: level, demand: d, nodes: max(nodes, n.Members()), at: now}
	tr.outRoot, tr.outGen, tr.outSeq = n.hash, t.gen, n.seq
}

// subtreeBins is the demands of the node (the most of its last reports) and of the
// children heard lately.
func (n *Node) subtreeBins(t *tag, tr *treeTag) []Bin {
	bins := append(tr.bins[:0], Bin{Idx: binOf(slices.Max(t.dem[:n.hist()])), Count: 1})
	for i := range tr.up {
		bins = addBins(bins, tr.up[i].bins)
	}
	return bins
}

// treeShare is the node's share of t over the tree: from the pool's aggregate, counting
// its own demand at the most of those it measured between lag() and hist() intervals ago;
// none before the first aggregate (the node's bucket still holds a permit: the bound
// counts it). Every report the node made in the last lag() intervals, the most of its
// last hist() demands, covers those: whichever of them a peer's share or the root's level
// counts it at, it is at least what the node counts itself at, and shares computed so
// never sum above one (docs/gossip.md, "Hundreds of daemons"). Counting the most of
// several, rather than the least as all-to-all, keeps a noisy demand (Poisson arrivals
// over a 100 ms interval) from counting low.
func (n *Node) treeShare(t *tag) float64 {
	tr := t.tr
	if tr == nil || !tr.agg.has {
		return 0
	}
	r := t.rate()
	own := slices.Max(t.dem[n.lag():n.hist()])
	a := &tr.agg
	if a.demand <= r {
		return min(1, (own+(r-a.demand)/float64(max(1, a.nodes)))/r)
	}
	return min(own, a.level) / r
}

// treeEntry returns t's entry for its tree at now, and whether it goes to the parent (up)
// or to the children (down, at the root); ok false: nothing to send.
func (n *Node) treeEntry(key string, t *tag, now int64) (e Entry, ok bool) {
	tr := t.tr
	s := tr.sent[0]
	busy := n.seq-tr.changed < history || (len(tr.bins) > 0 && tr.bins[len(tr.bins)-1].Idx > 0) || t.hold > now
	e = Entry{Tag: key, Gen: t.gen, Hits: s, Recent: s - tr.sent[history-1]}
	if t.hold > now {
		e.Hold = t.hold - now
	}
	if !tr.root {
		if !busy {
			return e, false
		}
		tr.sentS = s
		e.Bins = slices.Clone(tr.bins)
		return e, true
	}
	if t.owned {
		e.Booked = t.booked(now)
	}
	if !busy && e.Booked == 0 || !tr.agg.has {
		return e, false
	}
	e.Root, e.Seq = n.hash, n.seq
	e.Level = uint64(tr.agg.level * 1000)
	e.Demand = uint64(math.Ceil(tr.agg.demand * 1000))
	e.Nodes = uint64(tr.agg.nodes)
	return e, true
}

// receiveUp takes a child's subtree aggregates.
func (n *Node) receiveUp(now int64, slot int, ep uint32, r *Report) {
	for i := range r.Entries {
		e := &r.Entries[i]
		t := n.heardOf(e.Tag, now)
		if t == nil {
			continue
		}
		tr := n.treeOf(t)
		k := slices.IndexFunc(tr.up, func(k kidTag) bool { return k.slot == slot })
		if k < 0 {
			tr.up = append(tr.up, kidTag{slot: slot})
			k = len(tr.up) - 1
		}
		kt := &tr.up[k]
		d, _ := kt.news(ep, e)
		kt.bins = append(kt.bins[:0], e.Bins...)
		kt.at = now
		if d > 0 {
			tr.fromKids += d
			tr.remote += d
			n.stats.RemoteHits += d
			n.charge(t, d, now)
		}
		if e.Hold > 0 {
			n.hold(t, now, now+e.Hold)
		}
	}
}

// receiveDown takes the pool's aggregates from the parent, and keeps them for the
// children (Relays).
func (n *Node) receiveDown(now int64, r *Report) {
	for i := range r.Entries {
		e := &r.Entries[i]
		if e.Root == n.hash {
			continue // its own, back
		}
		t := n.heardOf(e.Tag, now)
		if t == nil {
			continue
		}
		tr := n.treeOf(t)
		var d uint64
		out := sub(e.Hits, tr.sentS) // the pool's hits beyond this subtree's, at least
		if e.Root != tr.outRoot || e.Gen != tr.outGen {
			d = min(e.Recent, out)
			tr.outRoot, tr.outGen, tr.outSeen = e.Root, e.Gen, out
		} else {
			if e.Seq <= tr.outSeq {
				continue // heard already (by another way)
			}
			if out > tr.outSeen {
				d = out - tr.outSeen
				tr.outSeen = out
			}
		}
		tr.outSeq = e.Seq
		tr.agg = aggregate{has: true, level: float64(e.Level) / 1000, demand: float64(e.Demand) / 1000, nodes: int(e.Nodes), at: now}
		if d > 0 {
			tr.remote += d
			n.stats.RemoteHits += d
			n.charge(t, d, now)
		}
		if e.Hold > 0 {
			n.hold(t, now, now+e.Hold)
		}
		if e.Booked > 0 {
			t.book(now + e.Booked)
		}
		for _, k := range tr.kids {
			if k >= 0 {
				if n.relays == nil {
					n.relays = map[int][]Entry{}
				}
				n.relays[k] = append(n.relays[k], *e)
			}
		}
	}
}

func sub(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return 0
}

// Relays returns the pools' aggregates that Receive took from a parent, to send to this
// node's children at once (each report to its To), and forgets them. Call it after
// Receive; the caller sends them as it sends reports.
func (n *Node) Relays() []Report {
	if len(n.relays) == 0 {
		return nil
	}
	out := make([]Report, 0, len(n.relays))
	for slot, es := range n.relays {
		if slot < len(n.peers) && n.peers[slot] != nil {
			out = append(out, Report{From: n.name, Inc: n.inc, Seq: n.seq, To: n.peers[slot].name, Tree: KindDown, Entries: es})
		}
	}
	clear(n.relays)
	slices.SortFunc(out, func(a, b Report) int { return cmpString(a.To, b.To) })
	return out
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
