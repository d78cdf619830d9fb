package cas

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/internal/testkit/classtest"
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
			counts := make([]*boardCount, 2)
			for i := range lims {
				counts[i] = &boardCount{Store: process()}
				b := New(counts[i], WithTimeout(2*time.Second))
				t.Cleanup(func() { b.Close() })
				lims[i] = sluice.MustNew(sluice.MustParse("10/s burst=10"), sluice.WithBackend(b))
				t.Cleanup(func() { lims[i].Close() })
			}
			asked, granted, flood := classtest.CriticalBesideFlood(lims[0], lims[1])
			t.Logf("%s: critical %d of %d granted; the flood got %d permits; the critical process: %v; the flood's: %v",
				s.name, granted, asked, flood, counts[0], counts[1])
			if granted < asked {
				t.Errorf("a critical caller beside another process's sheddable flood: %d of %d Allows granted, want all (the flood keeps its headroom; it got %d permits)", granted, asked, flood)
			}
		})
	}
}

// TestClassBoard: on each store, in virtual time, a class posted for a key reads back as
// posted that long ago, within the time it was posted for, and not after; a class not
// posted reads as not posted; another key's posts are its own; a post rides on the
// backend's next round (here a read); another process's post of a class that lasts three
// quarters of its time still stands for a new one (no write); and a read that finds every
// post over deletes the board, so that a key's board lasts as long as its latest post.
func TestClassBoard(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			clk := clock.NewVirtual()
			clk.Set(int64(1000 * time.Second))
			st := s.make(t, clk)
			b, other := New(st, WithTimeout(10*time.Second)), New(st, WithTimeout(10*time.Second))
			defer b.Close()
			defer other.Close()
			read := func(step int, key string, wantC, wantS time.Duration) {
				t.Helper()
				c, s, err := b.ClassesPosted(ctx, key)
				if err != nil || c != wantC || s != wantS {
					t.Errorf("step %d: %s: critical %v, standard %v, %v; want %v, %v", step, key, c, s, err, wantC, wantS)
				}
			}
			post := func(b *Backend, c priority.Class, recent time.Duration) {
				t.Helper()
				if err := b.PostClass(ctx, "api", c, recent); err != nil {
					t.Fatal(err)
				}
				if _, _, err := b.ClassesPosted(ctx, "other"); err != nil { // a round the post rides on
					t.Fatal(err)
				}
			}
			read(0, "api", -1, -1)
			post(b, priority.Critical, 400*time.Millisecond)
			post(b, priority.Sheddable, time.Second) // not a class the board keeps
			read(1, "api", 0, -1)
			clk.Advance(100 * time.Millisecond)
			read(2, "api", 100*time.Millisecond, -1)
			read(3, "other", -1, -1)
			w := other.Stats().Writes
			post(other, priority.Critical, 400*time.Millisecond) // 300 ms left of 400: it stands
			if got := other.Stats().Writes - w; got != 0 {
				t.Errorf("step 4: another process's critical post, 100 ms after one of 400 ms: %d writes, want 0", got)
			}
			post(other, priority.Standard, time.Second)
			if got := other.Stats().Writes - w; got != 1 {
				t.Errorf("step 5: another process's standard post: %d writes, want 1", got)
			}
			clk.Advance(300 * time.Millisecond)
			read(6, "api", -1, 300*time.Millisecond) // critical's 400 ms are over
			clk.Advance(700 * time.Millisecond)
			read(7, "api", -1, -1)
			snap, err := st.Load(ctx, []string{b.boardID("api")})
			if err != nil || snap.Records[0].Version != 0 {
				t.Errorf("step 8: the board, every post over and read: %+v %v, want no record", snap.Records, err)
			}
		})
	}
}

// boardCount is a store that counts its calls, and those that touch a board of classes.
// It is safe for concurrent use.
type boardCount struct {
	store.Store
	loads, boardLoads, onlyBoard, swaps, boardWrites atomic.Int64
}

func (s *boardCount) Load(ctx context.Context, ids []string) (store.Snapshot, error) {
	s.loads.Add(1)
	n := 0
	for _, id := range ids {
		if strings.Contains(id, "classes:") {
			n++
		}
	}
	if n > 0 {
		s.boardLoads.Add(1)
	}
	if n == len(ids) && n > 0 {
		s.onlyBoard.Add(1)
	}
	return s.Store.Load(ctx, ids)
}

func (s *boardCount) Swap(ctx context.Context, ws []store.Write) ([]uint64, error) {
	s.swaps.Add(1)
	for _, w := range ws {
		if strings.Contains(w.ID, "classes:") {
			s.boardWrites.Add(1)
		}
	}
	return s.Store.Swap(ctx, ws)
}

// String gives the counts.
func (s *boardCount) String() string {
	return fmt.Sprintf("store loads %d (%d with the board, %d of it alone), swaps %d (%d board writes)",
		s.loads.Load(), s.boardLoads.Load(), s.onlyBoard.Load(), s.swaps.Load(), s.boardWrites.Load())
}

// TestBoardCost measures what the board costs a class alone on a key (one process, in
// virtual time, an Allow every 10 ms for 10 s on 100/s burst=20): callers that name no
// class never touch it; a lone sheddable class reads it at most every 100 ms (the
// limiter's boardEvery), a round of its own, and writes nothing; a lone critical class
// reads and writes it at most every quarter of the time a class stays recent (1 s here),
// and never reads it before deciding.
func TestBoardCost(t *testing.T) {
	const steps = 1000
	for _, tc := range []struct {
		class               priority.Class
		named               bool
		maxReads, maxWrites int
	}{
		{priority.Standard, false, 0, 0},
		{priority.Sheddable, true, steps / 10, 0},
		{priority.Critical, true, steps / 25, steps / 25},
	} {
		clk := clock.NewVirtual()
		clk.Set(int64(1000 * time.Second))
		st := &boardCount{Store: store.NewMemory(clk)}
		b := New(st)
		l := sluice.MustNew(sluice.MustParse("100/s burst=20"), sluice.WithBackend(b), sluice.WithClock(clk))
		ctx := context.Background()
		if tc.named {
			ctx = priority.With(ctx, tc.class)
		}
		granted := 0
		for range steps {
			if l.Allow(ctx, "api") {
				granted++
			}
			clk.Advance(10 * time.Millisecond)
		}
		l.Close()
		b.Close()
		t.Logf("%v alone (named %v): %d of %d granted; %v", tc.class, tc.named, granted, steps, st)
		if r, w := int(st.boardLoads.Load()), int(st.boardWrites.Load()); r > tc.maxReads+1 || w > tc.maxWrites+1 {
			t.Errorf("%v alone: %d reads and %d writes of the board, want at most %d and %d", tc.class, r, w, tc.maxReads+1, tc.maxWrites+1)
		}
	}
}
