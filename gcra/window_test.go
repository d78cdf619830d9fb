package gcra

import (
	"math/rand/v2"
	"testing"
)

// win is a quota of n permits per window of w nanoseconds.
func win(n, w int64) Limit { t := w / n; return Limit{T: t, Tau: n * t, Window: w} }

// TestWindowTable: 3 permits per 10 s window, windows starting at multiples of 10 s.
func TestWindowTable(t *testing.T) {
	l := win(3, 10*sec)
	steps := []struct {
		at        int64
		n         int64
		maxDelay  int64
		allowed   bool
		delay     int64
		remaining int64
		retry     int64
		reset     int64
	}{
		{1 * sec, 1, 0, true, 0, 2, 0, 9 * sec},
		{2 * sec, 2, 0, true, 0, 0, 0, 8 * sec},
		{3 * sec, 1, 0, false, 0, 0, 7 * sec, 7 * sec},           // full until the boundary
		{9*sec + 999, 0, 0, true, 0, 0, 0, 1*sec - 999},          // a query
		{10 * sec, 3, 0, true, 0, 0, 0, 10 * sec},                // a new window: the whole count
		{11 * sec, 2, 20 * sec, true, 9 * sec, 0, 0, 19 * sec},   // reserved in the next window
		{12 * sec, 2, 10 * sec, false, 0, 0, 18 * sec, 18 * sec}, // the next has 1 left: the one after is too far
		{12 * sec, 1, 20 * sec, true, 8 * sec, 0, 0, 18 * sec},   // the last of the next window
		{25 * sec, 1, 0, false, 0, 0, 5 * sec, 5 * sec},          // that window is full now
		{30 * sec, 2, 0, true, 0, 1, 0, 10 * sec},
		{45 * sec, 3, 0, true, 0, 0, 0, 5 * sec}, // a window skipped: fresh again
	}
	tats := []int64{0}
	for i, s := range steps {
		r, _, err := Decide(tats, []Limit{l}, s.at, s.n, s.maxDelay)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if r.Allowed != s.allowed || r.Delay != s.delay || r.Remaining != s.remaining || r.RetryAfter != s.retry || r.ResetAfter != s.reset {
			t.Errorf("step %d: got allowed=%v delay=%d remaining=%d retry=%d reset=%d, want %v %d %d %d %d",
				i, r.Allowed, r.Delay, r.Remaining, r.RetryAfter, r.ResetAfter, s.allowed, s.delay, s.remaining, s.retry, s.reset)
		}
	}
	if _, _, err := Decide(tats, []Limit{l}, 50*sec, 4, 0); err != ErrCostExceedsBurst {
		t.Errorf("a cost above the count: got %v, want ErrCostExceedsBurst", err)
	}
}

