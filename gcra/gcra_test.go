package gcra

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
)

const sec = int64(1e9)

func lim(rate int64, period int64, burst int64) Limit {
	t := (period + rate - 1) / rate
	return Limit{T: t, Tau: burst * t}
}

// TestOneEverySixSecondsTimeline is the strict mode's example: one permit every 6 s,
// requests at t=2, t=8, t=13 and t=14 (pessimistic: deny rather than reserve).
func TestOneEverySixSecondsTimeline(t *testing.T) {
	l := lim(1, 6*sec, 1)
	steps := []struct {
		at         int64
		allowed    bool
		retryAfter int64
	}{
		{2 * sec, true, 0},
		{8 * sec, true, 0},
		{13 * sec, false, 1 * sec},
		{14 * sec, true, 0},
	}
	tat := int64(0)
	for i, s := range steps {
		var r Result
		var err error
		tat, r, err = DecideOne(tat, l, s.at, 1, 0)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if r.Allowed != s.allowed || r.RetryAfter != s.retryAfter {
			t.Errorf("step %d (t=%ds): got allowed=%v retryAfter=%d, want %v %d", i, s.at/sec, r.Allowed, r.RetryAfter, s.allowed, s.retryAfter)
		}
	}
}

// TestBoundedReservations is the optimistic side of the same example: with reservations
// bounded to one emission interval ahead, the third request reserves the permit at t=14
// and a fourth right after it is refused (the bound is reached).
func TestBoundedReservations(t *testing.T) {
	l := lim(1, 6*sec, 1)
	steps := []struct {
		at      int64
		allowed bool
		delay   int64
	}{
		{2 * sec, true, 0},
		{8 * sec, true, 0},
		{13 * sec, true, 1 * sec},  // reserved for t=14
		{13 * sec, false, 0},       // the next would be at t=20, 7 s ahead: over the bound
		{19 * sec, true, 1 * sec},  // reserved for t=20
		{26 * sec, true, 0},        // permit due
		{27 * sec, true, 5 * sec},  // reserved for t=32
		{27 * sec, false, 0},       // t=38 is 11 s ahead
		{30 * sec, false, 0},       // t=38 is 8 s ahead
		{32 * sec, true, 6 * sec},  // t=38 is exactly 6 s ahead
		{40 * sec, true, 4 * sec},  // t=44
		{100 * sec, true, 0},       // idle long ago: at once
		{100 * sec, true, 6 * sec}, // then the next interval
	}
	tat := int64(0)
	for i, s := range steps {
		var r Result
		tat, r, _ = DecideOne(tat, l, s.at, 1, 6*sec)
		if r.Allowed != s.allowed || r.Delay != s.delay {
			t.Errorf("step %d (t=%ds): got allowed=%v delay=%v, want %v %v", i, s.at/sec, r.Allowed, r.Delay, s.allowed, s.delay)
		}
	}
}

func TestDecideTable(t *testing.T) {
	l := lim(10, sec, 5) // T = 100ms, burst 5
	ms := int64(1e6)
	steps := []struct {
		at        int64
		n         int64
		allowed   bool
		remaining int64
		retry     int64
		reset     int64
	}{
		{0, 1, true, 4, 0, 100 * ms},
		{0, 3, true, 1, 0, 400 * ms},
		{0, 2, false, 1, 100 * ms, 400 * ms},
		{50 * ms, 1, true, 0, 0, 450 * ms},
		{50 * ms, 1, false, 0, 50 * ms, 450 * ms},
		{100 * ms, 1, true, 0, 0, 500 * ms},
		{600 * ms, 5, true, 0, 0, 500 * ms},
		{600 * ms, 0, true, 0, 0, 500 * ms}, // a query changes nothing
		{1100 * ms, 5, true, 0, 0, 500 * ms},
	}
	tats := []int64{0}
	for i, s := range steps {
		r, _, err := Decide(tats, []Limit{l}, s.at, s.n, 0)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if r.Allowed != s.allowed || r.Remaining != s.remaining || r.RetryAfter != s.retry || r.ResetAfter != s.reset {
			t.Errorf("step %d: got allowed=%v remaining=%d retry=%d reset=%d, want %v %d %d %d",
				i, r.Allowed, r.Remaining, r.RetryAfter, r.ResetAfter, s.allowed, s.remaining, s.retry, s.reset)
		}
	}
}

