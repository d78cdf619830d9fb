package strict

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/internal/rkey"
)

// maxFields is the most numeric fields one operation carries: a settlement under
// gcra.MaxLimits limits (sign, k, p, a pair, and two pairs per limit).
const maxFields = 5 + 4*4

// call is one operation (one record of a batch, see sluice.lua) waiting for its answer.
type call struct {
	key     string // the key (its Redis name is written when its batch is built)
	op      byte   // 'a', 'd', 's' or 'p'
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

// results is how many elements c's answer has in a reply (see sluice.lua).
func (c *call) results() int {
	if c.op == 'd' {
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

// grouping says which calls may share one script call. One script call may only touch
// keys that live on one server.
type grouping int

const (
	groupAll     grouping = iota // one Redis (or a Sentinel's master): every key together
	groupEachKey                 // any other client: one key per script call
)

// groupingOf returns how calls through client may be grouped: every key together on one
// Redis; one key per script call for anything else. In Redis Cluster, a script call may
// touch several keys only if they share a hash slot, and even then Redis answers
// TRYAGAIN while that slot migrates if any of them is missing (idle keys always are),
// where a single key is redirected (ASK); go-redis retries TRYAGAIN with back-off, so a
// resharding would run calls into their time-out. With one key per call, a cluster batch
// is one pipeline of script calls, each deciding all the batch's calls on its key. A
// Ring shards by its own hash of the key, so it too gets one key per call.
func groupingOf(client Client) grouping {
	if _, ok := client.(*goredis.Client); ok {
		return groupAll
	}
	return groupEachKey
}

// pipeliner coalesces the calls of concurrent goroutines into batches. A fixed set of
// flusher goroutines (owned by the backend, stopped by Close) each take every call queued
// (up to maxBatch) and send them as one pipeline holding one script call per group of
// keys that may share one (every key for one Redis, one key otherwise, see groupingOf):
// the script decides each group's calls in arrival order, reading and writing each key
// once.
// A lone caller is sent at once, alone; while batches are in flight, new calls queue and
// leave together, mostly when a batch returns (see ready for when they leave sooner), so
// the number of goroutines, not the round trip, sets the throughput.
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

	// direct lets a caller that finds nothing queued and nothing in flight send its own
	// call, with no hand-off to a flusher (the common case at low concurrency). It is on
	// only for clients that honour context deadlines, so that the caller still returns
	// within the time-out. With such a client the pipeliner also answers every call
	// within the time-out of its submission by itself (see deadline), and a caller waits
	// without a timer of its own (Backend.await).
	direct bool
	// The direct caller's buffers: there is one direct caller at a time (it sends only
	// when nothing else is in flight, and counts itself in flight meanwhile).
	directBB batchBuilder
	one      [1]*call

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

	mu       sync.Mutex
	cond     *sync.Cond
	queue    []*call
	inflight int // batches being sent, by flushers or direct callers
	flying   int // the calls in those batches
	eager    int // the calls queued that are not allowances (see ready)
	closed   bool
	wg       sync.WaitGroup
}

func newPipeliner(ctx context.Context, client Client, names, source string, timeout time.Duration, flushers, maxBatch int) *pipeliner {
	p := &pipeliner{client: client, names: names, sha: goredis.NewScript(source).Hash(), src: source, timeout: timeout,
		maxBatch: maxBatch, grouping: groupingOf(client), ctx: ctx,
		late: fmt.Errorf("no answer within %v (queued that long)", timeout)}
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
	if p.direct && p.inflight == 0 && len(p.queue) == 0 {
		p.inflight++
		p.flying++
		p.mu.Unlock()
		c.state.Store(callSent)
		p.one[0] = c
		p.directBB.exec(p, p.one[:])
		p.one[0] = nil
		p.mu.Lock()
		p.inflight--
		p.flying--
		if len(p.queue) > 0 {
			p.cond.Signal()
		}
		p.mu.Unlock()
		return true
	}
	p.queue = append(p.queue, c)
	if c.op != 'a' {
		p.eager++
	}
	// A waiting flusher is woken only when it may take the queue: an allowance queued
	// behind a batch in flight mostly is not (see ready), and waking a flusher that goes
	// back to sleep cost a goroutine switch per call. Whatever else makes the queue ready
	// wakes one too: a flusher whose batch returns looks again itself, and a direct
	// caller, a flusher that leaves calls behind and close signal.
	if p.ready() {
		p.cond.Signal()
	}
	p.mu.Unlock()
	return true
}

// deadlineCtx is a context that ends at a deadline, or when the backend closes.
type deadlineCtx struct {
	ctx    context.Context
	cancel context.CancelFunc // released by the timer at the deadline
	end    int64              // the deadline (Nanotime)
}

// deadline returns the context of a batch sent now whose oldest call was submitted at
// oldest: one that ends within the time-out, or at once when the backend closes. With a
// client that honours deadlines (direct) the time-out runs from oldest, so that the
// batch, and every call in it, is answered within the time-out of the oldest call's
// submission (a call whose time-out passed while it was queued is not sent: see
// unexpired); its callers wait without timers of their own. With any other client it
// runs from now, and each caller times its own wait. Batches whose deadlines fall within
// 1/100 of the time-out of each other share one context (each thus has at least 99% of
// its time-out), which spares a timer per batch.
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

// close stops the flushers after the batches in flight and fails the calls still queued
// with err.
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

// ready reports whether a flusher may take the queue now (p.mu held): when calls are
// queued and no batch is in flight; or when at least twice as many calls are queued as
// are in flight, or a whole batch (maxBatch); or when a call other than an allowance is
// queued. Allowances (Allow: one permit now or never) that arrive behind a batch in
// flight thus mostly wait for it and leave together when it returns, rather than as a
// second batch of the first few: on a Redis and clients short of CPU each batch costs
// both a round trip's system calls and wake-ups and Redis a script call, so fewer, larger
// batches decide more (at 64 goroutines on 10,000 keys, about 31 calls a batch instead of
// 20 and less CPU per decision on both sides; BENCHMARKS.md). A crowd behind a lone call
// (a direct caller's) still leaves at once, as does a whole batch. Other calls do not
// wait: a reservation is a waiter's place in the key's line across processes (fair
// waiting), which must reach Redis in the order the waiters came, as soon as it can.
func (p *pipeliner) ready() bool {
	n := len(p.queue)
	return n > 0 && (p.inflight == 0 || p.eager > 0 || n >= 2*p.flying || n >= p.maxBatch)
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
			if c.op != 'a' {
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
			bb.exec(p, batch)
		}
		p.mu.Lock()
		p.inflight-- // and this flusher takes what queued meanwhile, if it may
		p.flying -= len(batch)
		p.mu.Unlock()
		clear(batch)
	}
}

// groupKey identifies the calls that may share one script call.
type groupKey struct {
	key     string // groupEachKey: the key
	virtual bool
	vnow    int64
}

func groupKeyOf(how grouping, c *call) groupKey {
	gk := groupKey{virtual: c.virtual, vnow: c.vnow}
	if how == groupEachKey {
		gk.key = c.key
	}
	return gk
}

// group is one script call of a batch: its keys in order of first arrival, and its calls
// ordered by key, each key's calls in arrival order (the order of the script's records and
// of its reply).
type group struct {
	gk    groupKey
	keys  []string  // the keys (not their Redis names)
	refs  []nameRef // with refs: the keys' Redis names, in the builder's buffer
	calls []*call
	other bool // a call other than 'a', or a virtual now: the reply carries now
	cmd   *goredis.Cmd
	args  []any // cmd's arguments, kept from one batch to the next (cleared after each)
}

// batchBuilder turns a batch of calls into script calls, and their replies into answers.
// It keeps its buffers from one batch to the next; it is not safe for concurrent use.
type batchBuilder struct {
	groups []group
	gidx   map[groupKey]int // the groups, once there are many
	kidx   map[string]int   // a group's keys, once there are many
	counts []int
	sorted []*call
	again  []int
	cmds   []goredis.Cmder // the commands being sent
	names  []byte          // with refs: the Redis names of the batch's keys (see nameRef)
}

// nameRef is a key's Redis name written in a batch builder's buffer (batchBuilder.names):
// go-redis writes it as an encoding.BinaryMarshaler, and an interface holding a pointer
// to it needs no allocation, where the name made as a string was the one allocation per
// decision of a batched Allow. It reads the buffer when the command is written: the
// buffer only grows while the batch is built, and is reset for the next one.
type nameRef struct {
	buf      *[]byte
	off, end int
}

func (r *nameRef) MarshalBinary() ([]byte, error) { return (*r.buf)[r.off:r.end], nil }

// manyIndex is how many groups or keys are searched one by one before a map is used.
const manyIndex = 8

// exec sends batch as one pipeline of EVALSHA, one per group, and again with EVAL the
// groups that met NOSCRIPT (the script cache is empty after a Redis restart or SCRIPT
// FLUSH; EVAL loads it). A NOSCRIPT reply means the script did not run, so sending it
// again is safe. Every call of the batch is answered.
func (bb *batchBuilder) exec(p *pipeliner, batch []*call) {
	batch, oldest := p.unexpired(batch)
	if len(batch) == 0 {
		return
	}
	ctx := p.deadline(oldest)
	bb.group(p.grouping, batch)
	bb.cmds = bb.cmds[:0]
	for i := range bb.groups {
		g := &bb.groups[i]
		g.cmd = bb.command(ctx, p, g, argEvalsha, p.sha)
		bb.cmds = append(bb.cmds, g.cmd)
	}
	wait := bb.withAcks(ctx, p)
	execErr := p.send(ctx, bb.cmds)
	ackErr := p.acked(wait)
	bb.again = bb.again[:0]
	for i := range bb.groups {
		g := &bb.groups[i]
		err := replyErr(g.cmd, execErr)
		if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
			bb.again = append(bb.again, i)
			continue
		}
		g.answer(cmp.Or(err, ackErr))
	}
	if len(bb.again) > 0 {
		bb.cmds = bb.cmds[:0]
		for _, i := range bb.again {
			g := &bb.groups[i]
			g.cmd = bb.command(ctx, p, g, argEval, p.src)
			bb.cmds = append(bb.cmds, g.cmd)
		}
		wait := bb.withAcks(ctx, p)
		execErr := p.send(ctx, bb.cmds)
		ackErr := p.acked(wait)
		for _, i := range bb.again {
			bb.groups[i].answer(cmp.Or(replyErr(bb.groups[i].cmd, execErr), ackErr))
		}
	}
	for i := range bb.groups {
		g := &bb.groups[i]
		clear(g.keys)
		clear(g.refs)
		clear(g.calls)
		clear(g.args)
		g.keys, g.refs, g.calls, g.cmd, g.args = g.keys[:0], g.refs[:0], g.calls[:0], nil, g.args[:0]
	}
	clear(bb.cmds)
	bb.groups = bb.groups[:0]
	bb.names = bb.names[:0]
}

