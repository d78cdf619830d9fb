package strict

// The script's one codec: for each operation of sluice.lua (see its header for the
// arguments and replies), the Go side that encodes a call and the one that decodes its
// result. Nothing else writes the script's arguments or reads its replies.

import (
	_ "embed"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
)

//go:embed sluice.lua
var scriptSource string

func newCall(key string, op byte) *call {
	c := callPool.Get().(*call)
	c.key, c.op, c.nf = key, op, 0
	c.queued = clock.Default.Nanotime()
	c.state.Store(callQueued)
	return c
}

// field appends x to c's fields.
func (c *call) field(x int64) { c.f[c.nf] = x; c.nf++ }

// pair appends x as the script reads times: whole seconds and nanoseconds, the latter in
// [0, 1e9) (see sluice.lua on why).
func (c *call) pair(x int64) {
	s, ns := x/1e9, x%1e9
	if ns < 0 {
		s, ns = s-1, ns+1e9
	}
	c.f[c.nf], c.f[c.nf+1] = s, ns
	c.nf += 2
}

// pairAt reads the pair at arr[i], arr[i+1] of a reply.
func pairAt(arr []any, i int) (int64, bool) {
	s, ok1 := arr[i].(int64)
	ns, ok2 := arr[i+1].(int64)
	if !ok1 || !ok2 || ns < 0 || ns >= 1e9 {
		return 0, false
	}
	return s*1e9 + ns, true
}

// newCall returns a call of op on key, at Redis' time or, in tests, at the virtual time.
func (b *Backend) newCall(key string, op byte) *call {
	c := newCall(key, op)
	c.virtual, c.vnow = b.now != nil, 0
	if c.virtual {
		c.vnow = b.now()
	}
	return c
}

// decideCall is a decision of req (checked): 'd', or 'r' if a limit carries a ramp
// (gcra.Limit.Rise), each limit's ramp after its Tau and n*T (Over 0: none).
func (b *Backend) decideCall(key string, req backend.Request) *call {
	op := byte('d')
	for _, l := range req.Limits {
		if l.Rise != nil {
			op = 'r'
		}
	}
	c := b.newCall(key, op)
	c.field(req.N)
	c.pair(int64(max(req.MaxDelay, 0)))
	c.field(int64(len(req.Limits)))
	for _, l := range req.Limits {
		c.pair(l.Tau)
		c.pair(req.N * l.T)
		if op == 'r' {
			var r gcra.Rise
			if l.Rise != nil {
				r = *l.Rise
			}
			for _, x := range [...]int64{r.Elapsed, r.Over, r.Rate0, r.Period0, r.Rate, r.Period, r.Burst, r.Interval, r.Margin} {
				c.field(x)
			}
		}
	}
	return c
}

// decodeDecision reads the script's result {allowed, delay, TAT...} (times as pairs) at
// Redis' now into a grant. The result carries the decision and the key's TATs after it;
// Remaining and ResetAfter are derived from them by the Go core itself (a query, n = 0),
// exactly as gcra.Decide derives them.
func decodeDecision(arr []any, now int64, limits []gcra.Limit, n int64) (backend.Grant, bool) {
	if len(arr) != 3+2*len(limits) {
		return backend.Grant{}, false
	}
	allowed, ok1 := arr[0].(int64)
	delay, ok2 := pairAt(arr, 1)
	if !ok1 || !ok2 || (allowed != 0 && allowed != 1) {
		return backend.Grant{}, false
	}
	var tats [gcra.MaxLimits]int64
	for i := range limits {
		t, ok := pairAt(arr, 3+2*i)
		if !ok {
			return backend.Grant{}, false
		}
		tats[i] = t
	}
	q, _, err := gcra.Decide(tats[:len(limits)], limits, now, 0, 0)
	if err != nil {
		return backend.Grant{}, false
	}
	g := backend.Grant{Result: gcra.Result{Allowed: allowed == 1, Remaining: q.Remaining, ResetAfter: q.ResetAfter}}
	if !g.Allowed {
		g.RetryAfter = delay
		return g, true
	}
	g.Delay = delay
	g.Ticket = gcra.Ticket{N: n, At: now + delay, TatAfter: tats}
	return g, true
}

// done reads the result {1} of settle and penalize.
func done(arr []any) bool {
	if len(arr) != 1 {
		return false
	}
	v, ok := arr[0].(int64)
	return ok && v == 1
}

// allowCall is one permit now or never under l (checked).
func (b *Backend) allowCall(key string, l gcra.Limit) *call {
	c := b.newCall(key, 'a')
	c.pair(l.Tau)
	c.pair(l.T)
	return c
}

// decodeAllow reads the result {1} or {0} of an allowance.
func decodeAllow(arr []any) (allowed, ok bool) {
	if len(arr) != 1 {
		return false, false
	}
	v, ok := arr[0].(int64)
	return v == 1, ok && (v == 0 || v == 1)
}

// penaltyLimit is the limit a penalty drains (gcra.PenaltyLimit), as a 1-based index for
// the script, and its Tau - T.
func penaltyLimit(limits []gcra.Limit) (int, int64) {
	k := gcra.PenaltyLimit(limits)
	return k + 1, limits[k].Tau - limits[k].T
}

// adjustCall is the settlement of grant t to newN permits (see gcra.Adjust).
func (b *Backend) adjustCall(key string, limits []gcra.Limit, t gcra.Ticket, newN int64) *call {
	sign, d := 0, int64(0)
	switch {
	case newN > t.N:
		sign, d = 1, newN-t.N
	case newN < t.N:
		sign, d = -1, t.N-newN
	}
	var deltas [gcra.MaxLimits]int64
	for i, l := range limits {
		deltas[i] = gcra.MulSat(d, l.T) // the script saturates the TAT at gcra.MaxTAT
		if sign < 0 {
			deltas[i] = gcra.MulSat(d, l.MinT()) // never more than the grant took (a ramp's)
		}
		if sign < 0 && t.TatAfter[i] >= gcra.MaxTAT {
			deltas[i] = 0 // a saturated charge's size is lost: nothing to give back (gcra.Adjust)
		}
	}
	return b.settleCall(key, sign, limits, deltas[:len(limits)], &t)
}

// settleCall is a settlement: sign 1 charges deltas, -1 refunds them (against the
// ticket's TATs), 0 only re-applies a penalty in force.
func (b *Backend) settleCall(key string, sign int, limits []gcra.Limit, deltas []int64, t *gcra.Ticket) *call {
	p, off := penaltyLimit(limits)
	c := b.newCall(key, 's')
	c.field(int64(sign))
	c.field(int64(len(limits)))
	c.field(int64(p))
	c.pair(off)
	for i := range limits {
		c.pair(deltas[i])
		var after int64
		if t != nil {
			after = t.TatAfter[i]
		}
		c.pair(after)
	}
	return c
}

// penalizeCall is a penalty of d nanoseconds.
func (b *Backend) penalizeCall(key string, limits []gcra.Limit, d int64) *call {
	p, off := penaltyLimit(limits)
	c := b.newCall(key, 'p')
	c.pair(d)
	c.field(int64(len(limits)))
	c.field(int64(p))
	c.pair(off)
	return c
}

func opName(op byte) string {
	switch op {
	case 'd', 'r':
		return "decide"
	case 'a':
		return "allow"
	case 's':
		return "settle"
	case 'p':
		return "penalize"
	}
	return "call"
}