func TestCostErrors(t *testing.T) {
	l := lim(10, sec, 5)
	if _, _, err := Decide([]int64{0}, []Limit{l}, 0, 6, 1<<62); !errors.Is(err, ErrCostExceedsBurst) {
		t.Errorf("cost 6 over burst 5: got %v, want ErrCostExceedsBurst", err)
	}
	if _, _, err := DecideOne(0, l, 0, 6, 0); !errors.Is(err, ErrCostExceedsBurst) {
		t.Errorf("DecideOne cost 6 over burst 5: got %v, want ErrCostExceedsBurst", err)
	}
	if _, _, err := Decide([]int64{0}, []Limit{l}, 0, -1, 0); !errors.Is(err, ErrInvalidCost) {
		t.Errorf("negative cost: got %v", err)
	}
	two := []Limit{lim(100, sec, 20), lim(3, sec, 3)}
	if MaxCost(two) != 3 {
		t.Errorf("MaxCost = %d, want 3", MaxCost(two))
	}
	if _, _, err := Decide([]int64{0, 0}, two, 0, 4, 0); !errors.Is(err, ErrCostExceedsBurst) {
		t.Errorf("cost 4 over the smaller burst 3: got %v", err)
	}
}

func TestValidate(t *testing.T) {
	bad := [][]Limit{nil, {{T: 0, Tau: 1}}, {{T: 2, Tau: 1}}, {{T: 1, Tau: MaxTau + 1}}, make([]Limit, MaxLimits+1)}
	for i, ls := range bad {
		if err := ValidateLimits(ls); !errors.Is(err, ErrInvalidLimits) {
			t.Errorf("case %d: got %v, want ErrInvalidLimits", i, err)
		}
	}
	if err := ValidateLimits([]Limit{lim(1, sec, 1)}); err != nil {
		t.Error(err)
	}
}

// TestDenialConsumesNothing: with several limits, a denial by one leaves every TAT as it
// was.
func TestDenialConsumesNothing(t *testing.T) {
	ls := []Limit{lim(100, sec, 20), lim(2, sec, 2)}
	tats := []int64{0, 0}
	for i := 0; i < 2; i++ {
		if r, _, _ := Decide(tats, ls, 0, 1, 0); !r.Allowed {
			t.Fatalf("grant %d denied", i)
		}
	}
	before := slices.Clone(tats)
	for i := 0; i < 10; i++ {
		if r, _, _ := Decide(tats, ls, 0, 1, 0); r.Allowed {
			t.Fatalf("third grant allowed past the 2/s limit")
		}
	}
	if !slices.Equal(before, tats) {
		t.Errorf("denials changed state: %v -> %v", before, tats)
	}
	// The 100/s limit still has 18 of its burst: once the 2/s limit refills, it binds again.
	r, _, _ := Decide(tats, ls, sec/2, 1, 0)
	if !r.Allowed {
		t.Fatalf("grant at 500ms denied")
	}
}

func TestPenalize(t *testing.T) {
	ls := []Limit{lim(10, sec, 10), lim(4500, 3600*sec, 4500)}
	tats := []int64{0, 0}
	Penalize(tats, ls, 0, 3*sec)
	if r, _, _ := Decide(tats, ls, 3*sec-1, 1, 0); r.Allowed || r.RetryAfter != 1 {
		t.Errorf("before until: got %+v, want denied with RetryAfter 1ns", r)
	}
	if r, _, _ := Decide(tats, ls, 3*sec, 1, 0); !r.Allowed {
		t.Errorf("at until: denied")
	}
	if r, _, _ := Decide(tats, ls, 3*sec, 1, 0); r.Allowed {
		t.Errorf("second permit at until: allowed, want the key drained")
	}
	if tats[1] != 3*sec+800_000_000 {
		t.Errorf("the hourly limit was charged beyond its one permit: tat %d", tats[1])
	}
	before := slices.Clone(tats)
	Penalize(tats, ls, 5*sec, 4*sec)
	if !slices.Equal(before, tats) {
		t.Errorf("a penalty in the past changed state")
	}
}