// withAcks appends to bb.cmds the WAIT for the replicas' acknowledgements, if the
// backend asks for them (WithReplicaAcks), and returns it.
func (bb *batchBuilder) withAcks(ctx context.Context, p *pipeliner) *goredis.IntCmd {
	if p.acks == 0 {
		return nil
	}
	w := goredis.NewIntCmd(ctx, "wait", p.acks, p.ackMs)
	bb.cmds = append(bb.cmds, w)
	return w
}

// acked returns nil if wait (nil: none asked for) counted enough replicas, and otherwise
// an error that is a failure to reach Redis (ErrUnavailable), never a reply error: the
// writes may be lost to a failover, so their grants must not be used.
func (p *pipeliner) acked(wait *goredis.IntCmd) error {
	if wait == nil {
		return nil
	}
	n, err := wait.Result()
	switch {
	case err != nil:
		return fmt.Errorf("sluice redis: WAIT for %d replicas: %v", p.acks, err) // %v: not a Redis reply error
	case n < p.acks:
		return fmt.Errorf("sluice redis: %d of %d replicas acknowledged the writes within %d ms", n, p.acks, p.ackMs)
	}
	return nil
}

// group splits batch into bb.groups, each with its keys and its calls ordered by key.
func (bb *batchBuilder) group(how grouping, batch []*call) {
	last := -1
	for _, c := range batch {
		gk := groupKeyOf(how, c)
		if last < 0 || bb.groups[last].gk != gk {
			last = bb.groupIndex(gk)
		}
		bb.groups[last].calls = append(bb.groups[last].calls, c)
	}
	clear(bb.gidx)
	// Within each group: the keys in order of first arrival, and the calls ordered by key
	// (a stable counting sort, so that each key's calls stay in arrival order).
	for i := range bb.groups {
		g := &bb.groups[i]
		g.other = false
		for _, c := range g.calls {
			c.ki = bb.keyIndex(g, c.key)
			g.other = g.other || c.op != 'a' || c.virtual
		}
		clear(bb.kidx)
		if len(g.keys) == 1 {
			continue
		}
		bb.counts = slices.Grow(bb.counts[:0], len(g.keys)+1)[:len(g.keys)+1]
		clear(bb.counts)
		for _, c := range g.calls {
			bb.counts[c.ki+1]++
		}
		for k := 1; k < len(bb.counts); k++ {
			bb.counts[k] += bb.counts[k-1]
		}
		bb.sorted = slices.Grow(bb.sorted[:0], len(g.calls))[:len(g.calls)]
		for _, c := range g.calls {
			bb.sorted[bb.counts[c.ki]] = c
			bb.counts[c.ki]++
		}
		copy(g.calls, bb.sorted)
		clear(bb.sorted)
	}
}

