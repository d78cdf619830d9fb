package allot

// Measuring what a member's callers want, to report it to the store.

import (
	"math"
)

// active reports whether the member's callers are still at it: one waiting for a share,
// a permit pending, or a call recent enough (allowing thrice the wait a denial asked for:
// callers back off with jitter).
func (m *Member) active(now int64) bool { return m.demand.waiting > 0 || now <= m.quietAt() }

// Wait tells the member that a caller starts (+1) or stops (-1) waiting for a share (after
// NoLease or LeaseEnds): while one waits, the member wants as much as it can get.
func (m *Member) Wait(delta int) { m.demand.waiting = max(0, m.demand.waiting+delta) }

// quietAt is the instant after which the member counts as idle.
func (m *Member) quietAt() int64 {
	return max(m.pending.busyAt, m.demand.lastCall+3*m.demand.lastRetry) + m.cfg.idleGap + 2*m.demand.think
}

// learnThink learns, from a call at now, how long its callers take between a permit
// falling due and their next call (the API's service time, scheduling): a caller is
// judged idle only well after that.
func (m *Member) learnThink(now int64) {
	if gap := now - m.pending.busyAt; m.pending.busyAt >= m.demand.lastCall && gap >= 0 && gap < 2*m.cfg.renew {
		m.demand.think += (gap - m.demand.think) / 4
	}
}

