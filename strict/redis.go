package strict

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/rkey"
	"github.com/sluicehq/sluice/local"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// FormatVersion is the version of the state format, carried by every key name and by the
// script. A release that changes the format changes it, so that processes of two releases
// never read each other's state (see docs/strict.md on rolling upgrades).
const FormatVersion = 1

// scriptSource is the decision script, sent with EVALSHA, and with EVAL after NOSCRIPT.
//

// Defaults.
const (
	DefaultPrefix     = "sluice:"
	DefaultTimeout    = 100 * time.Millisecond // longest wait for an answer from Redis
	DefaultPipelines  = 2                      // most batches in flight at once (see WithPipelines)
	DefaultMaxBatch   = 256                    // most calls in one batch (one pipeline)
	DefaultProbeEvery = 100 * time.Millisecond // how often a down Redis is probed
)

// Client is what the backend needs of a go-redis client: pipelines. *goredis.Client,
// *goredis.ClusterClient, *goredis.Ring and goredis.UniversalClient (single, Sentinel,
// Cluster) satisfy it.
type Client interface {
	Pipeline() goredis.Pipeliner
}

// Backend decides permits in Redis, atomically per key, with Redis' clock. It implements
// backend.Backend and backend.Allower. It is safe for concurrent use; make one with New or
// Dial and Close it when done.
type Backend struct {
	client     Client
	owned      interface{ Close() error } // closed by Close when Dial made the client
	prefix     string
	names      string // prefix + "v1:", the start of every key's name (set by New)
	timeout    time.Duration
	pipelines  int
	maxBatch   int
	probeEvery time.Duration
	clock      clock.Clock
	share      float64        // fallback share; 0: no local fallback
	acks       int            // replicas that must acknowledge each batch's writes (WAIT); 0: none
	ackTimeout time.Duration  // how long a batch waits for them
	misuse     error          // an option that cannot work with this client: every call fails with it
	now        func() int64   // tests only: virtual time passed to the script
	fallback   *local.Backend // the local GCRA of fail mode "local"
	p          *pipeliner
	ctx        context.Context
	cancel     context.CancelFunc
	down       atomic.Bool // the breaker: Redis failed and has not answered a probe since
	flushing   atomic.Bool // a flush of the ledger runs in the background
	ledger     ledger      // what was admitted or charged while Redis was down

	mu     sync.Mutex  // orders closing and wg.Add
	closed atomic.Bool // set under mu
	wg     sync.WaitGroup

	stats struct {
		failures, fallbacks, probes, unpaid atomic.Int64
	}
}

var (
	_ backend.Backend  = (*Backend)(nil)
	_ backend.Allower  = (*Backend)(nil)
	_ backend.Pinger   = (*Backend)(nil)
	_ backend.Resetter = (*Backend)(nil)
)

// Option configures a Backend.
type Option interface{ apply(*Backend) }

type optionFunc func(*Backend)

func (f optionFunc) apply(b *Backend) { f(b) }

// WithPrefix sets the prefix of every key name (default DefaultPrefix). A key's state
// lives at PREFIX + "v1:{" + key + "}" (see KeyName).
func WithPrefix(p string) Option { return optionFunc(func(b *Backend) { b.prefix = p }) }

// WithTimeout bounds how long a call waits for Redis (default DefaultTimeout). A call with
// no answer by then fails with backend.ErrUnavailable, and the fail mode answers it.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(b *Backend) {
		if d > 0 {
			b.timeout = d
		}
	})
}

// WithPipelines sets how many batches may be in flight at once (default
// DefaultPipelines), whoever sends them: one of as many flusher goroutines, or a caller
// that sends its own call (see docs/strict.md); and how many calls one batch carries at
// most (default DefaultMaxBatch). A batch is one pipeline holding one script call per
// group of keys that may share one (see docs/strict.md). While batches are in flight,
// decisions now or never (allowances, and decisions of no MaxDelay) queued behind them
// leave when as many calls as are in flight are queued, or a whole batch, or a batch
// returns; any other call (a reservation) leaves as soon as fewer batches are in flight
// than this allows. Values <= 0 keep the default.
func WithPipelines(inFlight, maxBatch int) Option {
	return optionFunc(func(b *Backend) {
		if inFlight > 0 {
			b.pipelines = inFlight
		}
		if maxBatch > 0 {
			b.maxBatch = maxBatch
		}
	})
}

