package allot

// A member's decisions on its share: grants, settlements, penalties.

import (
	"errors"
	"math"
	"slices"
	"time"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/store"
)

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
	// AtStore: some limit is too small to share out and is decided at the store (see
	// Reply.Central): the caller takes the permits of those limits there (TakeRequest,
	// then Took), and decides the others with Decide on their members alone.
	AtStore
)

// TakenAtStore marks, in a ticket's TatAfter, a limit whose permits were taken at the
// store: settling them is the store's (OpGive, OpTake), not the member's bucket.
const TakenAtStore = math.MinInt64

// Decide decides n permits at now for a key under the limits the members hold shares of
// (one member per limit, all of the same process), reserving up to maxDelay ahead, but
// never past a lease's end. On a grant the members' states change; on a denial only their
// demand does.
func Decide(ms []*Member, now, n, maxDelay int64) (gcra.Result, gcra.Ticket, Outcome, error) {
	return decide(ms, now, n, maxDelay, true, nil)
}

// DecideAgain is Decide for a request decided again after a wait (NoLease, LeaseEnds,
// TooFar): its permits were already counted in the members' demand.
func DecideAgain(ms []*Member, now, n, maxDelay int64) (gcra.Result, gcra.Ticket, Outcome, error) {
	return decide(ms, now, n, maxDelay, false, nil)
}

// DecideKeeping is Decide for a decision that keeps part of each share's burst for a
// higher class (package priority): keep[i] is the fraction (0 to 1) of the burst of
// ms[i]'s share left unspent, as gcra.Limit.Keeping keeps it. A share too small to keep a
// permit is decided keeping nothing (see keptShare). A decision that keeps headroom does
// not borrow from the free capacity (see decide). Windowed quotas keep nothing.
func DecideKeeping(ms []*Member, now, n, maxDelay int64, keep *[gcra.MaxLimits]float64) (gcra.Result, gcra.Ticket, Outcome, error) {
	return decide(ms, now, n, maxDelay, true, keep)
}

// DecideAgainKeeping is DecideKeeping for a request decided again after a wait (see
// DecideAgain).
func DecideAgainKeeping(ms []*Member, now, n, maxDelay int64, keep *[gcra.MaxLimits]float64) (gcra.Result, gcra.Ticket, Outcome, error) {
	return decide(ms, now, n, maxDelay, false, keep)
}

// keptShare is the share l kept for a higher class: keep of its burst left unspent
// (gcra.Limit.Keeping). A share too small to keep a whole permit is l itself: it keeps no
// headroom, where refusing its every permit would leave this member's lower callers
// nothing while a higher class is recent (docs/lease.md, "Headroom for higher classes").
func keptShare(l gcra.Limit, keep float64) gcra.Limit {
	if k, ok := l.Keeping(keep); ok {
		return k
	}
	return l
}

