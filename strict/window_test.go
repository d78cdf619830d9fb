package strict

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
)

// win is a quota of n permits per window of w.
func win(n int64, w time.Duration) gcra.Limit {
	t := int64(w) / n
	return gcra.Limit{T: t, Tau: n * t, Window: int64(w)}
}

// TestWindowDifferential: random weighted decisions (some reserving ahead), penalties and
// charges on keys with one or two windowed quotas get the same answers from window.lua in
// a real Redis as from the Go core (gcra.Decide), at the same virtual times (whole
// microseconds).
func TestWindowDifferential(t *testing.T) {
	clk := clock.NewVirtual()
	b := New(newClient(t, shared.URL()), withNow(clk.Nanotime), WithTimeout(5*time.Second), WithPrefix(prefix(t)))
	defer b.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	us := int64(time.Microsecond)
	var granted, reserved, denied int
	for trial := range 30 {
		ls := []gcra.Limit{win(1+rng.Int64N(10), time.Duration(1+rng.Int64N(10))*time.Second)}
		if trial%2 == 0 {
			ls = append(ls, win(5+rng.Int64N(40), time.Duration(10+rng.Int64N(50))*time.Second))
		}
		key := "k" + string(rune('a'+trial))
		tats := make([]int64, len(ls))
		now := clk.Nanotime()
		for step := range 80 {
			now += rng.Int64N(int64(ls[0].Window)/3) / us * us
			clk.Set(now)
			switch {
			case rng.IntN(25) == 0:
				d := rng.Int64N(ls[0].Window) / us * us
				gcra.Penalize(tats, ls, now, now+d)
				if err := b.Penalize(ctx, key, ls, time.Duration(d)); err != nil {
					t.Fatal(err)
				}
				continue
			}
			n := 1 + rng.Int64N(gcra.MaxCost(ls))
			md := int64(0)
			if rng.IntN(3) == 0 {
				md = rng.Int64N(2*ls[0].Window) / us * us
			}
			want, _, err := gcra.Decide(tats, ls, now, n, md)
			if err != nil {
				t.Fatal(err)
			}
			g, err := b.Decide(ctx, key, backend.Request{Limits: ls, N: n, MaxDelay: time.Duration(md)})
			if err != nil {
				t.Fatalf("trial %d step %d: %v", trial, step, err)
			}
			if g.Result != want {
				t.Fatalf("trial %d step %d: n=%d maxDelay=%d: redis %+v, core %+v", trial, step, n, md, g.Result, want)
			}
			switch {
			case !want.Allowed:
				denied++
			case want.Delay > 0:
				reserved++
			default:
				granted++
			}
		}
	}
	t.Logf("%d granted at once, %d reserved ahead, %d denied", granted, reserved, denied)
	if granted == 0 || reserved == 0 || denied == 0 {
		t.Error("the sequences missed a kind of decision")
	}
}

// TestWindowRealTime: on Redis' clock, a limiter with a daily quota takes its count and
// no more, says the quota comes back at the next 00:00 UTC, settles a refund back into
// the window, forgets the key on Reset, and refuses a window beside a rate.
func TestWindowRealTime(t *testing.T) {
	b := New(newClient(t, shared.URL()), WithPrefix(prefix(t)), WithTimeout(5*time.Second))
	defer b.Close()
	l, err := sluice.New(sluice.MustParse("5/24h window"), sluice.WithBackend(b))
	if err != nil {
		t.Fatal(err)
	}
	r, err := l.ReserveWithin(ctx, "k", 3, 0)
	if err != nil || !r.Allowed {
		t.Fatalf("3 of 5: %+v %v", r, err)
	}
	if err := r.Settle(ctx, 1); err != nil { // 2 given back
		t.Fatal(err)
	}
	d, err := l.AllowN(ctx, "k", 4)
	if err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("4 more after the refund: %+v %v", d, err)
	}
	d, err = l.AllowN(ctx, "k", 1)
	if err != nil || d.Allowed {
		t.Fatalf("a sixth: %+v %v", d, err)
	}
	midnight := time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
	if until := time.Until(midnight); d.RetryAfter < until-2*time.Second || d.RetryAfter > until+2*time.Second {
		t.Errorf("RetryAfter %v, want about %v (to 00:00 UTC)", d.RetryAfter, until)
	}
	if err := l.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if d, err := l.AllowN(ctx, "k", 5); err != nil || !d.Allowed {
		t.Errorf("after Reset: %+v %v", d, err)
	}
	if _, err := sluice.New(sluice.MustParse("10/s; 5/24h window"), sluice.WithBackend(b)); !errors.Is(err, backend.ErrUnsupported) {
		t.Errorf("a window beside a rate: got %v, want ErrUnsupported", err)
	}
	if _, err := b.Decide(ctx, "m", backend.Request{Limits: []gcra.Limit{win(5, time.Hour), {T: 1e6, Tau: 1e6}}, N: 1}); !errors.Is(err, ErrMixedWindows) {
		t.Errorf("the backend asked to mix: got %v, want ErrMixedWindows", err)
	}
}