// WithProbeEvery sets how often a Redis that failed is probed for its return (default
// DefaultProbeEvery). While it is down, calls are answered at once without waiting for it.
func WithProbeEvery(d time.Duration) Option {
	return optionFunc(func(b *Backend) {
		if d > 0 {
			b.probeEvery = d
		}
	})
}

// WithClock sets the clock of the local fallback and of the charge-back ledger (default
// clock.Default). Decisions in Redis never read it: they use Redis' clock.
func WithClock(c clock.Clock) Option { return optionFunc(func(b *Backend) { b.clock = c }) }

// WithFailLocal selects the fail mode "local": while Redis is unavailable, this process
// decides on its own with a local GCRA at share (0 < share <= 1) of each limit's rate and
// burst (at least one permit of burst), instead of returning backend.ErrUnavailable. What
// it admitted is charged back to Redis when Redis returns. With P processes that each run
// at share s while all are cut off, the pool admits up to P*s of the limit: s = 1/P keeps
// it within the limit (see docs/strict.md, "Fail modes and their worst-case
// over-admission").
func WithFailLocal(share float64) Option {
	return optionFunc(func(b *Backend) {
		if share > 0 && share <= 1 {
			b.share = share
		}
	})
}

// WithReplicaAcks makes every batch wait until n replicas have acknowledged its writes
// (Redis WAIT n timeout, sent in the same pipeline after the script calls). The wait
// lasts at most timeout, which is at most the backend's time-out (<= 0: half of it). A
// batch that fewer replicas acknowledge in time fails with backend.ErrUnavailable, and the
// fail mode answers. Its grants are not used: they stay booked on the master, capacity
// wasted but never over-admitted. A grant that is used is then on n replicas, so a
// Sentinel failover to one of them cannot lose it. So what asynchronous replication loses
// to a promotion (see docs/strict.md, "The failover bound") is never used. The cost is
// the replicas' acknowledgement in every round trip. It needs a client of one Redis or of
// a Sentinel set's master (*goredis.Client); with any other, every call fails with an
// error that says so.
func WithReplicaAcks(n int, timeout time.Duration) Option {
	return optionFunc(func(b *Backend) {
		if n > 0 {
			b.acks, b.ackTimeout = n, timeout
		}
	})
}

// withNow makes the script use virtual time read from now instead of Redis TIME: the
// test-only entry point of the differential test and the conformance suite.
func withNow(now func() int64) Option { return optionFunc(func(b *Backend) { b.now = now }) }

// New returns a backend deciding in Redis through client. The caller keeps ownership of
// the client; it should not retry commands itself (go-redis does by default: set
// MaxRetries to -1, see docs/strict.md), but the backend bounds every call by its time-out
// whatever the client's settings.
func New(client Client, opts ...Option) *Backend {
	b := &Backend{
		client:     client,
		prefix:     DefaultPrefix,
		timeout:    DefaultTimeout,
		pipelines:  DefaultPipelines,
		maxBatch:   DefaultMaxBatch,
		probeEvery: DefaultProbeEvery,
		clock:      clock.Default,
	}
	for _, o := range opts {
		o.apply(b)
	}
	b.names = b.prefix + "v" + strconv.Itoa(FormatVersion) + ":"
	if b.share > 0 {
		b.fallback = local.New(local.WithClock(b.clock))
	}
	b.ledger.m = make(map[string]*debt)
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.p = newPipeliner(b.ctx, client, b.names, scriptSource, b.timeout, b.pipelines, b.maxBatch)
	b.p.direct = honoursDeadlines(client)
	if b.acks > 0 {
		if b.ackTimeout <= 0 || b.ackTimeout > b.timeout {
			b.ackTimeout = min(b.timeout, max(b.ackTimeout, b.timeout/2))
		}
		b.p.acks, b.p.ackMs = int64(b.acks), max(1, b.ackTimeout.Milliseconds())
		if groupingOf(client) != groupAll {
			b.misuse = fmt.Errorf("sluice redis: WithReplicaAcks needs a client of one Redis or a Sentinel set's master (*goredis.Client), not %T", client)
		}
	}
	return b
}

