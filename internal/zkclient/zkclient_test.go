package zkclient

import (
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/testkit/zktest"
)

// TestCloseEndsAConnectionAttempt: a client connecting to a ZooKeeper that accepted the
// connection but does not answer (paused) has no goroutine left once Close returns (and
// goleak's retries, about a second, have passed): zk.Conn.Close alone leaves its connect
// request's read waiting up to 26.7 s.
func TestCloseEndsAConnectionAttempt(t *testing.T) {
	s := zktest.New(t)
	ignore := goleak.IgnoreCurrent()
	s.Pause()
	defer s.Resume()
	c, _, err := Connect([]string{s.Addr()}, 4*time.Second, zktest.Quiet{})
	if err != nil {
		t.Fatal(err)
	}
	// Wait until the client has dialled: its connect request is then waiting for an
	// answer that does not come.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c.mu.Lock()
		n := len(c.conns)
		c.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the client did not dial within 10 s")
		}
	}
	c.Close()
	if err := goleak.Find(ignore); err != nil {
		t.Fatalf("a goroutine of the client is left after Close: %v", err)
	}
}

// TestUnansweredConnectIsTriedAgain: a connect request that a paused ZooKeeper accepted
// but does not answer (as one still starting after a restart on a loaded machine) is
// given up after the session time-out and made again on a new connection, not after
// go-zookeeper's ten receive time-outs (13.3 s at this 2 s session); once the server
// answers again the client has a session.
func TestUnansweredConnectIsTriedAgain(t *testing.T) {
	s := zktest.New(t)
	s.Pause()
	resumed := false
	defer func() {
		if !resumed {
			s.Resume()
		}
	}()
	c, events, err := Connect([]string{s.Addr()}, 2*time.Second, zktest.Quiet{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	session := make(chan struct{})
	go func() {
		once := session
		for e := range events {
			if e.State == zk.StateHasSession && once != nil {
				close(once)
				once = nil
			}
		}
	}()
	start := time.Now()
	for c.dials.Load() < 2 {
		if time.Since(start) > 8*time.Second {
			t.Fatalf("one connection in %v: the unanswered connect request was not given up", time.Since(start))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("the connect request given up and made again after %v", time.Since(start))
	s.Resume()
	resumed = true
	select {
	case <-session:
	case <-time.After(20 * time.Second):
		t.Fatal("no session within 20 s of the server's return")
	}
}
