package hits

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sluicehq/sluice/internal/classboard"

	"github.com/sluicehq/sluice/gcra"
)

// Policy says how much of a tag's bucket a node spends between syncs.
type Policy int

const (
	// Shares (the default): a node spends only its share of the tag's limit, from the
	// demand its peers and it reported.
	Shares Policy = iota
	// Whole is the DThrottle design as written: every node spends from the whole bucket
	// and hears of the others' hits at the next sync. It over-admits by up to the burst
	// and a sync interval's refill per node; it is kept for comparison.
	Whole
	// Equal gives each node 1/N of the limit, N the pool size it counts (Members: the
	// largest recently known membership), whatever the demand: the store-less "use the
	// pod count" of Numaflow's throttling.
	Equal
	// Owner: one node decides each tag, exactly, and the others forward their requests to
	// it: the tag's owner, chosen by rendezvous hashing over the nodes of the membership
	// (Owner). A node that starts owning a tag another may have decided fences it first
	// (no burst granted twice). See docs/gossip.md, "Deciding at the owner".
	Owner
	// Auto (the default) decides a tag by Shares where the tag is hot and its burst large:
	// when the pool's nodes would each hold at least AutoBurst permits of its burst and
	// each get as many at its rate in a sync interval; at its owner otherwise.
	Auto
)

// AutoBurst is the permits per node, of burst and of refill per sync interval, below which
// Auto decides a tag at its owner: smaller sub-buckets queue requests that one bucket
// would serve at once, and shares of a slow rate follow demand too slowly (the guarantee
// matrix's shares cells: docs/gossip.md). Above it, the owner's hop per decision is what
// shares save.
const AutoBurst = 32

// ParsePolicy reads "auto" (or ""), "owner", "shares", "equal" or "whole".
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "auto", "":
		return Auto, nil
	case "owner":
		return Owner, nil
	case "shares":
		return Shares, nil
	case "whole":
		return Whole, nil
	case "equal":
		return Equal, nil
	}
	return 0, fmt.Errorf("sluice: gossip policy %q: want auto, owner, shares, equal or whole", s)
}

func (p Policy) String() string {
	switch p {
	case Auto:
		return "auto"
	case Owner:
		return "owner"
	case Whole:
		return "whole"
	case Equal:
		return "equal"
	}
	return "shares"
}

// Config are a node's settings. Use DefaultConfig; Validate checks them.
type Config struct {
	Interval  time.Duration // how often a node reports; shares change at reports
	Hold      time.Duration // a peer lost (silent, or dead to the membership) keeps its share this long
	LostAfter time.Duration // a peer not heard from for this long is lost
	MaxTags   int           // tags held at once
	MaxPeers  int           // peers tracked at once
	Policy    Policy        // Auto, Owner, Shares, Equal or Whole
	// MeshMax is the largest pool (this node and its peers) that reports all-to-all; a
	// larger one reports over each tag's tree (Fanout children a node), so that the bytes
	// a node sends do not grow with the pool (docs/gossip.md, "Hundreds of daemons").
	MeshMax int
	Fanout  int // children of a node in a tag's tree
	// PolicyFor, if set, gives a key a policy of its own in place of Policy (a daemon
	// rule's `gossip:`): Auto, Owner or Shares, which choose whether the key is decided at
	// its owner; ok false keeps Policy. It must depend on the key alone and be the same on
	// every node (the nodes must agree on which keys have an owner). It is asked once per
	// tag held.
	PolicyFor func(key string) (p Policy, ok bool)
}

// DefaultConfig returns the defaults, each commented.
func DefaultConfig() Config {
	return Config{
		Interval:  100 * time.Millisecond, // the excess between syncs scales with it
		Hold:      2 * time.Second,        // a partition shorter than this does not multiply the limit
		LostAfter: 500 * time.Millisecond, // five silent intervals
		MaxTags:   1 << 20,                // as the daemon's max_keys
		MaxPeers:  4096,                   // a DaemonSet on a few thousand nodes
		Policy:    Auto,                   // the owner decides small limits, shares large ones
		MeshMax:   32,                     // all-to-all costs a node 31 messages an interval at most
		Fanout:    8,                      // a tree of 200 nodes is 3 levels deep, of 1,000 four
	}
}

// Validate reports the first bad setting.
func (c Config) Validate() error {
	switch {
	case c.Interval < time.Millisecond:
		return errors.New("sluice: gossip interval: want at least 1ms")
	case c.Hold < 0:
		return errors.New("sluice: gossip hold: want 0 or more")
	case c.LostAfter < c.Interval:
		return errors.New("sluice: gossip lost_after: want at least one interval")
	case c.MaxTags < 1, c.MaxPeers < 1:
		return errors.New("sluice: gossip max_tags and max_peers: want at least 1")
	case c.MeshMax < 1:
		return errors.New("sluice: gossip mesh_max: want at least 1")
	case c.Fanout < 2:
		return errors.New("sluice: gossip fanout: want at least 2")
	}
	return nil
}

// ErrTooManyTags is returned by Decide for a new tag when the node holds MaxTags.
var ErrTooManyTags = errors.New("sluice: gossip: too many tags")

// history is how many reports of a demand are kept: a node counts its own demand at the
// least of its last ones and a peer's at the most it received, so that shares computed
// from reports at most two intervals apart never sum above one (docs/gossip.md).
const history = 3

