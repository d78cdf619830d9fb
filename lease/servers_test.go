package lease

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/zktest"
)

// The package's tests share one etcd and one ZooKeeper, started by the first test that
// needs each and stopped when the package's tests end (TestMain): each takes a second or
// two to start. A test that wipes or restarts one leaves it running.
var shared struct {
	mu   sync.Mutex
	etcd *etcdtest.Server
	zk   *zktest.Server
}

// sharedEtcd returns the package's etcd, starting it at the first call. It fails the test
// if etcd cannot be started (not installed: the message names the package).
func sharedEtcd(t testing.TB) *etcdtest.Server {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.etcd == nil {
		s, err := etcdtest.Start()
		if err != nil {
			t.Fatal(err)
		}
		shared.etcd = s
	}
	return shared.etcd
}

// sharedZK returns the package's ZooKeeper, starting it at the first call.
func sharedZK(t testing.TB) *zktest.Server {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.zk == nil {
		s, err := zktest.Start()
		if err != nil {
			t.Fatal(err)
		}
		shared.zk = s
	}
	return shared.zk
}

// closeShared stops the shared servers.
func closeShared() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.etcd != nil {
		shared.etcd.Close()
	}
	if shared.zk != nil {
		shared.zk.Close()
	}
}

// etcdClient returns a client of addr for the test, closed after it.
func etcdClient(t testing.TB, addr string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// zkClient returns a connection to addr for the test, closed after it, once it has a
// session.
func zkClient(t testing.TB, addr string) *zk.Conn {
	t.Helper()
	c, _, err := zk.Connect([]string{addr}, 4*time.Second, zk.WithLogger(quietZK{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	zkSession(t, c)
	return c
}

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

// quietZK drops the ZooKeeper client's log (reconnections, which the tests cause).
type quietZK struct{}

func (quietZK) Printf(string, ...any) {}

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
