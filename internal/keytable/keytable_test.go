package keytable

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

func TestSteps(t *testing.T) {
	tb := New[int64]()
	set := func(v int64) func(*int64) { return func(p *int64) { *p = v } }
	a, loaded := tb.LoadOrStore("a", set(1))
	if loaded || a.Key() != "a" || a.Val != 1 || tb.Len() != 1 {
		t.Fatalf("step 0: got loaded %v key %q val %d len %d, want a new entry a=1, len 1", loaded, a.Key(), a.Val, tb.Len())
	}
	if got, loaded := tb.LoadOrStore("a", set(2)); !loaded || got != a || got.Val != 1 {
		t.Fatalf("step 1: LoadOrStore of a present key: got %p loaded %v val %d, want the first entry", got, loaded, got.Val)
	}
	if got := tb.Load("a"); got != a {
		t.Fatalf("step 2: Load(a) = %p, want %p", got, a)
	}
	if got := tb.Load("b"); got != nil {
		t.Fatalf("step 3: Load(b) = %p, want nil", got)
	}
	a2 := tb.Replace(a, set(3))
	if a2 == nil || a2 == a || a2.Val != 3 || tb.Load("a") != a2 || tb.Len() != 1 {
		t.Fatalf("step 4: Replace: got %p (val %v), Load %p, len %d; want a new entry a=3, len 1", a2, a2, tb.Load("a"), tb.Len())
	}
	if tb.Replace(a, set(4)) != nil || tb.Delete(a) {
		t.Fatalf("step 5: the replaced entry was still in the table")
	}
	if !tb.Delete(a2) || tb.Load("a") != nil || tb.Len() != 0 {
		t.Fatalf("step 6: Delete: Load %p, len %d, want nil and 0", tb.Load("a"), tb.Len())
	}
	if tb.Delete(a2) {
		t.Fatalf("step 7: a second Delete of the same entry reported true")
	}
	if b, loaded := tb.LoadOrStore("a", nil); loaded || b == a2 || b.Val != 0 {
		t.Fatalf("step 8: the key again after its delete: got loaded %v val %d, want a fresh entry", loaded, b.Val)
	}
}

// TestGrowAndShrink: every key stays found while shards double, and the slots go back
// when the keys go.
func TestGrowAndShrink(t *testing.T) {
	tb := New[int]()
	const n = 20_000
	es := make([]*Entry[int], n)
	for i := range es {
		es[i], _ = tb.LoadOrStore(fmt.Sprint("k", i), func(v *int) { *v = i })
	}
	if tb.Len() != n {
		t.Fatalf("Len %d, want %d", tb.Len(), n)
	}
	for i, e := range es {
		if got := tb.Load(fmt.Sprint("k", i)); got != e || got.Val != i {
			t.Fatalf("key %d: Load %p, want %p", i, got, e)
		}
	}
	seen := 0
	for range tb.All() {
		seen++
	}
	if seen != n {
		t.Fatalf("All yielded %d entries, want %d", seen, n)
	}
	if s := tb.slots(); s < n*4/3 || s > n*4+nShards*minSlots {
		t.Errorf("%d slots for %d keys, want 4/3 to 4 a key", s, n)
	}
	for _, e := range es {
		if !tb.Delete(e) {
			t.Fatalf("Delete(%s) = false", e.Key())
		}
	}
	if tb.Len() != 0 {
		t.Fatalf("Len %d after deleting every key", tb.Len())
	}
	if s := tb.slots(); s > nShards*minSlots {
		t.Errorf("%d slots left after every key went, want at most %d", s, nShards*minSlots)
	}
}

// slots counts the table's slots.
func (t *Table[V]) slots() int {
	n := 0
	for k := range t.shards {
		n += len(t.shards[k].array())
	}
	return n
}

// TestShardsGrowApart: the shards, filled alike by the hash, double at different numbers
// of keys. When each doubled at 3/4 full, the 64 shards of a table growing to 393,216 keys
// doubled from 8,192 slots to 16,384 within about 6% of its keys (all 32 MB of a
// million-key table's doubling, and its moves, within a few batches of a daemon's flood).
func TestShardsGrowApart(t *testing.T) {
	if testing.Short() {
		t.Skip("stores 400k keys")
	}
	const from = 8192
	tb := New[int]()
	var at []int // the table's keys when each shard doubled from `from` slots
	for i := 0; len(at) < nShards; i++ {
		k := fmt.Sprint("k", i)
		_, sh := tb.hash(k)
		before := len(sh.array())
		tb.LoadOrStore(k, nil)
		if before == from && len(sh.array()) == 2*from {
			at = append(at, tb.Len())
		}
	}
	first, last := slices.Min(at), slices.Max(at)
	t.Logf("the shards doubled from %d slots between %d and %d keys", from, first, last)
	if last-first < last/10 {
		t.Errorf("the shards doubled from %d slots between %d and %d keys: within %.1f%% of them, want 10%% at least", from, first, last, 100*float64(last-first)/float64(last))
	}
}

