package cas

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/priority"
	"github.com/sluicehq/sluice/store"
	etcdstore "github.com/sluicehq/sluice/store/etcd"
	zkstore "github.com/sluicehq/sluice/store/zk"
)

// processStores are the stores a test of several processes runs on, at the store's own
// time: name and a maker of a shared store's processes, which returns a maker of one
// process's store (on a client of its own, but for memory's one store in this process).
func processStores() []struct {
	name string
	make func(t *testing.T) func() store.Store
} {
	return []struct {
		name string
		make func(t *testing.T) func() store.Store
	}{
		{"memory", func(t *testing.T) func() store.Store {
			m := store.NewMemory(nil)
			return func() store.Store { return m }
		}},
		{"etcd", func(t *testing.T) func() store.Store {
			path := unique("/classes")
			return func() store.Store { return etcdstore.New(etcdClient(t), store.WithPrefix(path+"/")) }
		}},
		{"zk", func(t *testing.T) func() store.Store {
			path := unique("/classes")
			return func() store.Store { return zkstore.New(zkConn(t), store.WithPrefix(path)) }
		}},
	}
}

// TestClassesAcrossProcesses: two processes share a key's line in etcd, in ZooKeeper and
// in a Memory (each a limiter on a backend and a store of its own, sharing the line by
// process, sluice.FairProcesses). While a critical caller asks in one, five times a
// second, the other's sheddable waiters take their places in the line keeping the
// sheddable headroom (40% of the burst), so the critical caller's Allow finds permits
// left while the flood holds the line. Without a board of classes the flood's places keep
// nothing and nearly every critical Allow is refused.
func TestClassesAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("real time: not in -short")
	}
	for _, s := range processStores() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel() // each store its own server
			process := s.make(t)
			lims := make([]*sluice.Limiter, 2)
			for i := range lims {
				b := New(process(), WithTimeout(2*time.Second))
				t.Cleanup(func() { b.Close() })
				lims[i] = sluice.MustNew(sluice.MustParse("10/s burst=10"), sluice.WithBackend(b))
				t.Cleanup(func() { lims[i].Close() })
			}
			ctx, stop := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer func() { stop(); wg.Wait() }()
			var flood atomic.Int64 // permits the flood got
			shed := priority.With(ctx, priority.Sheddable)
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for lims[1].Wait(shed, "api") == nil {
						flood.Add(1)
					}
				}()
			}
			// The critical caller, from the start; its answers count once the flood has
			// held the line for two seconds (past the key's first window, in which a
			// sheddable caller keeps its headroom on a key its limiter has watched for
			// less: docs/priorities.md).
			crit := priority.With(ctx, priority.Critical)
			var asked, granted int
			for asked < 8 {
				ok := lims[0].Allow(crit, "api")
				if flood.Load() >= 20 {
					asked++
					if ok {
						granted++
					}
				}
				select {
				case <-time.After(200 * time.Millisecond):
				case <-ctx.Done():
				}
			}
			t.Logf("%s: critical %d of %d granted; the flood got %d permits", s.name, granted, asked, flood.Load())
			if granted < asked {
				t.Errorf("a critical caller beside another process's sheddable flood: %d of %d Allows granted, want all (the flood keeps its headroom; it got %d permits)", granted, asked, flood.Load())
			}
		})
	}
}
