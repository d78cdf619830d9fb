package sluice

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/fairq"
	"github.com/sluicehq/sluice/local"
	"github.com/sluicehq/sluice/priority"
)

func TestKeeping(t *testing.T) {
	l := gcra.Limit{T: 10, Tau: 200} // burst 20
	for _, tc := range []struct {
		keep float64
		tau  int64
		ok   bool
	}{{0, 200, true}, {0.15, 170, true}, {0.40, 120, true}, {0.99, 0, false}, {1, 0, false}} {
		k, ok := l.Keeping(tc.keep)
		if ok != tc.ok || ok && k.Tau != tc.tau {
			t.Errorf("Keeping(%v) = Tau %d, %v; want %d, %v", tc.keep, k.Tau, ok, tc.tau, tc.ok)
		}
	}
	if k, ok := (gcra.Limit{T: 10, Tau: 10}).Keeping(0.15); ok {
		t.Errorf("burst 1 keeping 15%%: %+v granted, want nothing (a whole permit is kept)", k)
	}
}

// TestHeadroomForHigherClasses: on 10/s burst=10, while a critical caller asked recently, a
// sheddable caller that does not wait leaves 4 permits of the burst (40%) and a standard one
// 2 (15% of 10, rounded up to whole permits); the critical caller takes what is left. With
// no critical caller for longer than the burst takes to refill (1 s), a sheddable caller
// takes the whole burst; on a key seen for less than that, it keeps the headroom all the
// same (a critical caller may be about to ask).
func TestHeadroomForHigherClasses(t *testing.T) {
	clk := clock.NewVirtual()
	l, err := New(MustParse("10/s burst=10"), WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	crit := priority.With(bg, priority.Critical)
	std := priority.With(bg, priority.Standard)
	shed := priority.With(bg, priority.Sheddable)
	count := func(ctx context.Context, key string) int {
		n := 0
		for l.Allow(ctx, key) {
			n++
		}
		return n
	}
	// A key seen for the first time: for a window (1 s) a sheddable flood keeps 40% all the
	// same, for a critical caller that may be about to ask; then, with none seen, it takes
	// the whole burst.
	if n := count(shed, "a"); n != 6 {
		t.Fatalf("sheddable on a new key took %d, want 6 (4 kept)", n)
	}
	clk.Advance(1500 * time.Millisecond)
	if n := count(shed, "a"); n != 10 {
		t.Fatalf("sheddable alone for 1.5 s took %d, want the whole burst of 10", n)
	}
	// A critical caller takes one permit of key b's burst of 10: a sheddable flood then
	// leaves 4 of the other 9, which the critical caller has.
	l.Allow(crit, "b")
	if n := count(shed, "b"); n != 5 {
		t.Fatalf("sheddable beside a critical caller took %d, want 5 (4 kept)", n)
	}
	if n := count(crit, "b"); n != 4 {
		t.Fatalf("critical took %d after the sheddable flood, want the 4 kept", n)
	}
	l.Allow(crit, "c")
	if n := count(std, "c"); n != 7 {
		t.Fatalf("standard beside a critical caller took %d, want 7 (2 kept)", n)
	}
	// Standard callers recent: a sheddable one keeps 40% for them.
	l.Allow(std, "d")
	if n := count(shed, "d"); n != 5 {
		t.Fatalf("sheddable beside a standard caller took %d, want 5 (the standard one took 1, 4 kept)", n)
	}
	// The classes stop being recent after the time the burst takes to refill (1 s).
	clk.Advance(1500 * time.Millisecond)
	if n := count(shed, "b"); n != 10 {
		t.Fatalf("sheddable 1.5 s after the critical caller took %d, want the whole burst", n)
	}
}

// recording is a backend that decides in process and keeps the last request it was asked
// (for a key other than "-").
type recording struct {
	*local.Backend
	mu   sync.Mutex
	last backend.Request
}

func (r *recording) Decide(ctx context.Context, key string, req backend.Request) (backend.Grant, error) {
	r.mu.Lock()
	r.last = backend.Request{Limits: slices.Clone(req.Limits), N: req.N, MaxDelay: req.MaxDelay, Core: slices.Clone(req.Core)}
	r.mu.Unlock()
	return r.Backend.Decide(ctx, key, req)
}

// TestHeadroomGoesWithTheCore: a decision that keeps headroom for a higher class hands
// the backend the key's own limits (backend.Request.Core) beside the kept ones, so that a
// backend keeping more of a key than its limits' state (the gossip mode's owner) keeps it
// by the key's own; one that keeps nothing hands it no Core.
func TestHeadroomGoesWithTheCore(t *testing.T) {
	be := &recording{Backend: local.New()}
	l, err := New(MustParse("10/s burst=10"), WithBackend(be))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	core := []gcra.Limit{{T: int64(time.Second) / 10, Tau: int64(time.Second)}}
	for i, st := range []struct {
		class priority.Class
		core  []gcra.Limit // want
		tau   int64        // of the limits, want
	}{
		{priority.Critical, nil, int64(time.Second)},
		{priority.Sheddable, core, int64(time.Second) * 6 / 10},
		{priority.Standard, core, int64(time.Second) * 8 / 10},
	} {
		l.Allow(priority.With(bg, st.class), "api")
		be.mu.Lock()
		got := be.last
		be.mu.Unlock()
		if !slices.Equal(got.Core, st.core) || len(got.Limits) != 1 || got.Limits[0].Tau != st.tau {
			t.Errorf("step %d (%v): Core %v, limits %v; want Core %v, tau %d", i, st.class, got.Core, got.Limits, st.core, st.tau)
		}
	}
}

// TestHeadroomRefusalSaysWhenToRetry: on 1/s (burst 1) a critical caller keeps the only
// permit from standard callers for a second after it asked: they are refused, told to
// come back when the critical caller stops being recent.
func TestHeadroomRefusalSaysWhenToRetry(t *testing.T) {
	clk := clock.NewVirtual()
	l, err := New(MustParse("1/s"), WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !l.Allow(priority.With(bg, priority.Critical), "k") {
		t.Fatal("critical refused")
	}
	clk.Advance(1200 * time.Millisecond) // the permit is back; the critical caller was 1.2 s ago
	d, err := l.AllowN(bg, "k", 1)
	if err != nil || !d.Allowed {
		t.Fatalf("standard 1.2 s after the critical caller: %+v, %v; want granted", d, err)
	}
	clk.Advance(800 * time.Millisecond)
	l.Allow(priority.With(bg, priority.Critical), "k") // at 2.0 s: refused (the permit is back at 2.2 s), but seen
	clk.Advance(500 * time.Millisecond)
	d, _ = l.AllowN(bg, "k", 1)
	if d.Allowed || d.RetryAfter != 500*time.Millisecond {
		t.Fatalf("standard 0.5 s after a critical caller on a burst of 1: %+v, want refused, to retry in 0.5 s", d)
	}
	clk.Advance(500 * time.Millisecond)
	if d, _ = l.AllowN(bg, "k", 1); !d.Allowed {
		t.Fatalf("standard 1 s after the critical caller: %+v, want granted", d)
	}
	if l2, err := New(MustParse("1/s"), WithHeadroom(priority.Headroom{Sheddable: 1.5})); err == nil {
		l2.Close()
		t.Fatal("a headroom of 150%: no error")
	}
}

// TestWaitingRoomServesHigherClassesFirst: on 10/s burst=1, five sheddable waiters and
// then one critical waiter: the critical one is served with the next permit.
func TestWaitingRoomServesHigherClassesFirst(t *testing.T) {
	clk := clock.NewVirtual()
	l, err := New(MustParse("10/s burst=1"), WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !l.Allow(bg, "k") {
		t.Fatal("first permit refused")
	}
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	var mu sync.Mutex
	var order []priority.Class
	var wg sync.WaitGroup
	wait := func(p priority.Class) {
		defer wg.Done()
		if err := l.Wait(priority.With(ctx, p), "k"); err == nil {
			mu.Lock()
			order = append(order, p)
			mu.Unlock()
		}
	}
	wg.Add(5)
	for range 5 {
		go wait(priority.Sheddable)
	}
	waitFor(t, "five sheddable waiters", func() bool { return l.waiting("k") == 5 && clk.Pending() >= 5 })
	wg.Add(1)
	go wait(priority.Critical)
	waitFor(t, "the critical waiter", func() bool { return l.waiting("k") == 6 && clk.Pending() >= 6 })
	clk.Advance(100 * time.Millisecond)
	waitFor(t, "one served", func() bool { mu.Lock(); defer mu.Unlock(); return len(order) >= 1 })
	mu.Lock()
	first := order[0]
	mu.Unlock()
	if first != priority.Critical {
		t.Fatalf("served first: %v, want the critical waiter (it came last)", first)
	}
	cancel()
	wg.Wait()
}

func TestFairqClassesServeHigherFirst(t *testing.T) {
	r := fairq.New(0)
	_ = r.JoinClass(1, "a", fairq.Sheddable)
	_ = r.JoinClass(2, "b", fairq.Standard)
	_ = r.JoinClass(3, "a", fairq.Critical)
	_ = r.JoinClass(4, "", fairq.Critical)
	var got []uint64
	for {
		id, ok := r.Serve()
		if !ok {
			break
		}
		got = append(got, id)
	}
	want := []uint64{3, 4, 2, 1}
	if len(got) != len(want) {
		t.Fatalf("served %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("served %v, want %v", got, want)
		}
	}
}

// TestStandardFastPathStillCounts: once calls in the process name classes, a standard
// Allow on a key no critical caller asked for takes the backend's fast path (it went the
// long way on every key: BenchmarkLeaseAllowOneKey, impl=sluice-lease-classed), and is
// still counted: a sheddable caller on that key then keeps its headroom (40% of the
// burst) for it, and a standard caller on a key a critical one asked for keeps 15%.
func TestStandardFastPathStillCounts(t *testing.T) {
	clk := clock.NewVirtual()
	l, err := New(MustParse("10/s burst=10"), WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	crit, shed := priority.With(bg, priority.Critical), priority.With(bg, priority.Sheddable)
	l.Allow(crit, "other") // the process's calls name classes
	clk.Advance(2 * time.Second)
	if !l.Allow(bg, "api") {
		t.Fatal("a standard Allow refused on a full burst")
	}
	n := 0
	for l.Allow(shed, "api") {
		n++
	}
	if n != 5 {
		t.Errorf("sheddable took %d of the 9 permits left beside a standard caller, want 5 (4 of 10 kept)", n)
	}
	l.Allow(crit, "crit")
	n = 0
	for l.Allow(bg, "crit") {
		n++
	}
	if n != 7 {
		t.Errorf("standard took %d of the 9 permits left beside a critical caller, want 7 (2 of 10 kept)", n)
	}
}
