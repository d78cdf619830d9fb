package strict

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
)

// The breaker. A call that cannot reach Redis (connection error, no answer within the
// time-out) opens it: from then on calls are answered at once (backend.ErrUnavailable, or
// the local fallback) instead of each waiting for the time-out, and one prober goroutine
// checks Redis every probeEvery. When Redis answers, the prober charges the ledger to it
// and closes the breaker. There are no retries: one probe at a time, whatever the load.

// trip opens the breaker after a failure and starts the prober. The prober closes it once
// Redis answers and has been charged the ledger.
func (b *Backend) trip() {
	b.stats.failures.Add(1)
	if !b.down.CompareAndSwap(false, true) {
		return
	}
	b.background(b.probe)
}

// background runs f in a goroutine that Close waits for, unless the backend is closed.
func (b *Backend) background(f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		f()
	}()
}

func (b *Backend) probe() {
	t := time.NewTimer(b.probeEvery)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		}
		b.stats.probes.Add(1)
		if b.probeOnce() == nil {
			// Close the breaker, then flush once more: debts recorded while the first
			// flush ran (the fallback still answered) go now, and a charge made after
			// this sees the breaker closed and flushes itself (see charge).
			b.down.Store(false)
			b.flushNow()
			return
		}
		t.Reset(b.probeEvery)
	}
}

