// Package backendtest is the conformance suite that every backend runs: the same steps at
// the same virtual times must give the same decisions, whether they are made in process,
// in Redis or elsewhere.
package backendtest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
)

// Factory makes a fresh backend whose decisions read time from clk. The backend is closed
// by the suite. Keys are unique per test, so a factory may share a store across calls.
type Factory func(t *testing.T, clk *clock.Virtual) backend.Backend

const sec = int64(time.Second)

func lim(rate, period, burst int64) gcra.Limit {
	t := (period + rate - 1) / rate
	return gcra.Limit{T: t, Tau: burst * t}
}

// step is one request at a virtual time and the decision expected.
type step struct {
	at        int64 // virtual nanoseconds
	n         int64
	maxDelay  time.Duration
	allowed   bool
	delay     int64
	remaining int64
}

// Run runs the suite against the backends that f makes.
func Run(t *testing.T, f Factory) {
	var seq atomic.Int64
	key := func(name string) string {
		return fmt.Sprintf("suite-%s-%d-%d", name, time.Now().UnixNano(), seq.Add(1))
	}
	ctx := context.Background()

	setup := func(t *testing.T) (backend.Backend, *clock.Virtual) {
		clk := clock.NewVirtual()
		clk.Set(1000 * sec) // away from zero: a zero TAT must mean "fresh"
		b := f(t, clk)
		t.Cleanup(func() { b.Close() })
		return b, clk
	}
	runSteps := func(t *testing.T, b backend.Backend, clk *clock.Virtual, k string, ls []gcra.Limit, base int64, steps []step) {
		t.Helper()
		for i, s := range steps {
			clk.Set(base + s.at)
			g, err := b.Decide(ctx, k, backend.Request{Limits: ls, N: s.n, MaxDelay: s.maxDelay})
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			if g.Allowed != s.allowed || g.Delay != s.delay || g.Remaining != s.remaining {
				t.Errorf("step %d (t=%v n=%d): got allowed=%v delay=%v remaining=%d, want %v %v %d", i,
					time.Duration(s.at), s.n, g.Allowed, time.Duration(g.Delay), g.Remaining, s.allowed, time.Duration(s.delay), s.remaining)
			}
		}
	}

	t.Run("OneEverySixSeconds", func(t *testing.T) {
		b, clk := setup(t)
		base := clk.Nanotime()
		runSteps(t, b, clk, key("one-every-6s"), []gcra.Limit{lim(1, 6*sec, 1)}, base, []step{
			{at: 2 * sec, n: 1, allowed: true},
			{at: 8 * sec, n: 1, allowed: true},
			{at: 13 * sec, n: 1, allowed: false},
			{at: 14 * sec, n: 1, allowed: true},
		})
	})

	t.Run("BurstAndWeights", func(t *testing.T) {
		b, clk := setup(t)
		base := clk.Nanotime()
		ms := int64(time.Millisecond)
		runSteps(t, b, clk, key("burst"), []gcra.Limit{lim(10, sec, 5)}, base, []step{
			{at: 0, n: 1, allowed: true, remaining: 4},
			{at: 0, n: 3, allowed: true, remaining: 1},
			{at: 0, n: 2, allowed: false, remaining: 1},
			{at: 50 * ms, n: 1, allowed: true, remaining: 0},
			{at: 100 * ms, n: 1, allowed: true, remaining: 0},
			{at: 100 * ms, n: 0, allowed: true, remaining: 0},
			{at: 700 * ms, n: 5, allowed: true, remaining: 0},
		})
	})

	t.Run("BoundedReservations", func(t *testing.T) {
		b, clk := setup(t)
		base := clk.Nanotime()
		runSteps(t, b, clk, key("resv"), []gcra.Limit{lim(1, 6*sec, 1)}, base, []step{
			{at: 2 * sec, n: 1, maxDelay: 6 * time.Second, allowed: true},
			{at: 3 * sec, n: 1, maxDelay: 6 * time.Second, allowed: true, delay: 5 * sec},
			{at: 3 * sec, n: 1, maxDelay: 6 * time.Second, allowed: false},
			{at: 3 * sec, n: 1, maxDelay: 11 * time.Second, allowed: true, delay: 11 * sec},
		})
	})

	t.Run("SeveralLimits", func(t *testing.T) {
		b, clk := setup(t)
		ls := []gcra.Limit{lim(100, sec, 20), lim(2, sec, 2), lim(4500, 3600*sec, 4500)}
		k := key("multi")
		base := clk.Nanotime()
		runSteps(t, b, clk, k, ls, base, []step{
			{at: 0, n: 1, allowed: true, remaining: 1},
			{at: 0, n: 1, allowed: true, remaining: 0},
			{at: 0, n: 1, allowed: false, remaining: 0},
			{at: 0, n: 1, allowed: false, remaining: 0},
			// Denials took nothing from the 100/s and hourly limits: at 500ms the 2/s limit
			// has one permit again, and the others still have theirs.
			{at: sec / 2, n: 1, allowed: true, remaining: 0},
			{at: 10 * sec, n: 2, allowed: true, remaining: 0},
		})
		if _, err := b.Decide(ctx, k, backend.Request{Limits: ls, N: 3}); !errors.Is(err, gcra.ErrCostExceedsBurst) {
			t.Errorf("cost 3 over the burst 2: got %v", err)
		}
	})

	t.Run("CancelAndSettle", func(t *testing.T) {
		b, clk := setup(t)
		ls := []gcra.Limit{lim(10, sec, 10)}
		k := key("settle")
		g, err := b.Decide(ctx, k, backend.Request{Limits: ls, N: 8})
		if err != nil || !g.Allowed {
			t.Fatalf("first grant: %+v %v", g, err)
		}
		if err := b.Adjust(ctx, k, ls, g.Ticket, 3); err != nil {
			t.Fatal(err)
		}
		g2, _ := b.Decide(ctx, k, backend.Request{Limits: ls, N: 7})
		if !g2.Allowed {
			t.Fatalf("after settling 8 down to 3, 7 more were denied")
		}
		if err := b.Adjust(ctx, k, ls, g2.Ticket, 0); err != nil {
			t.Fatal(err)
		}
		g3, _ := b.Decide(ctx, k, backend.Request{Limits: ls, N: 7})
		if !g3.Allowed {
			t.Fatalf("after cancelling 7, 7 more were denied")
		}
		if g4, _ := b.Decide(ctx, k, backend.Request{Limits: ls, N: 1}); g4.Allowed {
			t.Fatalf("an 11th permit was granted")
		}
		// Settling up charges at once.
		clk.Advance(2 * time.Second) // full again
		g5, _ := b.Decide(ctx, k, backend.Request{Limits: ls, N: 2})
		if err := b.Adjust(ctx, k, ls, g5.Ticket, 10); err != nil {
			t.Fatal(err)
		}
		if g6, _ := b.Decide(ctx, k, backend.Request{Limits: ls, N: 1}); g6.Allowed {
			t.Fatalf("after settling 2 up to 10, a permit was granted")
		}
	})

	t.Run("Penalize", func(t *testing.T) {
		b, clk := setup(t)
		ls := []gcra.Limit{lim(10, sec, 10)}
		k := key("pen")
		g0, err := b.Decide(ctx, k, backend.Request{Limits: ls, N: 5})
		if err != nil || !g0.Allowed {
			t.Fatalf("grant before the penalty: %+v %v", g0, err)
		}
		if err := b.Penalize(ctx, k, ls, 3*time.Second); err != nil {
			t.Fatal(err)
		}
		// Cancelling a grant made before the penalty cannot reopen the key.
		if err := b.Adjust(ctx, k, ls, g0.Ticket, 0); err != nil {
			t.Fatal(err)
		}
		g, _ := b.Decide(ctx, k, backend.Request{Limits: ls, N: 1})
		if g.Allowed || g.RetryAfter != 3*sec {
			t.Fatalf("during the penalty: %+v, want denied with RetryAfter 3s", g.Result)
		}
		clk.Advance(time.Second)
		clk.Advance(2*time.Second - 1)
		if g, _ := b.Decide(ctx, k, backend.Request{Limits: ls, N: 1}); g.Allowed {
			t.Fatalf("granted 1ns before the penalty's end")
		}
		clk.Advance(1)
		if g, _ := b.Decide(ctx, k, backend.Request{Limits: ls, N: 1}); !g.Allowed {
			t.Fatalf("denied at the penalty's end")
		}
	})

	t.Run("HugeCountsAndTimesSaturate", func(t *testing.T) {
		// A settlement whose cost overflows an int64 of nanoseconds, and a penalty past
		// what a time.Duration holds, hold the key back; neither wraps around and reopens it.
		b, clk := setup(t)
		ls := []gcra.Limit{lim(1, 3600*sec, 1)}
		k := key("huge")
		g, err := b.Decide(ctx, k, backend.Request{Limits: ls, N: 1, MaxDelay: time.Hour})
		if err != nil || !g.Allowed {
			t.Fatalf("grant: %+v %v", g, err)
		}
		if err := b.Adjust(ctx, k, ls, g.Ticket, 3_000_000); err != nil {
			t.Fatal(err)
		}
		clk.Advance(2 * time.Hour)
		if g, err := b.Decide(ctx, k, backend.Request{Limits: ls, N: 1}); err != nil || g.Allowed {
			t.Fatalf("after settling 1 up to 3,000,000 permits of 1/h: %+v %v, want denied", g.Result, err)
		}
		k2 := key("far")
		ls2 := []gcra.Limit{lim(10, sec, 10)}
		if err := b.Penalize(ctx, k2, ls2, time.Duration(math.MaxInt64)); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Hour)
		if g, err := b.Decide(ctx, k2, backend.Request{Limits: ls2, N: 1}); err != nil || g.Allowed {
			t.Fatalf("during a penalty of 292 years: %+v %v, want denied", g.Result, err)
		}
	})

	t.Run("ResetLiftsAPenalty", func(t *testing.T) {
		b, _ := setup(t)
		r, ok := b.(backend.Resetter)
		if !ok {
			t.Skip("the backend cannot forget a key (no backend.Resetter)")
		}
		ls := []gcra.Limit{lim(10, sec, 10)}
		k := key("reset")
		if g, err := b.Decide(ctx, k, backend.Request{Limits: ls, N: 10}); err != nil || !g.Allowed {
			t.Fatalf("the burst: %+v %v", g, err)
		}
		if err := b.Penalize(ctx, k, ls, 24*time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := r.Reset(ctx, k); err != nil {
			t.Fatal(err)
		}
		if g, err := b.Decide(ctx, k, backend.Request{Limits: ls, N: 10}); err != nil || !g.Allowed {
			t.Fatalf("after Reset: %+v %v, want the whole burst again", g.Result, err)
		}
		if err := r.Reset(ctx, key("never-seen")); err != nil {
			t.Fatalf("Reset of an unknown key: %v", err)
		}
	})

	t.Run("KeysAreIndependent", func(t *testing.T) {
		b, _ := setup(t)
		ls := []gcra.Limit{lim(1, sec, 1)}
		for i := 0; i < 50; i++ {
			if g, err := b.Decide(ctx, key(fmt.Sprint("k", i)), backend.Request{Limits: ls, N: 1}); err != nil || !g.Allowed {
				t.Fatalf("key %d: %+v %v", i, g, err)
			}
		}
	})

	t.Run("ConcurrentCallersGetExactlyTheBurst", func(t *testing.T) {
		b, _ := setup(t)
		for _, ls := range [][]gcra.Limit{{lim(50, sec, 50)}, {lim(50, sec, 50), lim(100, 60*sec, 100)}} {
			k := key("conc")
			var granted atomic.Int64
			var wg sync.WaitGroup
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 40; i++ {
						gr, err := b.Decide(ctx, k, backend.Request{Limits: ls, N: 1})
						if err != nil {
							t.Error(err)
							return
						}
						if gr.Allowed {
							granted.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			if granted.Load() != 50 {
				t.Errorf("%d limits: %d grants at one instant, want exactly the burst 50", len(ls), granted.Load())
			}
		}
	})

	t.Run("LimitsChangeOnAKey", func(t *testing.T) {
		b, _ := setup(t)
		k := key("change")
		one := []gcra.Limit{lim(3, sec, 3)}
		two := []gcra.Limit{lim(3, sec, 3), lim(10, 60*sec, 10)}
		for _, ls := range [][]gcra.Limit{one, two, one} {
			g, err := b.Decide(ctx, k, backend.Request{Limits: ls, N: 1})
			if err != nil || !g.Allowed {
				t.Fatalf("%d limits: %+v %v", len(ls), g, err)
			}
		}
		// Three permits went on the 3/s limit across the changes: the state carried over.
		if g, _ := b.Decide(ctx, k, backend.Request{Limits: one, N: 1}); g.Allowed {
			t.Errorf("state was lost when the key's limits changed")
		}
	})

	t.Run("Closed", func(t *testing.T) { RunClosed(t, f) })
}

// RunClosed checks the part of the contract every backend keeps, whatever decides for it
// (a daemon's rules, say): after Close, every call returns ErrClosed, never a decision.
func RunClosed(t *testing.T, f Factory) {
	ctx := context.Background()
	key := func(name string) string { return fmt.Sprintf("suite-%s-%d", name, time.Now().UnixNano()) }
	clk := clock.NewVirtual()
	b := f(t, clk)
	b.Close()
	ls := []gcra.Limit{lim(1, sec, 1)}
	if _, err := b.Decide(ctx, key("closed"), backend.Request{Limits: ls, N: 1}); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Decide after Close: got %v, want ErrClosed", err)
	}
	if err := b.Adjust(ctx, key("closed"), ls, gcra.Ticket{N: 1}, 0); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Adjust after Close: got %v, want ErrClosed", err)
	}
	if err := b.Penalize(ctx, key("closed"), ls, time.Second); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Penalize after Close: got %v, want ErrClosed", err)
	}
	if r, ok := b.(backend.Resetter); ok {
		if err := r.Reset(ctx, key("closed")); !errors.Is(err, backend.ErrClosed) {
			t.Errorf("Reset after Close: got %v, want ErrClosed", err)
		}
	}
}

