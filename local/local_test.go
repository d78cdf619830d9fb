package local

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/backendtest"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
)

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T, clk *clock.Virtual) backend.Backend {
		return New(WithClock(clk))
	})
}

var ctx = context.Background()

func one(rate int64, period time.Duration, burst int64) []gcra.Limit {
	t := (int64(period) + rate - 1) / rate
	return []gcra.Limit{{T: t, Tau: burst * t}}
}

func TestIdleKeysExpire(t *testing.T) {
	clk := clock.NewVirtual()
	b := New(WithClock(clk), WithSweepEvery(time.Second))
	defer b.Close()
	ls := one(1, time.Second, 1)
	for i := 0; i < 100; i++ {
		b.Decide(ctx, fmt.Sprint("k", i), backend.Request{Limits: ls, N: 1})
	}
	multi := append(one(1, time.Second, 1), one(1, time.Minute, 1)...)
	b.Decide(ctx, "multi", backend.Request{Limits: multi, N: 1})
	if b.Len() != 101 {
		t.Fatalf("Len = %d, want 101", b.Len())
	}
	clk.Advance(2 * time.Second)
	b.Decide(ctx, "new", backend.Request{Limits: ls, N: 1}) // an insert past SweepEvery sweeps
	b.wg.Wait()                                             // in the background
	if b.Len() != 2 || b.Evicted() != 100 {
		t.Fatalf("after the sweep: Len %d Evicted %d, want 2 (new, multi) and 100", b.Len(), b.Evicted())
	}
	clk.Advance(time.Minute)
	b.Sweep()
	if b.Len() != 0 {
		t.Fatalf("after a minute: Len %d, want 0", b.Len())
	}
}

func TestKeyCap(t *testing.T) {
	clk := clock.NewVirtual()
	// No background sweep in this test: the hour it advances would start one, and a sweep
	// racing the assertions forgets every idle key, not the one makeRoom takes.
	b := New(WithClock(clk), WithMaxKeys(10), WithSweepEvery(100*time.Hour))
	defer b.Close()
	ls := one(1, time.Hour, 1)
	for i := 0; i < 10; i++ {
		if g, err := b.Decide(ctx, fmt.Sprint("k", i), backend.Request{Limits: ls, N: 1}); err != nil || !g.Allowed {
			t.Fatalf("key %d: %v", i, err)
		}
	}
	if _, err := b.Decide(ctx, "k10", backend.Request{Limits: ls, N: 1}); !errors.Is(err, backend.ErrTooManyKeys) {
		t.Fatalf("11th key: got %v, want ErrTooManyKeys", err)
	}
	// Existing keys are still decided.
	if g, err := b.Decide(ctx, "k3", backend.Request{Limits: ls, N: 1}); err != nil || g.Allowed {
		t.Fatalf("existing key at the cap: %+v %v, want a plain denial", g, err)
	}
	// A penalty on a new key is refused as its decision is, and leaves no hold behind.
	for i := 0; i < 100; i++ {
		if err := b.Penalize(ctx, fmt.Sprint("p", i), ls, time.Hour); !errors.Is(err, backend.ErrTooManyKeys) {
			t.Fatalf("penalty on a new key at the cap: got %v, want ErrTooManyKeys", err)
		}
	}
	if holds := b.holds.Len(); holds != 0 {
		t.Errorf("%d holds kept for keys the backend refused", holds)
	}
	// Once keys go idle, a new key at the cap takes the place of one of them.
	clk.Advance(time.Hour)
	if g, err := b.Decide(ctx, "k10", backend.Request{Limits: ls, N: 1}); err != nil || !g.Allowed {
		t.Fatalf("11th key after the others went idle: %+v %v", g, err)
	}
	if b.Len() != 10 || b.Evicted() != 1 {
		t.Errorf("Len = %d, Evicted = %d, want 10 and 1", b.Len(), b.Evicted())
	}
}

// TestSweepRacesDecisions sweeps continuously while callers decide on a few keys at one
// virtual instant: no key may grant more than its burst, whatever the interleaving of
// sweeps (which kill idle entries) and decisions.
func TestSweepRacesDecisions(t *testing.T) {
	clk := clock.NewVirtual()
	b := New(WithClock(clk))
	defer b.Close()
	ls := one(5, time.Second, 5)
	for round := 0; round < 20; round++ {
		clk.Advance(time.Hour) // every key idle again
		var granted [4]atomic.Int64
		var wg sync.WaitGroup
		stop := make(chan struct{})
		go func() {
			for {
				select {
				case <-stop:
					return
				default:
					b.Sweep()
				}
			}
		}()
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 200; i++ {
					k := i % 4
					if gr, _ := b.Decide(ctx, fmt.Sprint("k", k), backend.Request{Limits: ls, N: 1}); gr.Allowed {
						granted[k].Add(1)
					}
				}
			}()
		}
		wg.Wait()
		close(stop)
		for k := range granted {
			if n := granted[k].Load(); n != 5 {
				t.Fatalf("round %d key %d: %d grants, want 5", round, k, n)
			}
		}
	}
}