// honoursDeadlines reports whether client is known to return by a context's deadline:
// go-redis clients with ContextTimeoutEnabled and no retries.
func honoursDeadlines(client Client) bool {
	switch c := client.(type) {
	case *goredis.Client:
		o := c.Options()
		return o.ContextTimeoutEnabled && o.MaxRetries <= 0
	case *goredis.ClusterClient:
		o := c.Options()
		return o.ContextTimeoutEnabled && o.MaxRetries <= 0
	}
	return false
}

// dialRedis connects to the Redis at url (redis://, rediss://, or redis-sentinel:// for the
// master a Sentinel set names: see redisstore.SentinelScheme) with the settings of
// redisstore.ClientOptions, checks that it answers, and returns a backend that owns the
// client (Close closes it). The check allows the longer of the time-out and a second (or
// ctx's deadline, if sooner), pinging again each time one goes unanswered: the first
// answer of a Redis that is busy, or reached through Sentinel (a lookup, then a
// connection), may take longer than the time-out that bounds each decision.
func dialRedis(ctx context.Context, url string, opts ...Option) (*Backend, error) {
	b, err := openRedis(url, opts...)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, max(b.timeout, time.Second))
	defer cancel()
	for {
		err := b.Ping(pctx) // an backend.ErrUnavailable, if any
		if err == nil {
			return b, nil
		}
		select {
		case <-pctx.Done():
			b.Close()
			return nil, err
		case <-time.After(min(b.timeout, 50*time.Millisecond)):
		}
	}
}

// openRedis is dialRedis without the first PING: the backend starts even while Redis is
// down, and answers by its fail mode until Redis returns. It fails only on a bad URL.
func openRedis(url string, opts ...Option) (*Backend, error) {
	probe := &Backend{timeout: DefaultTimeout}
	for _, o := range opts {
		o.apply(probe)
	}
	c, err := redisstore.NewClient(url, probe.timeout)
	if err != nil {
		return nil, err
	}
	b := New(c, opts...)
	b.owned = c
	b.p.conns = &conns{client: c}
	b.p.refs = b.p.grouping == groupAll
	return b, nil
}

// KeyName returns the Redis key that holds key's state: prefix, the format version, and
// the key as a hash tag, so that all of one key's Redis keys share a cluster slot and
// keys spread over slots. '\' and '}' in the key are escaped (as \\ and \]) and an empty
// key is written \0, so the tag is never empty nor cut short, and distinct keys never
// share a name.
func (b *Backend) KeyName(key string) string {
	return rkey.Name(b.names, key)
}

// Stats counts the backend's troubles.
type Stats struct {
	Failures  int64 // calls that could not get an answer from Redis
	Fallbacks int64 // decisions made by the local fallback
	Probes    int64 // probes of a down Redis
	Unpaid    int64 // debts of the local fallback dropped because Redis refused them (see flushLedger)
	Down      bool  // whether the breaker is open now
}

// Stats returns the counts so far.
func (b *Backend) Stats() Stats {
	return Stats{Failures: b.stats.failures.Load(), Fallbacks: b.stats.fallbacks.Load(), Probes: b.stats.probes.Load(),
		Unpaid: b.stats.unpaid.Load(), Down: b.down.Load()}
}

func checkRequest(limits []gcra.Limit, n int64) error {
	if n < 0 {
		return gcra.ErrInvalidCost
	}
	if err := gcra.ValidateLimits(limits); err != nil {
		return err
	}
	if n > gcra.MaxCost(limits) {
		return gcra.ErrCostExceedsBurst
	}
	return nil
}

// Decide decides req for key in Redis, at Redis' time.
func (b *Backend) Decide(ctx context.Context, key string, req backend.Request) (backend.Grant, error) {
	if err := checkRequest(req.Limits, req.N); err != nil {
		return backend.Grant{}, err
	}
	if w, err := windowed(req.Limits); w {
		if err != nil {
			return backend.Grant{}, err
		}
		return b.windowDecide(ctx, key, req)
	}
	c := b.decideCall(key, req)
	if err := b.run(ctx, key, c); err != nil {
		if b.fallback != nil && errors.Is(err, backend.ErrUnavailable) {
			return b.fallbackDecide(ctx, key, req)
		}
		return backend.Grant{}, err
	}
	g, ok := decodeDecision(c.res, c.now, req.Limits, req.N)
	var err error
	if !ok {
		err = &ReplyError{Op: "decide", Key: key, Reply: c.reply}
	}
	c.release()
	return g, err
}

