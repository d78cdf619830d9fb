// Package zkclient connects a ZooKeeper client (github.com/go-zookeeper/zk) whose Close
// ends everything the client started. zk.Conn.Close does not interrupt a connection
// attempt waiting for the server's answer to its connect request, which waits up to ten
// receive time-outs (26.7 s for a 4 s session): a client closed while its server hung or
// restarted left that goroutine running long after Close (seen in the robustness suite,
// seed 8016: every lease member's after ZooKeeper was restarted near its run's end).
// Connect's client also closes, on Close, the connections it dialled.
package zkclient

import (
	"net"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
)

// Conn is a ZooKeeper client whose Close also closes its connections. Its methods are
// zk.Conn's, safe for concurrent use.
type Conn struct {
	*zk.Conn
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// Connect connects to the ensemble servers as zk.Connect does (sessionTimeout, log to
// logger), through a dialer that keeps the connections for Close.
func Connect(servers []string, sessionTimeout time.Duration, logger zk.Logger) (*Conn, <-chan zk.Event, error) {
	c := &Conn{conns: map[net.Conn]struct{}{}}
	zc, events, err := zk.Connect(servers, sessionTimeout, zk.WithLogger(logger), zk.WithDialer(c.dial))
	if err != nil {
		return nil, nil, err
	}
	c.Conn = zc
	return c, events, nil
}

func (c *Conn) dial(network, address string, timeout time.Duration) (net.Conn, error) {
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

func (t *tracked) Close() error {
	t.c.mu.Lock()
	delete(t.c.conns, t.Conn)
	t.c.mu.Unlock()
	return t.Conn.Close()
}
