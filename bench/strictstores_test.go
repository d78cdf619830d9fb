package bench

import (
	"context"
	"fmt"
	"io"
	"log"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/testkit/etcdtest"
	"github.com/sluicehq/sluice/internal/testkit/zktest"
	"github.com/sluicehq/sluice/store"
	etcdstore "github.com/sluicehq/sluice/store/etcd"
	redisstore "github.com/sluicehq/sluice/store/redis"
	zkstore "github.com/sluicehq/sluice/store/zk"
	"github.com/sluicehq/sluice/strict"
	"github.com/sluicehq/sluice/strict/cas"
)

// BenchmarkStrictStores: decisions per second of the strict mode on etcd and on ZooKeeper
// (package strict/cas: read, decide in Go, compare-and-set) beside the Redis script's (package
// strict: one Lua script), in the same run, one process, on one key and on 1,000 keys,
// from 1 and 8 goroutines. Every decision is a grant (the limit is far above the load), so
// every one writes: the worst case (a denial writes nothing). Run with -count 6 and
// compare with benchstat: the stores take turns within each count.
func BenchmarkStrictStores(b *testing.B) {
	redisAddr := startRedis(b)
	etcd, err := etcdtest.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer etcd.Close()
	zks, err := zktest.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer zks.Close()
	ls := []gcra.Limit{{T: 1000, Tau: 1000 * 1000}} // 1e6/s burst=1000: never denies here
	for _, nkeys := range []int{1, 1000} {
		for _, g := range []int{1, 8} {
			for _, kind := range []string{"redis", "etcd", "zk"} {
				b.Run(fmt.Sprintf("keys=%d/goroutines=%d/store=%s", nkeys, g, kind), func(b *testing.B) {
					be, done := strictBackend(b, kind, redisAddr, etcd.Addr(), zks.Addr())
					defer done()
					ks := keys(nkeys)
					runStrictDecisions(b, be, ls, ks, g)
				})
			}
		}
	}
}

// strictBackend opens the strict mode's backend on the store kind names, keys under a fresh prefix.
func strictBackend(b *testing.B, kind, redisAddr, etcdAddr, zkAddr string) (backend.Backend, func()) {
	prefix := fmt.Sprintf("bench%d", time.Now().UnixNano())
	switch kind {
	case "etcd":
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdAddr}, Logger: zap.NewNop()})
		if err != nil {
			b.Fatal(err)
		}
		be := cas.New(etcdstore.New(c, store.WithPrefix(prefix+"/")), cas.WithTimeout(10*time.Second))
		return be, func() { be.Close(); c.Close() }
	case "zk":
		c, _, err := zk.Connect([]string{zkAddr}, 4*time.Second, zk.WithLogger(log.New(io.Discard, "", 0)))
		if err != nil {
			b.Fatal(err)
		}
		be := cas.New(zkstore.New(c, store.WithPrefix("/"+prefix)), cas.WithTimeout(10*time.Second))
		return be, func() { be.Close(); c.Close() }
	}
	o, err := redisstore.ClientOptions("redis://"+redisAddr, 10*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	c := goredis.NewClient(o)
	be := strict.New(c, strict.WithPrefix(prefix+":"), strict.WithTimeout(10*time.Second))
	return be, func() { be.Close(); c.Close() }
}

// runStrictDecisions makes b.N decisions of one permit from g goroutines, each going round the
// keys from its own place, and reports decisions per second.
func runStrictDecisions(b *testing.B, be backend.Backend, ls []gcra.Limit, ks []string, g int) {
	ctx := context.Background()
	req := backend.Request{Limits: ls, N: 1}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	b.ResetTimer()
	start := time.Now()
	for w := range g {
		n := b.N / g
		if w < b.N%g {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				gr, err := be.Decide(ctx, ks[(w*7919+i)%len(ks)], req)
				if err == nil && !gr.Allowed {
					err = fmt.Errorf("denied under a limit far above the load")
				}
				if err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if failed != nil {
		b.Fatal(failed)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
}
