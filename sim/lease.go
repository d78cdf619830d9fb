package sim

import (
	"math"
	"slices"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/lease/allot"
	"github.com/sluicehq/sluice/priority"
	"github.com/sluicehq/sluice/store"
)

// LeaseReport is the lease mode's own part of a report.
type LeaseReport struct {
	// MaxRatePPM and MaxBurst are the most the members had in use at once (their shares,
	// and older ones with permits still pending), checked after every change: rate in
	// parts per million of the limit, burst in permits (of Burst). The first limit's.
	MaxRatePPM int64 `json:"max_rate_ppm"`
	MaxBurst   int64 `json:"max_burst"`
	Burst      int64 `json:"burst"`
	// Breaches counts the checks at which the shares in use (member side) or counted
	// (store side) summed past the limit, in rate or in burst. It must be 0.
	Breaches int64 `json:"breaches"`
	// StoreOpsPerMemberS is store operations per member per second of membership.
	StoreOpsPerMemberS float64 `json:"store_ops_per_member_s"`
	// ReclaimS is, for each crash, how long until the members in use held as much rate
	// as before it (-1: not within the run).
	ReclaimS []float64 `json:"reclaim_s"`
	// ExpiredPermits counts permits given up because their process used them too late
	// (after a pause): they would have broken the limit's spacing.
	ExpiredPermits int64 `json:"expired_permits"`
}

// leaseMode: members decide in process on shares leased from the simulated store (package
// lease: the same State and Member cores as the real backend), renewing over the
// simulated network.
type leaseMode struct {
	cfg    allot.Config
	mcfg   allot.MemberConfig
	states []*allot.State // the store's records, one per limit
	inc    uint64
	limits []gcra.Limit

	members [][]*allot.Member // per simulated member: one per limit; nil when it has none
	minc    []uint32          // the member's incarnation they were made for
	parked  [][]int32         // goroutines waiting for a share
	waiting [][]bool          // goroutines counted as waiting (allot.Member.Wait)
	again   [][]bool          // goroutines deciding again after a borrow the store refused
	asking  [][]bool          // goroutines with a request decided and not yet granted or denied
	tickAt  []int64           // when the member's renewal timer is set (0: not set)
	tickSeq []int64
	since   []int64 // when the member's lease members were made

	msgs []leaseMsg
	free []int32

	// buckets are the store's buckets of the limits decided on them (allot.State.BucketAt),
	// named after the limit's record (lease.RecordID of simKey) and the bucket incarnation
	// (allot.BucketID), and bucketsSince when the store's incarnation began (store.Fresh
	// until it restarts).
	buckets      map[string][]byte
	bucketsSince int64

	// The shares the members have in use, summed for checkMembers: each member's as last
	// asked (per limit), until when it holds (math.MinInt64: the member was called since,
	// ask again), the sums per limit, the members called since the last check, and the
	// earliest instant a member's share may change by itself (usedNext). A check asks
	// only the members called since the last or whose shares changed with time, where
	// asking all of them after every answer cost a large pool a pass over every member per
	// renewal.
	used      [][]allot.Share
	usedUntil []int64
	usedSum   []allot.Share
	usedDirty []int32
	usedNext  int64

	memberSeconds float64
	crashes       []pendingCrash
	rep           LeaseReport
}

type leaseMsg struct {
	limit int32
	req   allot.Request
	rep   allot.Reply
	err   error
	// bucket, if its ID is not "", is the bucket a take goes to directly (the member knows
	// its limit is decided there: allot.Member.Bucket), as the backend's does.
	bucket allot.BucketRef
}

type pendingCrash struct {
	at     int64
	target int64 // the rate in use before the crash
	idx    int
}

