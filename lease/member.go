package lease

import (
	"errors"
	"fmt"
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

// headroom is how much more than its measured rate an unthrottled member asks for, so
// that it can grow before it is held back.
const headroom = 1.5

// saturation is the fraction of its share's rate a held-back member must ask for to count
// as saturated (wanting more), rather than bursty.
const saturation = 0.8

// prefetchLevel: with less than this fraction of its share's burst left while the policy
// means to give it more, a member renews early (a prefetch, so that it never runs dry).
const prefetchLevel = 0.2

// Member is one member's side of one limit: the lease it holds, its GCRA state at its
// share, its demand, and when it must talk to the store. Like State it is a pure core:
// its methods take now (the member's monotonic clock, nanoseconds) and return decisions
// and messages; the caller sends the messages and serializes calls.
type Member struct {
	id        string
	limit     gcra.Limit
	renew     int64
	margin    int64
	idleGap   int64
	horizon   int64
	failLocal bool

	joined bool
	epoch  Epoch
	seq    uint64
	share  Share
	local  gcra.Limit // share as a limit, when has
	has    bool
	expire int64 // own clock: sent + TTL - margin
	end    int64 // own clock: the lease may be used while now < end (expire, + grace failing locally)
	tat    int64
	hold   int64 // a penalty's end: no refund reopens the member before it
	drain  bool  // this limit carries the penalty's drain
	lastAt int64 // the latest permit time granted
	busyAt int64 // lastAt, unless the grant for it was cancelled (for idleness only)
	// pend lists the permits granted for later (At > now) that are still to be used, in
	// time order, while pendExact says the list is complete and booked at the current
	// share; otherwise lastAt bounds them.
	pend       []pendingPermit
	pendExact  bool
	returnable int64 // permits given up unspent, in nanoseconds of the limit (see Request.Return)
	returnBy   int64 // ... to be handed back before then (the old lease's end): later, the store has freed it

	contended bool // the last reply said others want as much as they can get

	noRefundBefore int64 // tickets for permits at or before it predate the share: no refund
	had            bool  // it has held a share (and may have granted tickets under it)
	ackSeq         uint64
	ackUntil       int64 // reservations under lease ackSeq are pending until then
	ackNow         bool  // a smaller share awaits acknowledgement: renew soon
	prevShare      Share // the share of the older lease still in use until prevUntil
	prevUntil      int64

	// demand over the window since the last request
	winStart  int64
	asked     int64
	used      int64
	throttled bool  // held back by its share in this window
	saturated bool  // held back, and active ever since
	heldRuns  int   // windows in a row in which it asked and was held back
	think     int64 // smoothed time from a permit falling due to the next call (the API's service time)
	waiting   int   // callers waiting for a share (see Wait)
	lastCall  int64
	lastRetry int64
	rate      float64 // smoothed asked rate, permits per nanosecond
	measured  bool    // rate holds a measurement
	demand    int64
	lastUsed  int64 // the last window's figures, for Status
	lastWin   int64

	// from the last reply
	target  Share
	live    int64
	retryAt int64

	settled   bool // it has had a share, or an answer that promises none soon
	inflight  bool
	nonce     uint64
	joinNonce uint64
	lastSent  int64
	failed    bool
	released  bool
	lastErr   error
}

// maxPending is how many permits granted for later a member lists exactly; beyond, it
// falls back to the latest one's time.
const maxPending = 8

type pendingPermit struct{ at, n int64 }

// pendingUntil returns the time of the last permit granted for later and still to be
// used, or now if there is none.
func (m *Member) pendingUntil(now int64) int64 {
	k := 0
	for k < len(m.pend) && m.pend[k].at <= now {
		k++
	}
	if k > 0 {
		m.pend = append(m.pend[:0], m.pend[k:]...)
	}
	if !m.pendExact {
		if m.lastAt > now {
			return m.lastAt
		}
		m.pendExact, m.pend = true, m.pend[:0] // everything granted is due: exact again
	}
	if len(m.pend) == 0 {
		return now
	}
	return max(now, m.pend[len(m.pend)-1].at)
}

// addPending records n permits granted for use at `at`, later than now.
func (m *Member) addPending(at, n int64) {
	if m.pendExact && len(m.pend) < maxPending {
		m.pend = append(m.pend, pendingPermit{at, n})
		return
	}
	m.pendExact = false
}

// settlePending records that the n permits granted for `at` were settled to newN.
func (m *Member) settlePending(at, n, newN int64) {
	for k := len(m.pend) - 1; k >= 0; k-- {
		if m.pend[k] == (pendingPermit{at, n}) {
			switch {
			case newN == 0:
				m.pend = append(m.pend[:k], m.pend[k+1:]...)
			case newN < n:
				m.pend[k].n = newN
			}
			return
		}
	}
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
	return &Member{
		id: id, limit: l, renew: max(int64(cfg.RenewEvery), 1), margin: int64(cfg.Margin), idleGap: gap, horizon: horizon,
		failLocal: cfg.FailMode != backend.FailClosed, winStart: now, lastCall: now, lastSent: math.MinInt64 / 4,
		lastAt: math.MinInt64 / 4, busyAt: math.MinInt64 / 4, noRefundBefore: math.MinInt64 / 4,
		pendExact: true,
	}
}

// ID returns the member's name.
func (m *Member) ID() string { return m.id }

// Limit returns the limit the member holds a share of.
func (m *Member) Limit() gcra.Limit { return m.limit }

// Inflight reports whether a request is out (Receive has not been called for it).
func (m *Member) Inflight() bool { return m.inflight }

// Released reports whether the member has released its share (it is done).
func (m *Member) Released() bool { return m.released }

// growing reports whether the policy means to give the member a larger rate than it holds
// (it gets it from what others free, at its next renewals).
func (m *Member) growing() bool {
	return m.target.Rate > m.share.Rate+max(RateScale/1000, m.share.Rate/20)
}

// rated reports whether the member holds a share with a rate (not nothing, not parked).
func (m *Member) rated() bool { return m.has && m.share.Rate > 0 }

// usable reports whether the member may use its share at now.
func (m *Member) usable(now int64) bool { return m.has && now < m.end }

// Usable returns the member's share as a limit, if it may use one at now.
func (m *Member) Usable(now int64) (gcra.Limit, bool) { return m.local, m.usable(now) }

// InUse returns what the member may be using at now: its share while it may use it or
// permits reserved under it are pending, and the share of an older lease while permits
// reserved under that are pending. The members' InUse sum to at most the limit at every
// instant (the store's invariant seen from the members' side).
func (m *Member) InUse(now int64) Share {
	var c Share
	if m.has && (now < m.end || now < m.pendingUntil(now)) {
		c = m.share
	}
	if now < m.prevUntil {
		c = maxShare(c, m.prevShare)
	}
	return c
}

// Outcome says why a decision came out as it did.
type Outcome uint8

const (
	// Granted: the permits were granted.
	Granted Outcome = iota
	// Throttled: the member's share denied them; the answer stands (RetryAfter).
	Throttled
	// NoLease: some limit has no usable share (yet), or one too small for the cost: a
	// caller that may wait should wait for the next renewal.
	NoLease
	// LeaseEnds: the permits would fall after a lease's end: a caller that may wait
	// should wait for the next renewal.
	LeaseEnds
	// TooFar: the permits lie beyond the member's booking horizon (while the pool is
	// contended): a caller that may wait should wait RetryAfter and ask again.
	TooFar
)

// Decide decides n permits at now for a key under the limits the members hold shares of
// (one member per limit, all of the same process), reserving up to maxDelay ahead, but
// never past a lease's end. On a grant the members' states change; on a denial only their
// demand does.
func Decide(ms []*Member, now, n, maxDelay int64) (gcra.Result, gcra.Ticket, Outcome, error) {
	return decide(ms, now, n, maxDelay, true)
}

// DecideAgain is Decide for a request decided again after a wait (NoLease, LeaseEnds,
// TooFar): its permits were already counted in the members' demand.
func DecideAgain(ms []*Member, now, n, maxDelay int64) (gcra.Result, gcra.Ticket, Outcome, error) {
	return decide(ms, now, n, maxDelay, false)
}

// decide is Decide; count is false when the same request is decided again after a wait
// (its permits were already counted in the members' demand).
func decide(ms []*Member, now, n, maxDelay int64, count bool) (gcra.Result, gcra.Ticket, Outcome, error) {
	if n < 0 {
		return gcra.Result{}, gcra.Ticket{}, Throttled, gcra.ErrInvalidCost
	}
	if len(ms) == 0 || len(ms) > gcra.MaxLimits {
		return gcra.Result{}, gcra.Ticket{}, Throttled, gcra.ErrInvalidLimits
	}
	var tats [gcra.MaxLimits]int64
	var ls [gcra.MaxLimits]gcra.Limit
	end := int64(math.MaxInt64)
	lease := true
	for i, m := range ms {
		if n > m.limit.Burst() {
			return gcra.Result{}, gcra.Ticket{}, Throttled, gcra.ErrCostExceedsBurst
		}
		if n > 0 {
			if count {
				m.asked += n
				m.learnThink(now)
			}
			m.lastCall = now
		}
		if !m.usable(now) || n > m.local.Burst() {
			lease = false
			continue
		}
		tats[i], ls[i] = m.tat, m.local
		end = min(end, m.end)
	}
	k := len(ms)
	if n == 0 {
		if !lease {
			return gcra.Result{Allowed: true}, gcra.Ticket{}, Granted, nil
		}
		res, _, err := gcra.Decide(tats[:k], ls[:k], now, 0, 0)
		return res, gcra.Ticket{}, Granted, err
	}
	if !lease {
		hint := ms[0].waitHint(now)
		for _, m := range ms {
			m.throttled = true
			// A caller told to come back is still at it until then, and a caller without a
			// share at all for at least a renewal (it may back off longer than told).
			m.lastRetry = max(hint, m.renew)
		}
		return gcra.Result{RetryAfter: hint}, gcra.Ticket{}, NoLease, nil
	}
	bound := min(max(maxDelay, 0), end-1-now)
	md := bound
	horizon := int64(-1)
	for _, m := range ms {
		if m.contended {
			horizon = max(horizon, m.horizon)
		}
	}
	if horizon >= 0 {
		md = min(md, horizon)
	}
	res, tk, err := gcra.Decide(tats[:k], ls[:k], now, n, md)
	if err != nil {
		return res, tk, Throttled, err
	}
	if !res.Allowed || res.Delay > 0 {
		for _, m := range ms {
			m.throttled = true
			if !res.Allowed && res.RetryAfter > bound {
				// A caller that may not wait is expected back after RetryAfter; one that
				// may wait, refused because the permit lies beyond its bound, gave up.
				m.lastRetry = 0
				if maxDelay == 0 {
					m.lastRetry = res.RetryAfter
				}
			}
		}
	}
	parked, growing := false, false
	for _, m := range ms {
		parked = parked || m.share.Parked()
		growing = growing || m.growing()
	}
	switch {
	case res.Allowed:
	case parked:
		// A parked share has spent its permit: wait for a rate.
		res.RetryAfter = ms[0].waitHint(now)
		return res, tk, NoLease, nil
	case res.RetryAfter <= bound:
		res.RetryAfter -= horizon // when it will be within the horizon
		return res, tk, TooFar, nil
	case res.RetryAfter <= maxDelay:
		return res, tk, LeaseEnds, nil
	case growing && maxDelay > 0:
		// Beyond the caller's bound on the share held now, but the policy means to give
		// the member more at its next renewal: a caller that may wait waits for it.
		return res, tk, LeaseEnds, nil
	default:
		return res, tk, Throttled, nil
	}
	for i, m := range ms {
		m.tat = tats[i]
		if tk.At > now {
			m.addPending(tk.At, n)
		}
		m.lastAt = max(m.lastAt, tk.At)
		m.busyAt = max(m.busyAt, tk.At)
		m.used += n
	}
	return res, tk, Granted, nil
}

// AllowOne takes one permit now, or not at all, from a key with one limit: Decide with
// n = 1 and no reservation, without the decision's details (the hot path). ok is false
// when the member holds no usable share.
func (m *Member) AllowOne(now int64) (allowed, ok bool) {
	if !m.usable(now) {
		return false, false
	}
	m.learnThink(now)
	m.lastCall = now
	m.asked++
	tat, allowed := gcra.AllowOne(m.tat, m.local, now)
	if !allowed && m.share.Parked() {
		return false, false // no rate yet: the caller goes the long way (NoLease)
	}
	if !allowed {
		m.throttled = true
		m.lastRetry = gcra.Wait(m.tat, m.local, now, 1)
		return false, true
	}
	m.tat = tat
	m.lastAt = max(m.lastAt, now)
	m.busyAt = max(m.busyAt, now)
	m.used++
	return true, true
}

// waitHint is how long a member without a usable share expects to wait for one.
func (m *Member) waitHint(now int64) int64 {
	return max(m.renew/4, m.Due(now)-now)
}

// Adjust settles a grant made by Decide over the same members to its real cost newN (see
// gcra.Adjust). Refunds are skipped for grants made under a share that has changed since
// (safe: a refund is only ever a gift); charges always apply.
func Adjust(ms []*Member, now int64, t gcra.Ticket, newN int64) error {
	if newN < 0 {
		return gcra.ErrInvalidCost
	}
	for i, m := range ms {
		if t.At > now {
			if newN == 0 && t.At == m.busyAt {
				m.busyAt = now // the latest reservation was given back: nothing pending
			}
			m.settlePending(t.At, t.N, newN)
		}
		if !m.has || (newN < t.N && t.At <= m.noRefundBefore) {
			continue
		}
		one := gcra.Ticket{N: t.N, At: t.At}
		one.TatAfter[0] = t.TatAfter[i]
		hold := int64(0)
		if m.drain {
			hold = m.hold // the penalty drains only its member's limit, as gcra.Adjust does
		}
		tats := [1]int64{m.tat}
		if _, err := gcra.Adjust(tats[:], []gcra.Limit{m.local}, now, one, newN, hold); err != nil {
			return err
		}
		m.tat = tats[0]
	}
	return nil
}

// Penalize holds the members back until `until`: the limit with the smallest tolerance is
// drained so that one permit is available then (as gcra.Penalize does), and no refund
// reopens any of them before it. It returns the index of the member that carries the
// drain (whose limit's record the penalty should be reported to), or -1.
func Penalize(ms []*Member, now, until int64) int {
	if until <= now || len(ms) == 0 || len(ms) > gcra.MaxLimits {
		return -1
	}
	var ls [gcra.MaxLimits]gcra.Limit
	for i, m := range ms {
		m.hold = max(m.hold, until)
		ls[i] = m.limit
	}
	k := gcra.PenaltyLimit(ls[:len(ms)])
	ms[k].applyPenalty(now, until)
	return k
}

// applyPenalty drains this member's share so that nothing is granted before until.
func (m *Member) applyPenalty(now, until int64) {
	m.hold = max(m.hold, until)
	m.drain = true
	if m.has {
		tats := [1]int64{m.tat}
		gcra.Penalize(tats[:], []gcra.Limit{m.local}, now, until)
		m.tat = tats[0]
	}
}

// active reports whether the member's callers are still at it: one waiting for a share,
// a permit pending, or a call recent enough (allowing thrice the wait a denial asked for:
// callers back off with jitter).
func (m *Member) active(now int64) bool { return m.waiting > 0 || now <= m.quietAt() }

// Wait tells the member that a caller starts (+1) or stops (-1) waiting for a share (after
// NoLease or LeaseEnds): while one waits, the member wants as much as it can get.
func (m *Member) Wait(delta int) { m.waiting = max(0, m.waiting+delta) }

// quietAt is the instant after which the member counts as idle.
func (m *Member) quietAt() int64 {
	return max(m.busyAt, m.lastCall+3*m.lastRetry) + m.idleGap + 2*m.think
}

// learnThink learns, from a call at now, how long its callers take between a permit
// falling due and their next call (the API's service time, scheduling): a caller is
// judged idle only well after that.
func (m *Member) learnThink(now int64) {
	if gap := now - m.busyAt; m.busyAt >= m.lastCall && gap >= 0 && gap < 2*m.renew {
		m.think += (gap - m.think) / 4
	}
}

// tokens returns the permits the member could take now, in nanoseconds of the limit
// (permits × the limit's T), for handing them back.
func (m *Member) tokens(now int64) int64 {
	if !m.usable(now) {
		return 0
	}
	v, _ := mulDiv(max(0, gcra.Level(m.tat, m.local, now)), m.limit.T, m.local.T)
	return v
}

// level returns the permits (as a fraction of the share's burst) the member could take now.
func (m *Member) level(now int64) float64 {
	if !m.has {
		return 0
	}
	return float64(gcra.Level(m.tat, m.local, now)) / float64(m.local.Tau)
}

// Due returns when the member must next send a request (now or earlier: at once).
func (m *Member) Due(now int64) int64 {
	if m.released {
		return math.MaxInt64
	}
	if !m.joined {
		if m.failed {
			return m.lastSent + m.renew/4
		}
		return math.MinInt64
	}
	d := m.lastSent + m.renew
	if m.rated() && m.contended && (m.throttled || m.saturated) {
		// Held back while others want all they can get too: capacity that idle members
		// give back is picked up at renewals, so renew twice as often.
		d = m.lastSent + m.renew/2
	}
	if m.failed {
		d = min(d, m.lastSent+m.renew/4)
	}
	if m.has {
		d = min(d, m.expire-m.renew/2) // prefetch before the lease runs out
	}
	if m.ackNow {
		d = min(d, max(m.ackUntil, m.lastSent+m.renew/20))
	}
	switch {
	case m.retryAt > 0:
		d = min(d, m.retryAt) // the store said when capacity frees
	case !m.rated() && (m.asked > 0 || m.throttled):
		d = min(d, m.lastSent+m.renew/4) // waiting for others to shrink at their renewals
	}
	if m.saturated && m.rated() && m.waiting == 0 {
		d = min(d, m.quietAt()+1) // gone idle after being held back: give the share back
	}
	if m.has && m.growing() && m.level(now) < prefetchLevel {
		d = min(d, m.lastSent+m.renew/4) // prefetch
	}
	return max(d, m.lastSent+m.renew/20)
}

// Request returns the request the member must send now, if one is due and none is in
// flight; or, when the member is at least half way through its renewal interval, if one
// is due by now + early (renewing a little early lets a process batch its renewals). The
// member counts it as in flight until Receive.
func (m *Member) Request(now, early int64) (Request, bool) {
	if m.inflight || m.released {
		return Request{}, false
	}
	if due := m.Due(now); due > now && (due > now+early || now-m.lastSent < m.renew/2) {
		return Request{}, false
	}
	m.nonce++
	req := Request{Member: m.id, Sent: now, Nonce: m.nonce, Size: m.live}
	if !m.joined {
		req.Op = OpJoin
		m.joinNonce = m.nonce
	} else {
		req.Op = OpRenew
		req.Epoch = m.epoch
		req.InUse = m.inUse(now)
		if req.InUse == m.seq {
			m.ackNow = false
		}
		// Relinquish: a member that went quiet after being held back, while
		// others want all they can get, gives its share back in this very request, with
		// the permits it saved (nothing of it is pending).
		if m.rated() && m.contended && m.saturated && !m.active(now) && m.pendingUntil(now) <= now {
			if now >= m.returnBy {
				m.returnable = 0
			}
			tok := m.tokens(now)
			m.has, m.share, m.prevUntil = false, Share{}, 0
			if tok >= m.limit.T {
				// Keep one whole permit, parked (see Share.Parked), for the next request.
				tok -= m.limit.T
				m.share = Share{Burst: 1}
				m.local, _ = m.share.Limit(m.limit)
				m.tat = now // a full bucket of one permit
				m.has = true
				req.Keep = 1
			}
			m.returnable += tok
			m.returnBy = m.expire
			req.Relinquish = true
		}
		if now >= m.returnBy {
			m.returnable = 0
		}
		if req.Relinquish || req.InUse == m.seq {
			req.Return, m.returnable = m.returnable, 0
		}
	}
	req.Demand = m.measure(now)
	m.inflight = true
	m.lastSent = now
	return req, true
}

// inUse is the oldest lease number the member may still use.
func (m *Member) inUse(now int64) uint64 {
	if now < m.ackUntil {
		return m.ackSeq
	}
	return m.seq
}

// measure closes the demand window at now and returns the demand to report, in parts of
// RateScale: as much as it can get when it joins, has no rate, or is saturated (held back
// by its share while asking for most of it) and still at it; nothing once it went quiet
// after being saturated (an on/off caller whose spell ended); otherwise its smoothed
// asked rate with some headroom.
func (m *Member) measure(now int64) int64 {
	dt := now - m.winStart
	quiet := !m.active(now)
	if m.joined && dt < m.renew/2 && !(m.saturated && quiet) && !(!m.rated() && m.asked > 0) {
		// A request soon after the last (an acknowledgement, a prefetch): too short a
		// window to measure; the demand stands and the window goes on.
		return m.demand
	}
	if dt > 0 && m.joined {
		r := float64(m.asked) / float64(dt)
		if m.measured {
			w := float64(dt) / float64(dt+4*m.renew) // smoothing over about four renewals
			m.rate += w * (r - m.rate)
		} else {
			m.rate, m.measured = r, true
		}
	}
	measured := int64(math.Min(float64(RateScale), m.rate*float64(m.limit.T)*float64(RateScale)*headroom))
	// Saturated: held back in two asking windows running, and asking (on average) at least most
	// of what its share gives (a caller that waits asks no faster than it is served). A
	// member held back now and then by a burst of requests under its share is not: it
	// reports its rate.
	switch {
	case m.throttled:
		m.heldRuns++
	case m.asked > 0:
		m.heldRuns = 0 // asked, and was never held back
	}
	sat := m.throttled && (!m.rated() || m.heldRuns >= 2 && m.rate*float64(m.local.T) >= saturation)
	var d int64
	switch {
	case !m.joined, !m.rated() && m.asked > 0, (sat || m.saturated) && !quiet:
		// A member joins because it was asked for permits, one without a rate is asked
		// for them, and a saturated one wants more: as much as it can get (the policy
		// gives it at most an equal part of what the others leave).
		d = RateScale
	case m.saturated || sat:
		m.rate = 0 // quiet after being saturated: an on/off caller whose spell ended
	default:
		d = measured
		if d == 0 && m.asked > 0 {
			d = 1
		}
	}
	// Still saturated while active and held back whenever it asks (one that asked with no
	// rate at all is, by definition).
	m.saturated = (sat || m.saturated) && !quiet && (m.throttled || m.asked == 0)
	m.demand = d
	m.lastUsed, m.lastWin = m.used, dt
	m.winStart, m.asked, m.used, m.throttled = now, 0, 0, false
	return d
}

// Receive applies the answer to the member's request number nonce (err for a failure: the
// store unreachable, or ErrStaleEpoch, after which the member joins again). Answers to any
// but the latest request are ignored.
func (m *Member) Receive(now int64, nonce uint64, rep Reply, err error) {
	if m.released || nonce != m.nonce || !m.inflight {
		return
	}
	m.inflight = false
	if err != nil {
		m.lastErr = err
		if errors.Is(err, ErrStaleEpoch) {
			m.joined, m.failed = false, false
		} else {
			m.failed = true
		}
		return
	}
	m.failed, m.lastErr = false, nil
	newEpoch := !m.joined || rep.Epoch != m.epoch
	if newEpoch {
		if nonce != m.joinNonce {
			return // an answer for a registration this member no longer has
		}
		m.joined, m.epoch = true, rep.Epoch
	}
	expire := rep.Sent + rep.TTL - m.margin
	switch {
	case !newEpoch && rep.Lease.Seq < m.seq:
		return
	case !newEpoch && rep.Lease.Seq == m.seq && rep.Lease.Share == m.share:
		if expire > m.expire {
			m.expire = expire
			m.end = expire
			if m.failLocal {
				m.end += rep.Grace
			}
		}
	default:
		m.change(now, rep, newEpoch, expire)
	}
	if rep.Penalty > 0 {
		m.applyPenalty(now, now+rep.Penalty)
	}
	m.target, m.live, m.contended = rep.Target, rep.Live, rep.Contended
	m.retryAt = 0
	if rep.RetryIn > 0 {
		m.retryAt = now + rep.RetryIn
	}
	m.settled = m.settled || m.has || rep.RetryIn == 0 || rep.RetryIn > m.renew
}

// Joining reports whether the member is still joining: it has no share yet, but the
// store has said (or will say, in its first answer) that one comes soon (a fresh limit's
// join window). A caller's first decision on a key waits for it.
func (m *Member) Joining() bool { return !m.settled && !m.failed }

// change moves the member to the lease in rep. Its bucket keeps its level in permits (a
// larger share does not make permits appear), plus what the store handed over full
// (Fill); the rest of a new share starts drained. Permits already reserved under the old
// lease are booked again on the new share when they fit it; otherwise they keep the old
// lease in use (and unacknowledged) until they are due, and the new share is used only
// after them. Permits the old bucket held beyond what the new one keeps are handed back
// to the store with the acknowledgement.
func (m *Member) change(now int64, rep Reply, newEpoch bool, expire int64) {
	nl, ok := rep.Lease.Share.Limit(m.limit)
	pu := m.pendingUntil(now)
	pending := pu > now
	oldUsable := m.usable(now)
	var oldLevel int64 // in the old share's nanoseconds; negative for a debt
	if oldUsable {
		oldLevel = gcra.Level(m.tat, m.local, now)
	}
	var fill int64
	if ok && rep.Fill > 0 {
		fill, _ = mulDiv(rep.Fill, nl.T, m.limit.T)
	}
	rebooked := false
	var kept int64 // what the new bucket keeps of the old one's level, in its nanoseconds
	if ok {
		if oldUsable {
			kept = min(convertLevel(oldLevel, m.local.T, nl.T), nl.Tau)
		}
		tat := gcra.AtLevel(nl, now, kept+fill)
		if pending && m.pendExact && oldUsable && !newEpoch {
			// Book the pending permits again on the new share, at their times.
			excl := oldLevel
			for _, p := range m.pend {
				excl += p.n * m.local.T
			}
			excl = min(excl, m.local.Tau)
			t2 := gcra.AtLevel(nl, now, min(convertLevel(excl, m.local.T, nl.T), nl.Tau)+fill)
			rebooked = true
			for _, p := range m.pend {
				t3, res, err := gcra.DecideOne(t2, nl, p.at, p.n, 0)
				if err != nil || !res.Allowed {
					rebooked = false
					break
				}
				t2 = t3
			}
			if rebooked {
				tat = t2
			}
		}
		if pending && !rebooked {
			// The new share starts empty after the last pending permit, so that nothing
			// is granted on it before they are done (the store keeps counting the old
			// lease until the member says it switched, which it says only then).
			tat = max(tat, pu+nl.Tau)
		}
		m.tat = tat
		if m.drain && m.hold > now {
			tats := [1]int64{m.tat}
			gcra.Penalize(tats[:], []gcra.Limit{nl}, now, m.hold)
			m.tat = tats[0]
		}
	}
	switch {
	case m.has && pending && !rebooked:
		if now < m.prevUntil {
			m.prevShare = maxShare(m.prevShare, m.share)
		} else {
			m.prevShare = m.share
		}
		m.prevUntil = max(m.prevUntil, pu)
		if !newEpoch {
			if now >= m.ackUntil {
				m.ackSeq = m.seq
			}
			m.ackUntil = max(m.ackUntil, pu)
		}
		m.pendExact = false // the pending permits stay booked in the old share's units
	case !newEpoch && oldUsable && oldLevel > 0 && !pending:
		// Hand back what the new bucket does not keep (a smaller burst, or no share).
		old, _ := mulDiv(oldLevel, m.limit.T, m.local.T)
		var keep int64
		if ok && kept > 0 {
			keep, _ = mulDivUp(kept, m.limit.T, nl.T)
		}
		if now >= m.returnBy {
			m.returnable = 0
		}
		m.returnable += max(0, old-keep)
		m.returnBy = m.expire
	}
	if newEpoch {
		m.ackUntil = 0
	}
	if !newEpoch && !m.share.Fits(rep.Lease.Share) {
		m.ackNow = true // the store holds the difference until it hears the member switched
	}
	if m.had {
		m.noRefundBefore = max(now, m.lastAt) // tickets of the old share are in its units
	}
	m.had = m.had || ok
	m.seq = rep.Lease.Seq
	m.share = rep.Lease.Share
	m.local, m.has = nl, ok
	m.expire = expire
	m.end = expire
	if m.failLocal {
		m.end += rep.Grace
	}
}

// Idle reports whether the member has had no call for `after` and nothing pending: it may
// release its share and be forgotten.
func (m *Member) Idle(now, after int64) bool {
	return !m.inflight && now-m.lastCall >= after && m.pendingUntil(now) <= now
}

// Release returns the request that hands the member's share back, and ends the member: it
// decides nothing more. ok is false if it never joined (nothing to hand back).
func (m *Member) Release(now int64) (Request, bool) {
	if m.released {
		return Request{}, false
	}
	m.released = true
	defer func() { m.has = false }()
	if !m.joined {
		return Request{}, false
	}
	m.nonce++
	req := Request{Op: OpRelease, Member: m.id, Epoch: m.epoch, InUse: m.inUse(now),
		BusyFor: max(0, m.pendingUntil(now)-now), Sent: now, Nonce: m.nonce}
	if req.BusyFor == 0 {
		if now < m.returnBy {
			req.Return = m.returnable
		}
		req.Return += m.tokens(now)
	}
	return req, true
}

// PenalizeRequest returns the request that reports a penalty until `until` to the store,
// so that the whole pool holds back.
func (m *Member) PenalizeRequest(now, until int64) Request {
	return Request{Op: OpPenalize, Member: m.id, Hold: until - now, Sent: now}
}

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
	// Expires is how long the lease may still be used (0: it may not).
	Expires time.Duration
	// Demand is the demand last reported, in parts of RateScale.
	Demand int64
	// Used is what the member granted over the last reporting window, and Granted what its
	// share allowed over it (its rate × the window).
	Used    int64
	Granted float64
	Window  time.Duration
	Live    int64 // live members, as the store last said
	Err     error // the last failure to reach the store, if the last request failed
}

// Status returns the member's state at now.
func (m *Member) Status(now int64) Status {
	st := Status{Limit: m.limit, Member: m.id, Epoch: m.epoch, Seq: m.seq, Share: m.share, Target: m.target,
		Demand: m.demand, Used: m.lastUsed, Window: time.Duration(m.lastWin), Live: m.live, Err: m.lastErr}
	if m.has {
		st.Rate = 1e9 / float64(m.local.T)
		st.Granted = st.Rate * float64(m.lastWin) / 1e9
	}
	if m.usable(now) {
		st.Expires = time.Duration(m.end - now)
	}
	return st
}