// TestChurnAtACap: a table kept at a fixed size by deleting a key for each new one (an
// eviction) neither grows nor fills with tombstones.
func TestChurnAtACap(t *testing.T) {
	tb := New[int]()
	const size = 10_000
	var live []*Entry[int]
	for i := 0; i < 20*size; i++ {
		if len(live) == size {
			k := i % size
			if !tb.Delete(live[k]) {
				t.Fatalf("step %d: Delete of a live entry failed", i)
			}
			live[k], _ = tb.LoadOrStore(fmt.Sprint("k", i), nil)
			continue
		}
		e, _ := tb.LoadOrStore(fmt.Sprint("k", i), nil)
		live = append(live, e)
	}
	if tb.Len() != size {
		t.Fatalf("Len %d, want %d", tb.Len(), size)
	}
	if s := tb.slots(); s > size*4+nShards*minSlots {
		t.Errorf("%d slots for %d keys after churn, want at most 4 a key", s, size)
	}
	for _, e := range live {
		if tb.Load(e.Key()) != e {
			t.Fatalf("%s lost in the churn", e.Key())
		}
	}
}

// TestConcurrent: goroutines insert, look up, replace and delete keys of their own while
// others do the same and sample, walk and look up every key (run it with -race).
func TestConcurrent(t *testing.T) {
	tb := New[atomic.Int64]()
	const workers, keys, rounds = 4, 2000, 5
	var wg sync.WaitGroup
	var stop atomic.Bool
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				for i := 0; i < keys; i++ {
					k := fmt.Sprint(w, "-", i)
					e, loaded := tb.LoadOrStore(k, func(v *atomic.Int64) { v.Store(int64(r)) })
					if loaded {
						errs <- fmt.Errorf("worker %d round %d: %s was still there", w, r, k)
						return
					}
					if i%3 == 0 {
						e = tb.Replace(e, func(v *atomic.Int64) { v.Store(int64(r)) })
					}
					if got := tb.Load(k); got != e || got.Val.Load() != int64(r) {
						errs <- fmt.Errorf("worker %d round %d: Load(%s) = %p, want %p", w, r, k, got, e)
						return
					}
				}
				for i := 0; i < keys; i++ {
					k := fmt.Sprint(w, "-", i)
					if e := tb.Load(k); e == nil || !tb.Delete(e) {
						errs <- fmt.Errorf("worker %d round %d: %s could not be deleted", w, r, k)
						return
					}
				}
			}
		}()
	}
	var readers sync.WaitGroup
	readers.Add(1)
	go func() {
		defer readers.Done()
		for !stop.Load() {
			for e := range tb.Sample(8) {
				e.Val.Load()
			}
			for e := range tb.All() {
				tb.Load(e.Key())
			}
		}
	}()
	wg.Wait()
	stop.Store(true)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if tb.Len() != 0 {
		t.Errorf("Len %d at the end, want 0", tb.Len())
	}
}

// TestSampleReachesEveryKey: samples start at random places, so that over many of them
// every key is looked at.
func TestSampleReachesEveryKey(t *testing.T) {
	tb := New[int]()
	const n = 1000
	for i := 0; i < n; i++ {
		tb.LoadOrStore(fmt.Sprint("k", i), nil)
	}
	seen := map[string]bool{}
	for range 2000 {
		got := 0
		for e := range tb.Sample(8) {
			seen[e.Key()] = true
			got++
		}
		if got != 8 {
			t.Fatalf("a sample of 8 yielded %d entries", got)
		}
	}
	if len(seen) < n*95/100 {
		t.Errorf("2,000 samples of 8 saw %d of %d keys, want at least 95%%", len(seen), n)
	}
	if empty := New[int](); func() int {
		c := 0
		for range empty.Sample(8) {
			c++
		}
		return c
	}() != 0 {
		t.Errorf("a sample of an empty table yielded entries")
	}
}

// TestAge: an entry ages with the keys inserted after its last use, in units of AgeUnit,
// and a lookup makes it young again.
func TestAge(t *testing.T) {
	tb := New[int]()
	tb.LoadOrStore("old", nil)
	tb.LoadOrStore("used", nil)
	for i := 0; i < 10*AgeUnit; i++ {
		tb.LoadOrStore(fmt.Sprint("k", i), nil)
		if i%AgeUnit == 0 {
			tb.Load("used")
		}
	}
	age := func(key string) uint32 {
		for e, a := range tb.Sample(tb.Len()) {
			if e.Key() == key {
				return a
			}
		}
		t.Fatalf("%s not in the table", key)
		return 0
	}
	if a := age("old"); a < 9 || a > 10 {
		t.Errorf("age of a key not used since %d inserts: %d, want 9 or 10", 10*AgeUnit, a)
	}
	if a := age("used"); a > 1 {
		t.Errorf("age of a key looked up every %d inserts: %d, want at most 1", AgeUnit, a)
	}
	if tb.Load("old"); age("old") != 0 {
		t.Errorf("age after a lookup: %d, want 0", age("old"))
	}
}

