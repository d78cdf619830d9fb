package gcra

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// ramp100 is "100/s burst=B ramp=10/s..60s" as a Rise at elapsed, with margin m.
func ramp100(burst, elapsed, m int64) Rise {
	return Rise{Elapsed: elapsed, Over: 60 * sec, Rate0: 10, Period0: sec, Rate: 100, Period: sec,
		Burst: burst, Interval: sec / 100, Margin: m}
}

// risen is the limit a Rise is at now, carrying it.
func risen(r Rise) Limit {
	l := Limit{Rise: &r}
	l.T, l.Tau = r.At(0)
	return l
}

// TestRiseAt: the limit along "100/s ramp=10/s..60s" (burst 100): 10/s and a burst of 10
// at the start, 55/s and 55 half-way (the interval rounded up), 100/s and 100 from the
// end on; a 12 ms margin keeps one permit of the burst (two once the interval is under
// 12 ms); burst 1 is spaced by the interval and the margin.
func TestRiseAt(t *testing.T) {
	steps := []struct {
		r      Rise
		d      int64
		t, tau int64
	}{
		{ramp100(100, 0, 0), 0, 100_000_000, 1_000_000_000},
		{ramp100(100, 0, 0), 30 * sec, 18_181_819, 55 * 18_181_819},
		{ramp100(100, 30*sec, 0), 0, 18_181_819, 55 * 18_181_819},
		{ramp100(100, 30*sec, 0), 30 * sec, 10_000_000, 1_000_000_000},
		{ramp100(100, 30*sec, 0), math.MaxInt64, 10_000_000, 1_000_000_000},
		{ramp100(100, 0, 12e6), 0, 100_000_000, 900_000_000},
		{ramp100(100, 0, 12e6), 60 * sec, 10_000_000, 980_000_000},
		{ramp100(1, 0, 12e6), 0, 112_000_000, 112_000_000},
		{ramp100(1, 0, 12e6), 60 * sec, 22_000_000, 22_000_000},
	}
	for i, s := range steps {
		if !s.r.Valid() {
			t.Fatalf("step %d: %+v not valid", i, s.r)
		}
		if tt, tau := s.r.At(s.d); tt != s.t || tau != s.tau {
			t.Errorf("step %d: At(%d) = %d, %d; want %d, %d", i, s.d, tt, tau, s.t, s.tau)
		}
	}
	for _, bad := range []Rise{
		{},
		func() Rise { r := ramp100(100, 60*sec, 0); return r }(),                      // over
		func() Rise { r := ramp100(100, 0, 0); r.Rate0 = 200; return r }(),            // starts faster
		func() Rise { r := ramp100(1<<40, 0, 0); return r }(),                         // a burst beyond exact doubles
		func() Rise { r := ramp100(100, 0, 0); r.Period0 = MaxExact + 1; return r }(), // a period beyond them
	} {
		if bad.Valid() {
			t.Errorf("%+v: valid, want not", bad)
		}
		if err := (Limit{T: 1, Tau: 1, Rise: &bad}).Validate(); err == nil {
			t.Errorf("a limit with %+v: valid, want ErrInvalidLimits", bad)
		}
	}
}

// TestDecideOnARise: bookings at once on the ramp come at the ramp's pace where each
// falls (the 100th at 6.3 s, not at 9.1 s as at the start's 10/s), each spaced at the
// ramp's interval no later than its slot; a key that is not behind decides as the limit
// without its ramp; DecideOne decides as Decide; a cancelled newest booking gives back
// the ramp's final interval, no more than it took.
func TestDecideOnARise(t *testing.T) {
	l := risen(ramp100(100, 0, 0))
	plain := Limit{T: l.T, Tau: l.Tau}
	now := 1000 * sec
	tats, plainTats := []int64{0}, []int64{0}
	one := int64(0)
	var last Ticket
	for k := 1; k <= 100; k++ {
		res, tk, err := Decide(tats, []Limit{l}, now, 1, math.MaxInt64)
		if err != nil || !res.Allowed {
			t.Fatalf("booking %d: %+v %v", k, res, err)
		}
		tat, res1, err := DecideOne(one, l, now, 1, math.MaxInt64)
		if err != nil || res1 != res || tat != tats[0] {
			t.Fatalf("booking %d: DecideOne %+v TAT %d, Decide %+v TAT %d", k, res1, tat, res, tats[0])
		}
		one = tat
		p, _, _ := Decide(plainTats, []Limit{plain}, now, 1, math.MaxInt64)
		if k <= 10 && p != res {
			t.Errorf("booking %d, within the burst: %+v, without the ramp %+v", k, res, p)
		}
		// The booking is spaced at the ramp's interval at a time no later than its slot.
		x := max(now, tk.TatAfter[0]-l.T-l.Tau) // a bound: the TAT before, less Tau
		if rt, _ := l.Rise.At(tk.At - now); k > 10 && tk.TatAfter[0]-max(tk.At, x) < rt {
			t.Errorf("booking %d at %d: spaced %d, under the ramp's interval at its slot %d", k, tk.At-now, tk.TatAfter[0]-tk.At, rt)
		}
		last = tk
	}
	if at := float64(last.At-now) / 1e9; at < 6.0 || at > 6.5 {
		t.Errorf("the 100th booking at %.3f s, want about 6.3 s (the line admits 90 by 6.27 s)", at)
	}
	before := tats[0]
	if _, err := Adjust(tats, []Limit{l}, now, last, 0, 0); err != nil || before-tats[0] != 10_000_000 {
		t.Errorf("cancelling the newest booking gave back %d ns (%v), want the final interval, 10 ms", before-tats[0], err)
	}
}