func newLeaseMode(sc *Scenario) *leaseMode {
	l := &leaseMode{cfg: allot.DefaultConfig(), mcfg: allot.DefaultMemberConfig(), inc: 1}
	s := &sc.Lease
	if s.TTL > 0 {
		l.cfg.TTL = s.TTL.D()
	}
	if s.Grace > 0 {
		l.cfg.Grace = s.Grace.D()
	}
	if s.Policy != "" {
		l.cfg.Policy, _ = allot.ParsePolicy(s.Policy) // checked when the scenario was read
	}
	if s.JoinWindow > 0 {
		l.cfg.JoinWindow = s.JoinWindow.D()
	}
	if s.Renew > 0 {
		l.mcfg.RenewEvery = s.Renew.D()
	}
	if s.Margin > 0 {
		l.mcfg.Margin = s.Margin.D()
	}
	if s.FailMode == "closed" {
		l.mcfg.FailMode = backend.FailClosed
	}
	return l
}

func (*leaseMode) name() string { return "lease" }

// setup makes the store's records the first time, and sizes the per-member tables.
func (l *leaseMode) setup(e *engine) {
	if l.states != nil {
		return
	}
	l.limits = limitconv.CoreRamped(e.limits, e.sc.Client.Margin.D()) // the allocation ramps a ramp itself
	l.states = make([]*allot.State, len(l.limits))
	for i, lim := range l.limits {
		st, err := allot.NewState(lim, l.inc, e.now, 0, l.cfg)
		if err != nil {
			panic(err) // the scenario's limits were validated
		}
		l.states[i] = st
	}
	n := len(e.members)
	l.members = make([][]*allot.Member, n)
	l.minc = make([]uint32, n)
	l.parked = make([][]int32, n)
	l.waiting = make([][]bool, n)
	l.again = make([][]bool, n)
	l.asking = make([][]bool, n)
	l.tickAt = make([]int64, n)
	l.tickSeq = make([]int64, n)
	l.since = make([]int64, n)
	l.rep.Burst = l.limits[0].Burst()
}

// ensure returns member mi's lease members, making them when it (re)joined.
func (l *leaseMode) ensure(e *engine, mi int32) []*allot.Member {
	l.setup(e)
	m := e.members[mi]
	if l.members[mi] == nil || l.minc[mi] != m.inc {
		ms := make([]*allot.Member, len(l.limits))
		for i, lim := range l.limits {
			ms[i] = allot.NewMember(m.name, lim, l.mcfg, e.now)
		}
		l.members[mi], l.minc[mi], l.since[mi] = ms, m.inc, e.now
		l.touch(mi)
		l.parked[mi] = l.parked[mi][:0]
		l.waiting[mi] = make([]bool, len(m.gs))
		l.again[mi] = make([]bool, len(m.gs))
		l.asking[mi] = make([]bool, len(m.gs))
		l.tickAt[mi] = 0
	}
	return l.members[mi]
}

// current reports whether a member-side event still applies to member mi.
func (l *leaseMode) current(e *engine, ev *event) bool {
	m := e.members[ev.m]
	return m.present && ev.op == m.inc && l.members != nil && l.members[ev.m] != nil && l.minc[ev.m] == m.inc
}

func (l *leaseMode) wait(mi, g int32) {
	if !l.waiting[mi][g] {
		l.waiting[mi][g] = true
		for _, m := range l.members[mi] {
			m.Wait(1)
		}
	}
}

func (l *leaseMode) unwait(mi, g int32) {
	if l.waiting[mi][g] {
		l.waiting[mi][g] = false
		for _, m := range l.members[mi] {
			m.Wait(-1)
		}
	}
}

