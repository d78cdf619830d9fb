package allot

// A member's side of a windowed quota (its limit's Window > 0): the tokens it drew from
// the window's count, its decisions on them, and what it asks the store for.

import (
	"math"

	"github.com/sluicehq/sluice/gcra"
)

// quotaHeld is what a member holds of a windowed quota's current window.
type quotaHeld struct {
	left      int64 // tokens held, usable while now < end
	chunk     int64 // the last chunk drawn: with a fifth of it left, the member draws more (a prefetch)
	end       int64 // own clock: the window's end as the store said, less the margin; 0 before any answer
	of        int64 // the store's clock: the end of the window the tokens are of (Reply.WindowEnd)
	remaining int64 // what the window had left after the last draw (0: spent, until the window ends)
	debt      int64 // tokens used beyond those held (a settlement up), paid from the next drawn
	got       int64 // tokens of the window received under the registration and not given back (Request.Got)
	short     bool  // a call found too few tokens (a weighted one) since the last draw
	asked     bool  // the request in flight asks for tokens
	dry       bool  // the last answer to a request for tokens gave none (a fence, a penalty, the window spent)
}

// windowed reports whether the member's limit is a windowed quota.
func (m *Member) windowed() bool { return m.limit.Window > 0 }

// expireQuota voids the tokens of a window that has ended (own clock).
func (m *Member) expireQuota(now int64) {
	if q := &m.quota; q.of != 0 && now >= q.end {
		q.left, q.debt, q.got, q.remaining = 0, 0, 0, -1 // the next window: unknown until the store says
	}
}

// spent reports whether the window is known to be spent: the store had nothing left at
// the last draw, and the window has not ended.
func (m *Member) spent(now int64) bool {
	return m.phase == registered && m.quota.of != 0 && now < m.quota.end && m.quota.remaining == 0
}

// needsQuota reports whether the member should draw tokens now: its callers want
// tokens, it holds a fifth of its last chunk or less, and the window has some left.
func (m *Member) needsQuota(now int64) bool {
	wants := m.demand.asked > 0 || m.demand.waiting > 0 || m.demand.throttled || m.active(now)
	return wants && (m.quota.left*5 <= m.quota.chunk || m.quota.short) && !m.spent(now)
}

// want returns how many tokens the member asks for: what its callers ask for over two
// renewal intervals (at least one token, and at least what they asked in the window now
// closing, asked), with the same headroom as a rate's demand; nothing while it holds
// more than a fifth of its last chunk, or once its callers went quiet.
func (m *Member) want(now, asked int64) int64 {
	if m.quota.chunk > 0 && m.quota.left*5 > m.quota.chunk && !m.quota.short {
		return 0 // enough held: it draws again at a fifth of its chunk (a prefetch)
	}
	if asked == 0 && m.demand.waiting == 0 && !m.active(now) {
		return 0
	}
	w := int64(math.Ceil(m.demand.rate * float64(2*m.cfg.renew) * headroom))
	return max(w, asked, 1)
}

// quotaDue is Due for a windowed quota's registered member: its heartbeat, sooner to draw
// tokens when it runs low (a prefetch), to give back tokens it no longer needs, or once
// the window has ended.
func (m *Member) quotaDue(now int64) int64 {
	d := m.link.lastSent + m.cfg.renew - m.spread()
	if m.link.failed {
		d = min(d, m.link.lastSent+m.cfg.renew/4)
	}
	if m.quota.of != 0 {
		d = min(d, max(m.quota.end, m.link.lastSent+m.cfg.renew/4)) // a new window
	}
	if m.needsQuota(now) {
		switch {
		case m.Drawing(now):
			return m.link.lastSent // a caller waits for tokens: at once, without the minimum gap
		case m.quota.dry:
			d = min(d, m.link.lastSent+m.cfg.renew/4) // the store had none to give: not at every call
		default:
			d = min(d, m.link.lastSent) // a prefetch: at once (within the minimum gap)
		}
	}
	if m.quota.left > 0 && m.demand.waiting == 0 {
		d = min(d, m.quietAt()+1) // gone quiet: give the tokens back
	}
	return max(d, m.link.lastSent+m.cfg.renew/20)
}

// quotaRequest fills in a windowed quota's part of a renewal: the tokens given back if the
// member's callers went quiet (relinquish), and the tokens it asks for.
func (m *Member) quotaRequest(now int64, req *Request) {
	m.expireQuota(now)
	asked := m.demand.asked
	req.UnusedOf = m.quota.of
	if m.quota.left > 0 && !m.active(now) {
		req.Unused = m.quota.left
		m.quota.got -= m.quota.left
		m.quota.left = 0
	}
	req.Got = max(m.quota.got, 0)
	req.Want = m.want(now, asked)
	m.quota.asked = req.Want > 0
}