// maxHistory is how many of its own demands a node keeps: over a tag's tree, a report
// takes a few intervals to reach every node, and a node counts its own demand from older
// ones (Node.hist, Node.lag).
const maxHistory = 12

// Node is one daemon's side of the pool. Make one with New. It is not safe for concurrent
// use: the caller serializes every call.
type Node struct {
	name   string
	inc    uint64
	cfg    Config
	seq    uint64 // reports made
	last   int64  // when the last report was made
	gen    uint64 // the last tag generation given
	tags   map[string]*tag
	peers  []*peer  // by slot; nil: free
	epochs []uint32 // by slot: bumped when a slot is freed, so its old per-tag entries are stale
	slot   map[string]int
	ws     []float64 // scratch: demands for a share
	stats  Stats

	// The ring (Policy Owner and Auto): this node and every peer held, by rendezvous hash.
	born   int64  // when the node was made
	hash   uint64 // its name's hash
	ring   uint64 // bumped at every change of the peers held: owners cached before are stale
	npeers int    // peers held
	dropAt int64  // when a peer was last let go (its tags moved); 0: never
	elder  bool   // a peer had reported for longer than this node when it first heard it

	// The trees (pools above MeshMax): this node and every live peer, by name hash.
	lver   uint64   // bumped at every change of the live peers: trees computed before are stale
	order  []member // the live nodes by hash, built at oVer
	oVer   uint64
	relays map[int][]Entry // aggregates to relay to children, by slot (Relays)
}

// Stats are a node's counters, for metrics.
type Stats struct {
	Tags          int    // tags held
	Peers         int    // peers live or held
	Reports       uint64 // reports made
	Received      uint64 // reports received and applied
	Malformed     uint64 // messages dropped as malformed (counted by the caller's decoder)
	Dropped       uint64 // remote tag entries dropped: MaxTags reached
	PeersRefused  uint64 // reports from new peers dropped: MaxPeers reached
	LocalHits     uint64 // permits granted here
	RemoteHits    uint64 // permits peers reported
	EvictedTags   uint64 // idle tags forgotten
	ExcessCharged uint64 // remote hits beyond a burst of debt, not charged (see Receive)
}

type peer struct {
	name  string
	hash  uint64 // the name's hash, for the ring
	inc   uint64
	heard int64
	lost  int64 // 0: live; otherwise when it was lost
}

// tag is one tag's state at the node.
type tag struct {
	policy Policy // whether it is decided at its owner (policyOf)
	k      int    // limits known (0: only peers have used the tag so far)
	lim    [gcra.MaxLimits]gcra.Limit
	view   [gcra.MaxLimits]int64   // the pool's bucket as this node knows it: TATs
	level  [gcra.MaxLimits]float64 // the node's own bucket at its share: permits
	at     int64                   // when level was last brought up to date
	share  float64
	cap    [gcra.MaxLimits]float64 // capacity(i) at share, kept by setShare
	hold   int64                   // end of a penalty

	gen     uint64          // this node's generation of the tag
	hits    uint64          // permits granted here in this generation (reported cumulatively)
	sent    [history]uint64 // hits as of the last reports, newest first
	changed uint64          // the report that last carried a change
	asked   int64           // permits asked here since the last report
	ewma    float64         // smoothed demand, permits per second
	dem     [maxHistory]float64
	pend    uint64 // remote hits heard before the tag's limits were known
	pendAt  int64
	used    int64 // last activity, local or remote
	peers   []peerTag

	hk    uint64 // the tag's hash, for the ring
	ring  uint64 // the ring version owner was computed at (0: not yet)
	owner int    // the tag's owner: -1 this node, otherwise a peer's slot
	owned bool   // this node has decided the tag as its owner since it last owned it
	other bool   // another node owned the tag while this node knew it

	bookedTo int64 // the latest booking an owner reported (Entry.Booked), as a time

	tr *treeTag // the tag's tree state (pools above MeshMax); nil until used

	board *classboard.Board // the tag's board of classes (classes.go); nil: none posted or told
}

// peerTag is what a peer reported about a tag.
type peerTag struct {
	seenHits
	dem [history]float64
}

// seenHits is what a node has heard of a tag's hits from one sender (a peer, or a child in
// the tag's tree): the sender's slot epoch + 1 (0: nothing), its generation of the tag,
// and the cumulative count it last reported.
type seenHits struct {
	epoch uint32
	gen   uint64
	count uint64
}

// news returns the hits of e (reported by a sender whose slot epoch + 1 is ep) that the
// node has not counted yet, and records e's count; fresh reports a generation the node had
// not heard of (or forgot): its recent hits are new here, older ones were heard before or
// no longer matter.
func (h *seenHits) news(ep uint32, e *Entry) (d uint64, fresh bool) {
	if h.epoch == ep && h.gen == e.Gen {
		if e.Hits > h.count {
			d = e.Hits - h.count
			h.count = e.Hits
		}
		return d, false
	}
	*h = seenHits{epoch: ep, gen: e.Gen, count: e.Hits}
	return min(e.Recent, e.Hits), true
}

// New returns a node named name (unique in the pool: the membership's node name), in its
// incarnation inc (a number that differs at every start, so peers can tell a restart).
func New(name string, inc uint64, cfg Config, now int64) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Node{name: name, inc: inc, cfg: cfg, last: now, tags: map[string]*tag{}, slot: map[string]int{},
		born: now, hash: strHash(name), ring: 1, lver: 1}, nil
}

// Name returns the node's name.
func (n *Node) Name() string { return n.name }