func (l *leaseMode) acquire(e *engine, mi, g int32) {
	ms := l.ensure(e, mi)
	l.touch(mi)
	s := &e.members[mi].gs[g]
	decide := allot.Decide
	if l.waiting[mi][g] || l.again[mi][g] {
		decide = allot.DecideAgain // the same request, after a wait or a borrow: counted once
	} else if e.members[mi].class == int8(priority.Critical) {
		for _, m := range ms {
			m.AskedCritical(1) // as the backend does for a critical caller's context
		}
	}
	l.again[mi][g] = false
	l.asking[mi][g] = true
	l.unwait(mi, g)
	res, tk, out, err := decide(ms, e.now, 1, e.maxWait)
	switch {
	case err != nil:
		l.deny(e, mi, g, 0)
	case out == allot.Granted:
		e.members[mi].tickets[g], s.hasTk = tk, true
		l.grant(e, mi, g, e.now+res.Delay)
	case out == allot.Throttled:
		l.deny(e, mi, g, res.RetryAfter)
	case out == allot.AtStore:
		// The limit is decided at the store: take the permit there, one round trip.
		// (Keys with several limits, some decided at the store, are not modelled: the
		// goroutine backs off.)
		req, ok := ms[0].TakeRequest(e.now, 1, e.maxWait)
		if len(ms) != 1 || !ok {
			l.deny(e, mi, g, 0)
			break
		}
		req.Nonce = takeNonce(g, e.members[mi].ops[g])
		ref, _ := ms[0].Bucket(e.now, lease.RecordID(simKey, ms[0].Limit()))
		l.sendMsg(e, mi, leaseMsg{limit: 0, req: req, bucket: ref}, true)
	case out == allot.TooFar:
		// The permit lies beyond the booking horizon: wait, then book it.
		l.wait(mi, g)
		e.schedule(event{at: e.now + max(res.RetryAfter, 1), kind: evRetry, m: mi, g: g, op: e.members[mi].ops[g]})
	case e.maxWait == 0 && !joining(ms) && !drawing(ms, e.now):
		l.deny(e, mi, g, res.RetryAfter) // no share (yet): a pessimistic client backs off
	default:
		// No share (yet), or the permit falls after the lease's end: wait for an answer
		// from the store, then ask again.
		l.wait(mi, g)
		l.parked[mi] = append(l.parked[mi], g)
	}
	l.reschedule(e, mi)
}

// grant hands goroutine g's permit, due at at, to the member's request that has waited
// longest: the limiter's waiting room serves a key's waiters in arrival order
// (docs/concepts.md, "Fair waiting"), whichever of them the decision was made for. The
// goroutines swap the requests they carry; the one left waiting goes on waiting for the
// next permit as it was.
func (l *leaseMode) grant(e *engine, mi, g int32, at int64) {
	m := e.members[mi]
	h := g
	for k := range m.gs {
		if l.asking[mi][k] && m.gs[k].busy && !m.gs[k].hasTk && m.gs[k].arrival < m.gs[h].arrival {
			h = int32(k)
		}
	}
	if h != g {
		a, b := &m.gs[g], &m.gs[h]
		a.arrival, b.arrival = b.arrival, a.arrival
		a.cost, b.cost = b.cost, a.cost
	}
	l.asking[mi][g] = false
	e.permit(mi, g, at)
}

// deny answers goroutine g's request with a denial (it backs off and asks again).
func (l *leaseMode) deny(e *engine, mi, g int32, retryAfter int64) {
	l.asking[mi][g] = false
	e.denied(mi, g, retryAfter)
}

// wake makes the goroutines waiting for a share ask again.
func (l *leaseMode) wake(e *engine, mi int32) {
	if len(l.parked[mi]) == 0 {
		return
	}
	gs := slices.Clone(l.parked[mi])
	l.parked[mi] = l.parked[mi][:0]
	m := e.members[mi]
	for _, g := range gs {
		if m.gs[g].busy && l.waiting[mi][g] {
			l.acquire(e, mi, g)
		}
	}
}

// reschedule sets member mi's renewal timer to its earliest due request.
func (l *leaseMode) reschedule(e *engine, mi int32) {
	ms := l.members[mi]
	if ms == nil {
		return
	}
	next := int64(math.MaxInt64)
	for _, m := range ms {
		if !m.Inflight() {
			next = min(next, m.Due(e.now))
		}
	}
	if next == math.MaxInt64 {
		return
	}
	next = max(next, e.now)
	if l.tickAt[mi] != 0 && l.tickAt[mi] <= next {
		return
	}
	l.tickAt[mi] = next
	l.tickSeq[mi]++
	e.schedule(event{at: next, kind: evLeaseTick, m: mi, op: e.members[mi].inc, val: l.tickSeq[mi]})
}