// RunAllower checks a backend's Allower fast path against its Decide on random steps.
func RunAllower(t *testing.T, f Factory) {
	clk := clock.NewVirtual()
	b := f(t, clk)
	defer b.Close()
	a, ok := b.(backend.Allower)
	if !ok {
		t.Skip("the backend has no Allower fast path")
	}
	ctx := context.Background()
	ls := []gcra.Limit{lim(3, sec, 2)}
	k1, k2 := fmt.Sprint("allower-a-", time.Now().UnixNano()), fmt.Sprint("allower-b-", time.Now().UnixNano())
	for i := 0; i < 500; i++ {
		clk.Advance(time.Duration(i%7) * 37 * time.Millisecond)
		got, err := a.AllowOne(ctx, k1, ls[0])
		if err != nil {
			t.Fatal(err)
		}
		g, err := b.Decide(ctx, k2, backend.Request{Limits: ls, N: 1})
		if err != nil {
			t.Fatal(err)
		}
		if got != g.Allowed {
			t.Fatalf("step %d: AllowOne %v, Decide %v", i, got, g.Allowed)
		}
	}
}

// RunRamps checks a backend that spaces bookings on a ramp where they fall (limits that
// carry a gcra.Limit.Rise: the strict mode's stores). 1,000 permits booked at once on a
// ramp from 10/s to 100/s over a minute (burst 100, a 12 ms margin) come along the ramp's
// line, not at the start's pace: each decision as the Go core makes it (gcra.Decide, the
// same delays), the 1,000th within 0.1 s of when the line has admitted it less the burst
// of 9 at the start, none ahead of the line. A cancelled booking, the newest, gives back no
// more than it took: the next booking comes no earlier than it did. Those booked 20 s into
// the ramp are spaced at the ramp's pace from there on.
func RunRamps(t *testing.T, f Factory) {
	ctx := context.Background()
	clk := clock.NewVirtual()
	clk.Set(1000 * sec)
	b := f(t, clk)
	defer b.Close()
	key := fmt.Sprintf("ramps-%d", time.Now().UnixNano())
	rise := func(elapsed int64) []gcra.Limit {
		r := &gcra.Rise{Elapsed: elapsed, Over: 60 * sec, Rate0: 10, Period0: sec, Rate: 100, Period: sec,
			Burst: 100, Interval: sec / 100, Margin: int64(12 * time.Millisecond)}
		l := gcra.Limit{Rise: r}
		l.T, l.Tau = r.At(0)
		return []gcra.Limit{l}
	}
	line := func(s float64) float64 { return 10*s + 0.75*s*s } // permits by s seconds in
	due := func(k float64) float64 { return (-10 + math.Sqrt(100+3*k)) / 1.5 }
	base := clk.Nanotime()
	model := make([]int64, 1)
	var last gcra.Ticket
	for k := 1; k <= 1000; k++ {
		ls := rise(0)
		g, err := b.Decide(ctx, key, backend.Request{Limits: ls, N: 1, MaxDelay: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		want, _, _ := gcra.Decide(model, ls, base, 1, int64(time.Hour))
		if g.Allowed != want.Allowed || g.Delay != want.Delay {
			t.Fatalf("booking %d: allowed %v delay %v, the core %v %v", k, g.Allowed, time.Duration(g.Delay), want.Allowed, time.Duration(want.Delay))
		}
		at := float64(g.Delay) / 1e9
		if at-due(max(0, float64(k-9))) > 0.1 || float64(k) > line(at)+9+1 {
			t.Fatalf("booking %d at %.3f s: the line admits %.1f by then (and a burst of 9), %d at %.3f s", k, at, line(at), k-9, due(float64(k-9)))
		}
		last = g.Ticket
	}
	if err := b.Adjust(ctx, key, rise(0), last, 0); err != nil {
		t.Fatal(err)
	}
	g, err := b.Decide(ctx, key, backend.Request{Limits: rise(0), N: 1, MaxDelay: time.Hour})
	if err != nil || !g.Allowed || g.Ticket.At < last.At {
		t.Fatalf("after cancelling the newest booking (at %v): %+v %v, want a booking no earlier", time.Duration(last.At-base), g, err)
	}
	// 20 s on, the ramp is at 40/s: bookings behind the line (at about 31 s) are spaced at
	// the ramp's pace there, about 1/57 s (less where the burst, scaled with the rate,
	// grows by a permit), not at 1/40 s.
	clk.Set(base + 20*sec)
	var first, prev int64
	for k := range 50 {
		g, err := b.Decide(ctx, key, backend.Request{Limits: rise(20 * sec), N: 1, MaxDelay: time.Hour})
		if err != nil || !g.Allowed {
			t.Fatalf("20 s in, booking %d: %+v %v", k, g, err)
		}
		if k == 0 {
			first = g.Ticket.At
		}
		prev = g.Ticket.At
	}
	if gap := time.Duration((prev - first) / 49); gap < 16*time.Millisecond || gap > 19*time.Millisecond {
		t.Errorf("20 s in: bookings %v apart on average, want the ramp's interval where they fall (16 to 19 ms)", gap)
	}
}