// Stats returns the node's counters.
func (n *Node) Stats() Stats {
	s := n.stats
	s.Tags = len(n.tags)
	s.Peers = 0
	for _, p := range n.peers {
		if p != nil {
			s.Peers++
		}
	}
	return s
}

// CountMalformed counts a message the caller could not decode.
func (n *Node) CountMalformed() { n.stats.Malformed++ }

// Members returns the pool size this node counts on at now: itself and every peer live or
// held (lost less than Hold ago). It is the largest recently known membership: a peer that
// vanishes is still counted until its hold ends.
func (n *Node) Members() int { return 1 + n.npeers }

// TagHits returns a tag's hits granted here and reported by peers (cumulative), for
// metrics, and whether the tag is held.
func (n *Node) TagHits(key string) (local, remote uint64, ok bool) {
	t := n.tags[key]
	if t == nil {
		return 0, 0, false
	}
	for i := range t.peers {
		if t.peers[i].epoch != 0 {
			remote += t.peers[i].count
		}
	}
	if t.tr != nil {
		remote += t.tr.remote
	}
	return t.hits, remote, true
}

// Tags calls f for each tag held, in no order, until f returns false.
func (n *Node) Tags(f func(key string) bool) {
	for k := range n.tags {
		if !f(k) {
			return
		}
	}
}

// rate is the permits per second of the slowest of the tag's limits: demand and shares
// are measured against it.
func (t *tag) rate() float64 {
	minT := int64(0)
	for i := range t.k {
		minT = max(minT, t.lim[i].T)
	}
	return 1e9 / float64(minT)
}

func (n *Node) get(key string, now int64) (*tag, error) {
	if t := n.tags[key]; t != nil {
		return t, nil
	}
	if len(n.tags) >= n.cfg.MaxTags {
		return nil, ErrTooManyTags
	}
	n.gen++
	t := &tag{gen: n.gen, at: now, used: now, share: -1, hk: strHash(key), policy: n.policyOf(key)}
	n.tags[key] = t
	return t, nil
}

// heardOf returns the tag a report's entry is of, used at now; nil when the node holds as
// many tags as it may (the entry is counted dropped).
func (n *Node) heardOf(key string, now int64) *tag {
	t, err := n.get(key, now)
	if err != nil {
		n.stats.Dropped++
		return nil
	}
	t.used = now
	return t
}

// policyOf is the policy that decides whether key has an owner: its own (PolicyFor), or
// the node's.
func (n *Node) policyOf(key string) Policy {
	if n.cfg.PolicyFor != nil {
		if p, ok := n.cfg.PolicyFor(key); ok {
			return p
		}
	}
	return n.cfg.Policy
}

// know sets the tag's limits from a local request: at first use, a change of the rule, or
// when only peers had used it. Remote hits heard before are charged now.
func (n *Node) know(t *tag, limits []gcra.Limit, now int64) {
	if t.k == len(limits) && slices.Equal(t.lim[:t.k], limits) {
		return
	}
	fresh := t.k == 0
	t.k = len(limits)
	copy(t.lim[:], limits)
	t.setShare(t.share) // the capacities of the new limits
	if t.hold > now {
		gcra.Penalize(t.view[:t.k], t.lim[:t.k], now, t.hold)
	}
	if fresh || t.share < 0 {
		t.setShare(n.shareOf(t))
		for i := range t.k {
			t.level[i] = t.capacity(i)
		}
		t.at = now
	}
	if t.pend > 0 {
		n.charge(t, t.pend, t.pendAt)
		t.pend = 0
	}
	t.book(t.bookedTo)
}

// booked is how long from now the node's view of the pool's bucket is booked beyond its
// burst: the latest of its limits' TAT less tau (0: a permit of burst is free).
func (t *tag) booked(now int64) int64 {
	var b int64
	for i := range t.k {
		b = max(b, t.view[i]-t.lim[i].Tau-now)
	}
	return b
}

// book takes an owner's booking: the pool's bucket holds no burst before until.
func (t *tag) book(until int64) {
	if until <= 0 {
		return
	}
	t.bookedTo = max(t.bookedTo, until)
	for i := range t.k {
		t.view[i] = max(t.view[i], gcra.After(until, t.lim[i].Tau))
	}
}

// capacity is the most permits the node's own bucket holds for limit i at its share:
// its share of the burst, and at least one permit (so a node whose share is tiny can
// still serve a first request; the bound counts it).
func (t *tag) capacity(i int) float64 { return t.cap[i] }

// setShare sets the node's share of the tag and the capacities that follow from it (a
// decision reads them; only a report or new limits change them).
func (t *tag) setShare(share float64) {
	t.share = share
	for i := range t.k {
		t.cap[i] = max(1, share*float64(t.lim[i].Burst()))
	}
}

// refill brings the node's own bucket up to now.
func (t *tag) refill(now int64) {
	if now <= t.at {
		return
	}
	dt := float64(now - t.at)
	for i := range t.k {
		t.level[i] = min(t.capacity(i), t.level[i]+t.share*dt/float64(t.lim[i].T))
	}
	t.at = now
}

// ownWait is how long n permits must wait in the node's own bucket at now (refilled):
// 0 if they may be taken at once, -1 if they never can at the present share.
func (t *tag) ownWait(n int64) int64 {
	var w int64
	for i := range t.k {
		need := float64(n) - t.level[i]
		if need <= 0 {
			continue
		}
		if t.share <= 0 || float64(n) > t.capacity(i) {
			return -1
		}
		w = max(w, int64(math.Ceil(need*float64(t.lim[i].T)/t.share)))
	}
	return w
}