// send sends a request about limit k to the store; reply says whether one is expected.
func (l *leaseMode) send(e *engine, mi int32, k int, req allot.Request, reply bool) {
	l.sendMsg(e, mi, leaseMsg{limit: int32(k), req: req}, reply)
}

// sendMsg sends a request (msg.req, about limit msg.limit) to the store.
func (l *leaseMode) sendMsg(e *engine, mi int32, msg leaseMsg, reply bool) {
	k, req := int(msg.limit), msg.req
	var slot int32
	if n := len(l.free); n > 0 {
		slot = l.free[n-1]
		l.free = l.free[:n-1]
	} else {
		slot = int32(len(l.msgs))
		l.msgs = append(l.msgs, leaseMsg{})
	}
	l.msgs[slot] = msg
	ev := event{kind: evLeaseReq, m: mi, g: int32(k), op: e.members[mi].inc, val: int64(slot), val2: req.Sent}
	if !e.toStore(ev) {
		l.free = append(l.free, slot)
		if reply {
			l.timeout(e, mi, k, req.Sent, req.Nonce)
		}
	}
}

// timeout schedules the member's time-out for a request that will get no answer in time.
func (l *leaseMode) timeout(e *engine, mi int32, k int, sent int64, nonce uint64) {
	e.schedule(event{at: sent + int64(e.sc.Store.Timeout), kind: evLeaseTimeout, m: mi, g: int32(k), op: e.members[mi].inc, val2: int64(nonce)})
}

func (l *leaseMode) handle(e *engine, ev *event) {
	l.touch(ev.m)
	switch ev.kind {
	case evLeaseTick:
		if !l.current(e, ev) || ev.val != l.tickSeq[ev.m] {
			return
		}
		l.tickAt[ev.m] = 0
		for k, m := range l.members[ev.m] {
			if req, ok := m.Request(e.now, 0); ok {
				l.send(e, ev.m, k, req, true)
			}
		}
		l.reschedule(e, ev.m)
	case evLeaseReq:
		l.store(e, ev)
	case evLeaseReply:
		slot := int32(ev.val)
		msg := l.msgs[slot]
		l.free = append(l.free, slot)
		if !l.current(e, ev) {
			return
		}
		if msg.req.Op == allot.OpTake {
			l.took(e, ev.m, msg)
			return
		}
		l.members[ev.m][ev.g].Receive(e.now, msg.req.Nonce, msg.rep, msg.err)
		l.checkMembers(e)
		l.wake(e, ev.m)
		l.reschedule(e, ev.m)
	case evLeaseTimeout:
		if !l.current(e, ev) {
			return
		}
		e.timeouts++
		if g, op, ok := fromTakeNonce(uint64(ev.val2)); ok {
			if m := e.members[ev.m]; m.gs[g].busy && m.ops[g] == op {
				l.deny(e, ev.m, g, 0) // the take got no answer in time
			}
			return
		}
		l.members[ev.m][ev.g].Receive(e.now, uint64(ev.val2), allot.Reply{}, backend.ErrUnavailable)
		l.reschedule(e, ev.m)
	}
}