// TestMemoryPerKey keeps the heap held per key under a bound, so a regression shows: the
// entry (32 bytes with an int64 state: key and state), and 16-byte slots 1/4 to 3/4 full.
func TestMemoryPerKey(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 200k keys")
	}
	const n = 200_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%010d", i)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tb := New[int64]()
	for _, k := range keys {
		tb.LoadOrStore(k, nil)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("heap per key (string owned by the caller): %.0f bytes", per)
	if per > 80 {
		t.Errorf("heap per key %.0f bytes, want at most 80", per)
	}
	runtime.KeepAlive(keys)
	runtime.KeepAlive(tb)
}

// TestHashSpreads: the hash of keys that differ in a few characters spreads them evenly
// over the shards and, within one, over the slots, at every key length; two tables hash
// apart.
func TestHashSpreads(t *testing.T) {
	k, other := newHasher(), newHasher()
	for _, format := range []string{"%d", "k%05d", "tenant-%06d", "rule\x1fuser-%012d", "a-much-longer-key-of-some-tenant-%020d"} {
		const n, buckets = 64_000, 64
		var shards, slots [buckets]int
		same := 0
		for i := 0; i < n; i++ {
			key := fmt.Sprintf(format, i)
			h := k.hash(key)
			shards[h>>58]++
			slots[uint32(h>>32)%buckets]++
			if h == other.hash(key) {
				same++
			}
			if h != k.hash(key) {
				t.Fatalf("%q: two hashes", key)
			}
		}
		for b := 0; b < buckets; b++ {
			// n/buckets = 1000 each; a fair spread stays well within ±20%.
			if shards[b] < 800 || shards[b] > 1200 || slots[b] < 800 || slots[b] > 1200 {
				t.Errorf("%s: bucket %d got %d keys by shard and %d by slot, want about %d", format, b, shards[b], slots[b], n/buckets)
			}
		}
		if same > 0 {
			t.Errorf("%s: %d keys hash alike in two tables", format, same)
		}
	}
}

// TestNoAllocationUnderALock: LoadOrStore makes a key's entry, and any bigger or cleaner
// array its shard needs, before it takes the shard's lock, and Delete the smaller one. An allocation may have to help
// the collector mark (an assist, in proportion to its size: a shard's array is up to
// megabytes), and while it does every other insert into the shard waits: under a flood of
// new keys at the daemon's cap such waits held batches of 1,000 queries past 100 ms.
func TestNoAllocationUnderALock(t *testing.T) {
	tb := New[int]()
	allocs := 0
	onAlloc = func() {
		allocs++
		for i := range tb.shards {
			if !tb.shards[i].mu.TryLock() {
				t.Fatalf("allocation %d with shard %d's lock held", allocs, i)
			}
			tb.shards[i].mu.Unlock()
		}
	}
	defer func() { onAlloc = nil }()
	var live []*Entry[int]
	for i := range 50_000 { // grows every shard, then churns at a cap: arrays cleared of tombstones
		if len(live) == 20_000 {
			tb.Delete(live[i%len(live)])
			live[i%len(live)], _ = tb.LoadOrStore(fmt.Sprint("k", i), nil)
			continue
		}
		e, _ := tb.LoadOrStore(fmt.Sprint("k", i), nil)
		live = append(live, e)
	}
	grown := tb.slots()
	for _, e := range live { // and shrinks every shard again
		tb.Delete(e)
	}
	if tb.slots() >= grown/4 {
		t.Fatalf("%d slots after every key's delete, %d before: the shards did not shrink", tb.slots(), grown)
	}
	if allocs < 50_000+nShards {
		t.Fatalf("%d allocations seen, want an entry a key and the shards' arrays: the hook is not called", allocs)
	}
}

// TestHashSeesEveryByte: changing any one byte of a key, at any length (each of the hash's
// paths: up to 3, 4 to 7, 8 to 16, and past 16 and 48 bytes, with the last 16 read apart),
// changes its hash, and so does appending a zero byte.
func TestHashSeesEveryByte(t *testing.T) {
	k := newHasher()
	r := rand.New(rand.NewPCG(1, 2))
	for n := 0; n <= 130; n++ {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		h := k.hash(string(b))
		if h == k.hash(string(append(b, 0))) {
			t.Errorf("%d bytes: a zero byte appended hashes alike", n)
		}
		for i := range b {
			c := bytes.Clone(b)
			c[i] ^= 1 << (i % 8)
			if k.hash(string(c)) == h {
				t.Errorf("%d bytes: flipping a bit of byte %d leaves the hash as it was", n, i)
			}
		}
	}
}

// BenchmarkHash: the table's hash against hash/maphash's, by key length.
func BenchmarkHash(b *testing.B) {
	k, seed := newHasher(), maphash.MakeSeed()
	for _, key := range []string{"api", "tenant-000123", "rule\x1fuser-000000000012", "a-much-longer-key-of-some-tenant-00000000000000000012"} {
		b.Run(fmt.Sprintf("len=%d/impl=keytable", len(key)), func(b *testing.B) {
			var x uint64
			for b.Loop() {
				x += k.hash(key)
			}
			sink = x
		})
		b.Run(fmt.Sprintf("len=%d/impl=maphash", len(key)), func(b *testing.B) {
			var x uint64
			for b.Loop() {
				x += maphash.String(seed, key)
			}
			sink = x
		})
	}
}

var sink uint64
