package cas

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/testkit/etcdtest"
	"github.com/sluicehq/sluice/internal/testkit/proctest"
	"github.com/sluicehq/sluice/internal/testkit/zktest"
)

// TestMain makes the test binary a worker process of the multi-process tests when
// workerEnv is set, and otherwise fails the package if a test leaves a goroutine behind,
// after stopping the etcd and ZooKeeper the tests shared.
func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		os.Exit(workerMain())
	}
	goleak.VerifyTestMain(withShared{m})
}

type withShared struct{ m *testing.M }

func (w withShared) Run() int {
	defer closeShared()
	return w.m.Run()
}

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

// etcdClient returns a client of the shared etcd, closed after the test.
func etcdClient(t testing.TB) *clientv3.Client { return etcdtest.Client(t, sharedEtcd(t).Addr()) }

// zkConn returns a connection to the shared ZooKeeper, closed after the test, once it has
// a session.
func zkConn(t testing.TB) *zk.Conn { return zktest.Conn(t, sharedZK(t).Addr()) }

var prefixes atomic.Int64

// unique returns a name unique to this run of the package, for a store's prefix or path.
func unique(name string) string {
	return fmt.Sprintf("%s%d-%d", name, time.Now().UnixNano(), prefixes.Add(1))
}
