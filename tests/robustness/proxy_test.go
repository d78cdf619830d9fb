package robustness

import (
	"bufio"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// echoServer answers each line with itself on a free loopback port until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := c.Write(append(sc.Bytes(), '\n')); err != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}

// roundTrip sends a line through a new connection to addr and reads it back within d.
func roundTrip(addr string, d time.Duration) (time.Duration, error) {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(start.Add(d))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return 0, err
	}
	if line != "ping\n" {
		return 0, errors.New("echo: " + line)
	}
	return time.Since(start), nil
}

// TestNetFaults: each toxic the schedule uses does to real traffic through the proxy what
// its name says, and is gone once removed.
func TestNetFaults(t *testing.T) {
	n := NewNet()
	defer n.Close()
	addr, err := n.Proxy("m0", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(addr, 2*time.Second); err != nil {
		t.Fatalf("clean link: %v", err)
	}
	// Latency: 150 ms each way, so a round trip takes at least 300 ms (a lower bound on
	// the injected delay, not a speed claim).
	if err := n.AddToxic("m0", "lat-d", "latency", "downstream", map[string]int{"latency": 150}); err != nil {
		t.Fatal(err)
	}
	if err := n.AddToxic("m0", "lat-u", "latency", "upstream", map[string]int{"latency": 150}); err != nil {
		t.Fatal(err)
	}
	if d, err := roundTrip(addr, 5*time.Second); err != nil || d < 300*time.Millisecond {
		t.Errorf("latency 150 ms each way: round trip %v, %v; want at least 300 ms", d, err)
	}
	n.RemoveToxic("m0", "lat-d")
	n.RemoveToxic("m0", "lat-u")
	// Black hole: nothing comes back, the connection stays open.
	if err := n.AddToxic("m0", "bh", "timeout", "upstream", map[string]int{"timeout": 0}); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(addr, 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("black hole: %v, want a time-out", err)
	}
	n.RemoveToxic("m0", "bh")
	// Reset: the connection is reset.
	if err := n.AddToxic("m0", "rst", "reset_peer", "upstream", map[string]int{"timeout": 0}); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(addr, 2*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("reset_peer: %v, want the connection reset", err)
	}
	n.RemoveToxic("m0", "rst")
	// Down: connections refused; up again: answered.
	if err := n.Down("m0"); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(addr, time.Second); err == nil {
		t.Error("proxy down: a round trip went through")
	}
	if err := n.Up("m0"); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(addr, 2*time.Second); err != nil {
		t.Errorf("proxy up again, toxics removed: %v", err)
	}
	if err := n.AddToxic("nope", "x", "latency", "upstream", nil); err == nil {
		t.Error("a toxic on an unknown proxy: no error")
	}
	if err := n.AddToxic("m0", "x", "no_such_toxic", "upstream", nil); err == nil {
		t.Error("an unknown toxic: no error")
	}
}
