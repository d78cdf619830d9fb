package strict

// The batching queue: a call waiting for its answer, and the pipeliner that queues the
// calls of concurrent goroutines and sends them in batches from its flushers, or sends a
// call that may leave at once from its caller.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
)

// maxFields is the most numeric fields one operation carries: a decision on a ramp under
// gcra.MaxLimits limits (n, a pair, k, and per limit two pairs and the ramp's nine).
const maxFields = 4 + 13*gcra.MaxLimits

// call is one operation (one record of a batch, see sluice.lua) waiting for its answer.
type call struct {
	key     string // the key (its Redis name is written when its batch is built)
	op      byte   // 'a', 'd', 'r', 's' or 'p'
	nf      int    // fields used in f
	f       [maxFields]int64
	virtual bool  // now is a virtual time (tests), not Redis TIME
	vnow    int64 // the virtual now
	queued  int64 // when it was made, just before it was submitted (clock.Default's Nanotime)

	state atomic.Int32 // callQueued, callSent or callAbandoned
	done  chan struct{}

	// The answer, valid after done: the call's results (its part of the reply), Redis'
	// now when the reply carries it, and the whole reply for error messages; or err.
	res   []any
	now   int64
	reply any
	err   error
	one   [1]any // holds a bare reply (a batch of one result), so res needs no allocation

	ki int // index of the call's key in its group (batch building, by the sender)
}

const (
	callQueued int32 = iota
	callSent
	callAbandoned
)

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// sameOp reports whether c repeats d's operation and fields (sent as '=').
func (c *call) sameOp(d *call) bool {
	return c.op == d.op && slices.Equal(c.f[:c.nf], d.f[:d.nf])
}

// eager reports whether c leaves the queue at once, even behind a batch in flight: any
// call but a decision now or never (an allowance, or a decision of maxDelay 0: Allow and
// AllowN). A reservation (maxDelay > 0) is a waiter's place in the key's line, which must
// reach Redis as soon as it can; a settlement or a penalty is rare.
func (c *call) eager() bool {
	switch c.op {
	case 'a':
		return false
	case 'd', 'r':
		return c.f[1] != 0 || c.f[2] != 0 // maxDelay, a pair (see Backend.decideCall)
	}
	return true
}

// results is how many elements c's answer has in a reply (see sluice.lua).
func (c *call) results() int {
	if c.op == 'd' || c.op == 'r' {
		return 3 + 2*int(c.f[3])
	}
	return 1
}

// release recycles a call whose answer was received (never an abandoned one: its
// pipeline may still write to it).
func (c *call) release() {
	c.key, c.res, c.reply, c.err, c.one[0] = "", nil, nil, nil, nil
	callPool.Put(c)
}

// pipeliner coalesces the calls of concurrent goroutines into batches. A fixed set of
// flusher goroutines (owned by the backend, stopped by Close) each take every call queued
// (up to maxBatch). A flusher sends them as one pipeline holding one script call per
// group of keys that may share one (every key for one Redis, one key otherwise: see
// groupingOf). The script decides each group's calls in arrival order, reading and
// writing each key once. A call that may leave at once, alone (a lone caller's, one
// beside a lone call in flight, a reservation), is sent by its caller (see leavesAlone).
// While batches are in flight, new calls queue and leave together, mostly when a batch
// returns (see ready for when they leave sooner). So the number of goroutines, not the
// round trip, sets the throughput.
type pipeliner struct {
	client   Client
	names    string // the start of every key's Redis name (Backend.KeyName)
	sha, src any    // the script's SHA1 and text (for EVAL after NOSCRIPT), boxed once
	timeout  time.Duration
	maxBatch int
	grouping grouping
	ctx      context.Context // cancelled by close
	// acks, if > 0, is how many replicas must acknowledge a batch's writes within ackMs
	// milliseconds (WAIT, after the script calls in the same pipeline; WithReplicaAcks).
	acks, ackMs int64

	// direct lets a caller that finds nothing queued send its own call, with no hand-off
	// to a flusher, when the call may leave at once (see leavesAlone): a lone caller's,
	// one beside a lone call in flight, a reservation. It is on only for clients that
	// honour context deadlines, so that the caller still returns within the time-out.
	// With such a client the pipeliner also answers every call within the time-out of its
	// submission by itself (see deadline), and a caller waits without a timer of its own
	// (Backend.await).
	direct bool
	// senders bounds the batches in flight at once, whoever sends them: as many as the
	// flushers (WithPipelines).
	senders int
	// spare holds the buffers of direct callers that returned (under mu): one for each
	// that sent at once, at most senders.
	spare []*directBuffers

	// conns, if not nil, are the connections batches are sent on (see conns); set before
	// the first call.
	conns *conns
	// refs makes script calls carry their keys and fields as pointers (see
	// group.command): only for a client the backend made (no hooks of the caller's) of
	// one Redis (no routing by key). Set before the first call.
	refs bool

	// dl is the context of the batches sent lately (see deadline).
	dl atomic.Pointer[deadlineCtx]
	// late answers a call whose time-out passed while it was queued (see unexpired).
	late error

	flushed atomic.Int64 // batches the flushers have sent (for tests)

	mu       sync.Mutex
	cond     *sync.Cond
	queue    []*call
	inflight int // batches being sent, by flushers or direct callers
	flying   int // the calls in those batches
	eager    int // the calls queued that leave at once (call.eager, see ready)
	closed   bool
	wg       sync.WaitGroup
}