// TestPropertyRiseNeverAheadOfTheLine: random bookings (costs 1 to 3, now moving on with
// the ramp, reservations unbounded) on random ramps never put more permits in any span
// [a, b] of slots than the ramp's line admits over it, plus the burst the ramp has reached
// by b (scaled, before the margin) and a permit; and the bookings keep up with the line.
func TestPropertyRiseNeverAheadOfTheLine(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for run := range 60 {
		rate := 20 + rng.Int64N(200)
		r := Rise{Over: (10 + rng.Int64N(50)) * sec, Rate0: 1 + rng.Int64N(rate/2), Period0: sec,
			Rate: rate, Period: sec, Burst: []int64{1, 5, rate}[rng.IntN(3)],
			Margin: []int64{0, 12e6}[rng.IntN(2)]}
		r.Interval = (r.Period + r.Rate - 1) / r.Rate
		r0, r1 := float64(r.Rate0)/1e9, float64(r.Rate)/1e9
		start := 500 * sec
		line := func(s int64) float64 { // permits the line admits by s
			e := float64(min(max(s-start, 0), r.Over))
			v := r0*e + (r1-r0)*e*e/(2*float64(r.Over))
			return v + r1*float64(max(s-start-r.Over, 0))
		}
		burst := func(s int64) float64 {
			e := float64(min(max(s-start, 0), r.Over))
			return math.Max(1, math.Floor(float64(r.Burst)*(r0+(r1-r0)*e/float64(r.Over))/r1))
		}
		type permit struct{ at, n int64 }
		var got []permit
		tats := []int64{0}
		now := start
		for range 400 {
			now += rng.Int64N(2 * r.Interval)
			ls := []Limit{{T: 0}}
			if el := now - start; el < r.Over {
				q := r
				q.Elapsed = el
				ls[0] = risen(q)
			} else {
				ls[0].T, ls[0].Tau = Tightened(r.Interval, r.Burst, r.Margin)
			}
			n := 1 + rng.Int64N(min(3, ls[0].Burst()))
			res, tk, err := Decide(tats, ls, now, n, math.MaxInt64)
			if err != nil || !res.Allowed {
				t.Fatalf("run %d: %+v %v", run, res, err)
			}
			got = append(got, permit{tk.At, n})
		}
		sort.Slice(got, func(i, j int) bool { return got[i].at < got[j].at })
		for i := range got {
			var sum int64
			for j := i; j < len(got); j++ {
				sum += got[j].n
				if lim := line(got[j].at) - line(got[i].at) + burst(got[j].at) + 1; float64(sum) > lim {
					t.Fatalf("run %d (%+v): %d permits in [%d, %d] ns after the start, the line admits %.2f", run, r, sum, got[i].at-start, got[j].at-start, lim)
				}
			}
		}
		// Keeping up (without a margin, which slows a small burst): all of them by when
		// the line has admitted them, less a permit's interval at the start, 2% of it.
		var all int64
		for _, p := range got {
			all += p.n
		}
		lastAt := got[len(got)-1].at
		if r.Margin == 0 && float64(all) < 0.98*line(lastAt-(r.Period0+r.Rate0-1)/r.Rate0) {
			t.Errorf("run %d (%+v): %d permits by %d ns, the line admits %.1f", run, r, all, lastAt-start, line(lastAt))
		}
	}
}
