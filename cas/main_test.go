package cas

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/zktest"
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
// needs each (a second or two each) and stopped when the package's tests end.
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

// etcdClient returns a client of the shared etcd, closed after the test.
func etcdClient(t testing.TB) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{sharedEtcd(t).Addr()}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// zkConn returns a connection to the shared ZooKeeper, closed after the test, once it has
// a session. A client that has none within 10 s is closed and another made: right after
// the server's start on the loaded machine, a first client once failed to connect for 15
// s (zk: could not connect to a server) while the next ones connected at once.
func zkConn(t testing.TB) *zk.Conn {
	t.Helper()
	addr := sharedZK(t).Addr()
	var last error
	for range 3 {
		c, _, err := zk.Connect([]string{addr}, 4*time.Second, zk.WithLogger(quietZK{}))
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

type quietZK struct{}

func (quietZK) Printf(string, ...any) {}

var prefixes atomic.Int64

// unique returns a name unique to this run of the package, for a store's prefix or path.
func unique(name string) string {
	return fmt.Sprintf("%s%d-%d", name, time.Now().UnixNano(), prefixes.Add(1))
}
