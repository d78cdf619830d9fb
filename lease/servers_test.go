package lease

import (
	"sync"
	"testing"
	"time"

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
