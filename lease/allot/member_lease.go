package allot

// The lease a member holds: its use, the permits pending on it, and the move to the next.

import (
	"math"

	"github.com/sluicehq/sluice/gcra"
)

// maxPending is how many permits granted for later a member lists exactly; beyond, it
// falls back to the latest one's time.
const maxPending = 8

type pendingPermit struct{ at, n int64 }

// pendingUntil returns the time of the last permit granted for later and still to be
// used, or now if there is none.
func (m *Member) pendingUntil(now int64) int64 {
	k := 0
	for k < len(m.pending.list) && m.pending.list[k].at <= now {
		k++
	}
	if k > 0 {
		m.pending.list = append(m.pending.list[:0], m.pending.list[k:]...)
	}
	if !m.pending.exact {
		if m.pending.lastAt > now {
			return m.pending.lastAt
		}
		m.pending.exact, m.pending.list = true, m.pending.list[:0] // everything granted is due: exact again
	}
	if len(m.pending.list) == 0 {
		return now
	}
	return max(now, m.pending.list[len(m.pending.list)-1].at)
}

// addPending records n permits granted for use at `at`, later than now.
func (m *Member) addPending(at, n int64) {
	if m.pending.exact && len(m.pending.list) < maxPending {
		m.pending.list = append(m.pending.list, pendingPermit{at, n})
		return
	}
	m.pending.exact = false
}

// settlePending records that the n permits granted for `at` were settled to newN.
func (m *Member) settlePending(at, n, newN int64) {
	for k := len(m.pending.list) - 1; k >= 0; k-- {
		if m.pending.list[k] == (pendingPermit{at, n}) {
			switch {
			case newN == 0:
				m.pending.list = append(m.pending.list[:k], m.pending.list[k+1:]...)
			case newN < n:
				m.pending.list[k].n = newN
			}
			return
		}
	}
}

// growing reports whether the policy means to give the member a larger rate than it holds
// (it gets it from what others free, at its next renewals).
func (m *Member) growing() bool {
	return m.view.target.Rate > m.lease.share.Rate+max(RateScale/1000, m.lease.share.Rate/20)
}

// rated reports whether the member holds a share with a rate (not nothing, not parked).
func (m *Member) rated() bool { return m.lease.has && m.lease.share.Rate > 0 }

// usable reports whether the member may use its share at now.
func (m *Member) usable(now int64) bool { return m.lease.has && now < m.lease.end }

// Usable returns the member's share as a limit, if it may use one at now.
func (m *Member) Usable(now int64) (gcra.Limit, bool) { return m.lease.local, m.usable(now) }

// InUse returns what the member may be using at now: its share while it may use it or
// permits reserved under it are pending, and the share of an older lease while permits
// reserved under that are pending. The members' InUse sum to at most the limit at every
// instant (the store's invariant seen from the members' side).
func (m *Member) InUse(now int64) Share {
	var c Share
	if m.lease.has && (now < m.lease.end || now < m.pendingUntil(now)) {
		c = m.lease.share
	}
	if now < m.handover.prevUntil {
		c = maxShare(c, m.handover.prevShare)
	}
	return c
}

// InUseUntil returns InUse(now) and the instant until which InUse returns the same share,
// as long as nothing else is called on the member: a caller that sums every member's
// InUse after each change asks again only the members it called since, or whose instant
// has come. It is now while InUse reads the permits pending beyond the lease's end (it
// may then change at any instant).
func (m *Member) InUseUntil(now int64) (Share, int64) {
	c := m.InUse(now)
	until := int64(math.MaxInt64)
	if m.lease.has {
		until = now
		if now < m.lease.end {
			until = m.lease.end
		}
	}
	if now < m.handover.prevUntil {
		until = min(until, m.handover.prevUntil)
	}
	return c, until
}

// tokens returns the permits the member could take now, in nanoseconds of the limit
// (permits × the limit's T), for handing them back.
func (m *Member) tokens(now int64) int64 {
	if !m.usable(now) {
		return 0
	}
	v, _ := mulDiv(max(0, gcra.Level(m.bucket.tat, m.lease.local, now)), m.limit.T, m.lease.local.T)
	return v
}

// level returns the permits (as a fraction of the share's burst) the member could take now.
func (m *Member) level(now int64) float64 {
	if !m.lease.has {
		return 0
	}
	return float64(gcra.Level(m.bucket.tat, m.lease.local, now)) / float64(m.lease.local.Tau)
}

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
		oldLevel = gcra.Level(m.bucket.tat, m.lease.local, now)
	}
	var fill int64
	if ok && rep.Fill > 0 {
		fill, _ = mulDiv(rep.Fill, nl.T, m.limit.T)
	}
	rebooked := false
	var kept int64 // what the new bucket keeps of the old one's level, in its nanoseconds
	if ok {
		if oldUsable {
			kept = min(convertLevel(oldLevel, m.lease.local.T, nl.T), nl.Tau)
		}
		tat := gcra.AtLevel(nl, now, kept+fill)
		if pending && m.pending.exact && oldUsable && !newEpoch {
			// Book the pending permits again on the new share, at their times.
			excl := oldLevel
			for _, p := range m.pending.list {
				excl += p.n * m.lease.local.T
			}
			excl = min(excl, m.lease.local.Tau)
			t2 := gcra.AtLevel(nl, now, min(convertLevel(excl, m.lease.local.T, nl.T), nl.Tau)+fill)
			rebooked = true
			for _, p := range m.pending.list {
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
		m.bucket.tat = tat
		if m.bucket.drain && m.bucket.hold > now {
			tats := [1]int64{m.bucket.tat}
			gcra.Penalize(tats[:], []gcra.Limit{nl}, now, m.bucket.hold)
			m.bucket.tat = tats[0]
		}
	}
	switch {
	case m.lease.has && pending && !rebooked:
		if now < m.handover.prevUntil {
			m.handover.prevShare = maxShare(m.handover.prevShare, m.lease.share)
		} else {
			m.handover.prevShare = m.lease.share
		}
		m.handover.prevUntil = max(m.handover.prevUntil, pu)
		if !newEpoch {
			if now >= m.handover.ackUntil {
				m.handover.ackSeq = m.lease.seq
			}
			m.handover.ackUntil = max(m.handover.ackUntil, pu)
		}
		m.pending.exact = false // the pending permits stay booked in the old share's units
	case !newEpoch && oldUsable && oldLevel > 0 && !pending:
		// Hand back what the new bucket does not keep (a smaller burst, or no share).
		old, _ := mulDiv(oldLevel, m.limit.T, m.lease.local.T)
		var keep int64
		if ok && kept > 0 {
			keep, _ = mulDivUp(kept, m.limit.T, nl.T)
		}
		if now >= m.handover.returnBy {
			m.handover.returnable = 0
		}
		m.handover.returnable += max(0, old-keep)
		m.handover.returnBy = m.lease.expire
	}
	if newEpoch {
		m.handover.ackUntil = 0
	}
	if !newEpoch && !m.lease.share.Fits(rep.Lease.Share) {
		m.handover.ackNow = true // the store holds the difference until it hears the member switched
	}
	if m.lease.had {
		m.handover.noRefundBefore = max(now, m.pending.lastAt) // tickets of the old share are in its units
	}
	m.lease.had = m.lease.had || ok
	m.lease.seq = rep.Lease.Seq
	m.lease.share = rep.Lease.Share
	m.lease.local, m.lease.has = nl, ok
	m.lease.expire = expire
	m.lease.end = expire
	if m.cfg.failLocal {
		m.lease.end += rep.Grace
	}
}