// store applies a request at the store, and answers it.
func (l *leaseMode) store(e *engine, ev *event) {
	slot := int32(ev.val)
	msg := &l.msgs[slot]
	reply := msg.req.Op == allot.OpJoin || msg.req.Op == allot.OpRenew || msg.req.Op == allot.OpConfirm || msg.req.Op == allot.OpTake
	if !e.storeUp() || e.partitioned[ev.m] {
		l.free = append(l.free, slot)
		if reply {
			l.timeout(e, ev.m, int(ev.g), ev.val2, msg.req.Nonce)
		}
		return
	}
	if int(msg.limit) >= len(l.states) { // sent under limits since changed
		l.free = append(l.free, slot)
		return
	}
	e.storeOps++
	e.bucket().storeOps++
	st := l.states[msg.limit]
	if msg.bucket.ID != "" {
		// A take at the limit's bucket, not its record (the backend's applyTakes).
		res := l.applyBucket(e, msg.bucket.ID, msg.bucket.BucketOp(st.Limit, msg.req))
		msg.rep, msg.err = allot.Reply{Taken: res.Taken, Wait: res.Wait * 1000, Sent: msg.req.Sent, Nonce: msg.req.Nonce}, nil
		out := event{kind: evLeaseReply, m: ev.m, g: ev.g, op: ev.op, val: ev.val}
		if !e.fromStore(out, ev.val2+int64(e.sc.Store.Timeout)) {
			l.free = append(l.free, slot)
			l.timeout(e, ev.m, int(ev.g), ev.val2, msg.req.Nonce)
		}
		return
	}
	var check error
	msg.rep, msg.err, check = st.ApplyChecked(e.now, l.cfg, msg.req)
	if check != nil {
		l.rep.Breaches++
	}
	l.atBucket(e, st, msg)
	if !reply {
		l.free = append(l.free, slot)
		return
	}
	out := event{kind: evLeaseReply, m: ev.m, g: ev.g, op: ev.op, val: ev.val}
	if !e.fromStore(out, ev.val2+int64(e.sc.Store.Timeout)) {
		l.free = append(l.free, slot)
		l.timeout(e, ev.m, int(ev.g), ev.val2, msg.req.Nonce)
	}
}

// atBucket does at its limit's bucket what the record answered with Reply.Bucket (a take
// of a limit decided on its bucket), and holds the bucket back for a penalty, in the same
// visit to the store: the backend's member takes at the bucket directly once it knows,
// one round trip as well.
func (l *leaseMode) atBucket(e *engine, st *allot.State, msg *leaseMsg) {
	if st.BucketAt == 0 || msg.err != nil {
		return
	}
	take := msg.req.Op == allot.OpTake && msg.rep.Bucket != 0 && !msg.rep.Taken && msg.req.MaxDelay >= 0
	if !take && (msg.req.Op != allot.OpPenalize || msg.req.Hold <= 0) {
		return
	}
	req := msg.req
	if req.Op == allot.OpTake && req.MaxDelay > 0 {
		// Booked at once or not at all, as the backend's (lease/bucket.go): the member's
		// word on the bucket, which bounds a booking, comes with this answer.
		req.MaxDelay = 0
	}
	op := allot.BucketRef{Start: st.BucketAt, Fence: int64(l.cfg.TTL + l.cfg.Grace)}.BucketOp(st.Limit, req)
	res := l.applyBucket(e, allot.BucketID(lease.RecordID(simKey, st.Limit), st.BucketInc), op)
	if msg.req.Op == allot.OpTake {
		msg.rep.Taken, msg.rep.Wait = res.Taken, res.Wait*1000
	}
}

// simKey is the key the simulated store's records are named after (lease.RecordID).
const simKey = "sim"

// applyBucket applies op to the bucket id in the simulated store.
func (l *leaseMode) applyBucket(e *engine, id string, op store.BucketOp) store.BucketResult {
	if l.buckets == nil {
		l.buckets, l.bucketsSince = map[string][]byte{}, store.Fresh
	}
	since := l.bucketsSince
	if since != store.Fresh {
		since /= 1000
	}
	out, _, res, err := store.ApplyBucket(l.buckets[id], e.now/1000, since, op)
	if err != nil {
		panic(err) // the simulator's own buckets
	}
	if out != nil {
		l.buckets[id] = out
	}
	return res
}

