// Package client talks to a Sluice daemon (`sluice serve`) over its line protocol: a small
// pool of connections with a short time-out. Each connection is pipelined: many goroutines
// share it, and answers come back in order.
//
// A daemon that does not answer right away is in trouble. So a call that fails or times
// out is answered by the client's fail mode (open, allowing the request, by default), and
// the client stops asking for a while, a back-off that doubles up to a maximum. Then it
// probes with one query. The Backend method adapts a Client to sluice.Limiter, so code
// moves between in-process and daemon use by changing one option.
//
// A call's class (priority.With on its context: docs/priorities.md) travels with its
// query (the protocol's c=), and the daemon keeps the higher classes' headroom across all
// its clients; a call without one is standard, as an older client's.
package client

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/priority"
)

// ErrInvalidTag: the tag is empty, not UTF-8, or holds a control character (a line break
// would split the query in two). Nothing is sent. The client's other failures are
// declared in package backend:
//   - backend.ErrUnavailable: the daemon did not answer in time, or the client is backing
//     off after a failure. Calls that return a decision answered it by the fail mode.
//   - backend.ErrClosed: the client was closed.
//   - backend.ErrUnsupported: the protocol cannot carry the operation (settling a
//     reservation).
var ErrInvalidTag = errors.New("sluice client: invalid tag")

// Client is a connection pool to one daemon. It is safe for concurrent use.
type Client struct {
	network, addr string
	timeout       time.Duration
	failOpen      bool
	minBackoff    time.Duration
	maxBackoff    time.Duration

	conns []*pconn
	next  atomic.Uint32

	downUntil atomic.Int64 // Unix nanoseconds: answer by the fail mode until then
	backoff   atomic.Int64
	probing   atomic.Bool
	failures  atomic.Int64
	closed    atomic.Bool
	// classless: the daemon refused a query's class (a release before classes): queries go
	// without one from then on.
	classless atomic.Bool
}

// Option configures a Client.
type Option interface{ apply(*Client) }

type optionFunc func(*Client)

func (f optionFunc) apply(c *Client) { f(c) }

// WithTimeout bounds each call, dial included (default 50ms: a local daemon answers in
// microseconds).
func WithTimeout(d time.Duration) Option { return optionFunc(func(c *Client) { c.timeout = d }) }

// WithFailMode sets the answer when the daemon does not answer in time: backend.FailOpen
// (the default: the daemon is a guard, and a worker should not stop because its guard
// did) allows, backend.FailClosed denies. The client has no local share: FailLocal is
// answered as FailClosed.
func WithFailMode(m backend.FailMode) Option {
	return optionFunc(func(c *Client) { c.failOpen = m == backend.FailOpen || m == backend.FailDefault })
}

// WithConns sets the number of pooled connections (default 2).
func WithConns(n int) Option {
	return optionFunc(func(c *Client) {
		if n > 0 {
			c.conns = make([]*pconn, n)
		}
	})
}

// WithBackoff sets the back-off after a failure: from min, doubling, up to max (default
// 100ms to 5s).
func WithBackoff(min, max time.Duration) Option {
	return optionFunc(func(c *Client) { c.minBackoff, c.maxBackoff = min, max })
}

// New returns a client for the daemon at addr: host:port, or a Unix socket path. It
// connects lazily.
func New(addr string, opts ...Option) *Client {
	c := &Client{network: "tcp", addr: addr, timeout: 50 * time.Millisecond, failOpen: true,
		minBackoff: 100 * time.Millisecond, maxBackoff: 5 * time.Second, conns: make([]*pconn, 2)}
	if strings.Contains(addr, "/") {
		c.network = "unix"
	}
	for _, o := range opts {
		o.apply(c)
	}
	for i := range c.conns {
		c.conns[i] = newPconn(c)
	}
	return c
}

// Failures returns the number of calls the daemon failed (answered by the fail mode).
func (c *Client) Failures() int64 { return c.failures.Load() }

// Close closes the connections; later calls return backend.ErrClosed.
func (c *Client) Close() error {
	c.closed.Store(true)
	for _, p := range c.conns {
		p.close(backend.ErrClosed)
	}
	return nil
}

// Answer is a daemon's answer to one query.
type Answer struct {
	Allowed    bool
	Delay      time.Duration // for a reservation: wait this long, then use the permits
	Remaining  int64
	RetryAfter time.Duration
	ResetAfter time.Duration
	// Failed reports that the daemon did not answer: Allowed is the fail mode's answer,
	// and RetryAfter how long until the client asks the daemon again (its back-off).
	Failed bool
	// Why says what decided where no limit did, as the daemon tells it: "no-rule" (no rule
	// matches the tag: allowed, not limited), "unlimited", "deny" (the tag's rule), or
	// "down" (the daemon's back end could not decide: its fail mode answered); "" for a
	// limit's decision, and from a daemon older than this field.
	Why string
}

