package bench

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/maypok86/otter/v2"
	"github.com/puzpuzpuz/xsync/v4"

	"github.com/sluicehq/sluice/internal/keytable"
)

// The candidates for the per-key table of the local mode, the lease mode and the daemon
// (internal/keytable won): each maps a key to its state, one atomic int64 (a TAT), and a
// decision is a lookup and a compare-and-swap. make bench BENCH=KeyTable compares them.
type keyTable interface {
	get(k string) *atomic.Int64 // nil if absent
	add(k string) *atomic.Int64 // the key's state, made if absent
}

type ktTable struct{ t *keytable.Table[atomic.Int64] }

func (k ktTable) get(key string) *atomic.Int64 {
	if e := k.t.Load(key); e != nil {
		return &e.Val
	}
	return nil
}

func (k ktTable) add(key string) *atomic.Int64 {
	e, _ := k.t.LoadOrStore(key, nil)
	return &e.Val
}

type syncMapTable struct{ m sync.Map }

func (s *syncMapTable) get(k string) *atomic.Int64 {
	if v, ok := s.m.Load(k); ok {
		return v.(*atomic.Int64)
	}
	return nil
}

func (s *syncMapTable) add(k string) *atomic.Int64 {
	v, _ := s.m.LoadOrStore(k, new(atomic.Int64))
	return v.(*atomic.Int64)
}

type xsyncTable struct {
	m *xsync.Map[string, *atomic.Int64]
}

func (x xsyncTable) get(k string) *atomic.Int64 {
	v, _ := x.m.Load(k)
	return v
}

func (x xsyncTable) add(k string) *atomic.Int64 {
	v, _ := x.m.LoadOrStore(k, new(atomic.Int64))
	return v
}

type otterTable struct {
	c *otter.Cache[string, *atomic.Int64]
}

func (o otterTable) get(k string) *atomic.Int64 {
	v, _ := o.c.GetIfPresent(k)
	return v
}

func (o otterTable) add(k string) *atomic.Int64 {
	v, _ := o.c.SetIfAbsent(k, new(atomic.Int64))
	return v
}

// shardedTable is the plain answer: Go maps behind one read-write mutex per shard.
type shardedTable struct {
	shards [64]struct {
		mu sync.RWMutex
		m  map[string]*atomic.Int64
		_  [32]byte
	}
}

func (s *shardedTable) shard(k string) int {
	h := uint32(2166136261)
	for i := 0; i < len(k); i++ {
		h = (h ^ uint32(k[i])) * 16777619
	}
	return int(h % 64)
}

func (s *shardedTable) get(k string) *atomic.Int64 {
	sh := &s.shards[s.shard(k)]
	sh.mu.RLock()
	v := sh.m[k]
	sh.mu.RUnlock()
	return v
}

func (s *shardedTable) add(k string) *atomic.Int64 {
	sh := &s.shards[s.shard(k)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.m == nil {
		sh.m = map[string]*atomic.Int64{}
	}
	v := sh.m[k]
	if v == nil {
		v = new(atomic.Int64)
		sh.m[k] = v
	}
	return v
}

// keyTables makes each candidate; maxKeys bounds otter's (the others' bound is their
// user's: the local mode's eviction).
var keyTables = []struct {
	name string
	make func(maxKeys int) keyTable
}{
	{"keytable", func(int) keyTable { return ktTable{keytable.New[atomic.Int64]()} }},
	{"syncmap", func(int) keyTable { return &syncMapTable{} }},
	{"xsync", func(int) keyTable { return xsyncTable{xsync.NewMap[string, *atomic.Int64]()} }},
	{"otter", func(n int) keyTable {
		c, err := otter.New(&otter.Options[string, *atomic.Int64]{MaximumSize: n})
		if err != nil {
			panic(err)
		}
		return otterTable{c}
	}},
	{"sharded", func(int) keyTable { return &shardedTable{} }},
}

// decideIn is a decision's work on the table: find the key's state (making it the first
// time) and move it on by compare-and-swap, as the local mode's Allow does.
func decideIn(t keyTable, k string, now int64) {
	s := t.get(k)
	if s == nil {
		s = t.add(k)
	}
	for {
		old := s.Load()
		if s.CompareAndSwap(old, max(old, now)+1) {
			return
		}
	}
}

// BenchmarkKeyTable: a decision's lookup and update from GOMAXPROCS goroutines, on one key
// and on 10,000 keys each walked from its own starting point.
func BenchmarkKeyTable(b *testing.B) {
	for _, n := range []int{1, 10_000} {
		ks := keys(n)
		for _, c := range keyTables {
			b.Run(fmt.Sprintf("keys=%d/impl=%s", n, c.name), func(b *testing.B) {
				t := c.make(1 << 20)
				for _, k := range ks {
					t.add(k)
				}
				var seed atomic.Int64
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					i := int(seed.Add(7919)) % len(ks)
					now := int64(0)
					for pb.Next() {
						now++
						decideIn(t, ks[i], now)
						if i++; i == len(ks) {
							i = 0
						}
					}
				})
			})
		}
	}
}

// BenchmarkKeyTableMemory: the heap each candidate holds per key, after a collection, with
// a million keys whose strings the caller owns (run with -benchtime 1x).
func BenchmarkKeyTableMemory(b *testing.B) {
	const n = 1 << 20
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("uniq-%d-%d", i%4, i)
	}
	for _, c := range keyTables {
		b.Run("impl="+c.name, func(b *testing.B) {
			var per float64
			for range b.N {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				t := c.make(n)
				for _, k := range ks {
					t.add(k)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				per = float64(after.HeapAlloc-before.HeapAlloc) / n
				runtime.KeepAlive(t)
			}
			b.ReportMetric(per, "B/key")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// TestKeyTableHotKeyEvictions: the eviction quality of the two candidates that evict, at
// a cap of 1,000 keys under a flood of 50,000 keys used once, with one hot key looked up
// after every 10 of them: otter's own policy (W-TinyLFU), and the local mode's rule on
// internal/keytable (a sample of 8, the least recently used goes). Neither may evict the
// hot key.
func TestKeyTableHotKeyEvictions(t *testing.T) {
	const maxKeys, flood = 1000, 50_000
	t.Run("impl=otter", func(t *testing.T) {
		c, err := otter.New(&otter.Options[string, int]{MaximumSize: maxKeys})
		if err != nil {
			t.Fatal(err)
		}
		c.Set("hot", 1)
		for i := 0; i < flood; i++ {
			c.Set(fmt.Sprint("cold", i), 0)
			if i%10 == 0 {
				if _, ok := c.GetIfPresent("hot"); !ok {
					t.Fatalf("step %d: the hot key was evicted", i)
				}
			}
		}
	})
	t.Run("impl=keytable", func(t *testing.T) {
		tb := keytable.New[int]()
		hot, _ := tb.LoadOrStore("hot", nil)
		for i := 0; i < flood; i++ {
			if tb.Len() >= maxKeys {
				var victim *keytable.Entry[int]
				var oldest uint32
				for e, age := range tb.Sample(8) {
					if victim == nil || age > oldest {
						victim, oldest = e, age
					}
				}
				tb.Delete(victim)
			}
			tb.LoadOrStore(fmt.Sprint("cold", i), nil)
			if i%10 == 0 && tb.Load("hot") != hot {
				t.Fatalf("step %d: the hot key was evicted", i)
			}
		}
	})
}