// touch says member mi was called (or made, or let go): the next check asks it again
// what it has in use.
func (l *leaseMode) touch(mi int32) {
	if int(mi) < len(l.usedUntil) && l.usedUntil[mi] != math.MinInt64 {
		l.usedUntil[mi] = math.MinInt64
		l.usedDirty = append(l.usedDirty, mi)
	}
}

// sumInUse brings the sums of the shares the members have in use (usedSum) up to now:
// the members touched since the last check, or whose shares may have changed with time,
// are asked again (Member.InUseUntil); the others' stand.
func (l *leaseMode) sumInUse(e *engine) {
	if len(l.usedSum) != len(l.limits) || len(l.usedUntil) != len(l.members) {
		l.usedSum = make([]allot.Share, len(l.limits))
		l.used = make([][]allot.Share, len(l.members))
		l.usedUntil = make([]int64, len(l.members))
		l.usedDirty = l.usedDirty[:0]
		for mi := range l.usedUntil {
			l.usedUntil[mi] = math.MinInt64
			l.usedDirty = append(l.usedDirty, int32(mi))
		}
		l.usedNext = math.MaxInt64
	}
	for _, mi := range l.usedDirty {
		l.askInUse(e, mi)
	}
	l.usedDirty = l.usedDirty[:0]
	if e.now < l.usedNext {
		return
	}
	// A member's share may have changed by itself: ask those whose instant has come, and
	// find the next such instant.
	l.usedNext = math.MaxInt64
	for mi := range l.members {
		if e.now >= l.usedUntil[mi] {
			l.askInUse(e, int32(mi))
		}
		l.usedNext = min(l.usedNext, l.usedUntil[mi])
	}
}

// askInUse asks member mi what it has in use (every limit), into the sums.
func (l *leaseMode) askInUse(e *engine, mi int32) {
	used := l.used[mi]
	for k, in := range used {
		l.usedSum[k].Rate -= in.Rate
		l.usedSum[k].Burst -= in.Burst
	}
	until := int64(math.MaxInt64)
	used = used[:0]
	if ms := l.members[mi]; ms != nil && e.members[mi].present && l.minc[mi] == e.members[mi].inc {
		for k := range l.limits {
			in, u := ms[k].InUseUntil(e.now)
			used = append(used, in)
			l.usedSum[k].Rate += in.Rate
			l.usedSum[k].Burst += in.Burst
			until = min(until, u)
		}
	}
	l.used[mi], l.usedUntil[mi] = used, until
	l.usedNext = min(l.usedNext, until)
}

// checkMembers checks, for every limit, that the shares the members have in use sum to
// at most the limit, and follows the reclaim of crashed members' shares.
func (l *leaseMode) checkMembers(e *engine) {
	l.sumInUse(e)
	for k, lim := range l.limits {
		sum := l.usedSum[k]
		if !sum.Fits(allot.Share{Rate: allot.RateScale, Burst: lim.Burst()}) {
			l.rep.Breaches++
		}
		if k != 0 {
			continue
		}
		l.rep.MaxRatePPM = max(l.rep.MaxRatePPM, sum.Rate)
		l.rep.MaxBurst = max(l.rep.MaxBurst, sum.Burst)
		l.crashes = slices.DeleteFunc(l.crashes, func(c pendingCrash) bool {
			if sum.Rate >= c.target {
				l.rep.ReclaimS[c.idx] = round(float64(e.now-c.at) / 1e9)
				return true
			}
			return false
		})
	}
}

// inUse returns the rate the live members have in use of the first limit.
func (l *leaseMode) inUse(e *engine) int64 {
	var r int64
	for mi, ms := range l.members {
		if ms != nil && e.members[mi].present && l.minc[mi] == e.members[mi].inc {
			r += ms[0].InUse(e.now).Rate
		}
	}
	return r
}