// probeOnce pings Redis and charges it the ledger.
func (b *Backend) probeOnce() error {
	if err := b.Ping(b.ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(b.ctx, b.timeout)
	defer cancel()
	return b.flushLedger(ctx)
}

// flushLedger charges Redis what was admitted, settled up or penalized while it was down.
// Entries that Redis could not take stay in the ledger for the next attempt, and the
// error keeps the breaker open; an entry that Redis refused (a *ReplyError: the key holds
// something else than Sluice state) can never be charged, so it is dropped and counted
// (Stats.Unpaid) rather than holding every key on the fallback for good.
func (b *Backend) flushLedger(ctx context.Context) error {
	entries := b.ledger.take()
	if len(entries) == 0 {
		return nil
	}
	now := b.clock.Nanotime()
	type pending struct {
		key string
		c   *call
	}
	var ps []pending
	for key, d := range entries {
		// What is still owed: each limit's debt beyond now, charged at Redis' now.
		if deltas, owed := d.owed.Owed(now, len(d.limits)); owed {
			ps = append(ps, pending{key: key, c: b.settleCall(key, 1, d.limits, deltas[:len(d.limits)], nil)})
		}
		if d.until > now {
			ps = append(ps, pending{key: key, c: b.penalizeCall(key, d.limits, d.until-now)})
		}
	}
	// Queued together, they leave in one batch.
	cs := make([]*call, len(ps))
	for i, p := range ps {
		cs[i] = p.c
	}
	if !b.p.submitAll(cs) {
		for _, c := range cs {
			c.release()
		}
		return backend.ErrClosed
	}
	var first error
	failed := map[string]bool{}
	for _, p := range ps {
		err := b.await(ctx, p.key, p.c)
		if err == nil {
			err = b.finish(p.c, opName(p.c.op), p.key)
		}
		var rerr *ReplyError
		switch {
		case errors.As(err, &rerr):
			b.stats.unpaid.Add(1)
		case err != nil:
			first = cmp.Or(first, err)
			failed[p.key] = true
		}
	}
	for key := range failed {
		b.ledger.merge(key, entries[key], now)
	}
	return first
}

// ledger keeps, per key, what this process admitted or charged while Redis was down: a
// GCRA state under the key's real limits on the local clock (each permit pushed through
// as if granted at its time, never refused), so that what is still owed to each limit
// when Redis returns is its TAT beyond now: an hourly quota is charged nearly all of a
// short outage's permits, a per-second limit almost none of them (they are in the past).
type ledger struct {
	mu sync.Mutex
	m  map[string]*debt
}

type debt struct {
	limits []gcra.Limit
	owed   gcra.Debt
	until  int64 // end of a penalty issued while down, on the local clock
}

func (l *ledger) entry(key string, limits []gcra.Limit) *debt {
	d := l.m[key]
	if d == nil || len(d.limits) != len(limits) {
		d = &debt{limits: append([]gcra.Limit(nil), limits...)}
		l.m[key] = d
	}
	return d
}

func (l *ledger) take() map[string]*debt {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.m
	l.m = make(map[string]*debt)
	return m
}

// merge puts back an entry that could not be charged, combined with any debt recorded
// since: an upper bound of the two (the later one plus what the earlier still owes).
func (l *ledger) merge(key string, old *debt, now int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	cur := l.m[key]
	if cur == nil || len(cur.limits) != len(old.limits) {
		l.m[key] = old
		return
	}
	cur.owed.Merge(&old.owed, len(cur.limits), now)
	cur.until = max(cur.until, old.until)
}

// charge records n permits used at `at` (local clock) under limits. If the breaker closed
// meanwhile, nobody else will flush the entry: flush it now.
func (b *Backend) charge(key string, limits []gcra.Limit, at, n int64) {
	b.ledger.mu.Lock()
	d := b.ledger.entry(key, limits)
	d.owed.Push(limits, at, n)
	up := !b.down.Load()
	b.ledger.mu.Unlock()
	if up && b.flushing.CompareAndSwap(false, true) {
		b.background(func() { defer b.flushing.Store(false); b.flushNow() })
	}
}

// flushNow charges the ledger to Redis, bounded by the time-out.
func (b *Backend) flushNow() {
	ctx, cancel := context.WithTimeout(b.ctx, b.timeout)
	defer cancel()
	_ = b.flushLedger(ctx)
}

// fallbackDecide decides req in the local fallback and records what it grants.
func (b *Backend) fallbackDecide(ctx context.Context, key string, req backend.Request) (backend.Grant, error) {
	b.stats.fallbacks.Add(1)
	scaled := gcra.ShareOf(req.Limits, b.share)
	if req.N > gcra.MaxCost(scaled) {
		return backend.Grant{}, fmt.Errorf("%w: redis: cost %d is above the local fallback's burst %d", backend.ErrUnavailable, req.N, gcra.MaxCost(scaled))
	}
	g, err := b.fallback.Decide(ctx, key, backend.Request{Limits: scaled, N: req.N, MaxDelay: req.MaxDelay})
	if err != nil {
		if errors.Is(err, backend.ErrClosed) {
			return g, err
		}
		return g, fmt.Errorf("%w: redis: local fallback: %w", backend.ErrUnavailable, err)
	}
	if g.Allowed && req.N > 0 {
		b.charge(key, req.Limits, g.Ticket.At, req.N)
	}
	return g, nil
}

// degradedAdjust settles while Redis is down: a charge is recorded (and taken from the
// local fallback's share); a refund is given up, which is safe.
func (b *Backend) degradedAdjust(key string, limits []gcra.Limit, t gcra.Ticket, newN int64) error {
	if newN <= t.N {
		return nil
	}
	now := b.clock.Nanotime()
	b.charge(key, limits, now, newN-t.N)
	if b.fallback != nil {
		_ = b.fallback.Adjust(context.Background(), key, gcra.ShareOf(limits, b.share), gcra.Ticket{N: t.N}, newN)
	}
	return nil
}

// degradedPenalize records a penalty issued while Redis is down, applies it to the local
// fallback, and sends what is left of it to Redis when it returns.
func (b *Backend) degradedPenalize(ctx context.Context, key string, limits []gcra.Limit, d time.Duration) error {
	now := b.clock.Nanotime()
	b.ledger.mu.Lock()
	e := b.ledger.entry(key, limits)
	e.until = max(e.until, gcra.After(now, int64(d)))
	b.ledger.mu.Unlock()
	if b.fallback != nil {
		return b.fallback.Penalize(ctx, key, gcra.ShareOf(limits, b.share), d)
	}
	return nil
}
