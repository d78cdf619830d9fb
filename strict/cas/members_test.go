package cas

import (
	"context"
	"io"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/store"
	etcdstore "github.com/sluicehq/sluice/store/etcd"
	zkstore "github.com/sluicehq/sluice/store/zk"
)

// skewed is a clock offset from another by a constant: a machine whose clock is wrong.
type skewed struct {
	clock.Clock
	off time.Duration
}

func (s skewed) Now() time.Time  { return s.Clock.Now().Add(s.off) }
func (s skewed) Nanotime() int64 { return s.Clock.Nanotime() + int64(s.off) }

// violations feeds grant times (one permit each) in order to a strict GCRA under l that
// never reserves, and counts those it refuses.
func violations(at []int64, l gcra.Limit) int {
	at = append([]int64(nil), at...)
	sort.Slice(at, func(i, j int) bool { return at[i] < at[j] })
	tats := []int64{0}
	bad := 0
	for _, t := range at {
		r, _, err := gcra.Decide(tats, []gcra.Limit{l}, t, 1, 0)
		if err != nil || !r.Allowed {
			bad++
		}
	}
	return bad
}

// TestEtcdSkewedClocks: two members whose clocks are skew apart share 50/s burst=1 on a
// real etcd, in virtual time: one takes permits all along, the other joins it now and
// then. Judged on the real (virtual) time of each grant, the pool
// breaks the limit (the member ahead takes permits early), but never by more than the
// skew allows: the grants conform to the limit with its tolerance widened by the skew
// (at most ceil(skew/T) permits beyond the limit in any window), as docs/consensus.md
// states. Judged on the store's time (the tickets'), they conform exactly.
func TestEtcdSkewedClocks(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewVirtual()
	clk.Set(int64(1000 * time.Second))
	const skew = 30 * time.Millisecond
	client := etcdClient(t)
	prefix := store.WithPrefix(unique("skew") + "/")
	ahead := New(etcdstore.New(client, prefix, store.WithNow(func() int64 { return skewed{clk, skew}.Now().UnixNano() })), WithTimeout(10*time.Second))
	right := New(etcdstore.New(client, prefix, store.WithNow(func() int64 { return clk.Now().UnixNano() })), WithTimeout(10*time.Second))
	defer ahead.Close()
	defer right.Close()
	l := gcra.Limit{T: int64(20 * time.Millisecond), Tau: int64(20 * time.Millisecond)} // 50/s burst=1
	var real, store []int64
	for step := range 400 {
		clk.Advance(3 * time.Millisecond)
		// The member that is right takes permits all along; the one ahead joins it every
		// other 120 ms, when its clock is ahead of the records' (the first grant of each
		// such phase comes early by up to the skew).
		members := []*Backend{right}
		if step/40%2 == 1 {
			members = append(members, ahead)
		}
		for _, m := range members {
			g, err := m.Decide(ctx, "k", backend.Request{Limits: []gcra.Limit{l}, N: 1})
			if err != nil {
				t.Fatal(err)
			}
			if g.Allowed {
				real = append(real, clk.Now().UnixNano())
				store = append(store, g.Ticket.At)
			}
		}
	}
	if v := violations(store, l); v != 0 {
		t.Errorf("on the store's time: %d of %d grants break the limit, want 0", v, len(store))
	}
	widened := gcra.Limit{T: l.T, Tau: l.Tau + int64(skew)}
	if v := violations(real, widened); v != 0 {
		t.Errorf("on the real time: %d of %d grants break the limit widened by the skew, want 0", v, len(real))
	}
	v := violations(real, l)
	t.Logf("%d grants in %v; %d break the limit itself on the real time", len(real), 1200*time.Millisecond, v)
	if v == 0 {
		t.Errorf("no grant broke the limit on the real time: the test does not show the skew's effect")
	}
}