// decide is Decide; count is false when the same request is decided again after a wait
// (its permits were already counted in the members' demand). keep, when not nil, is
// what each share keeps for a higher class (DecideKeeping).
func decide(ms []*Member, now, n, maxDelay int64, count bool, keep *[gcra.MaxLimits]float64) (gcra.Result, gcra.Ticket, Outcome, error) {
	if n < 0 {
		return gcra.Result{}, gcra.Ticket{}, Throttled, gcra.ErrInvalidCost
	}
	if len(ms) == 0 || len(ms) > gcra.MaxLimits {
		return gcra.Result{}, gcra.Ticket{}, Throttled, gcra.ErrInvalidLimits
	}
	for _, m := range ms {
		m.link.borrow = false // a borrow asked for before and never sent
	}
	if ms[0].windowed() {
		return decideQuota(ms, now, n, count)
	}
	var tats [gcra.MaxLimits]int64
	var ls [gcra.MaxLimits]gcra.Limit
	end := int64(math.MaxInt64)
	lease, central := true, false
	for i, m := range ms {
		if m.windowed() {
			return gcra.Result{}, gcra.Ticket{}, Throttled, gcra.ErrInvalidLimits // the lease mode decides windows apart from rates
		}
		if n > m.limit.Burst() {
			return gcra.Result{}, gcra.Ticket{}, Throttled, gcra.ErrCostExceedsBurst
		}
		if n > 0 {
			if count {
				m.demand.asked += n
				m.learnThink(now)
			}
			m.demand.lastCall = now
		}
		if m.view.central && m.phase == registered {
			central = true
		}
		share := m.lease.local
		if keep != nil && keep[i] > 0 {
			share = keptShare(share, keep[i])
		}
		if !m.usable(now) || n > share.Burst() {
			lease = false
			continue
		}
		if count && n > 0 && m.bucket.tat < now {
			m.demand.fullAt = now // its bucket stood full: permits went unused
		}
		tats[i], ls[i] = m.bucket.tat, share
		end = min(end, m.lease.end)
	}
	k := len(ms)
	if central && n > 0 {
		// A limit decided at the store keeps no headroom for a higher class (keep): a take
		// is decided on the limit's own bucket at the store, and carries no kept level.
		if maxDelay > 0 {
			// A caller that may wait: while the member holds all its places in the store's
			// line, it waits in the process for one to free (then decides again).
			for _, m := range ms {
				if wait, full := m.lineFull(now); full {
					return gcra.Result{RetryAfter: wait}, gcra.Ticket{}, TooFar, nil
				}
			}
		}
		return gcra.Result{}, gcra.Ticket{}, AtStore, nil
	}
	if n == 0 {
		if !lease {
			return gcra.Result{Allowed: true}, gcra.Ticket{}, Granted, nil
		}
		res, _, err := gcra.Decide(tats[:k], ls[:k], now, 0, 0)
		return res, gcra.Ticket{}, Granted, err
	}
	// A decision that keeps headroom for a higher class does not borrow. A borrow takes
	// its permits from the free capacity, which every member shares and whose level this
	// member knows only from the store's last answer: nothing there would stop it from
	// taking the part of the limit kept for the higher class. The caller is refused, and
	// asks again when the share has refilled or the higher class is no longer recent.
	borrow := keep == nil
	if borrow && !lease && canBorrowAll(ms, now, n) {
		// No usable share for it (none yet, or one too small for the cost): borrow from
		// what the free capacity saved up, one round trip.
		return startBorrow(ms, n)
	}
	if !lease {
		hint := ms[0].waitHint(now)
		for _, m := range ms {
			m.demand.throttled = true
			m.demand.held = m.demand.held || maxDelay > 0
			m.demand.waited = m.demand.waited || maxDelay > 0
			// A caller told to come back is still at it until then, and a caller without a
			// share at all for at least a renewal (it may back off longer than told).
			m.demand.lastRetry = max(hint, m.cfg.renew)
		}
		return gcra.Result{RetryAfter: hint}, gcra.Ticket{}, NoLease, nil
	}
	bound := min(max(maxDelay, 0), end-1-now)
	md := bound
	horizon := int64(-1)
	for _, m := range ms {
		if m.view.contended {
			horizon = max(horizon, m.bookAhead())
		}
	}
	if horizon >= 0 {
		md = min(md, horizon)
	}
	res, tk, err := gcra.Decide(tats[:k], ls[:k], now, n, md)
	if err != nil {
		return res, tk, Throttled, err
	}
	if borrow && (!res.Allowed || res.Delay > ms[0].bookAhead()) && canBorrowAll(ms, now, n) {
		// The share refuses the permits, or would have the caller wait longer than a
		// booking horizon, while the free capacity has saved some up: borrow them there
		// (one round trip), as one limiter shared by the whole pool would have granted
		// them. The share's state is unchanged; if the borrow fails, the caller decides
		// again on the share (DecideAgain).
		return startBorrow(ms, n)
	}
	if !res.Allowed || res.Delay > 0 {
		for _, m := range ms {
			m.demand.throttled = true
		}
	}
	if !res.Allowed || res.Delay > ms[0].cfg.horizon {
		// Held back: refused, or kept waiting longer than a booking horizon (a shorter
		// wait is the share's pacing, which a Poisson caller meets under its share too).
		for _, m := range ms {
			// A caller that waits, or may, is held back: it asks no faster than it is
			// served. A caller refused that may not wait has asked all the same: its
			// asking rate is its demand.
			m.demand.held = m.demand.held || res.Allowed || maxDelay > 0
			if !res.Allowed && res.RetryAfter > bound {
				// A caller that may not wait is expected back after RetryAfter; one that
				// may wait, refused because the permit lies beyond its bound, gave up.
				m.demand.lastRetry = 0
				if maxDelay == 0 {
					m.demand.lastRetry = res.RetryAfter
				}
			}
		}
	}
	parked, growing, sliver := false, false, false
	for _, m := range ms {
		parked = parked || m.lease.share.Parked()
		growing = growing || m.growing()
		sliver = sliver || m.belowEqualSplit()
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
		markWaited(ms)
		return res, tk, LeaseEnds, nil
	case growing || sliver:
		// Beyond the caller's bound on the share held now, but the policy means to give
		// the member more at its next renewal (or will, once it hears the demand): a
		// caller that may wait waits for it. A share below an equal split followed the
		// member's demand down while its callers were quiet, and grows once the store
		// hears they are back: the wait at that sliver (seconds) is not the wait for a
		// permit, so a caller is told to come back after a renewal interval.
		if sliver {
			res.RetryAfter = min(res.RetryAfter, ms[0].cfg.renew)
		}
		if maxDelay > 0 {
			markWaited(ms)
			return res, tk, LeaseEnds, nil
		}
		return res, tk, Throttled, nil
	default:
		return res, tk, Throttled, nil
	}
	for i, m := range ms {
		m.bucket.tat = tats[i]
		if tk.At > now {
			m.addPending(tk.At, n)
		}
		m.pending.lastAt = max(m.pending.lastAt, tk.At)
		m.pending.busyAt = max(m.pending.busyAt, tk.At)
		m.demand.used += n
	}
	return res, tk, Granted, nil
}