// groupIndex returns the index of the group gk, adding it if new.
func (bb *batchBuilder) groupIndex(gk groupKey) int {
	n := len(bb.groups)
	if n <= manyIndex {
		for i := range bb.groups {
			if bb.groups[i].gk == gk {
				return i
			}
		}
	} else {
		if len(bb.gidx) == 0 {
			if bb.gidx == nil {
				bb.gidx = make(map[groupKey]int)
			}
			for i := range bb.groups {
				bb.gidx[bb.groups[i].gk] = i
			}
		}
		if i, ok := bb.gidx[gk]; ok {
			return i
		}
		bb.gidx[gk] = n
	}
	if n < cap(bb.groups) {
		bb.groups = bb.groups[:n+1]
	} else {
		bb.groups = append(bb.groups, group{})
	}
	bb.groups[n].gk = gk
	return n
}

// keyIndex returns the index of name among g's keys, adding it if new.
func (bb *batchBuilder) keyIndex(g *group, key string) int {
	n := len(g.keys)
	if n > 0 && g.keys[n-1] == key {
		return n - 1
	}
	if n <= manyIndex {
		for i, k := range g.keys {
			if k == key {
				return i
			}
		}
	} else {
		if len(bb.kidx) == 0 {
			if bb.kidx == nil {
				bb.kidx = make(map[string]int)
			}
			for i, k := range g.keys {
				bb.kidx[k] = i
			}
		}
		if i, ok := bb.kidx[key]; ok {
			return i
		}
		bb.kidx[key] = n
	}
	g.keys = append(g.keys, key)
	return n
}

