package allot

import (
	"fmt"
	"hash/fnv"
	"math"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
)

// MemberConfig is a member's settings, the same for every limit it holds a share of. Use
// DefaultMemberConfig and change fields; Validate checks them.
type MemberConfig struct {
	// RenewEvery is how often the member renews each lease it holds (its heartbeat, which
	// also reports its demand). Renewals come sooner when the member waits for capacity,
	// prefetches (less than 20% of its share's burst left while more is coming), acknowledges
	// a smaller share, or has gone idle after being held back.
	RenewEvery time.Duration
	// Margin is taken off the store's TTL: the member stops using a lease at (the time it
	// sent the request that obtained it + TTL - Margin, + Grace in fail mode local, while
	// the store still counts it) on its own monotonic clock. It
	// covers the difference between the member's and the store's clock rates over TTL +
	// Grace.
	Margin time.Duration
	// FailMode is what a member that cannot renew does at its lease's end: FailLocal (the
	// default, also for FailDefault) goes on for the store's Grace, which the store keeps
	// quarantined, so no over-admission; FailClosed stops (docs/concepts.md, "Fail
	// modes"). FailOpen is not offered: Validate refuses it.
	FailMode backend.FailMode
	// IdleGap: a member that was held back by its share and then has no permit pending
	// and no call for this long is idle, and renews at once so that its share can go where
	// it is needed. Zero means max(20ms, RenewEvery/4).
	IdleGap time.Duration
	// Horizon: while other members want all the capacity they can get, permits are booked
	// at most this far ahead; a caller whose permit lies further waits (in Decide) until it
	// is within it. A share that shrinks can then be handed over at once, rather than after
	// the permits booked on it. Zero means RenewEvery/4.
	Horizon time.Duration
}

// DefaultMemberConfig returns the default member settings.
func DefaultMemberConfig() MemberConfig {
	return MemberConfig{
		RenewEvery: 250 * time.Millisecond, // four store operations a second per member and limit, at most a few more
		Margin:     50 * time.Millisecond,  // 3% of TTL + Grace: far above clock-rate error, covers scheduling
		FailMode:   backend.FailLocal,      // run on an expired lease for Grace
		IdleGap:    0,                      // max(20ms, RenewEvery/4)
		Horizon:    0,                      // RenewEvery/4
	}
}

// Validate reports whether c can be used.
func (c MemberConfig) Validate() error {
	switch {
	case c.RenewEvery <= 0:
		return fmt.Errorf("%w: RenewEvery %v must be positive", ErrInvalidConfig, c.RenewEvery)
	case c.Margin < 0:
		return fmt.Errorf("%w: Margin %v must not be negative", ErrInvalidConfig, c.Margin)
	case c.IdleGap < 0:
		return fmt.Errorf("%w: IdleGap %v must not be negative", ErrInvalidConfig, c.IdleGap)
	case c.Horizon < 0:
		return fmt.Errorf("%w: Horizon %v must not be negative", ErrInvalidConfig, c.Horizon)
	case c.FailMode == backend.FailOpen || c.FailMode > backend.FailLocal:
		return fmt.Errorf("%w: FailMode %v (want local or closed: a lease member never admits past its share)", ErrInvalidConfig, c.FailMode)
	}
	return nil
}

// headroom is how much more than its measured rate a windowed quota's member draws, so
// that it can grow before it runs out. (A rate's demand is reported without it: the store
// adds headroom from what the demands leave free.)
const headroom = 1.5

// probeNum / probeDen is how much more than its measured rate a saturated member asks for
// at each renewal.
const (
	probeNum int64 = 3
	probeDen int64 = 2
)

// borrowsPerWindow is how many borrows a member asks for at most between two of its
// requests to the store (a renewal interval, or a quarter of one while it borrows): the
// overflow of Poisson demand needs a few; a member whose demand outgrew its share needs a
// larger share, which its next renewal brings (it renews early, and reports the rate it
// was asked in the window rather than a smoothed one), not a store operation per request.
const borrowsPerWindow = 16

// waitedWindows: a saturated member whose callers were waiting (Wait) at this many
// renewals in a row (two seconds at the default interval) reports as much as it can get,
// as one whose callers wait for its share to grow does: workers that always wait for a
// permit (a backlog) ask no faster than they are served, and half as much again as that
// may not show the store that they want more than the limit.
const waitedWindows = 8

// fullWindows: a saturated member held back at this many renewals in a row while the limit
// was all handed out (no free rate) and others were given less than they asked reports as
// much as it can get.
const fullWindows = 2

// heldWindows: a saturated member held back at this many renewals in a row probes from its
// share (half as much again as the share, if more than its measured rate), not from its
// measured rate alone.
const heldWindows = 8