func TestDecideOneMatchesDecide(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 200; trial++ {
		l := lim(1+rng.Int64N(50), (1+rng.Int64N(5))*sec, 1+rng.Int64N(10))
		tat := int64(0)
		tats := []int64{0}
		now := int64(0)
		for step := 0; step < 200; step++ {
			now += rng.Int64N(l.T * 2)
			n := rng.Int64N(l.Burst() + 1)
			md := rng.Int64N(3) * l.T
			var r1 Result
			tat, r1, _ = DecideOne(tat, l, now, n, md)
			r2, _, _ := Decide(tats, []Limit{l}, now, n, md)
			if r1 != r2 || tat != tats[0] {
				t.Fatalf("trial %d step %d: DecideOne %+v tat %d, Decide %+v tat %d", trial, step, r1, tat, r2, tats[0])
			}
		}
	}
}

// use is a permit use as the API sees it.
type use struct {
	at, n  int64
	forced bool // an overrun charged after the fact: counted, never judged
}

// referee checks that uses conform to each limit: fed in time order to a strict GCRA that
// never reserves, every use must be accepted. It returns the index of the first violation.
func referee(uses []use, ls []Limit) (int, bool) {
	slices.SortStableFunc(uses, func(a, b use) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return 0
	})
	tats := make([]int64, len(ls))
	for i, u := range uses {
		if u.n == 0 {
			continue
		}
		if u.forced {
			for j, l := range ls {
				tats[j] = max(tats[j], u.at) + u.n*l.T
			}
			continue
		}
		r, _, err := Decide(tats, ls, u.at, u.n, 0)
		if err != nil || !r.Allowed {
			return i, false
		}
	}
	return 0, true
}

// countWindow is the conformance of docs/concepts.md, "Conformance", stated directly: in
// every window of length w, at most Burst + floor(w/T) permits. It checks windows that
// start and end at uses.
func countWindow(uses []use, l Limit) bool {
	for i := range uses {
		var sum int64
		for j := i; j < len(uses); j++ {
			sum += uses[j].n
			if sum > l.Burst()+(uses[j].at-uses[i].at)/l.T {
				return false
			}
		}
	}
	return true
}

// windowUses is the uses judged by the window count: overruns are left out, as the
// referee leaves them unjudged.
func windowUses(uses []use) []use {
	var out []use
	for _, u := range uses {
		if !u.forced && u.n > 0 {
			out = append(out, u)
		}
	}
	slices.SortStableFunc(out, func(a, b use) int { return int(a.at - b.at) })
	return out
}

type outstanding struct {
	tk Ticket
	id int
}