// TestMemoryPerKey measures the heap held per key and keeps it under a bound, so a
// regression shows. The figure is in docs/local.md.
func TestMemoryPerKey(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 100k keys")
	}
	const n = 100_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%010d", i) // 14 bytes
	}
	clk := clock.NewVirtual()
	b := New(WithClock(clk), WithMaxKeys(0))
	defer b.Close()
	ls := one(1, time.Hour, 1)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, k := range keys {
		b.Decide(ctx, k, backend.Request{Limits: ls, N: 1})
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("heap per single-limit key (14-byte key, string owned by the caller): %.0f bytes", per)
	if per > 100 {
		t.Errorf("heap per key %.0f bytes, want at most 100", per)
	}
	runtime.KeepAlive(keys)
	runtime.KeepAlive(b)
}

func TestClosed(t *testing.T) {
	b := New()
	defer b.Close()
	b.Close()
	ls := one(1, time.Second, 1)
	if err := b.Adjust(ctx, "k", ls, gcra.Ticket{N: 1}, 0); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Adjust: %v", err)
	}
	if err := b.Penalize(ctx, "k", ls, time.Second); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Penalize: %v", err)
	}
}

func TestZeroAllocs(t *testing.T) {
	b := New()
	defer b.Close()
	ls := one(1_000_000, time.Second, 1000)
	req := backend.Request{Limits: ls, N: 1}
	b.Decide(ctx, "hot", req)
	if a := testing.AllocsPerRun(1000, func() { b.Decide(ctx, "hot", req) }); a != 0 {
		t.Errorf("Decide on an existing single-limit key allocates %v times", a)
	}
	multi := append(one(1_000_000, time.Second, 1000), one(1_000_000, time.Minute, 1000)...)
	mreq := backend.Request{Limits: multi, N: 1}
	b.Decide(ctx, "hotm", mreq)
	if a := testing.AllocsPerRun(1000, func() { b.Decide(ctx, "hotm", mreq) }); a != 0 {
		t.Errorf("Decide on an existing multi-limit key allocates %v times", a)
	}
}

func TestAllowerMatchesDecide(t *testing.T) {
	backendtest.RunAllower(t, func(t *testing.T, clk *clock.Virtual) backend.Backend { return New(WithClock(clk)) })
}

func TestEvictLive(t *testing.T) {
	clk := clock.NewVirtual()
	b := New(WithClock(clk), WithMaxKeys(10), WithEvictLive())
	defer b.Close()
	ls := one(1, time.Hour, 1)
	for i := 0; i < 10; i++ {
		clk.Advance(time.Second) // k0 has the earliest TAT: the one closest to idle
		b.Decide(ctx, fmt.Sprint("k", i), backend.Request{Limits: ls, N: 1})
	}
	for i := 10; i < 15; i++ {
		if g, err := b.Decide(ctx, fmt.Sprint("k", i), backend.Request{Limits: ls, N: 1}); err != nil || !g.Allowed {
			t.Fatalf("new key %d at the cap: %+v %v", i, g, err)
		}
	}
	if b.Len() != 10 || b.EvictedLive() != 5 {
		t.Fatalf("Len %d EvictedLive %d, want 10 and 5", b.Len(), b.EvictedLive())
	}
	// Evicted keys start again with their burst: the price of the eviction.
	if g, _ := b.Decide(ctx, "k0", backend.Request{Limits: ls, N: 1}); !g.Allowed {
		t.Fatalf("k0 was not the victim: the earliest TAT should go first")
	}
}

// TestFloodAtTheCapNeverSweeps: new keys arriving at the key cap make room by sampling,
// at a cost independent of the number of keys; the only sweeps are the periodic ones in
// the background. (At the cap every insert used to sweep the whole map on the caller's
// goroutine, at most once per 50 ms, and a sweep of a million keys takes longer than that:
// a daemon flooded with new tags stalled for tens of seconds.)
func TestFloodAtTheCapNeverSweeps(t *testing.T) {
	for _, evictLive := range []bool{false, true} {
		t.Run(fmt.Sprint("evictLive=", evictLive), func(t *testing.T) {
			clk := clock.NewVirtual()
			const maxKeys, flood = 2000, 10_000
			opts := []Option{WithClock(clk), WithMaxKeys(maxKeys)}
			if evictLive {
				opts = append(opts, WithEvictLive())
			}
			b := New(opts...)
			defer b.Close()
			ls := one(1, 100*time.Millisecond, 1) // idle 100 ms after a grant
			if evictLive {
				ls = one(1, time.Hour, 1) // never idle during the flood
			}
			refused := 0
			for i := 0; i < flood; i++ {
				clk.Advance(50 * time.Millisecond)
				if _, err := b.Decide(ctx, fmt.Sprint("k", i), backend.Request{Limits: ls, N: 1}); err != nil {
					refused++
				}
			}
			b.wg.Wait()
			b.sweepMu.Lock()
			swept := b.swept
			b.sweepMu.Unlock()
			// Periodic sweeps: one per SweepEvery (10 s) of the 500 s flood, each over at
			// most maxKeys keys.
			if limit := int64(50 * maxKeys); swept > limit {
				t.Errorf("sweeps looked at %d entries for %d new keys, want at most %d", swept, flood, limit)
			}
			if refused != 0 {
				t.Errorf("%d new keys refused: the sample should find an idle key (or evict a live one)", refused)
			}
			if b.Len() > maxKeys {
				t.Errorf("Len %d over the cap %d", b.Len(), maxKeys)
			}
			t.Logf("swept %d entries, evicted %d idle and %d live keys", swept, b.Evicted(), b.EvictedLive())
		})
	}
}