// permitOK: a permit used later than its time plus the client's margin (its process was
// paused) is given up (a reserved permit is used within the jitter tolerance of its time
// or given up: docs/concepts.md), and the goroutine asks again.
func (l *leaseMode) permitOK(e *engine, ev *event) bool {
	if e.now <= ev.val+e.margin {
		return true
	}
	l.touch(ev.m)
	s := &e.members[ev.m].gs[ev.g]
	if s.hasTk && l.members[ev.m] != nil && l.minc[ev.m] == e.members[ev.m].inc {
		_ = allot.Adjust(l.members[ev.m], e.now, e.members[ev.m].tickets[ev.g], 0)
	}
	s.hasTk = false
	l.rep.ExpiredPermits++
	return false
}

func (l *leaseMode) penalize(e *engine, mi int32, until int64) {
	ms := l.ensure(e, mi)
	l.touch(mi)
	if k := allot.Penalize(ms, e.now, until); k >= 0 {
		l.send(e, mi, k, ms[k].PenalizeRequest(e.now, until), false)
	}
}

func (l *leaseMode) left(e *engine, mi int32, graceful bool) {
	l.touch(mi)
	if l.members == nil || l.members[mi] == nil || l.minc[mi] != e.members[mi].inc {
		return
	}
	ms := l.members[mi]
	m := e.members[mi]
	if graceful {
		// A graceful leave gives up the reservations its goroutines hold, then hands the
		// shares back (with what they saved).
		for g := range m.gs {
			if s := &m.gs[g]; s.hasTk {
				_ = allot.Adjust(ms, e.now, m.tickets[g], 0)
				s.hasTk = false
			}
		}
		for k, lm := range ms {
			if req, ok := lm.Release(e.now); ok {
				l.send(e, mi, k, req, false)
			}
		}
	} else {
		// A crash hands nothing back: its share is quarantined at the store until its
		// lease ends and the grace passes. Follow how long the others take to use it.
		l.rep.ReclaimS = append(l.rep.ReclaimS, -1)
		l.crashes = append(l.crashes, pendingCrash{at: e.now, target: l.inUse(e) - RateSlack, idx: len(l.rep.ReclaimS) - 1})
	}
	l.memberSeconds += float64(e.now-l.since[mi]) / 1e9
	l.members[mi] = nil
	l.parked[mi] = l.parked[mi][:0]
}

// RateSlack is how much less rate than before a crash counts as reclaimed: shares are
// rounded down to whole parts per million, and the water-filling leaves a few parts.
const RateSlack = allot.RateScale / 1000

// storeRestart: the store restarts empty, with a new incarnation: every member's epoch is
// stale, and each limit is fenced off until every lease granted before has ended.
func (l *leaseMode) storeRestart(e *engine) {
	l.setup(e)
	l.inc++
	l.buckets, l.bucketsSince = map[string][]byte{}, e.now // lost with everything else
	fence := l.cfg.FenceAfterRestart(e.now)
	for i, lim := range l.limits {
		l.states[i], _ = allot.NewState(lim, l.inc, e.now, fence, l.cfg)
	}
}

func (l *leaseMode) leaseReport(e *engine) *LeaseReport {
	r := l.rep
	if l.members != nil {
		seconds := l.memberSeconds
		for mi, ms := range l.members {
			if ms != nil && e.members[mi].present && l.minc[mi] == e.members[mi].inc {
				seconds += float64(e.now-l.since[mi]) / 1e9
			}
		}
		if seconds > 0 {
			r.StoreOpsPerMemberS = round(float64(e.storeOps) / seconds)
		}
	}
	if r.ReclaimS == nil {
		r.ReclaimS = []float64{}
	}
	r.ReclaimS = slices.Clone(r.ReclaimS)
	return &r
}

// joining reports whether a member is still joining some limit: its first decision on a
// key waits for its first share, whatever the client's bound (as the backend's does).
func joining(ms []*allot.Member) bool {
	for _, m := range ms {
		if m.Joining() {
			return true
		}
	}
	return false
}