func newPipeliner(ctx context.Context, client Client, names, source string, timeout time.Duration, flushers, maxBatch int) *pipeliner {
	p := &pipeliner{client: client, names: names, sha: goredis.NewScript(source).Hash(), src: source, timeout: timeout,
		maxBatch: maxBatch, grouping: groupingOf(client), ctx: ctx,
		senders: flushers, late: fmt.Errorf("no answer within %v (queued that long)", timeout)}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(flushers)
	for i := 0; i < flushers; i++ {
		go p.flusher()
	}
	return p
}

// submit queues c, or sends it at once from the caller's goroutine when the direct path
// applies; either way c.done is signalled when it is answered. It reports false once the
// pipeliner is closed.
func (p *pipeliner) submit(c *call) bool {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return false
	}
	if p.leavesAlone(c) {
		p.wg.Add(1) // close waits for it (closed is false: this happens before its Wait)
		p.inflight++
		p.flying++
		var d *directBuffers
		if n := len(p.spare); n > 0 {
			d = p.spare[n-1]
			p.spare[n-1] = nil
			p.spare = p.spare[:n-1]
		} else {
			d = new(directBuffers)
		}
		p.mu.Unlock()
		c.state.Store(callSent)
		d.one[0] = c
		d.bb.exec(p, d.one[:])
		d.one[0] = nil
		p.mu.Lock()
		p.inflight--
		p.flying--
		p.spare = append(p.spare, d)
		if len(p.queue) > 0 {
			p.cond.Signal()
		}
		p.mu.Unlock()
		p.wg.Done()
		return true
	}
	p.enqueue(c)
	p.mu.Unlock()
	return true
}

// submitAll queues cs together, so that they leave in one batch (or as few as maxBatch
// allows) rather than each sent alone by its caller, and signals each call's done when
// it is answered. It reports false, having queued none, once the pipeliner is closed.
func (p *pipeliner) submitAll(cs []*call) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range cs {
		p.enqueue(c)
	}
	return true
}

// enqueue queues c (p.mu held).
func (p *pipeliner) enqueue(c *call) {
	p.queue = append(p.queue, c)
	if c.eager() {
		p.eager++
	}
	// A waiting flusher is woken only when it may take the queue (see ready): waking one
	// that goes back to sleep costs a goroutine switch per call. Whatever else makes the
	// queue ready wakes a flusher too. A flusher whose batch returns looks again itself.
	// A direct caller, a flusher that leaves calls behind, and close signal one.
	if p.ready() {
		p.cond.Signal()
	}
}

// deadlineCtx is a context that ends at a deadline, or when the backend closes.
type deadlineCtx struct {
	ctx    context.Context
	cancel context.CancelFunc // released by the timer at the deadline
	end    int64              // the deadline (Nanotime)
}

// deadline returns the context of a batch sent now whose oldest call was submitted at
// oldest. The context ends within the time-out, or at once when the backend closes. With
// a client that honours deadlines (direct) the time-out runs from oldest, so that the
// batch, and every call in it, is answered within the time-out of the oldest call's
// submission. (A call whose time-out passed while it was queued is not sent: see
// unexpired.) Its callers then wait without timers of their own. With any other client
// the time-out runs from now, and each caller times its own wait. Batches whose deadlines
// fall within 1/100 of the time-out of each other share one context, which spares a
// timer per batch; each thus has at least 99% of its time-out.
func (p *pipeliner) deadline(oldest int64) context.Context {
	now := clock.Default.Nanotime()
	end := now + int64(p.timeout)
	if p.direct {
		end = oldest + int64(p.timeout)
	}
	if d := p.dl.Load(); d != nil && d.end <= end && d.end > end-int64(p.timeout)/100 {
		return d.ctx
	}
	ctx, cancel := context.WithTimeout(p.ctx, time.Duration(end-now))
	p.dl.Store(&deadlineCtx{ctx: ctx, cancel: cancel, end: end})
	return ctx
}

