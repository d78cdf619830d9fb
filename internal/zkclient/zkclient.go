// Package zkclient connects a ZooKeeper client (github.com/go-zookeeper/zk) whose Close
// ends everything the client started, and which gives up an unanswered connect request
// as ZooKeeper's own client does.
//
// go-zookeeper waits for the server's answer to its connect request up to ten receive
// time-outs (26.7 s for a 4 s session), and zk.Conn.Close does not interrupt that wait.
// A client closed while its server hung or restarted left that goroutine running long
// after Close (seen in the robustness suite, seed 8016: every lease member's after
// ZooKeeper was restarted near its run's end): Connect's client also closes, on Close,
// the connections it dialled. And a client whose request reached a server that accepted
// the connection but did not answer (one still starting after a restart on a loaded
// machine, or stalled) waited all that time before trying again: the lease members
// through ZooKeeper got no lease for 27 s after such a restart (lease's
// TestMultiProcessOnEtcdAndZK, under two test runs at once). No deadline on a connection
// of Connect's client lies more than the session time-out ahead, so an unanswered
// connect request is given up after it and made again on a new connection, as the Java
// client moves on after the session time-out divided among the servers; the receive
// time-out of an established session (two thirds of the session time-out) is unchanged.
package zkclient

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
)

// Conn is a ZooKeeper client whose Close also closes its connections. Its methods are
// zk.Conn's, safe for concurrent use.
type Conn struct {
	*zk.Conn
	wait   time.Duration // the session time-out: the furthest a deadline may lie ahead
	dials  atomic.Int64  // connections dialled
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// Connect connects to the ensemble servers as zk.Connect does (sessionTimeout, log to
// logger), through a dialer that keeps the connections for Close.
func Connect(servers []string, sessionTimeout time.Duration, logger zk.Logger) (*Conn, <-chan zk.Event, error) {
	c := &Conn{wait: sessionTimeout, conns: map[net.Conn]struct{}{}}
	zc, events, err := zk.Connect(servers, sessionTimeout, zk.WithLogger(logger), zk.WithDialer(c.dial))
	if err != nil {
		return nil, nil, err
	}
	c.Conn = zc
	return c, events, nil
}

func (c *Conn) dial(network, address string, timeout time.Duration) (net.Conn, error) {
	c.dials.Add(1)
	nc, err := net.DialTimeout(network, address, timeout)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		nc.Close()
		return nil, net.ErrClosed
	}
	c.conns[nc] = struct{}{}
	return &tracked{Conn: nc, c: c}, nil
}

// Close closes the client (zk.Conn.Close: its session ends, waiting up to a second for
// the server's answer), then every connection it dialled, so that a connection attempt
// waiting for an answer ends too.
func (c *Conn) Close() {
	c.Conn.Close()
	c.mu.Lock()
	c.closed = true
	conns := c.conns
	c.conns = nil
	c.mu.Unlock()
	for nc := range conns {
		nc.Close()
	}
}

// tracked is a dialled connection, forgotten by its Conn when closed.
type tracked struct {
	net.Conn
	c *Conn
}

// clamp returns d, or the session time-out from now if d lies further ahead. The zero
// time (no deadline) stays as it is.
func (t *tracked) clamp(d time.Time) time.Time {
	if d.IsZero() {
		return d
	}
	if limit := time.Now().Add(t.c.wait); d.After(limit) {
		return limit
	}
	return d
}

func (t *tracked) SetDeadline(d time.Time) error      { return t.Conn.SetDeadline(t.clamp(d)) }
func (t *tracked) SetReadDeadline(d time.Time) error  { return t.Conn.SetReadDeadline(t.clamp(d)) }
func (t *tracked) SetWriteDeadline(d time.Time) error { return t.Conn.SetWriteDeadline(t.clamp(d)) }

func (t *tracked) Close() error {
	t.c.mu.Lock()
	delete(t.c.conns, t.Conn)
	t.c.mu.Unlock()
	return t.Conn.Close()
}