// bookAhead is how far ahead the member books permits on its share before it borrows
// (and, while others want all they can get, at most): its booking horizon, or for a member
// whose callers include critical ones (it reports critical demand) on a contended limit
// that is not crowded (where the store keeps a reserve for them, criticalReserve),
// criticalAheadNum / criticalAheadDen of its renewal interval if that is longer. Elsewhere
// it borrows as any member does, at once. The store keeps a reserve
// for critical callers out of the lower classes' shares, and a critical member's share
// holds only part of its demand: borrowing whenever a caller would wait a horizon left the
// share idle between its callers' bursts while the reserve served them in its place
// (scenarios/priorities.yaml: utilization 0.944 to 0.950, against 0.965 to 0.971).
func (m *Member) bookAhead() int64 {
	if m.demand.critical0 > 0 && m.view.contended && m.view.live <= CrowdedAbove {
		return max(m.cfg.horizon, m.cfg.renew*criticalAheadNum/criticalAheadDen)
	}
	return m.cfg.horizon
}

// criticalAheadNum / criticalAheadDen: a member with critical callers books this part of
// its renewal interval ahead on its share before it borrows (bookAhead).
const (
	criticalAheadNum int64 = 3
	criticalAheadDen int64 = 5
)

// markWaited notes that a caller waits for the members' shares to grow (beyond what they
// hold, not merely for its turn within them): what it would ask meanwhile is not counted.
func markWaited(ms []*Member) {
	for _, m := range ms {
		m.demand.waited = true
	}
}