// measure closes the demand window at now and returns the demand to report, in parts of
// RateScale: as much as it can get when it joins, has no rate, or is saturated (held back
// by its share while asking for most of it) and still at it; nothing once it went quiet
// after being saturated (an on/off caller whose spell ended); otherwise its smoothed
// asked rate.
func (m *Member) measure(now int64) int64 {
	dt := now - m.demand.winStart
	quiet := !m.active(now)
	if m.phase == registered && dt < m.cfg.renew/2 && m.demand.borrows < borrowsPerWindow && !(m.demand.saturated && quiet) && !(!m.rated() && m.demand.asked > 0) {
		// A request soon after the last (an acknowledgement, a prefetch): too short a
		// window to measure; the demand stands and the window goes on.
		return m.demand.reported
	}
	if dt > 0 && m.phase == registered {
		rc := float64(m.demand.critical) / float64(dt)
		m.demand.critRate += float64(dt) / float64(dt+4*m.cfg.renew) * (rc - m.demand.critRate)
		if m.demand.critical > 0 && m.demand.critRate < rc/4 {
			m.demand.critRate = rc // critical callers that just came: at once, not over four renewals
		}
		r := float64(m.demand.asked) / float64(dt)
		switch {
		case !m.demand.measured:
			m.demand.rate, m.demand.measured = r, true
		case m.demand.borrows >= borrowsPerWindow && r > m.demand.rate:
			// Its share fell well short of its callers in this window (it borrowed for
			// many of them): its demand grew, and the rate of this window is it.
			m.demand.rate = r
		default:
			w := float64(dt) / float64(dt+4*m.cfg.renew) // smoothing over about four renewals
			m.demand.rate += w * (r - m.demand.rate)
		}
	}
	// The rate its callers asked for, refused requests included, without headroom: the
	// store gives headroom from what the demands leave free. Headroom asked by every
	// member would add up past the limit while the demands fit in it, and the water-filling
	// would then cut the largest members below what they ask.
	measured := int64(math.Min(float64(RateScale), m.demand.rate*float64(m.limit.T)*float64(RateScale)))
	// Saturated: held back in two asking windows running, and asking (on average) at least most
	// of what its share gives (a caller that waits asks no faster than it is served). A
	// member held back now and then by a burst of requests under its share is not: it
	// reports its rate.
	if m.demand.waiting > 0 {
		m.demand.waitRuns++
	} else {
		m.demand.waitRuns = 0
	}
	if m.view.contended && m.view.free.Rate == 0 && (m.demand.held || m.demand.asked == 0) {
		m.demand.fullRuns++
	} else {
		m.demand.fullRuns = 0
	}
	switch {
	case m.demand.held:
		m.demand.heldRuns++
	case m.demand.asked > 0:
		m.demand.heldRuns = 0 // asked, and was never held back
	}
	bursty := m.demand.fullAt > 0 && now-m.demand.fullAt < unusedWindows*m.cfg.renew
	sat := m.demand.held && (!m.rated() || m.demand.heldRuns >= 2 && m.demand.rate*float64(m.lease.local.T) >= saturation && !bursty)
	if m.cutForReserve() {
		// Held back by a share the store cut below the rate it reported, to keep a reserve
		// free (the rest is borrowed): the store knows its demand, and the reserve serves
		// the rest. Counted saturated, it would probe half as much again and then, with its
		// callers waiting for the borrows, ask for as much as it can get, which takes the
		// reserve (and the pool the borrows draw on) away from every member.
		sat = false
		m.demand.saturated = false
	}
	var d int64
	switch {
	case m.phase != registered, !m.rated() && m.demand.asked > 0:
		// A member joins because it was asked for permits, and one without a rate is
		// asked for them: as much as it can get (the policy gives it at most an equal part
		// of what the others leave).
		d = RateScale
	case (sat || m.demand.saturated) && !quiet &&
		(m.demand.waited || m.demand.waitRuns >= waitedWindows || m.demand.fullRuns >= fullWindows):
		// Saturated, with callers waiting for its share to grow, or waiting at every
		// renewal for a while (workers that always have a permit to wait for), or held back
		// at two renewals running while the limit is all handed out and others want more
		// too (a limit too small for everyone: an equal split is what it gets, and a
		// demand that moved at each renewal would move the shares with it): as much as it
		// can get (the policy gives it at most an equal part of what the others leave).
		d = RateScale
	case (sat || m.demand.saturated) && !quiet:
		// Held back by its share, but its callers are counted as they come: it asks for
		// half as much again as it measured (a multiplicative probe, as Doorman's clients
		// do), renewal after renewal while it is held back; held back at heldWindows
		// renewals in a row, half as much again as its share if that is more (callers
		// that wait for each permit before asking for the next are counted at the rate
		// they are served, which lags the share that serves them). A member held back now
		// and then by a burst of Poisson demand asks for its rate with that headroom, not
		// for an equal part of what members whose demand is known need.
		base := measured
		if m.demand.heldRuns >= heldWindows {
			base = max(base, m.lease.share.Rate)
		}
		d = min(RateScale, max(base, 1)*probeNum/probeDen)
	case m.demand.saturated || sat:
		m.demand.rate = 0 // quiet after being saturated: an on/off caller whose spell ended
	default:
		d = measured
		if d == 0 && m.demand.asked > 0 {
			d = 1
		}
	}
	// Still saturated while active and held back whenever it asks (one that asked with no
	// rate at all is, by definition).
	m.demand.saturated = (sat || m.demand.saturated) && !quiet && (m.demand.held || m.demand.asked == 0)
	m.demand.reported = d
	crit := int64(math.Min(float64(RateScale), m.demand.critRate*float64(m.limit.T)*float64(RateScale)))
	if crit == 0 && m.demand.critical > 0 {
		crit = 1
	}
	m.demand.critical0 = min(crit, d)
	m.demand.critical = 0
	m.demand.lastUsed, m.demand.lastWin = m.demand.used, dt
	m.demand.winStart, m.demand.asked, m.demand.used, m.demand.throttled, m.demand.held, m.demand.waited = now, 0, 0, false, false, false
	m.demand.borrows = 0
	return d
}

// AskedCritical counts n of the permits just asked (Decide counts them in the demand) as
// asked by callers of the critical class: the member reports that part of its demand
// (Request.Critical), which the store's fair policy gives first.
func (m *Member) AskedCritical(n int64) {
	if n > 0 {
		m.demand.critical += n
	}
}

// cutForReserve reports whether the member's share is below the measured rate it last
// reported because the store keeps a reserve free (the last answer had a free rate): its
// demand is known, and what the share does not grant is borrowed.
func (m *Member) cutForReserve() bool {
	return m.view.free.Rate > 0 && m.rated() && m.lease.share.Rate < m.demand.reported && m.demand.reported < RateScale
}