// TestPropertyConformance runs random sequences of requests (weights, reservations),
// cancellations (some reaching the core after the grant's slot, as a distributed caller's
// may), settlements up and down, penalties and idle spells through the core, and checks
// that the permits actually used conform to every limit, that nothing is used before a
// penalty's end, and that every grant respects its reservation bound.
func TestPropertyConformance(t *testing.T) {
	trials := 2000 // CancelAt's rule first fails at trial 1054
	if testing.Short() {
		trials = 200
	}
	if v, err := strconv.Atoi(os.Getenv("SLUICE_PROPERTY_TRIALS")); err == nil && v > 0 {
		trials = v // make fuzz runs many more
	}
	for trial := 0; trial < trials; trial++ {
		rng := rand.New(rand.NewPCG(uint64(trial), 7))
		nl := 1 + rng.IntN(3)
		ls := make([]Limit, nl)
		for i := range ls {
			ls[i] = lim(1+rng.Int64N(20), (1+rng.Int64N(10))*sec/2, 1+rng.Int64N(6))
		}
		tats := make([]int64, nl)
		maxN := MaxCost(ls)
		var uses []use
		var open []outstanding
		penaltyUntil := int64(0)
		now := int64(rng.Int64N(sec))
		for step := 0; step < 300; step++ {
			now += rng.Int64N(ls[0].T)
			if rng.IntN(10) == 0 {
				now += rng.Int64N(ls[0].Tau) // an idle spell, partial or whole
			}
			switch op := rng.IntN(10); {
			case op < 6: // request
				n := 1 + rng.Int64N(maxN)
				md := rng.Int64N(4) * ls[0].T
				r, tk, err := Decide(tats, ls, now, n, md)
				if err != nil {
					t.Fatalf("trial %d step %d: %v", trial, step, err)
				}
				if r.Allowed {
					if r.Delay > md {
						t.Fatalf("trial %d step %d: delay %d over bound %d", trial, step, r.Delay, md)
					}
					if tk.At < penaltyUntil {
						t.Fatalf("trial %d step %d: permit at %d inside a penalty until %d", trial, step, tk.At, penaltyUntil)
					}
					uses = append(uses, use{at: tk.At, n: n})
					open = append(open, outstanding{tk, len(uses) - 1})
				}
			case op < 8 && len(open) > 0: // cancel before use, or settle down or up
				k := rng.IntN(len(open))
				o := open[k]
				open = slices.Delete(open, k, k+1)
				var newN int64
				if rng.IntN(2) == 0 {
					if now >= o.tk.At && rng.IntN(2) == 0 {
						continue // already used: cannot be cancelled
					}
					// Cancelled before use; the cancellation may reach the core after the
					// slot (a process' clock and the decider's differ by a round trip).
				} else {
					newN = rng.Int64N(2*o.tk.N + 1)
					if newN > o.tk.N && slices.ContainsFunc(uses, func(u use) bool { return u.at > now && u.n > 0 }) {
						// An overrun while other permits are already promised for later may
						// push the API over for those (they were granted before the overrun
						// was known): that is why an estimate should be an upper bound. The
						// property covers overruns settled when nothing is pending.
						newN = o.tk.N
					}
				}
				if _, err := Adjust(tats, ls, now, o.tk, newN, penaltyUntil); err != nil {
					t.Fatal(err)
				}
				if newN > o.tk.N {
					// A call that overran its estimate: the overrun is charged at now, and
					// the model has the API count it then (the call itself may have broken
					// the limit already; settling cannot undo that, only make up for it).
					uses = append(uses, use{max(now, o.tk.At), newN - o.tk.N, true})
				} else {
					uses[o.id].n = newN
				}
			case op < 9:
				until := now + rng.Int64N(3*ls[0].T)
				Penalize(tats, ls, now, until)
				penaltyUntil = max(penaltyUntil, until)
			}
		}
		for i, l := range ls {
			if k, ok := referee(slices.Clone(uses), []Limit{l}); !ok {
				t.Fatalf("trial %d: limit %d (T=%d burst=%d): use %d violates: %v", trial, i, l.T, l.Burst(), k, uses)
			}
			if !countWindow(windowUses(uses), l) {
				t.Fatalf("trial %d: limit %d breaks the window count", trial, i)
			}
		}
	}
}

// TestNoLostCapacity: while demand exceeds the limit, grants reach it exactly:
// Burst + floor(w/T) permits over a window of length w.
func TestNoLostCapacity(t *testing.T) {
	for _, l := range []Limit{lim(1, 6*sec, 1), lim(10, sec, 5), lim(20, sec, 10), lim(4500, 3600*sec, 4500)} {
		// Pessimistic callers, several attempts on every tick of a grid that divides T.
		tat := int64(0)
		tick := l.T / 4
		var granted int64
		w := 400 * l.T
		start := int64(5 * sec)
		var uses []use
		for now := start; now <= start+w; now += tick {
			for a := int64(0); a < 2+l.Burst(); a++ {
				var r Result
				tat, r, _ = DecideOne(tat, l, now, 1, 0)
				if r.Allowed {
					granted++
					uses = append(uses, use{at: now, n: 1})
				}
			}
		}
		if want := l.Burst() + w/l.T; granted != want {
			t.Errorf("T=%d burst=%d pessimistic: granted %d over %d intervals, want %d", l.T, l.Burst(), granted, w/l.T, want)
		}
		if !countWindow(uses, l) {
			t.Errorf("T=%d burst=%d: grants break the window count", l.T, l.Burst())
		}
		// Optimistic callers: reservations fill every slot.
		tat = 0
		granted = 0
		for i := 0; i < 1000; i++ {
			var r Result
			tat, r, _ = DecideOne(tat, l, start, 1, w)
			if r.Allowed && r.Delay <= w {
				granted++
			}
		}
		if want := min(1000, l.Burst()+w/l.T); granted != want {
			t.Errorf("T=%d burst=%d optimistic: granted %d, want %d", l.T, l.Burst(), granted, want)
		}
	}
}