// Allow asks the daemon's first question, "serve or throttle?", for tag: one permit, now,
// in the plain protocol. When the daemon fails it answers by the fail mode.
func (c *Client) Allow(ctx context.Context, tag string) bool {
	if !wire.ValidTag(tag) {
		return false // the daemon refuses such a tag
	}
	resp, err := c.ask(ctx, wire.Query{Tag: []byte(tag), N: 1, Priority: int8(priority.Of(ctx))})
	if err != nil {
		return c.failOpen
	}
	return bytes.Equal(resp, []byte("OK"))
}

// Query asks for n permits for tag, now or (maxWait > 0) reserved up to maxWait ahead,
// with the details of the decision. When the daemon fails, the answer is the fail mode's
// (Failed set) and the error wraps backend.ErrUnavailable; when ctx ends first, the error
// is ctx's (the daemon is not held to have failed).
func (c *Client) Query(ctx context.Context, tag string, n int64, maxWait time.Duration) (Answer, error) {
	if !wire.ValidTag(tag) {
		return Answer{}, fmt.Errorf("%w: %q", ErrInvalidTag, tag)
	}
	if n < 0 || n > wire.MaxN {
		return Answer{}, fmt.Errorf("sluice client: %d permits: want 0 to %d", n, int64(wire.MaxN))
	}
	q := wire.Query{Tag: []byte(tag), N: n, Verbose: true, Priority: int8(priority.Of(ctx))}
	if maxWait > 0 {
		maxWait = min(maxWait, wire.MaxWaitMs*time.Millisecond) // the protocol's bound
		q.WaitMs = int64((maxWait + time.Millisecond - 1) / time.Millisecond)
	}
	resp, err := c.ask(ctx, q)
	if errors.Is(err, backend.ErrClosed) {
		return Answer{}, err
	}
	if err != nil {
		return Answer{Allowed: c.failOpen, Failed: true, RetryAfter: c.retryAfter()}, err
	}
	a, err := wire.ParseAnswer(resp)
	if err != nil {
		return Answer{}, fmt.Errorf("sluice client: %w", err)
	}
	return Answer{Allowed: a.Allowed, Delay: ms(max(a.DelayMs, 0)), Remaining: a.Remaining,
		RetryAfter: ms(a.RetryMs), ResetAfter: ms(a.ResetMs), Why: a.Why}, nil
}

func ms(x int64) time.Duration { return time.Duration(x) * time.Millisecond }

// ask sends q, with its class unless the daemon was found not to read classes: a daemon of
// a release before them refuses the option ("ER bad options"), and the query goes again
// without it, as every later one does (its calls are then all standard there, as they
// were before; upgrading the daemon and restarting the client gives them their classes).
// Without this, an application upgraded before its daemon had every call that names a
// class refused.
func (c *Client) ask(ctx context.Context, q wire.Query) ([]byte, error) {
	if q.Priority != 0 && c.classless.Load() {
		q.Priority = 0
	}
	resp, err := c.roundTrip(ctx, wire.AppendQuery(nil, q))
	if err == nil && q.Priority != 0 && bytes.HasPrefix(resp, []byte("ER bad options")) {
		c.classless.Store(true)
		q.Priority = 0
		resp, err = c.roundTrip(ctx, wire.AppendQuery(nil, q))
	}
	return resp, err
}

// Penalize holds tag back for d at the daemon (a worker's 429 with Retry-After).
func (c *Client) Penalize(ctx context.Context, tag string, d time.Duration) error {
	if !wire.ValidTag(tag) {
		return fmt.Errorf("%w: %q", ErrInvalidTag, tag)
	}
	pms := min(int64((d+time.Millisecond-1)/time.Millisecond), wire.MaxPenaltyMs)
	if pms <= 0 {
		return nil
	}
	resp, err := c.roundTrip(ctx, wire.AppendQuery(nil, wire.Query{Tag: []byte(tag), N: 1, PenaltyMs: pms}))
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(resp, []byte("OK")) {
		return fmt.Errorf("sluice client: penalize: %s", resp)
	}
	return nil
}