// keptOf reports whether kept are core keeping part of their bursts: the same rates and
// windows, bursts of at least one permit and no larger.
func keptOf(core, kept []gcra.Limit) bool {
	if len(core) != len(kept) {
		return false
	}
	for i, c := range core {
		k := kept[i]
		if k.T != c.T || k.Window != c.Window || k.Tau > c.Tau || k.Tau < k.T {
			return false
		}
	}
	return true
}

// Decide decides cost permits of key under limits at now (the limits already tightened
// by any margin; 1 to gcra.MaxLimits). maxDelay bounds how far ahead permits may be
// reserved (0: now or never). A grant is charged to the pool's bucket as the node knows
// it and to the node's own share; both must allow it. The ticket records the grant for
// Adjust.
func (n *Node) Decide(key string, limits []gcra.Limit, now, cost, maxDelay int64) (gcra.Result, gcra.Ticket, error) {
	var res gcra.Result
	var tk gcra.Ticket
	err := n.DecideTo(&res, &tk, key, limits, now, cost, maxDelay)
	return res, tk, err
}

// DecideTo is Decide writing its result and ticket into res and tk (zero on entry), so
// that a caller on the hot path copies neither.
func (n *Node) DecideTo(res *gcra.Result, tk *gcra.Ticket, key string, limits []gcra.Limit, now, cost, maxDelay int64) error {
	return n.DecideKept(res, tk, key, limits, limits, now, cost, maxDelay)
}

// DecideKept is DecideTo for a decision that keeps part of the burst for a higher class
// (package priority): core are the tag's limits, by which its state is kept and its route
// chosen, and kept the decision's, core with smaller bursts (gcra.Limit.Keeping). Where
// the tag is decided at its owner (Route), the pool's bucket keeps the difference; a tag
// decided by shares keeps nothing, and is decided under core (docs/priorities.md: kept
// there, the headroom cost utilization and served the higher classes no better). kept
// may be core itself; otherwise it must be core with the same rates and bursts no larger
// (gcra.ErrInvalidLimits).
func (n *Node) DecideKept(res *gcra.Result, tk *gcra.Ticket, key string, core, kept []gcra.Limit, now, cost, maxDelay int64) error {
	if cost < 0 {
		return gcra.ErrInvalidCost
	}
	limits := core
	t := n.tags[key]
	if t == nil || t.k != len(limits) || !slices.Equal(t.lim[:t.k], limits) {
		// A new tag, or new limits: check them (known ones were checked before).
		if err := gcra.ValidateLimits(limits); err != nil {
			return err
		}
		var err error
		if t, err = n.get(key, now); err != nil {
			return err
		}
		n.know(t, limits, now)
	}
	if len(kept) > 0 && &kept[0] != &core[0] && !keptOf(core, kept) {
		return fmt.Errorf("%w: kept limits %v of %v", gcra.ErrInvalidLimits, kept, core)
	}
	routed := n.routes(t.policy, limits)
	if !routed {
		kept = core // by shares: no headroom kept
	}
	if cost > 1 && cost > gcra.MaxCost(kept) {
		return gcra.ErrCostExceedsBurst
	}
	if routed && !n.claim(t, limits, now) {
		res.RetryAfter = int64(n.cfg.Interval)
		n.fill(t, res, now, routed)
		return nil
	}
	t.used = now
	t.asked += cost
	t.refill(now)
	view := t.view[:t.k]
	var delay int64
	for i, l := range kept {
		delay = max(delay, gcra.Wait(view[i], l, now, cost))
	}
	delay = max(delay, t.hold-now)
	own := t.ownWait(cost)
	if n.cfg.Policy == Whole || t.share >= 1 || routed {
		own = 0 // the whole limit: the pool's bucket decides alone
	}
	if own < 0 {
		// The share cannot hold the cost: come back after the next report, when shares
		// may have changed.
		res.RetryAfter = max(delay, int64(n.cfg.Interval))
	} else {
		delay = max(delay, own)
	}
	if cost == 0 {
		delay, own = 0, 0
	}
	if own < 0 || delay > maxDelay {
		if res.RetryAfter == 0 {
			res.RetryAfter = delay
		}
		n.fill(t, res, now, routed)
		return nil
	}
	res.Allowed, res.Delay = true, delay
	tk.N, tk.At = cost, now+delay
	if cost > 0 {
		for i, l := range limits {
			view[i] = max(view[i], tk.At) + cost*l.T
			tk.TatAfter[i] = view[i]
			if n.cfg.Policy != Whole && !routed {
				t.level[i] -= float64(cost)
			}
		}
		t.hits += uint64(cost)
		n.stats.LocalHits += uint64(cost)
	}
	n.fill(t, res, now, routed)
	return nil
}

// routes reports whether a tag of policy p under limits is decided at its owner: always
// with Owner; with Auto when the pool's nodes would each hold less than AutoBurst permits
// of the tightest burst.
func (n *Node) routes(p Policy, limits []gcra.Limit) bool {
	if p != Owner && p != Auto {
		return false
	}
	for _, l := range limits {
		if l.Window > 0 {
			return false // a window's origin is in the caller's time base: decided here
		}
	}
	if p == Owner {
		return true
	}
	nodes := AutoBurst * int64(1+n.npeers)
	for _, l := range limits {
		if l.Burst() < nodes || int64(n.cfg.Interval)/l.T < nodes {
			return true
		}
	}
	return false
}

