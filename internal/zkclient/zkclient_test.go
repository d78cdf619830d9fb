package zkclient

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/zktest"
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