// TestEtcdSkewAbsorbedByTheMargin: as TestEtcdSkewedClocks, through limiters whose margin
// is the skew (sluice.WithMargin): judged on the real time of each grant, none breaks the
// limit itself, as docs/consensus.md says a margin at least the skew ensures.
func TestEtcdSkewAbsorbedByTheMargin(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewVirtual()
	clk.Set(int64(1000 * time.Second))
	const skew = 30 * time.Millisecond
	client := etcdClient(t)
	prefix := store.WithPrefix(unique("margin") + "/")
	limits := sluice.MustParse("50/s burst=1")
	var ls []*sluice.Limiter
	for _, c := range []clock.Clock{skewed{clk, skew}, clk} {
		b := New(etcdstore.New(client, prefix, store.WithNow(func() int64 { return c.Now().UnixNano() })), WithTimeout(10*time.Second))
		defer b.Close()
		l, err := sluice.New(limits, sluice.WithBackend(b), sluice.WithMargin(skew), sluice.WithClock(clk),
			sluice.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))) // the margin costs 60% of the rate at burst 1: known
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ls = append(ls, l)
	}
	right, ahead := ls[1], ls[0]
	var real []int64
	for step := range 400 {
		clk.Advance(3 * time.Millisecond)
		members := []*sluice.Limiter{right}
		if step/40%2 == 1 {
			members = append(members, ahead)
		}
		for _, m := range members {
			if m.Allow(ctx, "k") {
				real = append(real, clk.Now().UnixNano())
			}
		}
	}
	if v := violations(real, limitconv.Core(limits, 0)[0]); v != 0 {
		t.Errorf("on the real time: %d of %d grants break the limit with a margin of the skew, want 0", v, len(real))
	}
	t.Logf("%d grants in %v", len(real), 1200*time.Millisecond)
	if len(real) < 15 {
		t.Errorf("%d grants in 1.2 s of 50/s with a 30 ms margin (at most one every 50 ms: 24), want at least 15", len(real))
	}
}

// runMembers runs members (each its own backend, as processes are) with two goroutines
// each, taking permits of key under l for d, and returns the store time of every grant.
func runMembers(logf func(...any), members []*Backend, l gcra.Limit, d time.Duration) []int64 {
	ctx := context.Background()
	var mu sync.Mutex
	var at []int64
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for _, m := range members {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					g, err := m.Decide(ctx, "shared", backend.Request{Limits: []gcra.Limit{l}, N: 1})
					if err != nil {
						logf(err) // a time-out on the loaded machine: the fail mode's, not a grant
						time.Sleep(5 * time.Millisecond)
						continue
					}
					if g.Allowed {
						mu.Lock()
						at = append(at, g.Ticket.At)
						mu.Unlock()
						continue
					}
					time.Sleep(time.Duration(min(g.RetryAfter, int64(20*time.Millisecond))))
				}
			}()
		}
	}
	wg.Wait()
	return at
}

// TestMembersShareALimit: four members, each its own backend and store client, share
// 50/s burst=5 on a real etcd and a real ZooKeeper for two seconds of real time. Judged
// exactly on the store's time of each grant, no grant breaks the limit; liveness is judged
// loosely (the machine is shared): at least half the capacity is used.
func TestMembersShareALimit(t *testing.T) {
	if testing.Short() {
		t.Skip("real time: not in -short")
	}
	l := gcra.Limit{T: int64(20 * time.Millisecond), Tau: int64(100 * time.Millisecond)}
	for _, name := range []string{"etcd", "zk"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // each store its own server
			var members []*Backend
			path := unique("/members")
			for range 4 {
				var st store.Store
				if name == "etcd" {
					st = etcdstore.New(etcdClient(t), store.WithPrefix(path+"/"))
				} else {
					st = zkstore.New(zkConn(t), store.WithPrefix(path))
				}
				m := New(st, WithTimeout(2*time.Second))
				defer m.Close()
				members = append(members, m)
			}
			at := runMembers(t.Log, members, l, 2*time.Second)
			var conflicts, writes int64
			for _, m := range members {
				s := m.Stats()
				conflicts, writes = conflicts+s.Conflicts, writes+s.Writes
			}
			t.Logf("%d conflicts in %d writes", conflicts, writes)
			judgeGrants(t, at, l)
		})
	}
}

// judgeGrants checks grant times (one permit each, on the store's time) exactly against
// l, and their utilization over their span loosely (at least half: the machine is shared).
func judgeGrants(t *testing.T, at []int64, l gcra.Limit) {
	t.Helper()
	if len(at) == 0 {
		t.Fatal("no grants")
	}
	if v := violations(at, l); v != 0 {
		t.Errorf("%d of %d grants break the limit on the store's time", v, len(at))
	}
	sort.Slice(at, func(i, j int) bool { return at[i] < at[j] })
	span := at[len(at)-1] - at[0]
	capacity := float64(l.Burst()) + float64(span)/float64(l.T)
	u := float64(len(at)) / capacity
	t.Logf("%d grants over %v: utilization %.2f", len(at), time.Duration(span), u)
	if u < 0.5 {
		t.Errorf("utilization %.2f, want at least 0.5", u)
	}
}