// Route returns the node that decides key's permits under limits: "" when this node does
// (by its share, or as the key's owner), otherwise the owner's name, to which the caller
// forwards the request (Decide there); and whether the key is decided at an owner at all
// (one line that every node's callers share, this node's included). The owner is the node, of this one and every peer
// held (live, or lost less than Hold ago), whose name hashes highest with the key
// (rendezvous hashing): the nodes agree on it while they agree on the membership, and a
// change of membership moves only the keys of the node that came or went.
func (n *Node) Route(key string, limits []gcra.Limit) (owner string, routed bool) {
	t := n.tags[key]
	var p Policy
	if t != nil {
		p = t.policy
	} else {
		p = n.policyOf(key)
	}
	if !n.routes(p, limits) {
		return "", false
	}
	var o int
	if t != nil {
		o = n.ownerOf(t)
	} else {
		o = n.pick(strHash(key))
	}
	if o < 0 {
		return "", true
	}
	return n.peers[o].name, true
}

// ownerOf returns t's owner (-1: this node), cached until the ring changes. Seeing
// another owner clears the claim: the next owner decision here is fenced.
func (n *Node) ownerOf(t *tag) int {
	if t.ring != n.ring {
		t.owner, t.ring = n.pick(t.hk), n.ring
		if t.owner >= 0 {
			t.owned, t.other = false, true
		}
	}
	return t.owner
}

// pick is the rendezvous: the highest score of the key's hash with each node's.
func (n *Node) pick(hk uint64) int {
	best, bestName, o := mix(hk^n.hash), n.name, -1
	for i, p := range n.peers {
		if p != nil {
			if sc := mix(hk ^ p.hash); outranks(sc, p.name, best, bestName) {
				best, bestName, o = sc, p.name, i
			}
		}
	}
	return o
}

// outranks reports whether a node scoring sc with a key, named name, beats the best so
// far: the higher score, and between equal scores the greater name.
func outranks(sc uint64, name string, best uint64, bestName string) bool {
	return sc > best || (sc == best && name > bestName)
}

// OwnerOf returns the node of nodes (their names in the pool) that decides key as its
// owner when those are the nodes a Node holds: the one whose name hashes highest with the
// key, as Route picks it. It returns "" for no nodes. Tests and tools use it to find a
// key's owner from outside the pool.
func OwnerOf(key string, nodes []string) string {
	hk := strHash(key)
	var best uint64
	owner := ""
	for i, name := range nodes {
		if sc := mix(hk ^ strHash(name)); i == 0 || outranks(sc, name, best, owner) {
			best, owner = sc, name
		}
	}
	return owner
}

// claim is called before this node decides t as its owner. The first such decision since
// it last owned t is fenced (the pool's bucket taken as empty: no burst is granted twice)
// when another node may have decided t lately and not yet told it: another node owned t
// in this node's ring; or a node was let go (its keys moved) less than a fence's length
// ago; or this node joined a pool that was deciding before it, less than a fence's length
// ago (it may be the restart of t's owner). A fence's length is Hold + LostAfter + the
// bucket's time to refill (its tau). In a pool that starts together, nothing is fenced.
// Until a young node has heard every peer once it cannot tell (nor has it heard the hits
// its peers granted lately): claim reports false, and it decides nothing yet.
func (n *Node) claim(t *tag, limits []gcra.Limit, now int64) bool {
	n.ownerOf(t)
	if t.owned {
		return true
	}
	var tau int64
	for _, l := range limits {
		tau = max(tau, l.Tau)
	}
	fence := int64(n.cfg.Hold) + int64(n.cfg.LostAfter) + tau
	young := now-n.born < fence
	if young && !n.meshed() {
		// Over a tree this node does not hear every peer: a young node fences instead.
		t.owned = true
		for i, l := range limits {
			t.view[i] = max(t.view[i], gcra.After(now, l.Tau))
		}
		return true
	}
	if young {
		for _, p := range n.peers {
			if p != nil && p.inc == 0 && p.lost == 0 {
				return false // not heard yet
			}
		}
	}
	t.owned = true
	if !t.other && (n.dropAt == 0 || now-n.dropAt >= fence) && (!n.elder || !young) {
		return true
	}
	for i, l := range limits {
		t.view[i] = max(t.view[i], gcra.After(now, l.Tau))
	}
	return true
}

