package lease

import (
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluicehq/sluice/internal/testkit/etcdtest"
	"github.com/sluicehq/sluice/internal/testkit/proctest"
	"github.com/sluicehq/sluice/internal/testkit/zktest"
)

// The package's tests share one etcd and one ZooKeeper, started by the first test that
// needs each (a second or two each) and stopped when the package's tests end (TestMain).
// A test that wipes or restarts one leaves it running.
var (
	sharedEtcdServer = proctest.Shared[*etcdtest.Server]{Start: etcdtest.Start}
	sharedZKServer   = proctest.Shared[*zktest.Server]{Start: zktest.Start}
)

// sharedEtcd returns the package's etcd, starting it at the first call.
func sharedEtcd(t testing.TB) *etcdtest.Server { return sharedEtcdServer.Get(t) }

// sharedZK returns the package's ZooKeeper, starting it at the first call.
func sharedZK(t testing.TB) *zktest.Server { return sharedZKServer.Get(t) }

// closeShared stops the shared servers.
func closeShared() {
	sharedEtcdServer.Close()
	sharedZKServer.Close()
}

// etcdClient returns a client of addr for the test, closed after it.
func etcdClient(t testing.TB, addr string) *clientv3.Client { return etcdtest.Client(t, addr) }

// zkClient returns a connection to addr for the test, closed after it, once it has a
// session.
func zkClient(t testing.TB, addr string) *zk.Conn { return zktest.Conn(t, addr) }

// zkSession waits until c answers (a ZooKeeper restarted or wiped: the client connects
// again, and takes a new session if the old one is gone; requests made before fail).
func zkSession(t testing.TB, c *zk.Conn) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, _, err := c.Exists("/")
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ZooKeeper did not answer for 15 s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// zkDeleteTree deletes the znode at root and every znode below it, if any.
func zkDeleteTree(t testing.TB, c *zk.Conn, root string) {
	t.Helper()
	kids, _, err := c.Children(root)
	if errors.Is(err, zk.ErrNoNode) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		zkDeleteTree(t, c, root+"/"+k)
	}
	if err := c.Delete(root, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
		t.Fatal(err)
	}
}