// AllowOne takes one permit now, or not at all, from a key with one limit: Decide with
// n = 1 and no reservation, without the decision's details (the hot path). ok is false
// when the member holds no usable share, or when its share refuses and it may borrow: the
// caller then goes the long way (Decide).
func (m *Member) AllowOne(now int64) (allowed, ok bool) {
	if !m.usable(now) {
		return false, false
	}
	tat, allowed := gcra.AllowOne(m.bucket.tat, m.lease.local, now)
	if !allowed && (m.lease.share.Parked() || m.canBorrow(now, 1)) {
		return false, false // no rate yet (NoLease), or a borrow: the caller goes the long way
	}
	m.learnThink(now)
	m.demand.lastCall = now
	m.demand.asked++
	if !allowed {
		m.demand.throttled = true
		m.demand.lastRetry = gcra.Wait(m.bucket.tat, m.lease.local, now, 1)
		return false, true
	}
	m.bucket.tat = tat
	m.pending.lastAt = max(m.pending.lastAt, now)
	m.pending.busyAt = max(m.pending.busyAt, now)
	m.demand.used++
	return true, true
}

// FastShare is what a caller may grant single permits on without serializing with the
// member's other calls (a lock-free fast path beside AllowOne): the share as a limit, the
// instant until which the lease may be used, and the share's bucket (its TAT) when Fast
// was called. A permit that gcra.AllowOne grants on Limit, at a now before End, from the
// bucket's TAT at that moment, is a permit AllowOne would grant. A refusal is not: the
// member counts it, and may borrow instead (AllowOne).
type FastShare struct {
	Limit gcra.Limit // never a windowed quota's
	End   int64
	Tat   int64
}

// Fast returns the member's FastShare; ok is false when single permits must go through
// AllowOne (no share, a windowed quota's tokens, released). The caller hands what it
// granted on the share to Granted before it calls any other method.
func (m *Member) Fast() (FastShare, bool) {
	if !m.lease.has || m.windowed() || m.lease.local.Window > 0 || m.phase == released {
		return FastShare{}, false
	}
	return FastShare{Limit: m.lease.local, End: m.lease.end, Tat: m.bucket.tat}, true
}

// FastGrants are the permits granted on a FastShare since Fast returned it.
type FastGrants struct {
	N     int64 // how many (none: the member is left as it is)
	Tat   int64 // the bucket's TAT after the last of them
	First int64 // the now of the first call that granted one
	Last  int64 // the now of the latest
}

// Granted counts g, the permits granted on the member's FastShare: the member is then as
// N calls of AllowOne that granted them would have left it, the calls between the first
// and the last taken as evenly spaced (it is not told their times: only its callers' think
// time, which learnThink smooths over the gaps, depends on them).
func (m *Member) Granted(g FastGrants) {
	if g.N <= 0 {
		return
	}
	m.grantedAt(g.First)
	if rest := g.N - 1; rest > 0 {
		gap := (g.Last - g.First) / rest
		from := max(rest-thinkSteps, 0) // the calls before leave nothing in the think time
		if from > 0 {
			t := g.First + from*gap
			m.demand.lastCall = max(m.demand.lastCall, t)
			m.pending.lastAt, m.pending.busyAt = max(m.pending.lastAt, t), max(m.pending.busyAt, t)
		}
		for k := from + 1; k < rest; k++ {
			m.grantedAt(g.First + k*gap)
		}
		m.grantedAt(g.Last)
	}
	m.bucket.tat = g.Tat
	m.demand.asked += g.N
	m.demand.used += g.N
}

// grantedAt is AllowOne's bookkeeping of a permit granted at now, but for the count.
func (m *Member) grantedAt(now int64) {
	m.learnThink(now)
	m.demand.lastCall = max(m.demand.lastCall, now)
	m.pending.lastAt = max(m.pending.lastAt, now)
	m.pending.busyAt = max(m.pending.busyAt, now)
}

// thinkSteps bounds the calls of a batch Granted replays: before them, what the think time
// learned has long been smoothed away (each call moves it a quarter of the way).
const thinkSteps = 128