// TestWindowPoolProperty: a pool of limiters sharing one daily quota through a real Redis,
// in virtual time starting at random hours of the day: members join at random, crash
// (their reservations are never settled or cancelled), take weighted permits (1 to 5),
// reserve up to a minute ahead, and settle some grants to less. Over every window, the
// permits granted (net of refunds) never exceed the count, and with demand above the
// quota the window is used to within one request's cost of its count before it ends.
func TestWindowPoolProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const count = 500
	for trial := range 4 {
		start := time.Date(2026, 6, 1+trial, rng.IntN(24), rng.IntN(60), 0, 0, time.UTC)
		clk := clock.NewVirtualAt(start)
		origin := start.UnixNano()
		b := New(newClient(t, shared.URL()), withNow(func() int64 { return origin + clk.Nanotime() }), WithTimeout(5*time.Second), WithPrefix(prefix(t)))
		lim := sluice.MustParse("500/24h window")
		var members []*sluice.Limiter
		var alive []bool
		used := map[int64]int64{} // window start (Unix ns) -> permits counted
		day := int64(24 * time.Hour)
		windowOf := func(at int64) int64 { return at - at%day }
		for step := 0; clk.Now().Before(start.Add(3 * 24 * time.Hour)); step++ {
			if len(members) == 0 || rng.IntN(50) == 0 {
				l, err := sluice.New(lim, sluice.WithBackend(b), sluice.WithClock(clk), sluice.WithMaxWait(time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				members, alive = append(members, l), append(alive, true)
			}
			if rng.IntN(80) == 0 {
				alive[rng.IntN(len(alive))] = false // a crash: its reservations are left as they are
			}
			i := rng.IntN(len(members))
			if !alive[i] {
				continue
			}
			n := 1 + rng.Int64N(5)
			r, err := members[i].Reserve(ctx, "quota", n)
			if err != nil {
				t.Fatalf("trial %d step %d: %v", trial, step, err)
			}
			if r.Allowed {
				at := clk.Now().Add(r.Delay).UnixNano()
				w := windowOf(at)
				used[w] += n
				if rng.IntN(6) == 0 && r.Delay == 0 {
					keep := rng.Int64N(n + 1)
					if err := r.Settle(ctx, keep); err != nil {
						t.Fatal(err)
					}
					used[w] -= n - keep // a refund in the window it was counted in
				}
				if used[w] > count {
					t.Fatalf("trial %d step %d: %d permits in the day of %v, quota %d", trial, step, used[w], time.Unix(0, w).UTC(), count)
				}
			}
			// Demand: about 0.01/s of requests averaging 3 permits, 2,600 a day, above the quota.
			clk.Advance(time.Duration(rng.Int64N(int64(200 * time.Second))))
		}
		nfull := 0
		for w, u := range used {
			full := w >= start.UnixNano() && w+day <= clk.Now().UnixNano() // a whole day inside the run
			if full {
				nfull++
			}
			if full && u < count-4 {
				t.Errorf("trial %d: the day of %v used %d of %d", trial, time.Unix(0, w).UTC(), u, count)
			}
		}
		if nfull < 2 {
			t.Errorf("trial %d: %d whole days in the run, want at least 2", trial, nfull)
		}
		for _, l := range members {
			l.Close()
		}
		b.Close()
	}
}

// TestRampOnRedis: a limiter ramping "100/s ramp=10/s..60s" through the GCRA script (each
// call carries the limit of its instant) admits, second by second, what the ramp's line
// allows, as in process.
func TestRampOnRedis(t *testing.T) {
	clk := clock.NewVirtual()
	b := New(newClient(t, shared.URL()), withNow(clk.Nanotime), WithTimeout(5*time.Second), WithPrefix(prefix(t)))
	defer b.Close()
	l, err := sluice.New(sluice.MustParse("100/s ramp=10/s..60s"), sluice.WithBackend(b), sluice.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	step := 50 * time.Millisecond
	for sec := range 62 {
		var got int64
		for range int(time.Second / step) {
			for l.Allow(ctx, "k") {
				got++
			}
			clk.Advance(step)
		}
		lo, hi := 10+90*float64(sec)/60, 10+90*float64(sec+1)/60
		if sec >= 60 {
			lo, hi = 100, 100
		}
		if sec == 0 {
			hi += 10 // the scaled burst
		}
		if float64(got) < lo-2 || float64(got) > hi+1 {
			t.Errorf("second %d: admitted %d, want %.1f to %.1f", sec, got, lo, hi)
		}
	}
}

// TestWindowExpiryAtWindowEnd: in real time, a window counter's key expires exactly when
// its window ends: the script gives Redis the end itself (PXAT). docs/strict.md,
// "Windowed quotas: the window counter", says why a TTL (PX) was a millisecond off. The
// windows are an hour long, so that a window rarely ends between a write and the read of
// its expiry (a key found gone is skipped).
func TestWindowExpiryAtWindowEnd(t *testing.T) {
	c := newClient(t, shared.URL())
	b := New(c, WithPrefix(prefix(t)), WithTimeout(5*time.Second))
	defer b.Close()
	ls := []gcra.Limit{win(1_000_000_000_000, time.Hour)}
	off, gone := 0, 0
	for i := 0; i < 4000; i++ {
		k := fmt.Sprint("k", i%50)
		if g, err := b.Decide(ctx, k, backend.Request{Limits: ls, N: 1}); err != nil || !g.Allowed {
			t.Fatalf("%+v %v", g, err)
		}
		at, err := c.PExpireTime(ctx, b.windowKey(k)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if at < 0 { // gone: its window ended since the write
			gone++
			continue
		}
		if at%time.Hour != 0 {
			off++
			if off <= 3 {
				t.Errorf("%s expires at %v, not at the end of a window (a whole hour)", k, at)
			}
		}
	}
	if off > 0 {
		t.Errorf("%d of 4000 writes expired their counter off its window's end", off)
	}
	if gone > 100 {
		t.Errorf("%d of 4000 counters gone right after their write", gone)
	}
}
