package allot

// The renewal protocol: when a member must talk to the store, what it sends, and how it
// applies the answers.

import (
	"errors"
	"math"
)

// Due returns when the member must next send a request (now or earlier: at once).
func (m *Member) Due(now int64) int64 {
	if m.phase == released {
		return math.MaxInt64
	}
	if m.phase != registered {
		if m.link.failed {
			return m.link.lastSent + m.cfg.renew/4
		}
		return now // at once (not math.MinInt64: callers subtract now from it)
	}
	if m.windowed() {
		return m.quotaDue(now)
	}
	d := m.link.lastSent + m.cfg.renew - m.spread()
	if m.view.central && !m.lease.has && !m.handover.ackNow && !m.link.failed {
		if m.view.bucket != 0 {
			// Decided on its bucket: a renewal keeps its word that the limit is decided
			// there alive, and nothing else, by a confirm (a read of the record): at every
			// interval, so that every member's word, which bounds how far ahead it books at
			// the bucket, reaches about as far. Renewing two intervals before it ran out,
			// the members' horizons ran from two intervals to a TTL, and those that asked
			// when theirs was longest took the slots the others could not reach: 18 of 200
			// members always waiting on 100/s burst=20 had twice the others' permits
			// (Jain's index 0.94; 0.99 confirming at every interval).
			return d
		}
		// Decided at the store: its takes keep it alive (until takenTill), and a renewal
		// only reports its demand: it renews when its takes no longer keep it alive.
		return max(d, m.view.takenTill-m.cfg.renew)
	}
	if m.rated() && m.view.contended && (m.demand.throttled || m.demand.saturated) {
		// Held back while others want all they can get too: capacity that idle members
		// give back is picked up at renewals, so renew twice as often.
		d = m.link.lastSent + m.cfg.renew/2 - m.spread()/2
	}
	if m.link.failed {
		d = min(d, m.link.lastSent+m.cfg.renew/4)
	}
	if m.lease.has {
		d = min(d, m.lease.expire-m.cfg.renew/2) // prefetch before the lease runs out
	}
	if m.handover.ackNow {
		d = min(d, max(m.handover.ackUntil, m.link.lastSent+m.cfg.renew/20))
	}
	switch {
	case m.view.retryAt > 0:
		d = min(d, m.view.retryAt) // the store said when capacity frees
	case !m.rated() && (m.demand.asked > 0 || m.demand.throttled):
		d = min(d, m.link.lastSent+m.cfg.renew/4) // waiting for others to shrink at their renewals
	}
	if m.demand.saturated && m.rated() && m.demand.waiting == 0 {
		d = min(d, m.quietAt()+1) // gone idle after being held back: give the share back
	}
	if m.demand.borrows >= borrowsPerWindow {
		// Its share falls well short of its callers: a larger share at the next renewal,
		// soon, rather than a borrow per request.
		d = min(d, m.link.lastSent+m.cfg.renew/4)
	}
	if m.lease.has && m.growing() && (m.level(now) < prefetchLevel || m.demand.throttled) {
		// The policy means to give it more, and it needs it: it renews at a quarter of
		// the interval to pick up capacity as soon as others free it (a prefetch).
		d = min(d, m.link.lastSent+m.cfg.renew/4)
	}
	return max(d, m.link.lastSent+m.cfg.renew/20)
}

// confirms reports whether the member's renewal is a confirm (OpConfirm), a read of the
// record rather than a write: it is registered on a limit the record said is decided on
// its bucket (its word on it may have ended: a late answer; its entry, which only a write
// renews, has expired), and has nothing to tell the store: no share or older lease
// in use, none to acknowledge, no permits to give back. Its renewal would only keep its
// registration alive, and with it its word on the bucket; a crowded limit's members
// renewing that way wrote the record a thousand times a second through its relay, and
// most went unanswered (BenchmarkLeaseRedisMembers, members=1000).
//
// A member registered without an entry (a join of a record on its bucket: epoch number
// 0) always confirms: a renewal of that registration is stale whatever it still holds of
// an earlier one (permits in use, a share to acknowledge), and it renewed, was stale,
// joined again and renewed again until they were done, unregistered meanwhile.
func (m *Member) confirms(now int64) bool {
	return m.phase == registered && m.view.central && m.view.bucket != 0 && (m.epoch.N == 0 ||
		m.InUse(now).IsZero() && !m.handover.ackNow && now >= m.handover.ackUntil &&
			(m.handover.returnable == 0 || now >= m.handover.returnBy))
}