// AllowOne takes one permit for key under l if one is free now (backend.Allower): the
// script's brief form, whose reply is one integer.
func (b *Backend) AllowOne(ctx context.Context, key string, l gcra.Limit) (bool, error) {
	ls := [1]gcra.Limit{l}
	if err := checkRequest(ls[:], 1); err != nil {
		return false, err
	}
	if l.Window > 0 {
		g, err := b.Decide(ctx, key, backend.Request{Limits: ls[:], N: 1})
		return g.Allowed, err
	}
	c := b.allowCall(key, l)
	if err := b.run(ctx, key, c); err != nil {
		if b.fallback != nil && errors.Is(err, backend.ErrUnavailable) {
			g, err := b.fallbackDecide(ctx, key, backend.Request{Limits: ls[:], N: 1})
			return g.Allowed, err
		}
		return false, err
	}
	allowed, ok := decodeAllow(c.res)
	var err error
	if !ok {
		err = &ReplyError{Op: "allow", Key: key, Reply: c.reply}
	}
	c.release()
	return allowed, err
}

// Adjust settles a grant to its real cost newN (see backend.Backend and gcra.Adjust).
// While Redis is unavailable a charge (newN above the grant) is kept and charged when it
// returns; a refund is given up (safe: refunds may be partial).
func (b *Backend) Adjust(ctx context.Context, key string, limits []gcra.Limit, t gcra.Ticket, newN int64) error {
	if newN < 0 {
		return gcra.ErrInvalidCost
	}
	if err := gcra.ValidateLimits(limits); err != nil {
		return err
	}
	if w, err := windowed(limits); w {
		if err != nil {
			return err
		}
		return b.windowAdjust(ctx, key, limits, t, newN)
	}
	if b.down.Load() {
		if b.isClosed() {
			return backend.ErrClosed
		}
		return b.degradedAdjust(key, limits, t, newN)
	}
	c := b.adjustCall(key, limits, t, newN)
	if err := b.run(ctx, key, c); err != nil {
		if errors.Is(err, backend.ErrUnavailable) {
			return b.degradedAdjust(key, limits, t, newN)
		}
		return err
	}
	return b.finish(c, "settle", key)
}

// finish checks the result of a settlement or penalty and releases c.
func (b *Backend) finish(c *call, op, key string) error {
	var err error
	if !done(c.res) {
		err = &ReplyError{Op: op, Key: key, Reply: c.reply}
	}
	c.release()
	return err
}

// Penalize holds key back for d in Redis, for every process that shares it. While Redis
// is unavailable the penalty is applied to the local fallback (if any) and sent to Redis,
// for what is left of it, when Redis returns.
func (b *Backend) Penalize(ctx context.Context, key string, limits []gcra.Limit, d time.Duration) error {
	if err := gcra.ValidateLimits(limits); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	if w, err := windowed(limits); w {
		if err != nil {
			return err
		}
		return b.windowPenalize(ctx, key, limits, int64(d))
	}
	if b.down.Load() {
		if b.isClosed() {
			return backend.ErrClosed
		}
		return b.degradedPenalize(ctx, key, limits, d)
	}
	c := b.penalizeCall(key, limits, int64(d))
	if err := b.run(ctx, key, c); err != nil {
		if errors.Is(err, backend.ErrUnavailable) {
			return b.degradedPenalize(ctx, key, limits, d)
		}
		return err
	}
	return b.finish(c, "penalize", key)
}

// run sends c through the pipeliner and waits for its answer, at most the time-out. While
// the breaker is open it fails at once; a failure to reach Redis opens it. On success the
// caller reads c's results and releases it; on failure c is no longer the caller's.
func (b *Backend) run(ctx context.Context, key string, c *call) error {
	if b.misuse != nil {
		c.release()
		return b.misuse
	}
	if b.down.Load() {
		c.release()
		if b.isClosed() {
			return backend.ErrClosed
		}
		return b.unavailable(fmt.Errorf("%w: redis: down since a failure, probed every %v", backend.ErrUnavailable, b.probeEvery))
	}
	if !b.p.submit(c) {
		c.release()
		return backend.ErrClosed
	}
	err := b.await(ctx, key, c)
	if errors.Is(err, backend.ErrUnavailable) {
		b.trip()
		err = b.unavailable(err)
	}
	return err
}