// belowEqualSplit reports whether the member's share is below an equal split of the
// limit's rate among the live members: a share the fair policy cut to the member's
// demand, which grows when the demand does.
func (m *Member) belowEqualSplit() bool {
	return m.lease.share.Rate*max(m.view.live, 1) < RateScale
}

// waitHint is how long a member without a usable share expects to wait for one.
func (m *Member) waitHint(now int64) int64 {
	return max(m.cfg.renew/4, m.Due(now)-now)
}

// Adjust settles a grant made by Decide over the same members to its real cost newN (see
// gcra.Adjust). Refunds are skipped for grants made under a share that has changed since
// (safe: a refund is only ever a gift); charges always apply.
func Adjust(ms []*Member, now int64, t gcra.Ticket, newN int64) error {
	if newN < 0 {
		return gcra.ErrInvalidCost
	}
	for i, m := range ms {
		if m.windowed() {
			m.adjustQuota(now, t.TatAfter[i], t.N, newN)
			continue
		}
		if t.At > now {
			if newN == 0 && t.At == m.pending.busyAt {
				m.pending.busyAt = now // the latest reservation was given back: nothing pending
			}
			m.settlePending(t.At, t.N, newN)
		}
		if t.TatAfter[i] == TakenAtStore || !m.lease.has || (newN < t.N && t.At <= m.handover.noRefundBefore) {
			continue // a limit taken at the store is the store's to settle
		}
		one := gcra.Ticket{N: t.N, At: t.At}
		one.TatAfter[0] = t.TatAfter[i]
		hold := int64(0)
		if m.bucket.drain {
			hold = m.bucket.hold // the penalty drains only its member's limit, as gcra.Adjust does
		}
		tats := [1]int64{m.bucket.tat}
		if _, err := gcra.Adjust(tats[:], []gcra.Limit{m.lease.local}, now, one, newN, hold); err != nil {
			return err
		}
		m.bucket.tat = tats[0]
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
		m.bucket.hold = max(m.bucket.hold, until)
		ls[i] = m.limit
	}
	k := gcra.PenaltyLimit(ls[:len(ms)])
	ms[k].applyPenalty(now, until)
	return k
}

// applyPenalty drains this member's share so that nothing is granted before until.
func (m *Member) applyPenalty(now, until int64) {
	m.bucket.hold = max(m.bucket.hold, until)
	m.bucket.drain = true
	if m.lease.has {
		tats := [1]int64{m.bucket.tat}
		gcra.Penalize(tats[:], []gcra.Limit{m.lease.local}, now, until)
		m.bucket.tat = tats[0]
	}
}

// canBorrow reports whether the member may borrow n permits from what the free capacity
// saved up: it is registered with the store and in touch with it, the limit is shared out
// (not decided at the store), no penalty holds it back, and the store's last word on the
// pool, refilled since at the free rate, less what it asked to borrow since, holds them.
func (m *Member) canBorrow(now, n int64) bool {
	if m.phase != registered || m.view.central || m.link.failed || m.windowed() || m.bucket.hold > now ||
		m.demand.borrows >= borrowsPerWindow {
		return false
	}
	return m.poolLevel(now) >= gcra.MulSat(n, m.limit.T)
}

// poolLevel is what the member expects the free capacity to hold at now, in nanoseconds of
// the limit's tolerance.
func (m *Member) poolLevel(now int64) int64 {
	gain, _ := mulDiv(max(now-m.view.poolAt, 0), m.view.free.Rate, RateScale)
	return min(gcra.AddSat(m.view.pool, gain), gcra.MulSat(m.view.free.Burst, m.limit.T)) - m.view.borrowed
}

// canBorrowAll reports whether every one of ms (the limits of one key) may borrow n
// permits: a decision borrows on all its limits or on none.
func canBorrowAll(ms []*Member, now, n int64) bool {
	for _, m := range ms {
		if !m.canBorrow(now, n) {
			return false
		}
	}
	return true
}

