package strict

// How a batch's commands reach Redis: on a connection the backend holds (conns, for a
// client it made itself) or through the client, in one pipeline or one by one.

import (
	"context"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/clock"
)

// send sends cmds on a connection of the pipeliner's own (see conns) or through the
// client.
func (p *pipeliner) send(ctx context.Context, cmds []goredis.Cmder) error {
	if p.conns == nil {
		return send(ctx, p.client, cmds)
	}
	cn := p.conns.get()
	err := send(ctx, cn, cmds)
	p.conns.put(cn, err)
	return err
}

// conns are connections held from a client the backend made itself (Open, Dial), each
// used by one batch at a time. A command sent on one skips the health check that go-redis
// runs each time its pool hands out a connection. A connection whose command failed in
// any way is given back to the pool (go-redis drops it if it is broken) and replaced. So
// is one idle for longer than connIdle, which the pool's check then looks at. A caller's
// client is not used this way, so that the hooks it added (tracing, metrics) still run.
// docs/strict.md, "Throughput: batches" ("The lean path"), says what the check costs.
type conns struct {
	client *goredis.Client
	mu     sync.Mutex
	free   []heldConn
	closed bool
}

// heldConn is a free connection and when it was last used (clock.Default's Nanotime).
type heldConn struct {
	cn   *goredis.Conn
	used int64
}

// connIdle is how long a held connection may sit idle and still be used without the
// pool's health check: half of Redis' shortest idle timeout (1 s).
const connIdle = 500 * time.Millisecond

func (cs *conns) get() *goredis.Conn {
	cs.mu.Lock()
	if n := len(cs.free); n > 0 {
		h := cs.free[n-1]
		cs.free[n-1] = heldConn{}
		cs.free = cs.free[:n-1]
		cs.mu.Unlock()
		if clock.Default.Nanotime()-h.used <= int64(connIdle) {
			return h.cn
		}
		_ = h.cn.Close() // back to the pool, which checks it before handing it out again
		return cs.client.Conn()
	}
	cs.mu.Unlock()
	return cs.client.Conn()
}

// put takes cn back after a send that ended with err: kept for the next batch if the
// send succeeded, else given back to the client's pool.
func (cs *conns) put(cn *goredis.Conn, err error) {
	cs.mu.Lock()
	if err == nil && !cs.closed {
		cs.free = append(cs.free, heldConn{cn: cn, used: clock.Default.Nanotime()})
		cs.mu.Unlock()
		return
	}
	cs.mu.Unlock()
	_ = cn.Close()
}

// close gives every connection back to the client's pool.
func (cs *conns) close() {
	cs.mu.Lock()
	free := cs.free
	cs.free, cs.closed = nil, true
	cs.mu.Unlock()
	for _, h := range free {
		_ = h.cn.Close()
	}
}

// processor is a client that sends one command by itself (go-redis clients do): cheaper
// than a pipeline of one.
type processor interface {
	Process(ctx context.Context, cmd goredis.Cmder) error
}

// send sends cmds, in one pipeline or, for a lone one, by itself. The error is the
// pipeline's (see replyErr); each command carries its own.
func send(ctx context.Context, client Client, cmds []goredis.Cmder) error {
	if len(cmds) == 1 {
		if pr, ok := client.(processor); ok {
			return pr.Process(ctx, cmds[0])
		}
	}
	pipe := client.Pipeline()
	for _, c := range cmds {
		_ = pipe.Process(ctx, c)
	}
	_, err := pipe.Exec(ctx)
	return err
}