// spread returns how much earlier than its interval the member's next regular renewal
// comes: a number in [0, renew/20) drawn from the member's name and request number.
// Members started together (a deploy) would otherwise renew at the same instants for
// ever (each renewal is timed from the last), and on a shared record each renewal's write
// would collide with the others'; the spread makes their phases drift apart, renewing a
// little early (never late). It is a hash, not a random draw: the core stays
// deterministic.
func (m *Member) spread() int64 {
	x := m.phaseSeed + m.link.nonce*0x9e3779b97f4a7c15 // splitmix64
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	x ^= x >> 31
	return int64(x % uint64(max(m.cfg.renew/20, 1)))
}

// Request returns the request the member must send now, if one is due and none is in
// flight; or, when the member is at least half way through its renewal interval, if one
// is due by now + early (renewing a little early lets a process batch its renewals). The
// member counts it as in flight until Receive.
func (m *Member) Request(now, early int64) (Request, bool) {
	if m.link.inflight || m.phase == released {
		return Request{}, false
	}
	if due := m.Due(now); due > now && (due > now+early || now-m.link.lastSent < m.cfg.renew/2) {
		return Request{}, false
	}
	m.link.nonce++
	req := Request{Member: m.id, Sent: now, Nonce: m.link.nonce, Size: m.view.live, Seen: m.seenIfHolding(now)}
	if m.phase != registered {
		req.Op = OpJoin
		m.link.joinNonce = m.link.nonce
	} else if m.windowed() {
		req.Op = OpRenew
		req.Epoch = m.epoch
		m.quotaRequest(now, &req)
	} else if m.confirms(now) {
		req.Op = OpConfirm
		req.Epoch = m.epoch
		if now < m.view.bucketUntil+m.view.bucketFence {
			// Its word on the bucket may have ended (a late answer), and what it booked
			// there with it may still come: a record found rewound or lost is fenced.
			// Past a fence's length after, the record may have gone idle and been
			// deleted, which is no risk: a confirm made again would fence the limit for
			// nothing.
			req.Seen = m.link.seen
		}
	} else {
		req.Op = OpRenew
		req.Epoch = m.epoch
		req.InUse = m.inUse(now)
		if req.InUse == m.lease.seq {
			m.handover.ackNow = false
		}
		// Relinquish: a member that went quiet after being held back, while
		// others want all they can get, gives its share back in this very request, with
		// the permits it saved (nothing of it is pending).
		if m.rated() && m.view.contended && m.demand.saturated && !m.active(now) && m.pendingUntil(now) <= now {
			if now >= m.handover.returnBy {
				m.handover.returnable = 0
			}
			tok := m.tokens(now)
			m.lease.has, m.lease.share, m.handover.prevUntil = false, Share{}, 0
			if tok >= m.limit.T {
				// Keep one whole permit, parked (see Share.Parked), for the next request.
				tok -= m.limit.T
				m.lease.share = Share{Burst: 1}
				m.lease.local, _ = m.lease.share.Limit(m.limit)
				m.bucket.tat = now // a full bucket of one permit
				m.lease.has = true
				req.Keep = 1
			}
			m.handover.returnable += tok
			m.handover.returnBy = m.lease.expire
			req.Relinquish = true
		}
		if now >= m.handover.returnBy {
			m.handover.returnable = 0
		}
		if req.Relinquish || req.InUse == m.lease.seq {
			req.Return, m.handover.returnable = m.handover.returnable, 0
		}
	}
	if m.windowed() && req.Op == OpJoin {
		m.expireQuota(now)
		req.Want = m.want(now, m.demand.asked)
		m.quota.asked = req.Want > 0
	}
	req.Demand = m.measure(now)
	req.Critical = m.demand.critical0
	m.link.confirm = req.Op == OpConfirm
	m.link.inflight = true
	m.link.lastSent = now
	return req, true
}

// inUse is the oldest lease number the member may still use.
func (m *Member) inUse(now int64) uint64 {
	if now < m.handover.ackUntil {
		return m.handover.ackSeq
	}
	return m.lease.seq
}