// startBorrow makes the decision a borrow of n permits at the store on each of ms
// (AtStore; TakeRequest makes the requests, TookBorrow applies the answers).
func startBorrow(ms []*Member, n int64) (gcra.Result, gcra.Ticket, Outcome, error) {
	for _, m := range ms {
		m.link.borrow = true
		m.view.borrowed = gcra.AddSat(m.view.borrowed, gcra.MulSat(n, m.limit.T))
		m.demand.borrows++
	}
	return gcra.Result{}, gcra.Ticket{}, AtStore, nil
}

// learnPool records what the store said of the free capacity.
func (m *Member) learnPool(now int64, rep Reply) {
	m.view.pool, m.view.free, m.view.poolAt, m.view.borrowed = rep.Pool, rep.Free, now, 0
}

// Borrowing reports whether the take Decide asked for (AtStore) is a borrow: the limit is
// shared out, and the member borrows from what the free capacity saved up.
func (m *Member) Borrowing() bool { return m.link.borrow }

// TookBorrow applies the store's answer to a borrow of n permits asked at now. Granted,
// the permits are the member's to use at once; refused (or failed), the caller decides
// again on the member's share (DecideAgain): the member now knows the pool is short.
func (m *Member) TookBorrow(now, n int64, rep Reply, err error) {
	if err != nil {
		if errors.Is(err, ErrStaleEpoch) && m.phase == registered {
			m.becomeUnregistered()
		}
		m.view.pool, m.view.borrowed = 0, 0
		m.view.poolAt = now
		return
	}
	m.link.seen = max(m.link.seen, rep.Version)
	m.view.central = m.view.central || rep.Central
	m.learnPool(now, rep)
	if rep.Taken {
		m.demand.used += n
		m.pending.lastAt = max(m.pending.lastAt, now)
		m.pending.busyAt = max(m.pending.busyAt, now)
	}
}

// Central reports whether the member's limit is decided at the store (Reply.Central).
func (m *Member) Central() bool { return m.view.central && m.phase == registered }

// BucketRef is a limit's bucket as its member knows it (Member.Bucket).
type BucketRef struct {
	ID string // BucketID of the record's
	// Start is what a missing bucket starts at (State.BucketAt, the store's clock), and
	// Fence how long a bucket lost with its store is fenced (the record's TTL + Grace).
	Start, Fence int64
}

// BucketOp is the operation on bucket b of limit l that carries req out, in the bucket's
// microseconds (times and intervals rounded so that the bucket is never faster nor its
// burst larger): a take, booked at most the record's TTL + Grace ahead (as the record
// books: a bucket lost with its store is fenced that long); a settlement up (MaxDelay <
// 0: used already); permits given back (which change nothing: store.BucketOp); or a
// penalty's hold. The backend and the simulator both decide a bucket's requests by it.
func (b BucketRef) BucketOp(l gcra.Limit, req Request) store.BucketOp {
	op := store.BucketOp{Start: (b.Start + 999) / 1000, Fence: (b.Fence + 999) / 1000}
	op.T, op.Tau = store.BucketLimit(l.T, l.Tau)
	switch {
	case req.Op == OpPenalize:
		op.Hold = (max(req.Hold, 0) + 999) / 1000
	case req.Op == OpGive:
		op.N = -req.N
	case req.MaxDelay < 0:
		op.N, op.Charge = req.N, true
	default:
		op.N, op.MaxDelay = req.N, max(min(req.MaxDelay, b.Fence), 0)/1000
	}
	return op
}