// unavailable adds the retry hint to a failure to reach Redis: the prober's interval,
// the soonest Redis can be found back (a caller asking sooner gets the same answer).
func (b *Backend) unavailable(err error) error {
	return &backend.UnavailableError{RetryAfter: b.probeEvery, Err: err}
}

// await waits for the answer of c (submitted), at most the time-out, and classifies its
// error: ErrClosed, backend.ErrUnavailable (Redis could not decide) or a *ReplyError. On
// success the caller reads c's results and releases it. On failure c is released, or
// abandoned to the batch that may still answer it.
func (b *Backend) await(ctx context.Context, key string, c *call) error {
	if b.p.direct {
		// The pipeliner answers c within the time-out (see pipeliner.deadline): no timer.
		done := ctx.Done()
		if done == nil {
			<-c.done
			return b.answered(key, c)
		}
		select {
		case <-c.done:
			return b.answered(key, c)
		case <-done:
			c.state.CompareAndSwap(callQueued, callAbandoned)
			return ctx.Err()
		}
	}
	select {
	case <-c.done: // answered already (the caller sent it itself)
		return b.answered(key, c)
	default:
	}
	t := timers.Get().(*time.Timer)
	t.Reset(b.timeout)
	select {
	case <-c.done:
		t.Stop()
		timers.Put(t)
		return b.answered(key, c)
	case <-t.C:
		timers.Put(t)
		c.state.CompareAndSwap(callQueued, callAbandoned)
		return fmt.Errorf("%w: redis: no answer within %v", backend.ErrUnavailable, b.timeout)
	case <-ctx.Done():
		t.Stop()
		timers.Put(t)
		c.state.CompareAndSwap(callQueued, callAbandoned)
		return ctx.Err()
	}
}

// answered classifies the error of an answered call; on failure it releases c.
func (b *Backend) answered(key string, c *call) error {
	err := c.err
	if err == nil {
		return nil
	}
	op := opName(c.op)
	c.release()
	switch {
	case errors.Is(err, backend.ErrClosed):
		return err
	case unavailable(err):
		return fmt.Errorf("%w: redis: %w", backend.ErrUnavailable, err)
	}
	return &ReplyError{Op: op, Key: key, Err: err}
}

func (b *Backend) isClosed() bool { return b.closed.Load() }

// Close stops the pipelines and the prober, waiting for those in flight (at most the
// time-out, when the client honours context deadlines), and closes the client if Dial
// made it. Later calls return backend.ErrClosed.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		return nil
	}
	b.closed.Store(true)
	b.mu.Unlock()
	b.down.Store(true) // fail fast from now on
	b.cancel()
	b.p.close(backend.ErrClosed)
	b.wg.Wait()
	if b.fallback != nil {
		b.fallback.Close()
	}
	if b.owned != nil {
		return b.owned.Close()
	}
	return nil
}

// Reset forgets key in Redis (and in the fallback and its ledger): its next request is
// decided as a new key's, and its penalty is lifted, for every process (backend.Resetter).
func (b *Backend) Reset(ctx context.Context, key string) error {
	if b.isClosed() {
		return backend.ErrClosed
	}
	b.ledger.mu.Lock()
	delete(b.ledger.m, key)
	b.ledger.mu.Unlock()
	if b.fallback != nil {
		b.fallback.Reset(ctx, key)
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	p := b.client.Pipeline()
	p.Del(ctx, b.KeyName(key), b.windowKey(key))
	if _, err := p.Exec(ctx); err != nil {
		return fmt.Errorf("%w: redis: %w", backend.ErrUnavailable, err)
	}
	return nil
}

// Ping reports whether Redis answers a PING now, within the backend's time-out
// (backend.Pinger: the daemon's /readyz).
func (b *Backend) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	p := b.client.Pipeline()
	p.Ping(ctx)
	if _, err := p.Exec(ctx); err != nil {
		return fmt.Errorf("%w: redis: %w", backend.ErrUnavailable, err)
	}
	return nil
}