// TestWindowProperty: random weighted requests, reservations, settlements and penalties
// over a window limit alone and beside a GCRA limit never count more than the quota in
// any window (each grant counted in the window of its At); a request denied at once with
// no reservation allowed is denied only when its window is full (no capacity is lost); and
// a key with permits counted in the current window is never Idle.
func TestWindowProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for trial := range 300 {
		q := win(1+rng.Int64N(20), (1+rng.Int64N(20))*sec)
		ls := []Limit{q}
		if trial%3 == 0 {
			ls = append(ls, lim(1+rng.Int64N(10), sec, 1+rng.Int64N(5)))
		}
		tats := make([]int64, len(ls))
		used := map[int64]int64{} // window end -> permits counted
		type grant struct {
			tk Ticket
		}
		var last *grant
		now := int64(rng.Int64N(100)) * sec
		var hold int64
		for step := range 400 {
			now += rng.Int64N(q.Window / 4)
			n := 1 + rng.Int64N(MaxCost(ls))
			md := int64(0)
			if rng.IntN(4) == 0 {
				md = rng.Int64N(2 * q.Window)
			}
			if rng.IntN(40) == 0 {
				until := now + rng.Int64N(q.Window)
				Penalize(tats, ls, now, until)
				hold = max(hold, until)
				last = nil
				continue
			}
			if last != nil && rng.IntN(8) == 0 {
				newN := rng.Int64N(last.tk.N + 1)
				e := q.WindowEnd(last.tk.At)
				before := tats[0]
				tk, err := Adjust(tats, ls, now, last.tk, newN, hold)
				if err != nil {
					t.Fatal(err)
				}
				if tats[0] < before { // a refund given back to its window
					used[e] -= last.tk.N - newN
				} else if newN > last.tk.N {
					used[q.WindowEnd(now)] += 0 // a charge is the API's count, not a grant: not checked
				}
				last.tk = tk
				continue
			}
			r, tk, err := Decide(tats, ls, now, n, md)
			if err != nil {
				t.Fatalf("trial %d step %d: %v", trial, step, err)
			}
			if r.Allowed {
				if tk.At < hold {
					t.Fatalf("trial %d step %d: granted at %d before the penalty's end %d", trial, step, tk.At, hold)
				}
				e := q.WindowEnd(tk.At)
				used[e] += n
				if used[e] > q.Burst() {
					t.Fatalf("trial %d step %d: %d permits in the window ending %d, quota %d", trial, step, used[e], e, q.Burst())
				}
				last = &grant{tk}
			} else if md == 0 && len(ls) == 1 && now >= hold && r.RetryAfter > 0 {
				if e := q.WindowEnd(now); used[e]+n <= q.Burst() && tats[0] <= e+used[e]*q.T {
					t.Fatalf("trial %d step %d: denied %d with %d of %d used", trial, step, n, used[e], q.Burst())
				}
			}
			if used[q.WindowEnd(now)] > 0 && Idle(tats[:1], now) {
				t.Fatalf("trial %d step %d: idle with permits counted in the window", trial, step)
			}
		}
	}
}

func TestWindowAllowOneMatchesDecideOne(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := range 100 {
		l := win(1+rng.Int64N(50), (1+rng.Int64N(5))*sec)
		a, b := int64(0), int64(0)
		now := int64(0)
		for step := range 300 {
			now += rng.Int64N(2 * l.T)
			var ok bool
			a, ok = AllowOne(a, l, now)
			var r Result
			b, r, _ = DecideOne(b, l, now, 1, 0)
			if ok != r.Allowed || a != b {
				t.Fatalf("trial %d step %d: AllowOne %v %d, DecideOne %v %d", trial, step, ok, a, r.Allowed, b)
			}
		}
	}
}

func TestWindowValidateAndShare(t *testing.T) {
	if err := (Limit{T: 4, Tau: 12, Window: 10}).Validate(); err == nil {
		t.Error("a window shorter than its count's Tau validated")
	}
	if err := (Limit{T: 3, Tau: 9, Window: 10}).Validate(); err != nil {
		t.Errorf("3 per 10ns: %v", err)
	}
	s := win(10000, 24*3600*sec).Share(0.25)
	if s.Window != 24*3600*sec || s.Burst() != 2500 || s.Tau > s.Window {
		t.Errorf("a quarter of 10000/24h: got %+v (burst %d)", s, s.Burst())
	}
	ls := []Limit{win(5, sec), lim(10, sec, 10), win(2, sec)}
	o := win(3, 10*sec)
	o.Origin = 4 * sec // now = 0 is 4 s into a window: it ends at now = 6 s
	if e := o.WindowEnd(0); e != 6*sec {
		t.Errorf("WindowEnd with an origin: got %d, want %d", e, 6*sec)
	}
	if k := PenaltyLimit(ls); k != 1 {
		t.Errorf("PenaltyLimit: got %d, want the GCRA limit 1", k)
	}
	if k := PenaltyLimit([]Limit{win(5, sec), win(2, sec/2)}); k != 1 {
		t.Errorf("PenaltyLimit of windows: got %d, want 1", k)
	}
}