// Bucket reports whether the member's limit is decided on its bucket (State.BucketAt) at
// now, and if so which, named after the record's ID: the caller takes there (the
// request from TakeRequest, the answer to Took), rather than at the record. It is not
// once the registration it learnt it under may have ended: the member then asks the
// record, which says again.
func (m *Member) Bucket(now int64, recordID string) (BucketRef, bool) {
	if !m.Central() || m.view.bucket == 0 || now >= m.view.bucketUntil {
		return BucketRef{}, false
	}
	return BucketRef{ID: BucketID(recordID, m.view.bucketInc), Start: m.view.bucket, Fence: m.view.bucketFence}, true
}

// learnBucket learns from a reply of the record, to a request of its registration's,
// whether the limit is decided on its bucket, until expire (own clock).
// An answer to a request sent before the one it last learnt from says nothing newer (a
// late answer, out of order, may name a bucket a rewound record has left); a bucket
// named anew is taken at only until the word of the answer that named it.
func (m *Member) learnBucket(rep Reply, expire int64) {
	if rep.Sent < m.view.bucketSent {
		return
	}
	m.view.bucketSent = rep.Sent
	m.view.bucket = rep.Bucket
	if rep.Bucket == 0 {
		return
	}
	if rep.BucketInc != m.view.bucketInc {
		m.view.bucketInc, m.view.bucketUntil = rep.BucketInc, expire
	}
	m.view.bucketFence = rep.TTL + rep.Grace
	m.view.bucketUntil = max(m.view.bucketUntil, expire)
}

// TookAtBucket applies the bucket's answer, arrived at arrival, to a take of n permits
// asked at now (Bucket): taken, usable after wait, or refused (the same take would be
// granted after wait); err if the store did not answer.
func (m *Member) TookAtBucket(now, arrival, n int64, taken bool, wait int64, err error) {
	m.Took(now, arrival, n, Reply{Central: true, Bucket: m.view.bucket, BucketInc: m.view.bucketInc, Taken: taken, Wait: wait, Sent: now}, err)
}

// TakeRequest returns the request that takes n permits of a store-decided limit at the
// store, at once or booked up to maxDelay (at most the member's booking horizon, or two
// round trips to the store) ahead (OpTake); ok is false when the member is not registered
// (it must join first: the caller waits for its next renewal).
func (m *Member) TakeRequest(now, n, maxDelay int64) (Request, bool) {
	if m.phase != registered {
		return Request{}, false
	}
	borrow := m.link.borrow
	m.link.borrow = false
	if borrow {
		maxDelay = 0 // a borrow is at once or not at all
	} else if maxDelay > 0 {
		// Booked at most a booking horizon ahead (or two round trips to the store, if
		// longer: a member that comes back to book its turn must reach the store before
		// it): a permit booked further ahead is lost when its caller gives up before its
		// slot (the store cannot give back a slot that later ones follow without crowding
		// them), where a caller waiting in the store's line for its turn leaves nothing
		// behind.
		//
		// A limit decided on its bucket has no line: a take booked there is its caller's
		// place, as far ahead as the bucket books (TTL + Grace); a caller told to come back
		// later competes with every other as it comes, and slots that come free while the
		// refused ones sleep past them are lost (1,000 members of 2000/s at 120% of it,
		// booking a horizon ahead: 0.91 of the ideal throttle's permits).
		// Nor past the member's word on its bucket (bucketUntil): a member whose record
		// was lost stops taking there then, and every permit it booked has come before
		// the record made again (fenced TTL + Grace from the loss) grants any.
		if m.view.bucket == 0 {
			maxDelay = min(maxDelay, max(m.cfg.horizon, 2*m.link.rtt, 1))
		} else {
			maxDelay = min(maxDelay, max(m.view.bucketUntil-now, 0))
		}
		m.line.inflight = append(m.line.inflight, now)
	}
	return Request{Op: OpTake, Member: m.id, Epoch: m.epoch, N: n, MaxDelay: maxDelay, Sent: now, Seen: m.seenIfHolding(now), Borrow: borrow}, true
}

