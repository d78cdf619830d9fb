package cas

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/backendtest"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/local"
	"github.com/sluicehq/sluice/store"
	etcdstore "github.com/sluicehq/sluice/store/etcd"
	zkstore "github.com/sluicehq/sluice/store/zk"
)

// virtualStore is a store whose time is a virtual clock's, not the store's: for tests of
// ZooKeeper, whose time is its leader's (the records' stamps are the leader's too, so
// they go).
type virtualStore struct {
	store.Store
	clk *clock.Virtual
}

func (s virtualStore) Load(ctx context.Context, ids []string) (store.Snapshot, error) {
	snap, err := s.Store.Load(ctx, ids)
	snap.Now, snap.Since = s.clk.Now().UnixNano(), math.MinInt64
	for i := range snap.Records {
		snap.Records[i].Now = 0
	}
	return snap, err
}

// stores are the stores every test runs on: name and a maker of a fresh store whose time
// is clk's.
func stores(t *testing.T) []struct {
	name string
	make func(t *testing.T, clk *clock.Virtual) store.Store
} {
	return []struct {
		name string
		make func(t *testing.T, clk *clock.Virtual) store.Store
	}{
		{"memory", func(t *testing.T, clk *clock.Virtual) store.Store { return store.NewMemory(clk) }},
		{"etcd", func(t *testing.T, clk *clock.Virtual) store.Store {
			return etcdstore.New(etcdClient(t), store.WithPrefix(unique("cas")+"/"), store.WithNow(func() int64 { return clk.Now().UnixNano() }))
		}},
		{"zk", func(t *testing.T, clk *clock.Virtual) store.Store {
			return virtualStore{zkstore.New(zkConn(t), store.WithPrefix(unique("/cas"))), clk}
		}},
	}
}

// TestConformance runs the backend conformance suite on each store, in virtual time.
func TestConformance(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel() // each store its own server: their round trips overlap
			backendtest.Run(t, func(t *testing.T, clk *clock.Virtual) backend.Backend {
				return New(s.make(t, clk), WithTimeout(10*time.Second))
			})
		})
	}
}

// TestRampBookings: on each store, bookings on a ramp are spaced where they fall, as the
// core spaces them (the core decides here).
func TestRampBookings(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			backendtest.RunRamps(t, func(t *testing.T, clk *clock.Virtual) backend.Backend {
				return New(s.make(t, clk), WithTimeout(10*time.Second))
			})
		})
	}
}

// TestDifferential runs the same random calls at the same virtual times through the
// backend on each store and through the in-process backend (package local, the Go core
// in memory), and demands the same decisions.
func TestDifferential(t *testing.T) {
	sets := [][]gcra.Limit{
		{{T: int64(100 * time.Millisecond), Tau: int64(500 * time.Millisecond)}},
		{{T: int64(time.Second), Tau: int64(time.Second)}},
		{{T: int64(50 * time.Millisecond), Tau: int64(200 * time.Millisecond)}, {T: int64(time.Second), Tau: int64(3 * time.Second)}},
	}
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			ctx := context.Background()
			clk := clock.NewVirtual()
			clk.Set(int64(1000 * time.Second))
			b := New(s.make(t, clk), WithTimeout(10*time.Second))
			defer b.Close()
			ref := local.New(local.WithClock(clk))
			defer ref.Close()
			rng := rand.New(rand.NewPCG(1, 2))
			type grant struct {
				k     int
				t, rt gcra.Ticket // the backend's and the reference's (their times differ by a constant)
			}
			var grants []grant
			steps := 300
			if s.name == "memory" {
				steps = 5000
			}
			base := unique("diff")
			for i := range steps {
				clk.Advance(time.Duration(rng.Int64N(int64(150 * time.Millisecond))))
				k := rng.IntN(len(sets))
				key, ls := fmt.Sprint(base, k), sets[k]
				switch r := rng.IntN(10); {
				case r < 7:
					req := backend.Request{Limits: ls, N: rng.Int64N(gcra.MaxCost(ls) + 1)}
					if rng.IntN(3) == 0 {
						req.MaxDelay = time.Duration(rng.Int64N(int64(2 * time.Second)))
					}
					got, err1 := b.Decide(ctx, key, req)
					want, err2 := ref.Decide(ctx, key, req)
					if err1 != nil || err2 != nil || got.Result != want.Result {
						t.Fatalf("step %d: decide %s %+v: got %+v %v, want %+v %v", i, key, req, got.Result, err1, want.Result, err2)
					}
					if got.Allowed && got.Ticket.N > 0 {
						grants = append(grants, grant{k, got.Ticket, want.Ticket})
					}
				case r < 9 && len(grants) > 0:
					j := rng.IntN(len(grants))
					g := grants[j]
					newN := rng.Int64N(2 * g.t.N)
					key := fmt.Sprint(base, g.k)
					err1 := b.Adjust(ctx, key, sets[g.k], g.t, newN)
					err2 := ref.Adjust(ctx, key, sets[g.k], g.rt, newN)
					if err1 != nil || err2 != nil {
						t.Fatalf("step %d: adjust: %v %v", i, err1, err2)
					}
					grants = append(grants[:j], grants[j+1:]...)
				default:
					d := time.Duration(rng.Int64N(int64(time.Second)))
					if err1, err2 := b.Penalize(ctx, key, ls, d), ref.Penalize(ctx, key, ls, d); err1 != nil || err2 != nil {
						t.Fatalf("step %d: penalize: %v %v", i, err1, err2)
					}
				}
			}
		})
	}
}