// strHash is FNV-1a, 64 bits: the same in every process (the ring's nodes must agree).
func strHash(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// mix is splitmix64's finalizer: a key's score with each node spreads evenly.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// fill sets a result's Remaining and ResetAfter from the pool's view and the node's share.
func (n *Node) fill(t *tag, res *gcra.Result, now int64, routed bool) {
	res.Remaining = math.MaxInt64
	for i := range t.k {
		l := t.lim[i]
		v := max(t.view[i], now)
		res.Remaining = min(res.Remaining, max(0, (now+l.Tau-v)/l.T))
		if n.cfg.Policy != Whole && !routed {
			res.Remaining = min(res.Remaining, max(0, int64(t.level[i])))
		}
		res.ResetAfter = max(res.ResetAfter, v-now)
	}
}

// Adjust settles a grant to its real cost newN: more is charged at once (and reported);
// less gives the difference back to the node's own share and, where the grant is still
// the newest, to its view of the pool (gcra.Adjust's rule). What peers were told stays
// charged with them: a refund is local.
func (n *Node) Adjust(key string, limits []gcra.Limit, now int64, tk gcra.Ticket, newN int64) (gcra.Ticket, error) {
	if newN < 0 {
		return tk, gcra.ErrInvalidCost
	}
	t := n.tags[key]
	if t == nil || t.k != len(limits) {
		return tk, nil // forgotten: nothing to settle against
	}
	t.refill(now)
	d := newN - tk.N
	if d > 0 {
		t.hits += uint64(d)
		n.stats.LocalHits += uint64(d)
	}
	if n.cfg.Policy != Whole {
		for i := range t.k {
			t.level[i] = min(t.capacity(i), t.level[i]-float64(d))
		}
	}
	hold := int64(0)
	if t.hold > now {
		hold = t.hold
	}
	return gcra.Adjust(t.view[:t.k], limits, now, tk, newN, hold)
}

// Penalize holds key back until `until`: no permit is granted here before then, and the
// next reports carry the hold to the peers.
func (n *Node) Penalize(key string, limits []gcra.Limit, now, until int64) error {
	if err := gcra.ValidateLimits(limits); err != nil {
		return err
	}
	t, err := n.get(key, now)
	if err != nil {
		return err
	}
	n.know(t, limits, now)
	if n.hold(t, now, until) {
		t.changed = n.seq + 1 // the next report carries it
	}
	return nil
}

// hold applies a penalty until `until`, and reports whether it extended the one in force.
func (n *Node) hold(t *tag, now, until int64) bool {
	if until <= now || until <= t.hold {
		return false
	}
	t.hold = min(until, gcra.MaxTAT)
	gcra.Penalize(t.view[:t.k], t.lim[:t.k], now, t.hold)
	t.used = now
	return true
}

// Reset forgets key here (its next request is decided as a new tag's); peers keep what
// they were told.
func (n *Node) Reset(key string) { delete(n.tags, key) }

// peerSlot returns the slot of a named peer, making it if new (-1: MaxPeers reached).
func (n *Node) peerSlot(name string, now int64) int {
	if i, ok := n.slot[name]; ok {
		return i
	}
	i := -1
	if len(n.slot) < len(n.peers) { // a slot is free (slot maps every peer held)
		i = slices.Index(n.peers, nil)
	}
	if i < 0 {
		if len(n.peers) >= n.cfg.MaxPeers {
			return -1
		}
		n.peers = append(n.peers, nil)
		n.epochs = append(n.epochs, 0)
		i = len(n.peers) - 1
	}
	n.peers[i] = &peer{name: name, hash: strHash(name), heard: now}
	n.slot[name] = i
	n.npeers++
	n.ring++
	n.lver++
	return i
}

// dropPeer forgets the peer in slot i: its per-tag entries become stale.
func (n *Node) dropPeer(i int, now int64) {
	delete(n.slot, n.peers[i].name)
	n.peers[i] = nil
	n.epochs[i]++
	n.npeers--
	n.ring++
	n.lver++
	n.dropAt = now
}

// Join tells the node that the membership sees peer name alive. A peer counts in the pool
// from then on; its demand counts from its first report.
func (n *Node) Join(name string, now int64) {
	if name == n.name {
		return
	}
	if i := n.peerSlot(name, now); i >= 0 {
		p := n.peers[i]
		if p.lost != 0 {
			p.lost, p.heard = 0, now
			n.lver++
		}
	} else {
		n.stats.PeersRefused++
	}
}

// Leave tells the node that the membership lost peer name: gone for good after a graceful
// leave (its share is free at once), or dead (it may be cut off rather than stopped: its
// share is held for Hold).
func (n *Node) Leave(name string, now int64, graceful bool) {
	i, ok := n.slot[name]
	if !ok {
		return
	}
	if graceful {
		n.dropPeer(i, now)
		return
	}
	if p := n.peers[i]; p.lost == 0 {
		p.lost = now
		n.lver++
	}
}

// Report is what a node sends its peers at every sync.
type Report struct {
	From    string // the sender's node name
	Inc     uint64 // the sender's incarnation
	Seq     uint64 // the sender's report number
	Entries []Entry
	// Tree is 0 for a report to every peer (all-to-all), KindUp for a subtree's aggregate
	// to a tag's parent, KindDown for the pool's aggregate from a tag's root.
	Tree byte
	To   string // the peer a tree's report is for (not on the wire); "": every peer
}

// Entry is one tag in a report. Counts are cumulative within the sender's generation of
// the tag, so a lost report is made good by the next one that carries the tag.
type Entry struct {
	Tag    string
	Gen    uint64 // the sender's generation of the tag (a new one after it forgot the tag)
	Hits   uint64 // permits the sender granted in this generation
	Recent uint64 // of them, those granted in its last three reports' intervals
	Demand uint64 // permits per second asked at the sender, smoothed, in thousandths
	Hold   int64  // a penalty's time left at the sender, nanoseconds; 0: none
	// Booked: when the sender decides the tag as its owner, how long from now the pool's
	// bucket is booked beyond its burst (permits granted ahead, to callers that wait for
	// them), nanoseconds; 0: none. Whoever owns the tag next grants nothing before then.
	Booked int64

	// Over a tag's tree (Report.Tree), Hits and Recent count the sender's subtree (up) or
	// the pool (down), and Gen is the generation of the tag at the sender (up) or the root
	// (down). Up, Bins are the subtree's demands; down, Root is the root's name hashed,
	// Seq the root's report number, Level the water level and Demand the pool's demand
	// (thousandths of a permit per second), Nodes the nodes the leftover is split among.
	Bins  []Bin
	Root  uint64
	Seq   uint64
	Level uint64
	Nodes uint64
}

// demandAlpha is the weight of the last interval in the smoothed demand.
const demandAlpha = 0.5

// Report makes the node's report at now, to be sent to every peer: Sync's report for
// every peer, for a caller that reports all-to-all (a pool of at most MeshMax nodes).
func (n *Node) Report(now int64) Report {
	for _, r := range n.Sync(now) {
		if r.To == "" {
			return r
		}
	}
	return Report{From: n.name, Inc: n.inc, Seq: n.seq}
}

// Sync makes the node's reports at now. In a pool of at most MeshMax nodes it is one
// report, for every peer (To ""): the tags whose hits, demand or penalty changed in the
// last three reports. In a larger pool each report is for one peer (To), over the tags'
// trees: to a tag's parent the subtree's aggregate, and, at a tag's root, to its children
// the pool's. It is also the node's tick: demand is measured, silent peers are marked lost
// (all-to-all only: over trees the membership says), held ones dropped, shares
// recomputed, and idle tags forgotten. Call it every Interval.
func (n *Node) Sync(now int64) []Report {
	n.seq++
	dt := float64(now-n.last) / 1e9
	n.last = now
	mesh := n.meshed()
	lost := 0
	for i, p := range n.peers {
		if p == nil {
			continue
		}
		if mesh && p.lost == 0 && now-p.heard > int64(n.cfg.LostAfter) {
			p.lost = now
			n.lver++
		}
		if p.lost != 0 && now-p.lost >= int64(n.cfg.Hold) {
			n.dropPeer(i, now)
		} else if p.lost != 0 {
			lost++
		}
	}
	mesh = n.meshed()
	rep := Report{From: n.name, Inc: n.inc, Seq: n.seq}
	var ups, downs map[int][]Entry
	idleAfter := max(int64(n.cfg.Hold), 20*int64(n.cfg.Interval))
	for key, t := range n.tags {
		if dt > 0 {
			t.ewma = demandAlpha*float64(t.asked)/dt + (1-demandAlpha)*t.ewma
			if t.asked == 0 && t.ewma < 0.01 {
				t.ewma = 0
			}
		}
		t.asked = 0
		d := math.Round((t.ewma+t.unmet(now, dt))*1000) / 1000
		if d != t.dem[0] || t.hits != t.sent[0] {
			t.changed = n.seq
		}
		copy(t.dem[1:], t.dem[:])
		t.dem[0] = d
		copy(t.sent[1:], t.sent[:])
		t.sent[0] = t.hits
		if !mesh {
			n.treeTick(t, now, lost)
		}
		if t.k > 0 {
			t.refill(now)
			t.setShare(n.shareOf(t))
			for i := range t.k {
				t.level[i] = min(t.level[i], t.capacity(i))
			}
		}
		if !mesh {
			if e, ok := n.treeEntry(key, t, now); ok {
				if t.tr.root {
					if downs == nil {
						downs = map[int][]Entry{}
					}
					for _, k := range t.tr.kids {
						downs[k] = append(downs[k], e)
					}
				} else {
					if ups == nil {
						ups = map[int][]Entry{}
					}
					ups[t.tr.parent] = append(ups[t.tr.parent], e)
				}
			} else if now-t.used > idleAfter && n.idle(t, now) {
				delete(n.tags, key)
				n.stats.EvictedTags++
			}
			continue
		}
		if t.changed != 0 && n.seq-t.changed < history {
			e := Entry{Tag: key, Gen: t.gen, Hits: t.hits, Recent: t.hits - t.sent[history-1], Demand: uint64(d * 1000)}
			if t.hold > now {
				e.Hold = t.hold - now
			}
			if t.owned {
				e.Booked = t.booked(now)
			}
			rep.Entries = append(rep.Entries, e)
		} else if now-t.used > idleAfter && n.idle(t, now) {
			delete(n.tags, key)
			n.stats.EvictedTags++
		}
	}
	n.stats.Reports++
	if mesh {
		return []Report{rep}
	}
	out := n.addressed(nil, ups, KindUp)
	return n.addressed(out, downs, KindDown)
}

// addressed appends a report of kind to each peer in es (by slot), in the order of the
// peers' names.
func (n *Node) addressed(out []Report, es map[int][]Entry, kind byte) []Report {
	from := len(out)
	for slot, e := range es {
		if slot >= 0 && slot < len(n.peers) && n.peers[slot] != nil {
			out = append(out, Report{From: n.name, Inc: n.inc, Seq: n.seq, To: n.peers[slot].name, Tree: kind, Entries: e})
		}
	}
	slices.SortFunc(out[from:], func(a, b Report) int { return cmpString(a.To, b.To) })
	return out
}

// unmet is the demand the node's share leaves waiting, permits per second: the permits
// its callers have booked ahead of its own bucket (reservations beyond the share's
// refill), to be served within the next interval dt. Callers that wait ask once and then
// wait: what they ask is what they are granted, so the asked rate alone cannot tell a
// daemon whose callers wait long from one that needs nothing more.
func (t *tag) unmet(now int64, dt float64) float64 {
	if t.k == 0 || dt <= 0 {
		return 0
	}
	t.refill(now)
	var b float64
	for i := range t.k {
		b = max(b, -t.level[i])
	}
	return b / dt
}

// idle reports whether forgetting t changes nothing: its buckets full, no penalty, no
// demand here or at a peer, nothing pending.
func (n *Node) idle(t *tag, now int64) bool {
	if t.ewma != 0 || t.hold > now || t.pend != 0 || !gcra.Idle(t.view[:t.k], now) || t.boardLive(now) {
		return false
	}
	for i := range t.k {
		if t.level[i] < t.capacity(i) {
			return false
		}
	}
	for i := range t.peers {
		if pt := &t.peers[i]; n.valid(pt, i) && slices.Max(pt.dem[:]) > 0 {
			return false
		}
	}
	if t.tr != nil {
		for _, k := range t.tr.up {
			if len(k.bins) > 0 && k.bins[len(k.bins)-1].Idx > 0 {
				return false
			}
		}
	}
	return true
}

func (n *Node) valid(pt *peerTag, slot int) bool {
	return pt.epoch != 0 && slot < len(n.peers) && n.peers[slot] != nil && pt.epoch == n.epochs[slot]+1
}

// Receive applies a peer's report at now: its hits are charged to the pool's bucket as
// this node knows it, its demand is kept for the shares, its penalties applied. A report
// from a peer the node did not know adds it to the pool.
func (n *Node) Receive(now int64, r *Report) {
	if r.From == n.name {
		return
	}
	i := n.peerSlot(r.From, now)
	if i < 0 {
		n.stats.PeersRefused++
		return
	}
	p := n.peers[i]
	if p.inc != r.Inc {
		if p.inc != 0 { // restarted: what it said before no longer counts
			n.epochs[i]++
		}
		p.inc = r.Inc
		if r.Seq > n.seq+history {
			n.elder = true // it was deciding before this node was: see claim
		}
	}
	if p.lost != 0 {
		n.lver++
	}
	p.heard, p.lost = now, 0
	n.stats.Received++
	ep := n.epochs[i] + 1
	switch r.Tree {
	case KindUp:
		n.receiveUp(now, i, ep, r)
		return
	case KindDown:
		n.receiveDown(now, r)
		return
	}
	for _, e := range r.Entries {
		t := n.heardOf(e.Tag, now)
		if t == nil {
			continue
		}
		if len(t.peers) <= i {
			t.peers = append(t.peers, make([]peerTag, i+1-len(t.peers))...)
		}
		pt := &t.peers[i]
		d, fresh := pt.news(ep, &e)
		if fresh {
			pt.dem = [history]float64{}
		}
		copy(pt.dem[1:], pt.dem[:])
		pt.dem[0] = float64(e.Demand) / 1000
		if d > 0 {
			n.stats.RemoteHits += d
			n.charge(t, d, now)
		}
		if e.Hold > 0 {
			n.hold(t, now, gcra.After(now, e.Hold))
		}
		if e.Booked > 0 {
			t.book(gcra.After(now, e.Booked))
		}
	}
}

// charge counts d hits a peer granted against the pool's bucket as this node knows it, at
// now (they happened before: charging them later is conservative). The debt it leaves is
// kept to one burst: what a cut-off peer admitted beyond that is not repaid (the API has
// long forgotten it; docs/gossip.md).
func (n *Node) charge(t *tag, d uint64, now int64) {
	if t.k == 0 {
		t.pend += d
		t.pendAt = now
		return
	}
	var excess uint64
	for i := range t.k {
		l := t.lim[i]
		want := gcra.After(max(t.view[i], now), gcra.MulSat(int64(min(d, math.MaxInt32)), l.T))
		limit := now + 2*l.Tau
		if want > limit && want > t.view[i] {
			excess = max(excess, uint64((want-max(limit, t.view[i]))/l.T))
			want = max(limit, t.view[i])
		}
		t.view[i] = want
	}
	n.stats.ExcessCharged += excess
}

// shareOf is the node's share of t's limit from the demands last reported: max-min fair
// (water-filling) among the node and its peers, what nobody wants split evenly. The node
// counts its own demand at the least of its last reports, each peer's at the most it
// received, and a lost peer's at no less than its own.
func (n *Node) shareOf(t *tag) float64 {
	switch n.cfg.Policy {
	case Whole:
		return 1
	case Equal:
		return 1 / float64(n.Members())
	}
	if !n.meshed() {
		return n.treeShare(t)
	}
	r := t.rate()
	own := slices.Min(t.dem[:history])
	ws := n.ws[:0]
	for i, p := range n.peers {
		if p == nil {
			continue
		}
		var w float64
		if i < len(t.peers) && n.valid(&t.peers[i], i) {
			w = slices.Max(t.peers[i].dem[:])
		}
		if p.lost != 0 {
			w = max(w, own)
		}
		ws = append(ws, w)
	}
	n.ws = ws
	return waterfill(own, ws, r) / r
}

// waterfill returns what own gets of capacity r among itself and others (demands, in the
// same unit): if everyone's demand fits, its demand plus an even part of what is left;
// otherwise min(own, L), with L the level at which the demands, each capped at L, sum to
// r. It grows with own and shrinks as any other grows. It sorts others, with own added.
func waterfill(own float64, others []float64, r float64) float64 {
	total := own
	for _, w := range others {
		total += w
	}
	all := append(others, own)
	k := len(all)
	if total <= r {
		return own + (r-total)/float64(k)
	}
	slices.Sort(all)
	left := r
	for i, w := range all {
		rest := float64(k - i)
		if w*rest > left {
			return min(own, left/rest)
		}
		left -= w
	}
	return own
}