// saturation is the fraction of its share's rate a held-back member must ask for to count
// as saturated (wanting more), rather than bursty.
const saturation = 0.8

// unusedWindows: a member whose share's bucket a call found full (its permits overflowing
// unused) within this many renewal intervals is bursty, not saturated, however often its
// bursts hold it back: Poisson callers at about their share's rate are held back by each
// burst and ask at the share's rate, yet leave it unused between bursts. Counted
// saturated, they asked for all they could get whenever the limit was all handed out, and
// held 14% more than they used, out of the reach of members that wanted more (the
// matrix's hundred-b20/classes/poisson-120/none: 0.944 of the ideal served).
const unusedWindows = 4

// prefetchLevel: with less than this fraction of its share's burst left while the policy
// means to give it more, a member renews early (a prefetch, so that it never runs dry).
const prefetchLevel = 0.2

// Member is one member's side of one limit: the lease it holds, its GCRA state at its
// share, its demand, and when it must talk to the store. Like State it is a pure core:
// its methods take now (the member's monotonic clock, nanoseconds) and return decisions
// and messages; the caller sends the messages and serializes calls.
//
// Its registration with the store is an explicit phase (unregistered, registered,
// released), changed only by become*; the rest of its state is grouped by what it is
// about. The methods live in files by concern: member_decide.go (decisions, settlements,
// penalties), member_demand.go (measuring what its callers want), member_protocol.go (the
// renewal protocol: when to send what, and applying the store's answers) and
// member_lease.go (the lease held, handing a share over to the next).
type Member struct {
	id string
	// phaseSeed (a hash of id) spreads the member's regular renewals (spread).
	phaseSeed uint64
	limit     gcra.Limit
	cfg       memberSettings

	phase phase
	epoch Epoch // the registration, while registered

	lease    heldLease
	bucket   shareBucket
	pending  pendingPermits
	handover handover
	demand   demandWindow
	view     storeView
	link     link
	line     storeLine // its places in a store-decided limit's line
	quota    quotaHeld // a windowed quota's tokens (limit.Window > 0)
}

// phase is where a member stands with the store.
type phase uint8

const (
	// unregistered: no registration (never joined, or the store forgot it): the next
	// request joins.
	unregistered phase = iota
	// registered: it holds an epoch, and its requests renew it.
	registered
	// released: it handed its share back and decides nothing more.
	released
)