// TestHotKeyOutlivesAFlood: at the cap with WithEvictLive, a key in use is never evicted
// by a flood of new keys used once. The hot key is throttled for the whole flood (an
// eviction would grant it a fresh burst), and its TAT is the earliest of all, so the rule
// "evict the sampled key closest to idle" alone took it as soon as a sample held it.
func TestHotKeyOutlivesAFlood(t *testing.T) {
	clk := clock.NewVirtual()
	const maxKeys, flood = 1000, 50_000
	b := New(WithClock(clk), WithMaxKeys(maxKeys), WithEvictLive(), WithSweepEvery(100*time.Hour))
	defer b.Close()
	ls := one(1, time.Hour, 1)
	if ok, err := b.AllowOne(ctx, "hot", ls[0]); err != nil || !ok {
		t.Fatalf("hot key's first permit: %v %v", ok, err)
	}
	for i := 0; i < flood; i++ {
		clk.Advance(time.Millisecond)
		if g, err := b.Decide(ctx, fmt.Sprint("cold", i), backend.Request{Limits: ls, N: 1}); err != nil || !g.Allowed {
			t.Fatalf("cold key %d: %+v %v", i, g, err)
		}
		if i%10 == 0 {
			if ok, err := b.AllowOne(ctx, "hot", ls[0]); err != nil || ok {
				t.Fatalf("step %d: hot key allowed (%v, %v): it was evicted", i, ok, err)
			}
		}
	}
	if b.Len() != maxKeys || b.EvictedLive() < flood-maxKeys {
		t.Errorf("Len %d EvictedLive %d, want %d and at least %d", b.Len(), b.EvictedLive(), maxKeys, flood-maxKeys)
	}
}

// TestAllowOneMatchesTheCore: AllowOne, whose usual case writes gcra.AllowOne out, decides
// as the core does, step by step on virtual time: on a key under a rate, on one under a
// windowed quota (the long way), on a key that had two limits before (converted, carrying
// its first TAT), and on a key reset between steps (a fresh entry).
func TestAllowOneMatchesTheCore(t *testing.T) {
	clk := clock.NewVirtual()
	clk.Set(int64(time.Hour))
	b := New(WithClock(clk))
	defer b.Close()
	rate := one(3, time.Second, 2)[0]
	window := gcra.Limit{T: int64(time.Second) / 4, Tau: int64(time.Second), Window: int64(time.Second)}
	two := append(one(3, time.Second, 2), one(10, time.Minute, 10)...)
	model := map[string]int64{}
	allow := func(step int, key string, l gcra.Limit) {
		t.Helper()
		got, err := b.AllowOne(ctx, key, l)
		if err != nil {
			t.Fatal(err)
		}
		tat, want := gcra.AllowOne(model[key], l, clk.Nanotime())
		model[key] = tat
		if got != want {
			t.Fatalf("step %d, key %s: AllowOne %v, the core %v", step, key, got, want)
		}
	}
	for i := 0; i < 600; i++ {
		clk.Advance(time.Duration(i%7) * 41 * time.Millisecond)
		allow(i, "rate", rate)
		allow(i, "window", window)
		if i%50 == 0 {
			// Two limits for a step: the key's first TAT is carried to its next single decision.
			tats := []int64{model["conv"], 0}
			if _, err := b.Decide(ctx, "conv", backend.Request{Limits: two, N: 1}); err != nil {
				t.Fatal(err)
			}
			gcra.Decide(tats, two, clk.Nanotime(), 1, 0)
			model["conv"] = tats[0]
		}
		allow(i, "conv", rate)
		if i%30 == 0 {
			if err := b.Reset(ctx, "reset"); err != nil {
				t.Fatal(err)
			}
			model["reset"] = 0
		}
		allow(i, "reset", rate)
	}
}