func TestAdjust(t *testing.T) {
	l := lim(10, sec, 10) // T=100ms
	ls := []Limit{l}
	tats := []int64{0}
	_, tk, _ := Decide(tats, ls, 0, 8, 0)
	// Settle down to 3: the 5 unused permits return at once.
	tk2, _ := Adjust(tats, ls, sec/10, tk, 3, 0)
	if tats[0] != 3*l.T || tk2.N != 3 {
		t.Fatalf("settle down: tat %d N %d, want %d 3", tats[0], tk2.N, 3*l.T)
	}
	// Settle up to 5: 2 more charged at once.
	Adjust(tats, ls, sec/10, tk2, 5, 0)
	if tats[0] != 5*l.T {
		t.Fatalf("settle up: tat %d, want %d", tats[0], 5*l.T)
	}
	// A reservation followed by another: cancelling the first gives nothing back (the
	// second was promised a slot on top of it); cancelling the second, the newest, gives
	// back its permit, and then the first is the newest and gives back its own.
	tats = []int64{0}
	Decide(tats, ls, 0, 10, 0) // drain
	_, a, _ := Decide(tats, ls, 0, 3, sec)
	_, b, _ := Decide(tats, ls, 0, 1, sec)
	Adjust(tats, ls, 0, a, 0, 0)
	if want := 14 * l.T; tats[0] != want {
		t.Errorf("cancel under a later grant: tat %d, want %d", tats[0], want)
	}
	Adjust(tats, ls, 0, b, 0, 0)
	Adjust(tats, ls, 0, a, 0, 0)
	if want := 10 * l.T; tats[0] != want {
		t.Errorf("cancel the newest, then the one under it: tat %d, want %d", tats[0], want)
	}
	// A penalty since the grant: nothing back.
	tats = []int64{0}
	_, p, _ := Decide(tats, ls, 0, 3, 0)
	Penalize(tats, ls, 0, sec)
	before := tats[0]
	Adjust(tats, ls, 0, p, 0, sec)
	if tats[0] != before {
		t.Errorf("refund after a penalty: %d -> %d", before, tats[0])
	}
	// Nothing refunded once the slot has elapsed.
	tats = []int64{0}
	_, c, _ := Decide(tats, ls, 0, 2, 0)
	before = tats[0]
	Adjust(tats, ls, 5*sec, c, 0, 0)
	if tats[0] != before {
		t.Errorf("refund after the slot elapsed: %d -> %d", before, tats[0])
	}
	if _, err := Adjust(tats, ls, 0, c, -1, 0); !errors.Is(err, ErrInvalidCost) {
		t.Errorf("negative settle: %v", err)
	}
}

// TestAdjustKeepsLaterGrants: a grant settled after another was stacked on it (settled
// down to what was used, or cancelled by a caller whose cancellation reached the decider
// late) gives nothing back: the permits of the grant made since are never granted twice.
// T=10, burst 5.
func TestAdjustKeepsLaterGrants(t *testing.T) {
	ls := []Limit{{T: 10, Tau: 50}}
	for _, c := range []struct {
		name  string
		newN  int64 // what the first grant settles to (0: cancelled, never used)
		wantT int64 // the TAT after the settlement
		wantA int64 // when 5 more permits are granted
	}{
		{"cancelled", 0, 40, 40},
		{"settled down to 1", 1, 40, 40},
	} {
		tats := []int64{0}
		_, first, _ := Decide(tats, ls, 0, 3, 0) // 3 at 0: TAT 30
		if _, _, _ = Decide(tats, ls, 25, 1, 0); tats[0] != 40 {
			t.Fatalf("%s: step 1: TAT %d, want 40", c.name, tats[0]) // 1 at 25, on top
		}
		if _, err := Adjust(tats, ls, 25, first, c.newN, 0); err != nil || tats[0] != c.wantT {
			t.Fatalf("%s: step 2: TAT %d (%v), want %d", c.name, tats[0], err, c.wantT)
		}
		r, tk, _ := Decide(tats, ls, 25, 5, 100)
		if !r.Allowed || tk.At != c.wantA {
			t.Fatalf("%s: step 3: 5 permits %+v at %d, want at %d", c.name, r, tk.At, c.wantA)
		}
		uses := []use{{at: 25, n: 1}, {at: tk.At, n: 5}}
		if c.newN > 0 {
			uses = append(uses, use{at: 0, n: c.newN})
		}
		if k, ok := referee(uses, ls); !ok {
			t.Fatalf("%s: use %d breaks the limit: %v", c.name, k, uses)
		}
	}
}