// command builds g's script call (see sluice.lua for the arguments): the keys' Redis
// names, the time mode, and for each key the number of its records and its records, an
// operation that repeats the previous record's being sent as '='. With p.refs, the names
// go in as pointers to nameRefs into bb.names and the fields as pointers (*int64) into
// g's calls, which live until the reply is read: an interface holding a pointer needs no
// allocation, where one holding a string or an int64 does, once per key and per field.
// go-redis writes what a pointer refers to, but reads a key given so wrongly where it
// routes by key (Cluster, Ring) and a hook (tracing) would print the pointer: refs is
// only for the backend's own client of one Redis (pipeliner.refs). Without it each name
// is made as a string.
func (bb *batchBuilder) command(ctx context.Context, p *pipeliner, g *group, name, script any) *goredis.Cmd {
	n := 4 + 2*len(g.keys)
	for _, c := range g.calls {
		n += 1 + c.nf
	}
	args := slices.Grow(g.args[:0], n)
	args = append(args, name, script, len(g.keys))
	if p.refs {
		if len(g.refs) != len(g.keys) { // not yet written (a NOSCRIPT's second command reuses them)
			g.refs = slices.Grow(g.refs[:0], len(g.keys))[:len(g.keys)]
			for i, k := range g.keys {
				off := len(bb.names)
				bb.names = rkey.AppendName(bb.names, p.names, k)
				g.refs[i] = nameRef{buf: &bb.names, off: off, end: len(bb.names)}
			}
		}
		for i := range g.refs {
			args = append(args, &g.refs[i])
		}
	} else {
		for _, k := range g.keys {
			args = append(args, rkey.Name(p.names, k))
		}
	}
	c0 := g.calls[0]
	switch {
	case c0.virtual:
		s, ns := c0.vnow/1e9, c0.vnow%1e9
		if ns < 0 {
			s, ns = s-1, ns+1e9
		}
		args = append(args, fmt.Sprintf("%d %d", s, ns))
	case g.other:
		args = append(args, "+")
	default:
		args = append(args, "")
	}
	var prev *call
	for i := 0; i < len(g.calls); {
		ki := g.calls[i].ki
		j := i
		for j < len(g.calls) && g.calls[j].ki == ki {
			j++
		}
		if j-i == 1 && prev != nil && g.calls[i].sameOp(prev) {
			// A key's one call repeating the previous operation: '=' stands for 1 '='.
			args = append(args, "=")
			prev = g.calls[i]
			i = j
			continue
		}
		args = append(args, j-i)
		for _, c := range g.calls[i:j] {
			if prev != nil && c.sameOp(prev) {
				args = append(args, "=")
			} else {
				args = append(args, opArg(c.op))
				if p.refs {
					for j := range c.f[:c.nf] {
						args = append(args, &c.f[j])
					}
				} else {
					for _, x := range c.f[:c.nf] {
						args = append(args, x)
					}
				}
			}
			prev = c
		}
		i = j
	}
	g.args = args
	cmd := goredis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// The script call's constant arguments, boxed once: a string converted to an interface
// where it is appended would be allocated for every record.
var (
	argEvalsha, argEval         any = "evalsha", "eval"
	opAllow, opDecide, opSettle any = "a", "d", "s"
	opPenalize                  any = "p"
)

// opArg is op's argument in a script call.
func opArg(op byte) any {
	switch op {
	case 'a':
		return opAllow
	case 'd':
		return opDecide
	case 's':
		return opSettle
	}
	return opPenalize
}

// answer splits g's reply among its calls and signals each: an error for all, or each
// call's results (a record's error text becomes its error).
func (g *group) answer(err error) {
	if err != nil {
		for _, c := range g.calls {
			c.err = err
			c.done <- struct{}{}
		}
		return
	}
	reply := g.cmd.Val()
	arr, isArr := reply.([]any)
	var now int64
	i, ok := 0, true
	if g.other {
		if ok = isArr && len(arr) >= 2; ok {
			now, ok = pairAt(arr, 0)
			i = 2
		}
	}
	if !g.other && len(g.calls) == 1 {
		// A reply of one element is sent bare.
		c := g.calls[0]
		c.one[0] = reply
		arr = c.one[:]
	} else if !isArr {
		ok = false
	}
	for _, c := range g.calls {
		c.reply, c.now, c.res = reply, now, nil
		if !ok {
			continue
		}
		if i >= len(arr) {
			ok = false
			continue
		}
		if s, isErr := arr[i].(string); isErr {
			c.err = scriptError(s)
			i++
			continue
		}
		n := c.results()
		if i+n > len(arr) {
			ok = false
			continue
		}
		c.res = arr[i : i+n : i+n]
		i += n
	}
	if ok && i != len(arr) {
		ok = false
	}
	for _, c := range g.calls {
		if !ok {
			// A reply of the wrong shape: every call reports it (res nil).
			c.res = nil
		}
		c.done <- struct{}{}
	}
}

// replyErr is a pipelined command's error. A pipeline that could not get a connection
// (go-redis v9) reports the failure only from Exec and leaves its commands without error
// and without reply: such a command gets Exec's error. Every reply of the script is
// non-nil, so a command with neither did not run.
func replyErr(cmd *goredis.Cmd, execErr error) error {
	if err := cmd.Err(); err != nil {
		return err
	}
	if cmd.Val() == nil {
		if execErr == nil {
			execErr = errors.New("sluice redis: no reply")
		}
		return execErr
	}
	return nil
}

// timers reuses the timers that bound each call's wait (Go 1.23 timers: after Stop, no
// stale value is received).
var timers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}
