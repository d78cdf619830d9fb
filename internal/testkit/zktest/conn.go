package zktest

import (
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
)

// Conn returns a connection to the ZooKeeper at addr for the test, closed after it, once
// it has a session, its log dropped. A client that has none within 10 s is closed and
// another made: right after the server's start on a loaded machine, a first client once
// failed to connect for 15 s (zk: could not connect to a server) while the next ones
// connected at once.
func Conn(t testing.TB, addr string) *zk.Conn {
	t.Helper()
	var last error
	for range 3 {
		c, _, err := zk.Connect([]string{addr}, 4*time.Second, zk.WithLogger(Quiet{}))
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if _, _, last = c.Exists("/"); last == nil {
				t.Cleanup(c.Close)
				return c
			}
		}
		t.Logf("ZooKeeper did not answer a client for 10 s (%v): another client", last)
		c.Close()
	}
	t.Fatalf("ZooKeeper did not answer three clients for 10 s each: %v", last)
	return nil
}

// Quiet is a ZooKeeper client logger that drops everything (reconnections, which the
// tests cause).
type Quiet struct{}

// Printf drops the line.
func (Quiet) Printf(string, ...any) {}