// receiveQuota applies a windowed quota's answer: the tokens handed over, for the window
// that ends WindowLeft after the store read its clock, which is no earlier than when the
// request was sent: the member uses them until Sent + WindowLeft - its margin.
func (m *Member) receiveQuota(rep Reply, newEpoch bool) {
	q := &m.quota
	end := rep.Sent + rep.WindowLeft - m.cfg.margin
	if rep.WindowEnd != q.of || newEpoch {
		// A new window; or a new registration, which the store counts from nothing: the
		// tokens of the one before are given up (still counted as handed out: safe).
		q.left, q.debt, q.got, q.end, q.of = 0, 0, 0, end, rep.WindowEnd
	}
	q.got += rep.Quota
	q.dry = q.asked && rep.Quota == 0
	if rep.Quota > 0 || q.dry {
		q.short = false
	}
	q.end = max(q.end, end) // each answer's is no later than the window's real end
	got := rep.Quota
	pay := min(got, q.debt)
	q.debt -= pay
	q.left += got - pay
	if rep.Quota > 0 {
		q.chunk = rep.Quota
	}
	q.remaining = rep.Remaining
}

// decideQuota is Decide for windowed quotas (all of ms's limits): n tokens from each
// member's, now or not at all. A member short of tokens waits for its next draw
// (NoLease) unless the window is spent: then the caller is told to come back when it
// ends (Throttled). Tokens are never reserved ahead.
func decideQuota(ms []*Member, now, n int64, count bool) (gcra.Result, gcra.Ticket, Outcome, error) {
	for _, m := range ms {
		if !m.windowed() {
			return gcra.Result{}, gcra.Ticket{}, Throttled, gcra.ErrInvalidLimits // the lease mode decides windows apart from rates
		}
		if n > m.limit.Burst() {
			return gcra.Result{}, gcra.Ticket{}, Throttled, gcra.ErrCostExceedsBurst
		}
		m.expireQuota(now)
		if n > 0 {
			if count {
				m.demand.asked += n
			}
			m.demand.lastCall = now
		}
	}
	rem, reset := int64(math.MaxInt64), int64(0)
	var hold int64
	short, spent := false, false
	for _, m := range ms {
		rem = min(rem, m.quota.left)
		if m.quota.of != 0 {
			reset = max(reset, m.quota.end-now)
		}
		hold = max(hold, m.bucket.hold)
		if m.quota.left < n {
			short = true
			spent = spent || m.spent(now)
		}
	}
	if n == 0 {
		return gcra.Result{Allowed: true, Remaining: rem, ResetAfter: reset}, gcra.Ticket{}, Granted, nil
	}
	switch {
	case hold > now:
		for _, m := range ms {
			m.demand.throttled = true
		}
		return gcra.Result{RetryAfter: hold - now, ResetAfter: reset}, gcra.Ticket{}, Throttled, nil
	case spent:
		for _, m := range ms {
			m.demand.throttled = true
			m.demand.lastRetry = 0 // it has nothing to wait for before the window ends
		}
		return gcra.Result{RetryAfter: max(reset, 1), ResetAfter: reset}, gcra.Ticket{}, Throttled, nil
	case short:
		hint := ms[0].waitHint(now)
		for _, m := range ms {
			m.quota.short = m.quota.short || m.quota.left < n
			m.demand.throttled = true
			m.demand.lastRetry = max(hint, m.cfg.renew)
		}
		return gcra.Result{RetryAfter: hint, ResetAfter: reset}, gcra.Ticket{}, NoLease, nil
	}
	tk := gcra.Ticket{N: n, At: now}
	rem = math.MaxInt64
	for i, m := range ms {
		m.quota.left -= n
		rem = min(rem, m.quota.left)
		tk.TatAfter[i] = m.quota.of // the window the tokens are of: a refund only within it
		m.pending.lastAt = max(m.pending.lastAt, now)
		m.pending.busyAt = max(m.pending.busyAt, now)
		m.demand.used += n
	}
	return gcra.Result{Allowed: true, Remaining: rem, ResetAfter: reset}, tk, Granted, nil
}

// adjustQuota settles a grant of a windowed quota's tokens to newN: tokens not used go
// back to what the member holds while their window lasts; more used are taken from what
// it holds, and beyond it from the next tokens it draws in the window.
func (m *Member) adjustQuota(now int64, of, n, newN int64) {
	m.expireQuota(now)
	if of != m.quota.of || now >= m.quota.end {
		return // its window has ended: nothing of it is left to settle
	}
	if newN < n {
		m.quota.left += n - newN
		return
	}
	more := newN - n
	take := min(more, m.quota.left)
	m.quota.left -= take
	m.quota.debt += more - take
}

// Drawing reports whether the member of a windowed quota is short of tokens for a call
// while the window still has some (and the store answers): a caller waits for its next
// draw, one store round trip, rather than be denied tokens the window has.
func (m *Member) Drawing(now int64) bool {
	return m.windowed() && m.phase == registered && m.quota.short && !m.quota.dry && !m.spent(now) && !m.link.failed
}