// ReportExpired tells the daemon that n permits reserved for tag (w=) were not used
// because they came too late (sluice.ErrPermitExpired): the daemon counts them in
// sluice_permits_expired_total. It gives nothing back. A limiter over Backend calls it
// by itself.
func (c *Client) ReportExpired(ctx context.Context, tag string, n int64) error {
	if !wire.ValidTag(tag) {
		return fmt.Errorf("%w: %q", ErrInvalidTag, tag)
	}
	if n <= 0 {
		return nil
	}
	resp, err := c.roundTrip(ctx, wire.AppendQuery(nil, wire.Query{Tag: []byte(tag), N: min(n, wire.MaxN), Expired: true}))
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(resp, []byte("OK")) {
		return fmt.Errorf("sluice client: report expired permits: %s", resp)
	}
	return nil
}

// roundTrip sends one query line and returns its answer line (without '\n'), applying the
// time-out and the back-off.
func (c *Client) roundTrip(ctx context.Context, line []byte) ([]byte, error) {
	if c.closed.Load() {
		return nil, backend.ErrClosed
	}
	if until := c.downUntil.Load(); until != 0 && time.Now().UnixNano() < until {
		return nil, backend.ErrUnavailable
	} else if until != 0 && !c.probing.CompareAndSwap(false, true) {
		return nil, backend.ErrUnavailable // another call is probing
	}
	ctx, cancel := context.WithTimeoutCause(ctx, c.timeout, errSlow)
	defer cancel()
	p := c.conns[int(c.next.Add(1))%len(c.conns)]
	resp, err := p.do(ctx, line)
	if err != nil && ctx.Err() != nil && context.Cause(ctx) != errSlow {
		// The caller gave up (its context ended): not the daemon's failure.
		if until := c.downUntil.Load(); until != 0 {
			c.probing.Store(false)
		}
		return nil, err
	}
	if err != nil {
		c.failures.Add(1)
		b := min(max(2*c.backoff.Load(), int64(c.minBackoff)), int64(c.maxBackoff))
		c.backoff.Store(b)
		c.downUntil.Store(time.Now().UnixNano() + b)
		c.probing.Store(false)
		return nil, fmt.Errorf("%w: daemon: %v", backend.ErrUnavailable, err)
	}
	if c.downUntil.Load() != 0 {
		c.downUntil.Store(0)
		c.backoff.Store(0)
		c.probing.Store(false)
	}
	return resp, nil
}

// retryAfter is how long until the client asks the daemon again after a failure: the
// back-off left, at least the shortest one.
func (c *Client) retryAfter() time.Duration {
	left := time.Duration(c.downUntil.Load() - time.Now().UnixNano())
	return max(left, c.minBackoff)
}

// errSlow is the cause of a call's context ending at the client's time-out.
var errSlow = errors.New("no answer within the time-out")

// pconn is one pipelined connection. Writers take the write token (a channel, so that a
// caller waiting for it gives up at its own deadline), join the queue of pending calls
// under mu and write their query; one reader goroutine per connection hands the answers
// out in order. No I/O happens under mu, and no call waits for a reader to exit: a
// connection that failed or timed out is closed and left to its reader, which returns at
// once; Client.Close waits for every reader.
type pconn struct {
	cl      *Client
	wtok    chan struct{} // the write token: held while dialling and writing
	mu      sync.Mutex
	c       net.Conn
	w       *bufio.Writer
	pending []*call
	gen     int
	closed  bool
	readers sync.WaitGroup // Add under mu and only while !closed; Wait after closed is set
}

type call struct {
	done chan struct{}
	gen  int // the connection it was sent on
	resp []byte
	err  error
}

func newPconn(cl *Client) *pconn { return &pconn{cl: cl, wtok: make(chan struct{}, 1)} }

func (p *pconn) do(ctx context.Context, line []byte) ([]byte, error) {
	select {
	case p.wtok <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	cl, err := p.send(ctx, line)
	<-p.wtok
	if err != nil {
		return nil, err
	}
	select {
	case <-cl.done:
		return cl.resp, cl.err
	case <-ctx.Done():
		// The answer will come, late, to a call nobody waits for. A daemon slower than
		// the time-out is not trusted with the next queries: start over on a fresh
		// connection. A caller that gave up leaves the connection to the others.
		if context.Cause(ctx) == errSlow {
			p.fail(cl.gen, errSlow)
		}
		return nil, ctx.Err()
	}
}

// send queues and writes one query; the write token is held.
func (p *pconn) send(ctx context.Context, line []byte) (*call, error) {
	p.mu.Lock()
	c, w, gen, closed := p.c, p.w, p.gen, p.closed
	p.mu.Unlock()
	if closed {
		return nil, backend.ErrClosed
	}
	if c == nil {
		var d net.Dialer
		nc, err := d.DialContext(ctx, p.cl.network, p.cl.addr)
		if err != nil {
			return nil, err
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			nc.Close()
			return nil, backend.ErrClosed
		}
		p.gen++
		p.c, p.w, gen = nc, bufio.NewWriter(nc), p.gen
		c, w = p.c, p.w
		p.readers.Add(1)
		go p.read(nc, gen)
		p.mu.Unlock()
	}
	cl := &call{done: make(chan struct{}), gen: gen}
	p.mu.Lock()
	if p.gen != gen { // the connection failed meanwhile
		p.mu.Unlock()
		return nil, errors.New("connection lost")
	}
	p.pending = append(p.pending, cl)
	p.mu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		c.SetWriteDeadline(dl)
	}
	_, err := w.Write(line)
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		p.fail(gen, err)
		return nil, err
	}
	return cl, nil
}