// unexpired answers, with a client that honours deadlines (direct), the calls of batch
// whose time-out has passed since they were submitted (they waited in the queue behind
// batches that took that long), and returns the others and when the oldest of them was
// submitted.
func (p *pipeliner) unexpired(batch []*call) ([]*call, int64) {
	now := clock.Default.Nanotime()
	if !p.direct {
		return batch, now
	}
	limit, oldest := now-int64(p.timeout), now
	n := 0
	for _, c := range batch {
		if c.queued <= limit {
			c.err = p.late
			c.done <- struct{}{}
			continue
		}
		oldest = min(oldest, c.queued)
		batch[n] = c
		n++
	}
	clear(batch[n:])
	return batch[:n], oldest
}

// close stops the flushers after the batches in flight, waits for the callers sending
// their own, and fails the calls still queued with err.
func (p *pipeliner) close(err error) {
	p.mu.Lock()
	p.closed = true
	q := p.queue
	p.queue, p.eager = nil, 0
	p.cond.Broadcast()
	p.mu.Unlock()
	for _, c := range q {
		if c.state.CompareAndSwap(callQueued, callSent) {
			c.err = err
			c.done <- struct{}{}
		}
	}
	p.wg.Wait()
	if p.conns != nil {
		p.conns.close()
	}
}

// directBuffers are a direct caller's buffers, kept for the next (see pipeliner.spare).
type directBuffers struct {
	bb  batchBuilder
	one [1]*call
}

// leavesAlone reports whether c, not yet queued, is sent at once by its caller (p.mu
// held): with a client that honours deadlines (direct), when nothing is queued and c
// would leave at once as a queue of one (see ready: fewer than senders batches in
// flight, and none, or a lone call, or c eager). Handed to a flusher and answered back,
// such a call cost two goroutine switches: at two goroutines, where every call leaves
// beside a lone one, sluice decided fewer a second on Redis than redis_rate
// (BENCHMARKS.md, "Calls beside a lone one").
func (p *pipeliner) leavesAlone(c *call) bool {
	return p.direct && len(p.queue) == 0 && p.mayLeave(1, c.eager())
}

// ready reports whether a flusher may take the queue now (p.mu held): never while
// senders batches are in flight (direct callers' count). Otherwise it may when calls
// are queued and no batch is in flight. It may when at least as many calls are queued
// as are in flight, or a whole batch (maxBatch). It may when an eager call is queued
// (call.eager). So decisions now or never (Allow, AllowN) queued behind a batch in
// flight leave together as a second batch about its size, and a reservation leaves at
// once. docs/strict.md, "Throughput: batches", says why.
func (p *pipeliner) ready() bool { return p.mayLeave(len(p.queue), p.eager > 0) }

// mayLeave is ready's rule for a queue of n calls, eager if any of them is (p.mu held).
func (p *pipeliner) mayLeave(n int, eager bool) bool {
	return n > 0 && p.inflight < p.senders && (p.inflight == 0 || eager || n >= p.flying || n >= p.maxBatch)
}

func (p *pipeliner) flusher() {
	defer p.wg.Done()
	batch := make([]*call, 0, p.maxBatch)
	var bb batchBuilder
	for {
		p.mu.Lock()
		for !p.closed && !p.ready() {
			p.cond.Wait()
		}
		if p.closed {
			p.mu.Unlock()
			return
		}
		n := min(len(p.queue), p.maxBatch)
		batch = batch[:0]
		for _, c := range p.queue[:n] {
			if c.state.CompareAndSwap(callQueued, callSent) {
				batch = append(batch, c)
			}
		}
		rest := copy(p.queue, p.queue[n:])
		clear(p.queue[rest:])
		p.queue = p.queue[:rest]
		p.eager = 0
		for _, c := range p.queue {
			if c.eager() {
				p.eager++
			}
		}
		if rest > 0 {
			p.cond.Signal()
		}
		p.inflight++
		p.flying += len(batch)
		p.mu.Unlock()
		if len(batch) > 0 {
			p.flushed.Add(1)
			bb.exec(p, batch)
		}
		p.mu.Lock()
		p.inflight-- // and this flusher takes what queued meanwhile, if it may
		p.flying -= len(batch)
		p.mu.Unlock()
		clear(batch)
	}
}

// timers reuses the timers that bound each call's wait (Go 1.23 timers: after Stop, no
// stale value is received).
var timers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}