func (p phase) String() string {
	switch p {
	case unregistered:
		return "unregistered"
	case registered:
		return "registered"
	case released:
		return "released"
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// memberSettings are the member's settings, from MemberConfig.
type memberSettings struct {
	renew, margin, idleGap, horizon int64
	failLocal                       bool // run on an expired lease for the store's grace
}

// heldLease is the lease the member holds.
type heldLease struct {
	seq    uint64
	share  Share
	local  gcra.Limit // share as a limit, when has
	has    bool       // it holds a share
	had    bool       // it has held a share (and may have granted tickets under it)
	expire int64      // own clock: sent + TTL - margin
	end    int64      // own clock: the lease may be used while now < end (expire, + grace failing locally)
}

// shareBucket is the GCRA state at the share, and the penalty on it.
type shareBucket struct {
	tat   int64
	hold  int64 // a penalty's end: no refund reopens the member before it
	drain bool  // this limit carries the penalty's drain
}

// pendingPermits are the permits granted for later (At > now) and still to be used.
type pendingPermits struct {
	// list holds them in time order while exact says it is complete and booked at the
	// current share; otherwise lastAt bounds them.
	list   []pendingPermit
	exact  bool
	lastAt int64 // the latest permit time granted
	busyAt int64 // lastAt, unless the grant for it was cancelled (for idleness only)
}

// handover is what moving from one lease to the next leaves to settle.
type handover struct {
	returnable     int64 // permits given up unspent, in nanoseconds of the limit (see Request.Return)
	returnBy       int64 // ... to be handed back before then (the old lease's end): later, the store has freed it
	noRefundBefore int64 // tickets for permits at or before it predate the share: no refund
	ackSeq         uint64
	ackUntil       int64 // reservations under lease ackSeq are pending until then
	ackNow         bool  // a smaller share awaits acknowledgement: renew soon
	prevShare      Share // the share of the older lease still in use until prevUntil
	prevUntil      int64
}

// demandWindow measures what the member's callers want, over the window since the last
// request.
type demandWindow struct {
	winStart  int64
	asked     int64
	used      int64
	throttled bool  // held back by its share in this window
	held      bool  // ... and a caller waited, or might have: its asking rate is censored
	waited    bool  // a caller waited for a share (Wait) in this window
	borrows   int64 // borrows asked for in this window (startBorrow)
	fullAt    int64 // when a call last found its share's bucket full (permits overflowing unused)
	saturated bool  // held back, and active ever since
	heldRuns  int   // windows in a row in which it asked and was held back
	waitRuns  int   // windows in a row that ended with callers waiting (Wait)
	fullRuns  int   // windows in a row held back while the limit was all handed out and others wanted more
	think     int64 // smoothed time from a permit falling due to the next call (the API's service time)
	waiting   int   // callers waiting for a share (see Wait)
	lastCall  int64
	lastRetry int64
	rate      float64 // smoothed asked rate, permits per nanosecond
	measured  bool    // rate holds a measurement
	reported  int64   // the demand last reported
	critical  int64   // permits asked in this window by callers of the critical class (AskedCritical)
	critRate  float64 // smoothed rate of those, permits per nanosecond
	critical0 int64   // the part of the demand last reported that critical callers ask
	lastUsed  int64   // the last window's figures, for Status
	lastWin   int64
}

// storeView is what the last reply said.
type storeView struct {
	target    Share
	live      int64
	retryAt   int64
	contended bool  // others want as much as they can get
	central   bool  // the limit is decided at the store (Reply.Central)
	takenTill int64 // a take keeps it alive at the store until then (own clock)
	// bucket is the record's BucketAt (Reply.Bucket: the limit is decided on its bucket),
	// and bucketUntil when the registration it was told under may have ended (own clock):
	// the member takes at the bucket only until then, so that a member whose record was
	// lost (and made again, fenced, with a bucket of its own) stops within a TTL, as a
	// lease does.
	bucket      int64
	bucketUntil int64
	bucketInc   uint64 // the bucket's name (Reply.BucketInc)
	bucketFence int64  // the record's TTL + Grace: a lost bucket is fenced that long
	bucketSent  int64  // when the request whose answer it learnt them from was sent
	settled     bool   // it has had a share, or an answer that promises none soon
	// What the free capacity had saved up (pool, nanoseconds of the limit's tolerance) and
	// its rate and burst (free), as the store last said at poolAt (own clock), and what the
	// member has asked to borrow of it since (borrowed): a member borrows only while it
	// expects a permit there.
	pool     int64
	free     Share
	poolAt   int64
	borrowed int64
}

// storeLine is what a member holds in a store-decided limit's line (Central): each take it
// sent and has no answer to yet (until the answer, or a renewal interval after it sent it),
// each permit booked ahead for it (until the permit falls due), and its place among the
// store's waiters (until it was told to come back). A member holds at most
// the permits of a booking horizon there at once, at least one (places): its other callers
// wait in the process, so the store serves the pool by member, as the strict mode's
// processes share its line (sluice.FairProcesses), not by goroutine.
type storeLine struct {
	inflight []int64 // the send time of each take in flight
	booked   []int64 // when each permit booked ahead falls due, or its place among the waiters is its to claim
}

// link is the state of the exchange with the store.
type link struct {
	inflight  bool
	nonce     uint64
	joinNonce uint64
	lastSent  int64
	confirm   bool // the request in flight is a confirm (OpConfirm)
	failed    bool // the last request failed
	lastErr   error
	seen      uint64 // the newest version of the record seen (Request.Seen)
	borrow    bool   // the take Decide asked for (AtStore) is a borrow (Request.Borrow)
	rtt       int64  // the store's round trip: the longest seen lately, less an eighth at each answer
}

// sawRoundTrip counts an answer that took d to come back from the store.
func (l *link) sawRoundTrip(d int64) {
	l.rtt = max(d, l.rtt-l.rtt/8)
}

// NewMember returns member id's side of limit l, made at now. It holds nothing until it
// joins (its first request).
func NewMember(id string, l gcra.Limit, cfg MemberConfig, now int64) *Member {
	gap := int64(cfg.IdleGap)
	if gap == 0 {
		gap = max(int64(20*time.Millisecond), int64(cfg.RenewEvery)/4)
	}
	horizon := int64(cfg.Horizon)
	if horizon == 0 {
		horizon = int64(cfg.RenewEvery) / 4
	}
	h := fnv.New64a()
	h.Write([]byte(id))
	return &Member{
		id: id, limit: l, phaseSeed: h.Sum64(),
		cfg: memberSettings{renew: max(int64(cfg.RenewEvery), 1), margin: int64(cfg.Margin), idleGap: gap, horizon: horizon,
			failLocal: cfg.FailMode != backend.FailClosed},
		pending:  pendingPermits{exact: true, lastAt: math.MinInt64 / 4, busyAt: math.MinInt64 / 4},
		handover: handover{noRefundBefore: math.MinInt64 / 4},
		demand:   demandWindow{winStart: now, lastCall: now},
		link:     link{lastSent: math.MinInt64 / 4},
	}
}

// ID returns the member's name.
func (m *Member) ID() string { return m.id }

// LastCall returns when the member was last asked for permits.
func (m *Member) LastCall() int64 { return m.demand.lastCall }

// Limit returns the limit the member holds a share of.
func (m *Member) Limit() gcra.Limit { return m.limit }

// Inflight reports whether a request is out (Receive has not been called for it).
func (m *Member) Inflight() bool { return m.link.inflight }

// Released reports whether the member has released its share (it is done).
func (m *Member) Released() bool { return m.phase == released }

// becomeUnregistered: the store does not know the member (any more): the next request
// joins.
func (m *Member) becomeUnregistered() {
	m.phase, m.epoch = unregistered, Epoch{}
	m.link.failed = false
	m.handover.ackNow = false // an acknowledgement is of a registration the store no longer has
	m.view.bucket, m.view.bucketUntil, m.view.bucketInc, m.view.bucketSent = 0, 0, 0, 0
}

// becomeRegistered: the store registered the member under epoch.
func (m *Member) becomeRegistered(epoch Epoch) { m.phase, m.epoch = registered, epoch }

// becomeReleased: the member hands its share back; it decides nothing more.
func (m *Member) becomeReleased() { m.phase = released }

// Status is what a member holds of one limit, for observers and metrics.
type Status struct {
	Key    string     // the key, filled by the backend
	Limit  gcra.Limit // the limit shared
	Member string
	Epoch  Epoch
	Seq    uint64
	Share  Share   // the share held
	Target Share   // the share the policy wants it to hold
	Rate   float64 // the share's rate in permits per second
	// At is when the status was taken, on the member's clock: Expires and WindowLeft
	// count from it (an observer that runs later, its process paused, must count from
	// At, not from its own now).
	At int64
	// Expires is how long the lease may still be used (0: it may not).
	Expires time.Duration
	// Prev is the share of an older lease the member still uses, for permits it booked
	// under it before it moved to Share, and PrevLeft how long it uses it still (0: none).
	// What the member may be using is the larger of the two (Member.InUse).
	Prev     Share
	PrevLeft time.Duration
	// Demand is the demand last reported, in parts of RateScale, and Critical the part of
	// it that callers of the critical class ask (the store's fair policy gives it first).
	Demand   int64
	Critical int64
	// Used is what the member granted over the last reporting window, and Granted what its
	// share allowed over it (its rate × the window).
	Used    int64
	Granted float64
	Window  time.Duration
	Live    int64 // live members, as the store last said
	Err     error // the last failure to reach the store, if the last request failed
	// Tokens (a windowed quota) is how many tokens of the window the member holds, and
	// WindowLeft how long until the window ends (its own clock, less its margin).
	Tokens     int64
	WindowLeft time.Duration
	// Asked is when the request this status answers was sent (the member's clock; zero
	// from Member.Status, set by the backend's observer call). A member that acknowledges
	// a smaller share stops using the bigger one then, before the answer arrives.
	Asked int64
	// Borrowed is, for a status that answers a borrow (the backend's observer call), the
	// permits the member borrowed from the free capacity (Request.Borrow), apart from its
	// share: its from the instant the answer arrived (At), their slot. Zero otherwise.
	Borrowed int64
}

// Status returns the member's state at now.
func (m *Member) Status(now int64) Status {
	st := Status{At: now, Limit: m.limit, Member: m.id, Epoch: m.epoch, Seq: m.lease.seq, Share: m.lease.share, Target: m.view.target,
		Demand: m.demand.reported, Critical: m.demand.critical0, Used: m.demand.lastUsed, Window: time.Duration(m.demand.lastWin), Live: m.view.live, Err: m.link.lastErr}
	if m.lease.has {
		st.Rate = 1e9 / float64(m.lease.local.T)
		st.Granted = st.Rate * float64(m.demand.lastWin) / 1e9
	}
	if m.usable(now) {
		st.Expires = time.Duration(m.lease.end - now)
	}
	if now < m.handover.prevUntil {
		st.Prev, st.PrevLeft = m.handover.prevShare, time.Duration(m.handover.prevUntil-now)
	}
	if m.windowed() && m.quota.of != 0 && now < m.quota.end {
		st.Tokens, st.WindowLeft = m.quota.left, time.Duration(m.quota.end-now)
	}
	return st
}

// Live is how many members hold the limit, as the store last said (0 before any answer).
func (m *Member) Live() int64 { return m.view.live }

// OnBucket reports whether the record last said its limit is decided on its bucket
// (State.BucketAt).
func (m *Member) OnBucket() bool { return m.view.bucket != 0 }