// GiveRequest returns the request that settles a take (or a borrow, on a limit that is
// shared out) at the store: it gives back n permits taken and not used (OpGive) or, with a
// negative n, charges -n more at once (a settlement up: an OpTake with a negative
// MaxDelay, which the store never refuses).
func (m *Member) GiveRequest(now, n int64) Request {
	borrow := !m.view.central // permits borrowed on a limit that is shared out
	if n < 0 {
		return Request{Op: OpTake, Member: m.id, Epoch: m.epoch, N: -n, MaxDelay: -1, Sent: now, Borrow: borrow} // a charge
	}
	return Request{Op: OpGive, Member: m.id, Epoch: m.epoch, N: n, Sent: now, Borrow: borrow}
}

// Took applies the store's answer, arrived at arrival, to a take of n permits asked at now:
// the member learns whether its limit is still decided at the store and how long the store
// takes to answer, and counts the permits in its demand. An answer to a borrow is
// TookBorrow's.
func (m *Member) Took(now, arrival, n int64, rep Reply, err error) {
	if err == nil && rep.Borrow {
		m.TookBorrow(arrival, n, rep, nil)
		return
	}
	if err == nil {
		m.link.sawRoundTrip(arrival - now)
	}
	if i := slices.IndexFunc(m.line.inflight, func(sent int64) bool { return sent <= now }); i >= 0 {
		m.line.inflight = slices.Delete(m.line.inflight, i, i+1)
		if err == nil && rep.Wait > 0 {
			// A permit booked ahead, or a place in the store's line that it was told to
			// come back for: its other callers wait in the process until then.
			m.line.booked = append(m.line.booked, now+rep.Wait)
		}
	}
	if err != nil {
		if errors.Is(err, ErrStaleEpoch) && m.phase == registered {
			m.becomeUnregistered()
		}
		m.demand.throttled, m.demand.held = true, true
		return
	}
	m.view.central = rep.Central
	if rep.TTL > 0 { // the record's answer (a bucket's keeps nobody alive)
		m.view.takenTill = max(m.view.takenTill, rep.Sent+rep.Wait+rep.TTL-m.cfg.margin)
		m.learnBucket(rep, rep.Sent+rep.TTL-m.cfg.margin)
	}
	m.link.seen = max(m.link.seen, rep.Version)
	if !rep.Taken {
		m.demand.throttled, m.demand.held = true, true
		return
	}
	at := now + rep.Wait
	m.demand.used += n
	m.pending.lastAt = max(m.pending.lastAt, at)
	m.pending.busyAt = max(m.pending.busyAt, at)
}

// lineFull reports whether the member holds all its places in its store-decided limit's
// line at now (storeLine), and if so how long until one may free: when the first booked
// permit falls due, or soon, while a take is in flight (its answer frees or books it).
func (m *Member) lineFull(now int64) (wait int64, full bool) {
	m.line.inflight = slices.DeleteFunc(m.line.inflight, func(sent int64) bool { return now-sent >= m.cfg.renew })
	m.line.booked = slices.DeleteFunc(m.line.booked, func(due int64) bool { return due <= now })
	if len(m.line.inflight)+len(m.line.booked) < m.places() {
		return 0, false
	}
	wait = math.MaxInt64
	if len(m.line.inflight) > 0 {
		wait = inflightPoll
	}
	for _, due := range m.line.booked {
		wait = min(wait, due-now)
	}
	return max(wait, 1), true
}

// places is how many places the member may hold in a store-decided limit's line: the
// permits of its booking horizon at the limit's rate, at least one, at most maxPlaces.
func (m *Member) places() int {
	if m.limit.T <= 0 {
		return 1
	}
	return int(min(maxPlaces, max(1, m.cfg.horizon/m.limit.T)))
}

// maxPlaces is the most places a member holds in a store-decided limit's line.
const maxPlaces = 64

// inflightPoll is how soon a caller waiting for a place held by a take in flight asks
// again (a store round trip is a millisecond or two).
const inflightPoll = int64(time.Millisecond)
