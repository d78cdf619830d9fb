package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/lease/allot"
	"github.com/sluicehq/sluice/store"
)

const all = RateScale

func lim(rate int64, period time.Duration, burst int64) gcra.Limit {
	t := (int64(period) + rate - 1) / rate
	return gcra.Limit{T: t, Tau: burst * t}
}

// TestEpochsNeverRepeatAfterAForgottenRecord: a member from an earlier registration (a
// partitioned old pod) must never have its renewal accepted as a later registration's,
// even when the store forgot the record in between (no member, a full pool) and made it
// again.
func TestEpochsNeverRepeatAfterAForgottenRecord(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewVirtual()
	s := store.NewMemory(clk)
	a := &applier{store: s, cfg: DefaultConfig()}
	l := lim(10, time.Second, 10)
	apply := func(req allot.Request) (allot.Reply, error) {
		t.Helper()
		res, err := a.apply(ctx, []call{{key: "k", limit: l, req: req}})
		if err != nil {
			t.Fatal(err)
		}
		return res[0].rep, res[0].err
	}
	old, err := apply(allot.Request{Op: allot.OpJoin, Member: "pod", Demand: all})
	if err != nil {
		t.Fatal(err)
	}
	// The replacement joins under the same name, then leaves.
	clk.Advance(2 * time.Second)
	repl, err := apply(allot.Request{Op: allot.OpJoin, Member: "pod", Demand: all})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := apply(allot.Request{Op: allot.OpRelease, Member: "pod", Epoch: repl.Epoch}); err != nil {
		t.Fatal(err)
	}
	// Long enough for every quarantine to end and the pool to refill: the record is forgotten.
	clk.Advance(10 * time.Second)
	if _, err := apply(allot.Request{Op: allot.OpPenalize, Hold: 0}); err != nil {
		t.Fatal(err)
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("the idle record was kept (%d records)", n)
	}
	// It joins again: a new record.
	again, err := apply(allot.Request{Op: allot.OpJoin, Member: "pod", Demand: all})
	if err != nil {
		t.Fatal(err)
	}
	if again.Epoch == old.Epoch || again.Epoch == repl.Epoch {
		t.Fatalf("epoch %+v issued again (earlier: %+v, %+v)", again.Epoch, old.Epoch, repl.Epoch)
	}
	// The old pod comes back from its partition with its first epoch.
	if rep, err := apply(allot.Request{Op: allot.OpRenew, Member: "pod", Epoch: old.Epoch, Demand: all}); !errors.Is(err, allot.ErrStaleEpoch) {
		t.Fatalf("the old registration's renewal was accepted: %+v, %v", rep, err)
	}
}

// slowStore is a store.Memory with a round trip: etcd's or ZooKeeper's milliseconds.
type slowStore struct {
	*store.Memory
	rtt time.Duration
}

func (s *slowStore) Load(ctx context.Context, ids []string) (store.Snapshot, error) {
	time.Sleep(s.rtt)
	return s.Memory.Load(ctx, ids)
}

func (s *slowStore) Swap(ctx context.Context, ws []store.Write) ([]uint64, error) {
	time.Sleep(s.rtt)
	return s.Memory.Swap(ctx, ws)
}

// countingStore counts the writes that lost their compare-and-set.
type countingStore struct {
	store.Store
	lost atomic.Int64
}

func (c *countingStore) Swap(ctx context.Context, ws []store.Write) ([]uint64, error) {
	vs, err := c.Store.Swap(ctx, ws)
	for _, v := range vs {
		if v == 0 {
			c.lost.Add(1)
		}
	}
	return vs, err
}

// TestMembersOfAProcessCombine: eight members of one process renewing one limit every
// 10 ms through a store with 2 ms round trips never lose a compare-and-set to each other
// (464 of their writes lost before they combined their rounds), and the process's
// combiner is dropped once idle.
func TestMembersOfAProcessCombine(t *testing.T) {
	st := &countingStore{Store: &slowStore{Memory: store.NewMemory(nil), rtt: 2 * time.Millisecond}}
	l := lim(20, time.Second, 10)
	var bs []*Backend
	for i := range 8 {
		b, err := New(st, WithID(fmt.Sprint("m", i)), WithRenewEvery(10*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		bs = append(bs, b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, b := range bs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				b.AllowOne(ctx, "api", l)
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	for _, b := range bs {
		b.Close()
	}
	if n := st.lost.Load(); n != 0 {
		t.Errorf("%d writes lost their compare-and-set to a member of the same process", n)
	}
	loads, swaps := st.Store.(*slowStore).Ops()
	t.Logf("%d loads, %d swaps for 8 members", loads, swaps)
	combining.Lock()
	defer combining.Unlock()
	for k := range combining.m {
		if k.store == store.Store(st) {
			t.Error("a combiner kept after its last round")
		}
	}
}

// flakyStore is a store whose first `failures` loads fail as unavailable (as ZooKeeper's
// client before its first connection, or a Redis restarting), then answers as store.Store does.
type flakyStore struct {
	store.Store
	failures int
	loads    int
}

func (s *flakyStore) Load(ctx context.Context, ids []string) (store.Snapshot, error) {
	s.loads++
	if s.loads <= s.failures {
		return store.Snapshot{}, fmt.Errorf("lease store: %w: not connected yet", backend.ErrUnavailable)
	}
	return s.Store.Load(ctx, ids)
}

// TestWaitUnfencedAsksAgain: a store that does not answer yet is asked again until ctx
// ends, and its last error is returned then. The demo's wait gave up at the first
// backend.ErrUnavailable: under two make test runs at once, a ZooKeeper demo failed so ("zk:
// could not connect to a server") on its first connection attempt.
func TestWaitUnfencedAsksAgain(t *testing.T) {
	s := &flakyStore{Store: store.NewMemory(nil), failures: 3}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := WaitUnfenced(ctx, s, DefaultConfig()); err != nil || s.loads != 4 {
		t.Fatalf("after 3 failed loads: %v, %d loads, want nil after 4", err, s.loads)
	}
	never := &flakyStore{Store: store.NewMemory(nil), failures: 1 << 30}
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := WaitUnfenced(ctx, never, DefaultConfig())
	if !errors.Is(err, backend.ErrUnavailable) || never.loads < 2 {
		t.Fatalf("a store that never answers: %v after %d loads, want backend.ErrUnavailable after several", err, never.loads)
	}
}
