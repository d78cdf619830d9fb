package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// call is one script invocation waiting for its pipeline.
type call struct {
	keys  [1]string
	args  []any
	state atomic.Int32 // callQueued, callSent or callAbandoned
	done  chan struct{}
	reply any
	err   error
}

const (
	callQueued int32 = iota
	callSent
	callAbandoned
)

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

func newCall(key string, args []any) *call {
	c := callPool.Get().(*call)
	c.keys[0] = key
	c.args = args
	c.state.Store(callQueued)
	return c
}

// release recycles a call whose answer was received (never an abandoned one: its
// pipeline may still write to it).
func (c *call) release() {
	c.args, c.reply, c.err = nil, nil, nil
	callPool.Put(c)
}

// pipeliner coalesces the calls of concurrent goroutines into pipelines. A fixed set of
// flusher goroutines (owned by the backend, stopped by Close) each take every call queued
// (up to maxBatch) and send them as one pipeline. A lone caller is sent at once, alone;
// while pipelines are in flight, new calls queue and leave together with the next one, so
// the number of goroutines, not the round trip, sets the throughput.
type pipeliner struct {
	client   Client
	script   *goredis.Script
	timeout  time.Duration
	maxBatch int
	ctx      context.Context // cancelled by close

	// direct lets a caller that finds nothing queued and nothing in flight send its own
	// call, with no hand-off to a flusher (the common case at low concurrency). It is on
	// only for clients that honour context deadlines, so that the caller still returns
	// within the time-out.
	direct bool

	mu       sync.Mutex
	cond     *sync.Cond
	queue    []*call
	inflight int // pipelines being sent, by flushers or direct callers
	closed   bool
	wg       sync.WaitGroup
}

func newPipeliner(ctx context.Context, client Client, script *goredis.Script, timeout time.Duration, flushers, maxBatch int) *pipeliner {
	p := &pipeliner{client: client, script: script, timeout: timeout, maxBatch: maxBatch, ctx: ctx}
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
		p.mu.Unlock()
		c.state.Store(callSent)
		batch := [1]*call{c}
		var cmds [1]*goredis.Cmd
		p.exec(batch[:], cmds[:0])
		p.mu.Lock()
		p.inflight--
		if len(p.queue) > 0 {
			p.cond.Signal()
		}
		p.mu.Unlock()
		return true
	}
	p.queue = append(p.queue, c)
	p.cond.Signal()
	p.mu.Unlock()
	return true
}

// close stops the flushers after the pipelines in flight and fails the calls still
// queued with ErrClosed-like errors (the caller maps them).
func (p *pipeliner) close(err error) {
	p.mu.Lock()
	p.closed = true
	q := p.queue
	p.queue = nil
	p.cond.Broadcast()
	p.mu.Unlock()
	for _, c := range q {
		if c.state.CompareAndSwap(callQueued, callSent) {
			c.err = err
			c.done <- struct{}{}
		}
	}
	p.wg.Wait()
}

func (p *pipeliner) flusher() {
	defer p.wg.Done()
	batch := make([]*call, 0, p.maxBatch)
	cmds := make([]*goredis.Cmd, 0, p.maxBatch)
	for {
		p.mu.Lock()
		for len(p.queue) == 0 && !p.closed {
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
		if rest > 0 {
			p.cond.Signal()
		}
		p.inflight++
		p.mu.Unlock()
		if len(batch) > 0 {
			cmds = p.exec(batch, cmds[:0])
		}
		p.mu.Lock()
		p.inflight--
		p.mu.Unlock()
	}
}

// exec sends batch as one pipeline of EVALSHA, and again with EVAL those that met
// NOSCRIPT (the script cache is empty after a Redis restart or SCRIPT FLUSH; EVAL loads
// it). A NOSCRIPT reply means the script did not run, so sending it again is safe.
func (p *pipeliner) exec(batch []*call, cmds []*goredis.Cmd) []*goredis.Cmd {
	ctx, cancel := context.WithTimeout(p.ctx, p.timeout)
	defer cancel()
	pipe := p.client.Pipeline()
	for _, c := range batch {
		cmds = append(cmds, p.script.EvalSha(ctx, pipe, c.keys[:], c.args...))
	}
	_, execErr := pipe.Exec(ctx)
	var again []*call
	for i, c := range batch {
		err := replyErr(cmds[i], execErr)
		if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
			again = append(again, c)
			continue
		}
		c.reply, c.err = cmds[i].Val(), err
		c.done <- struct{}{}
		cmds[i] = nil
	}
	if len(again) > 0 {
		pipe := p.client.Pipeline()
		retry := make([]*goredis.Cmd, len(again))
		for i, c := range again {
			retry[i] = p.script.Eval(ctx, pipe, c.keys[:], c.args...)
		}
		_, execErr := pipe.Exec(ctx)
		for i, c := range again {
			c.reply, c.err = retry[i].Val(), replyErr(retry[i], execErr)
			c.done <- struct{}{}
		}
	}
	clear(cmds)
	return cmds
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

// ErrUnavailable wraps every failure to get an answer from Redis in time: a connection
// error, no answer within the time-out, a Redis that is loading or without a master, or
// the circuit breaker open after such a failure. The limiter's fail mode answers it.
var ErrUnavailable = errors.New("sluice redis: redis unavailable")

// ReplyError is an answer from Redis that the backend cannot use: an error raised by the
// script (bad arguments, a key holding another state format) or a reply of the wrong
// shape. It is not a sign that Redis is down.
type ReplyError struct {
	Op    string // the script operation: decide, allow, settle, penalize, probe
	Key   string
	Reply any   // the reply received, if it had the wrong shape
	Err   error // the error Redis returned, if any
}

func (e *ReplyError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("sluice redis: %s %q: %v", e.Op, e.Key, e.Err)
	}
	return fmt.Sprintf("sluice redis: %s %q: unexpected reply %#v", e.Op, e.Key, e.Reply)
}

func (e *ReplyError) Unwrap() error { return e.Err }

// unavailable reports whether err means that Redis could not decide (as opposed to a
// decision refused because of its arguments).
func unavailable(err error) bool {
	if err == nil {
		return false
	}
	var rerr goredis.Error
	if errors.As(err, &rerr) && !errors.Is(err, goredis.ErrClosed) {
		msg := rerr.Error()
		for _, p := range []string{"LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "OOM", "NOREPLICAS"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	// Anything else is the connection's: refused, reset, closed, timed out.
	return true
}