func TestIdle(t *testing.T) {
	if !Idle([]int64{1, 5}, 5) || Idle([]int64{1, 6}, 5) {
		t.Error("Idle wrong")
	}
}

func TestAllowOneMatchesDecideOne(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 100; trial++ {
		l := lim(1+rng.Int64N(50), (1+rng.Int64N(5))*sec, 1+rng.Int64N(10))
		a, b := int64(0), int64(0)
		now := int64(0)
		for step := 0; step < 300; step++ {
			now += rng.Int64N(l.T)
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

func TestShare(t *testing.T) {
	for _, c := range []struct {
		l         Limit
		share     float64
		wantT     int64
		wantBurst int64
	}{
		{Limit{T: 10, Tau: 100}, 0.5, 20, 5},            // half the rate, half the burst
		{Limit{T: 10, Tau: 30}, 1.0 / 3, 30, 1},         // 3 × 1/3 = 0.999…: one permit, not 0
		{Limit{T: 10, Tau: 10}, 0.25, 40, 1},            // at least one permit
		{Limit{T: 3, Tau: 30}, 0.5, 6, 5},               // T rounded up: the share never exceeds
		{Limit{T: MaxTau, Tau: MaxTau}, 0.5, MaxTau, 1}, // within MaxTau
	} {
		got := c.l.Share(c.share)
		if got.T != c.wantT || got.Burst() != c.wantBurst || got.Validate() != nil {
			t.Errorf("%+v.Share(%g) = %+v (burst %d), want T %d burst %d", c.l, c.share, got, got.Burst(), c.wantT, c.wantBurst)
		}
	}
}

// TestHugeSettlementSaturates: settling a grant to a count whose cost does not fit in an
// int64 of nanoseconds holds the key back for good; it never wraps around and reopens it.
func TestHugeSettlementSaturates(t *testing.T) {
	const hour = 3600 * sec
	now := int64(1_700_000_000) * sec // a real Unix time
	for _, n := range []int64{3_000_000, 1 << 40, math.MaxInt64} {
		ls := []Limit{lim(1, hour, 1)}
		tats := []int64{0}
		_, tk, err := Decide(tats, ls, now, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Adjust(tats, ls, now, tk, n, 0); err != nil {
			t.Fatal(err)
		}
		if res, _, _ := Decide(tats, ls, now+sec, 1, 0); res.Allowed {
			t.Errorf("settled to %d: the next permit was allowed (TAT %d)", n, tats[0])
		}
		if tats[0] > MaxTAT || tats[0] < now {
			t.Errorf("settled to %d: TAT %d outside [now, MaxTAT]", n, tats[0])
		}
		// Cancelling a saturated charge gives nothing back: its exact size is lost.
		tk2 := tk
		tk2.N, tk2.TatAfter[0] = n, tats[0]
		if _, err := Adjust(tats, ls, now+sec, tk2, 0, 0); err != nil {
			t.Fatal(err)
		}
		if res, _, _ := Decide(tats, ls, now+2*sec, 1, 0); res.Allowed && n > 1<<30 {
			t.Errorf("settled to %d then cancelled: reopened (TAT %d)", n, tats[0])
		}
	}
}

// TestFarPenaltySaturates: a penalty far in the future (a Retry-After centuries away)
// holds the key back; its end never overflows into the past.
func TestFarPenaltySaturates(t *testing.T) {
	now := int64(1_700_000_000) * sec
	ls := []Limit{lim(10, sec, 10)}
	tats := []int64{0}
	Penalize(tats, ls, now, After(now, math.MaxInt64))
	if res, _, _ := Decide(tats, ls, now+sec, 1, 0); res.Allowed {
		t.Fatalf("a penalty to the end of time was not held (TAT %d)", tats[0])
	}
	if got := After(now, math.MaxInt64); got != MaxTAT {
		t.Errorf("After(now, MaxInt64) = %d, want MaxTAT", got)
	}
	if got := AddSat(math.MaxInt64-1, 5); got != math.MaxInt64 {
		t.Errorf("AddSat overflow = %d", got)
	}
	if got := AddSat(math.MinInt64+1, -5); got != math.MinInt64 {
		t.Errorf("AddSat underflow = %d", got)
	}
	if got := MulSat(1<<40, 1<<40); got != math.MaxInt64 {
		t.Errorf("MulSat = %d", got)
	}
}