// read hands answers to the pending calls in order until the connection fails.
func (p *pconn) read(c net.Conn, gen int) {
	defer p.readers.Done()
	r := bufio.NewReaderSize(c, 4096)
	for {
		line, err := r.ReadSlice('\n')
		p.mu.Lock()
		if p.gen != gen {
			p.mu.Unlock()
			return
		}
		if err != nil {
			p.failLocked(err)
			p.mu.Unlock()
			return
		}
		if len(p.pending) == 0 {
			p.failLocked(errors.New("an answer to no query"))
			p.mu.Unlock()
			return
		}
		cl := p.pending[0]
		p.pending[0] = nil
		p.pending = p.pending[1:]
		p.mu.Unlock()
		cl.resp = append([]byte(nil), line[:len(line)-1]...)
		close(cl.done)
	}
}

// fail drops connection gen (if it is still the current one) and fails its pending calls.
func (p *pconn) fail(gen int, err error) {
	p.mu.Lock()
	if p.gen == gen {
		p.failLocked(err)
	}
	p.mu.Unlock()
}

// failLocked fails every pending call and drops the connection; p.mu is held.
func (p *pconn) failLocked(err error) {
	for _, cl := range p.pending {
		cl.err = err
		close(cl.done)
	}
	p.pending = nil
	if p.c != nil {
		p.c.Close()
		p.c, p.w = nil, nil
		p.gen++
	}
}

// close fails every pending call, closes the connection for good and waits for its
// reader to return.
func (p *pconn) close(err error) {
	p.mu.Lock()
	p.closed = true
	p.failLocked(err)
	p.mu.Unlock()
	p.readers.Wait()
}

// --- the sluice.Limiter adapter ---

// Backend adapts the client to sluice.WithBackend. The key is sent as the tag, and the
// daemon's rules decide, whatever limits the limiter was built with (those only bound the
// cost of one request). Reservations travel as the protocol's w= option, and Penalize as
// p=. Settling or cancelling a reservation is not carried: it returns
// backend.ErrUnsupported, and the permits stay taken. Permits a limiter finds expired are
// reported (ReportExpired) for the daemon's count. When the daemon fails, decisions are
// the client's fail mode's, with no error. Closing the backend closes the client, and
// later calls return backend.ErrClosed.
func (c *Client) Backend() backend.Backend { return clientBackend{c} }

type clientBackend struct{ c *Client }

// Capabilities reports that every process asking the daemon shares each key's line there,
// and that the daemon keeps the higher classes' headroom from the class each query
// carries (backend.Capable).
func (clientBackend) Capabilities() backend.Capabilities {
	return backend.Capabilities{SharedLine: true, Classes: true}
}

func (b clientBackend) Decide(ctx context.Context, key string, req backend.Request) (backend.Grant, error) {
	a, err := b.c.Query(ctx, key, req.N, req.MaxDelay)
	if err != nil && !a.Failed {
		return backend.Grant{}, err
	}
	g := backend.Grant{Result: gcra.Result{
		Allowed:    a.Allowed,
		Delay:      int64(a.Delay),
		Remaining:  a.Remaining,
		RetryAfter: int64(a.RetryAfter),
		ResetAfter: int64(a.ResetAfter),
	}}
	g.Ticket.N = req.N
	return g, nil
}

func (b clientBackend) Adjust(context.Context, string, []gcra.Limit, gcra.Ticket, int64) error {
	if b.c.closed.Load() {
		return backend.ErrClosed
	}
	return backend.ErrUnsupported
}

func (b clientBackend) Penalize(ctx context.Context, key string, _ []gcra.Limit, d time.Duration) error {
	return b.c.Penalize(ctx, key, d)
}

func (b clientBackend) ReportExpired(ctx context.Context, key string, n int64) error {
	return b.c.ReportExpired(ctx, key, n)
}

var _ backend.ExpiryReporter = clientBackend{}

// Close closes the client: later calls return backend.ErrClosed.
func (b clientBackend) Close() error { return b.c.Close() }
