package gossip

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/goleak"
)

// cutter is a test transport over the real one: it counts what goes through, and cuts
// this member's links to chosen addresses, or to every address while shut: datagrams to a
// cut address are lost and streams to it refused. Cutting a link at both ends (each
// member's cutter names the other) cuts it both ways.
type cutter struct {
	memberlist.NodeAwareTransport
	shut                   atomic.Bool
	sent, dialled, refused atomic.Int64
	mu                     sync.Mutex
	cut                    map[string]bool
}

func (c *cutter) set(addrs []string, on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut == nil {
		c.cut = map[string]bool{}
	}
	for _, a := range addrs {
		c.cut[a] = on
	}
}

func (c *cutter) isCut(addr string) bool {
	if c.shut.Load() {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cut[addr]
}

func (c *cutter) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if c.isCut(a.Addr) {
		return time.Now(), nil // lost on the way, as a datagram may be
	}
	c.sent.Add(1)
	return c.NodeAwareTransport.WriteToAddress(b, a)
}

func (c *cutter) WriteTo(b []byte, addr string) (time.Time, error) {
	return c.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (c *cutter) DialAddressTimeout(a memberlist.Address, d time.Duration) (net.Conn, error) {
	if c.isCut(a.Addr) {
		c.refused.Add(1)
		return nil, errors.New("link cut")
	}
	c.dialled.Add(1)
	return c.NodeAwareTransport.DialAddressTimeout(a, d)
}

func (c *cutter) DialTimeout(addr string, d time.Duration) (net.Conn, error) {
	return c.DialAddressTimeout(memberlist.Address{Addr: addr}, d)
}

// TestWrapTransport: a member's traffic goes through Config.WrapTransport's transport,
// over the real UDP and TCP underneath. Through an open gate it joins its peer and they
// exchange reports. Through a shut one it cannot join, at New or when it retries. Close
// shuts the transport down (the package's leak check would see its listeners' goroutines
// otherwise).
func TestWrapTransport(t *testing.T) {
	if testing.Short() {
		t.Skip("real time")
	}
	ignore := goleak.IgnoreCurrent()
	a := member(t, nil)
	g := &cutter{}
	var wrapped int
	b := member(t, func(c *Config) {
		c.Peers = []string{a.Addr()}
		c.WrapTransport = func(nt memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
			wrapped++
			g.NodeAwareTransport = nt
			return g
		}
	})
	if wrapped != 1 {
		t.Fatalf("WrapTransport called %d times, want 1", wrapped)
	}
	if _, port, _ := net.SplitHostPort(b.Addr()); port == "0" {
		t.Fatalf("b advertises %s: want the port its wrapped transport bound", b.Addr())
	}
	waitFor(t, "a and b joined through the wrapped transport", func() bool {
		return a.ml.NumMembers() == 2 && b.ml.NumMembers() == 2
	})
	waitFor(t, "a hears b's reports", func() bool { return a.stats.msgsRecv.Load() > 0 })
	if g.sent.Load() == 0 || g.dialled.Load() == 0 {
		t.Fatalf("through the gate: %d datagrams, %d streams; want both (join is a stream, probes and reports datagrams)", g.sent.Load(), g.dialled.Load())
	}

	shut := &cutter{}
	shut.shut.Store(true)
	cfg := DefaultConfig()
	cfg.Bind, cfg.Peers = "127.0.0.1:0", []string{a.Addr()}
	cfg.WrapTransport = func(nt memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
		shut.NodeAwareTransport = nt
		return shut
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// Its join at New and its rejoin a second later (alone, it retries the seed list).
	waitFor(t, "c tries to join twice", func() bool { return shut.refused.Load() >= 2 })
	if n := c.ml.NumMembers(); n != 1 {
		t.Fatalf("a member behind a shut gate counts %d members, want 1 (alone)", n)
	}
	if n := a.ml.NumMembers(); n != 2 {
		t.Fatalf("a counts %d members with c behind a shut gate, want 2", n)
	}
	c.Close()
	b.Close()
	a.Close()
	// memberlist's Shutdown does not wait for a probe in flight: it ends at its time-out
	// (the probe interval, scaled up to 8 times when the member's health is low) and its
	// TCP fallback. Every goroutine of the test must have ended within 5 s.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		err := goleak.Find(ignore)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after Close: %v", err)
		}
	}
}