// drawing reports whether a windowed quota's member is short of tokens while the window
// has some: the decision waits for its draw, whatever the client's bound (as the
// backend's does).
func drawing(ms []*allot.Member, now int64) bool {
	for _, m := range ms {
		if m.Drawing(now) {
			return true
		}
	}
	return false
}

// takeFlag marks a take's nonce: the goroutine and its operation travel in it, so that the
// answer (or its time-out) finds the goroutine that asked.
const takeFlag = 1 << 63

func takeNonce(g int32, op uint32) uint64 { return takeFlag | uint64(g)<<32 | uint64(op) }

func fromTakeNonce(n uint64) (int32, uint32, bool) {
	if n&takeFlag == 0 {
		return 0, 0, false
	}
	return int32(n>>32) & 0x7fffffff, uint32(n), true
}

// took applies the store's answer to a take: the goroutine uses its permit after the
// wait, or backs off.
func (l *leaseMode) took(e *engine, mi int32, msg leaseMsg) {
	g, op, _ := fromTakeNonce(msg.rep.Nonce)
	m := e.members[mi]
	if msg.req.Borrow {
		l.members[mi][msg.limit].TookBorrow(e.now, 1, msg.rep, msg.err)
		if !m.gs[g].busy || m.ops[g] != op {
			return // the goroutine gave up meanwhile
		}
		if msg.err == nil && msg.rep.Taken {
			l.grant(e, mi, g, e.now) // used at once, as a take is
		} else {
			l.again[mi][g] = true // the pool was short: decide again on the share
			l.acquire(e, mi, g)
		}
		l.reschedule(e, mi)
		return
	}
	if msg.bucket.ID != "" {
		l.members[mi][msg.limit].TookAtBucket(msg.req.Sent, e.now, 1, msg.rep.Taken, msg.rep.Wait, msg.err)
	} else {
		l.members[mi][msg.limit].Took(msg.req.Sent, e.now, 1, msg.rep, msg.err) // asked at Sent, as the backend says
	}
	if !m.gs[g].busy || m.ops[g] != op {
		return // the goroutine gave up meanwhile
	}
	switch {
	case msg.err == nil && msg.rep.Taken:
		l.grant(e, mi, g, e.now+msg.rep.Wait)
	case msg.err == nil && msg.rep.Wait <= e.maxWait:
		// A caller that may wait that long keeps its place in the store's line and asks
		// again when told, as the backend does.
		l.wait(mi, g)
		e.schedule(event{at: e.now + max(msg.rep.Wait, 1), kind: evRetry, m: mi, g: g, op: m.ops[g]})
	default:
		l.deny(e, mi, g, msg.rep.Wait)
	}
	l.reschedule(e, mi)
}

// limitChanger is a mode that follows a change of the limit itself.
type limitChanger interface{ limitChanged(e *engine) }

// limitChanged follows a change of the limit (a reload): every member hands its shares of
// the old limits back at once (as the backend does when a key is decided under new
// limits) and joins the records of the new ones; the old records' leases end as their
// members release them.
func (l *leaseMode) limitChanged(e *engine) {
	if l.states == nil {
		return
	}
	for mi, ms := range l.members {
		if ms == nil || l.minc[mi] != e.members[mi].inc {
			continue
		}
		for k, m := range ms {
			if req, ok := m.Release(e.now); ok {
				l.send(e, int32(mi), k, req, false)
			}
		}
		l.members[mi] = nil // made again, under the new limits, at the next decision
		for g := range l.waiting[mi] {
			l.waiting[mi][g] = false
		}
	}
	l.limits = limitconv.CoreRamped(e.limits, e.sc.Client.Margin.D())
	l.states = make([]*allot.State, len(l.limits))
	for i, lim := range l.limits {
		l.states[i], _ = allot.NewState(lim, l.inc, e.now, 0, l.cfg)
	}
	l.usedSum = nil // every member asked again, of the new limits
	l.rep.Burst = l.limits[0].Burst()
}