// Receive applies the answer to the member's request number nonce (err for a failure: the
// store unreachable, or ErrStaleEpoch, after which the member joins again). Answers to any
// but the latest request are ignored.
func (m *Member) Receive(now int64, nonce uint64, rep Reply, err error) {
	if m.phase == released || nonce != m.link.nonce || !m.link.inflight {
		return
	}
	m.link.inflight = false
	if err != nil {
		m.link.lastErr = err
		if errors.Is(err, ErrStaleEpoch) {
			m.becomeUnregistered()
		} else {
			m.link.failed = true
		}
		return
	}
	m.link.failed, m.link.lastErr = false, nil
	m.link.sawRoundTrip(now - m.link.lastSent)
	m.link.seen = max(m.link.seen, rep.Version)
	if m.link.confirm {
		// Still on its bucket: its word on it goes on (State.confirm).
		if m.phase == registered && rep.Epoch == m.epoch && rep.Bucket != 0 {
			m.learnBucket(rep, rep.Sent+min(rep.Word, rep.TTL)-m.cfg.margin)
			if rep.Penalty > 0 {
				m.applyPenalty(now, now+rep.Penalty)
			}
		}
		return
	}
	newEpoch := m.phase != registered || rep.Epoch != m.epoch
	if newEpoch {
		if nonce != m.link.joinNonce {
			return // an answer for a registration this member no longer has
		}
		m.becomeRegistered(rep.Epoch)
	}
	if m.windowed() {
		m.receiveQuota(rep, newEpoch)
		if rep.Penalty > 0 {
			m.applyPenalty(now, now+rep.Penalty)
		}
		m.view.live = rep.Live
		m.view.settled = true
		return
	}
	expire := rep.Sent + rep.TTL - m.cfg.margin
	m.learnBucket(rep, expire)
	switch {
	case !newEpoch && rep.Lease.Seq < m.lease.seq:
		return
	case !newEpoch && rep.Lease.Seq == m.lease.seq && rep.Lease.Share == m.lease.share:
		if expire > m.lease.expire {
			m.lease.expire = expire
			m.lease.end = expire
			if m.cfg.failLocal {
				m.lease.end += rep.Grace
			}
		}
	default:
		m.change(now, rep, newEpoch, expire)
	}
	if rep.Penalty > 0 {
		m.applyPenalty(now, now+rep.Penalty)
	}
	m.view.target, m.view.live, m.view.contended, m.view.central = rep.Target, rep.Live, rep.Contended, rep.Central
	m.learnPool(now, rep)
	m.view.retryAt = 0
	if rep.RetryIn > 0 {
		m.view.retryAt = now + rep.RetryIn
	}
	m.view.settled = m.view.settled || m.lease.has || rep.RetryIn == 0 || rep.RetryIn > m.cfg.renew
}

// Joining reports whether the member is still joining: it has no share yet, but the
// store has said (or will say, in its first answer) that one comes soon (a fresh limit's
// join window). A caller's first decision on a key waits for it.
func (m *Member) Joining() bool { return !m.view.settled && !m.link.failed }

// Idle reports whether the member has had no call for `after` and nothing pending: it may
// release its share and be forgotten.
func (m *Member) Idle(now, after int64) bool {
	return !m.link.inflight && now-m.demand.lastCall >= after && m.pendingUntil(now) <= now
}

// Release returns the request that hands the member's share back, and ends the member: it
// decides nothing more. ok is false if it never joined (nothing to hand back).
func (m *Member) Release(now int64) (Request, bool) {
	if m.phase == released {
		return Request{}, false
	}
	wasRegistered := m.phase == registered
	m.becomeReleased()
	defer func() { m.lease.has = false }()
	if !wasRegistered {
		return Request{}, false
	}
	m.link.nonce++
	req := Request{Op: OpRelease, Member: m.id, Epoch: m.epoch, InUse: m.inUse(now), Seen: m.seenIfHolding(now),
		BusyFor: max(0, m.pendingUntil(now)-now), Sent: now, Nonce: m.link.nonce}
	if m.windowed() {
		m.expireQuota(now)
		req.Unused, req.UnusedOf, req.Got = m.quota.left, m.quota.of, max(m.quota.got-m.quota.left, 0)
		return req, true
	}
	if req.BusyFor == 0 {
		if now < m.handover.returnBy {
			req.Return = m.handover.returnable
		}
		req.Return += m.tokens(now)
	}
	return req, true
}

// PenalizeRequest returns the request that reports a penalty until `until` to the store,
// so that the whole pool holds back.
func (m *Member) PenalizeRequest(now, until int64) Request {
	return Request{Op: OpPenalize, Member: m.id, Hold: until - now, Sent: now, Seen: m.seenIfHolding(now)}
}

// seenIfHolding is the newest version of the record the member has seen while it may still
// use a share leased from it (or permits reserved under one), and 0 once all of that has
// ended: a record that vanished since is then no risk to anyone the member knows of.
func (m *Member) seenIfHolding(now int64) uint64 {
	if m.windowed() {
		// Tokens drawn from the record count until their window ends, used or not: a
		// record lost meanwhile must count its window spent.
		if m.quota.of != 0 && now < m.quota.end {
			return m.link.seen
		}
		return 0
	}
	if m.InUse(now).IsZero() && (m.view.bucket == 0 || now >= m.view.bucketUntil) {
		// (A member that takes at its limit's bucket holds what it booked there: a record
		// found rewound then moves to a new bucket, State.Rewound.)
		return 0
	}
	return m.link.seen
}
