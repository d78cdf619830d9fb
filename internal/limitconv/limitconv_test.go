package limitconv_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/local"
)

// TestCore: a limit's interval is Period/Rate rounded up, its burst tolerance Burst
// intervals.
func TestCore(t *testing.T) {
	for _, c := range []struct {
		limit string
		t     time.Duration
		core  [2]int64
	}{
		{"100/s", 10 * time.Millisecond, [2]int64{1e7, 1e9}},
		{"6/m", 10 * time.Second, [2]int64{1e10, 6e10}},
		{"4500/h", 800 * time.Millisecond, [2]int64{8e8, 4500 * 8e8}},
		{"1/6s", 6 * time.Second, [2]int64{6e9, 6e9}},
		{"10/s burst=20", 100 * time.Millisecond, [2]int64{1e8, 2e9}},
		{"3/s", 333333334, [2]int64{333333334, 1000000002}},
	} {
		ls := sluice.MustParse(c.limit)
		if got := limitconv.Interval(ls[0]); got != c.t {
			t.Errorf("%s: interval %v, want %v", c.limit, got, c.t)
		}
		if core := limitconv.Core(ls, 0)[0]; core.T != c.core[0] || core.Tau != c.core[1] {
			t.Errorf("%s: core %+v, want %v", c.limit, core, c.core)
		}
	}
	// A limit built without a burst has a burst of its rate.
	if got := limitconv.Core([]sluice.Limit{{Rate: 3, Period: time.Second}}, 0)[0]; got.Tau != 1000000002 {
		t.Errorf("3/s without a burst: core %+v", got)
	}
}

// TestMargin: a margin holds whole permits of a burst in reserve, or spaces a burst of one
// T + margin apart.
func TestMargin(t *testing.T) {
	ms := time.Millisecond
	for i, c := range []struct {
		limit  string
		margin time.Duration
		t, tau int64
	}{
		{"20/s burst=10", 10 * ms, 50e6, 9 * 50e6},       // one permit of the burst held back
		{"20/s burst=10", 120 * ms, 50e6, 7 * 50e6},      // ceil(120/50) = 3
		{"1/6s", 10 * ms, 6010e6, 6010e6},                // burst 1: spaced T + J
		{"100/s burst=2", 25 * ms, 10e6 + 15e6, 25e6},    // the reserve would take the burst
		{"20/s burst=10", 0, 50e6, 10 * 50e6},            // exact
		{"20/s burst=10", -time.Second, 50e6, 10 * 50e6}, // negative is zero
	} {
		got := limitconv.Core(sluice.MustParse(c.limit), c.margin)[0]
		if got.T != c.t || got.Tau != c.tau {
			t.Errorf("case %d: %s with margin %v: got T=%d Tau=%d, want %d %d", i, c.limit, c.margin, got.T, got.Tau, c.t, c.tau)
		}
	}
}

// TestCoreAtFollowsTheRamp: the ramped limit's rate is on or under the line from the
// ramp's rate to the limit's, within one permit's rounding, its burst scaled alike, and
// the plain limit once the ramp is over.
func TestCoreAtFollowsTheRamp(t *testing.T) {
	ls := sluice.MustParse("100/s ramp=10/s..60s")
	for _, c := range []struct {
		at        time.Duration
		rate      float64 // permits a second on the line
		wantBurst int64
	}{
		{0, 10, 10}, {30 * time.Second, 55, 55}, {59 * time.Second, 98.5, 98}, {60 * time.Second, 100, 100}, {time.Hour, 100, 100},
	} {
		g := limitconv.CoreAt(ls, 0, c.at)[0]
		got := 1e9 / float64(g.T)
		if got > c.rate || got < c.rate*0.999 {
			t.Errorf("at %v: rate %.3f/s, want %.1f/s (at most)", c.at, got, c.rate)
		}
		if g.Burst() != c.wantBurst {
			t.Errorf("at %v: burst %d, want %d", c.at, g.Burst(), c.wantBurst)
		}
	}
	if limitconv.CoreAt(ls, 0, time.Minute)[0] != limitconv.Core(ls, 0)[0] {
		t.Error("after the ramp, CoreAt is not Core")
	}
	q := limitconv.Core(sluice.MustParse("10000/24h window"), time.Second)[0]
	if q.Window != int64(24*time.Hour) || q.Burst() != 10000 || q.T != 8640*int64(time.Millisecond) {
		t.Errorf("10000/24h window: core %+v", q)
	}
}

// TestCoreRamped: a ramp in core units starts at the ramp's share of the core's rate.
func TestCoreRamped(t *testing.T) {
	got := limitconv.CoreRamped(sluice.MustParse("100/s ramp=10/s..60s; 5/s; 10/h window"), 0)
	want := []gcra.Limit{
		{T: int64(10 * time.Millisecond), Tau: 100 * int64(10*time.Millisecond), Ramp: gcra.Ramp{T0: int64(100 * time.Millisecond), Over: int64(time.Minute)}},
		{T: int64(200 * time.Millisecond), Tau: 5 * int64(200*time.Millisecond)},
		{T: int64(6 * time.Minute), Tau: 10 * int64(6*time.Minute), Window: int64(time.Hour)},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("limit %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestRampsAndWindows(t *testing.T) {
	a := sluice.MustParse("100/s ramp=10/s..60s; 5/s")
	if limitconv.RampOver(a) != time.Minute || limitconv.Windowed(a) {
		t.Errorf("%v: ramp over %v, windowed %v", a, limitconv.RampOver(a), limitconv.Windowed(a))
	}
	if !limitconv.Windowed(sluice.MustParse("5/s; 10/h window")) {
		t.Error("a windowed quota not seen")
	}
	for _, c := range []struct {
		b    string
		same bool
	}{
		{"100/s burst=5 ramp=10/s..60s; 5/s burst=1", true}, // bursts do not ramp apart
		{"100/s ramp=10/s..90s; 5/s", false},
		{"200/s ramp=10/s..60s; 5/s", false},
		{"100/s ramp=10/s..60s", false},
	} {
		if got := limitconv.SameRamps(a, sluice.MustParse(c.b)); got != c.same {
			t.Errorf("SameRamps(%v, %v) = %v, want %v", a, c.b, got, c.same)
		}
	}
}

// plain decides GCRA limits only.
type plain struct{ backend.Backend }

// TestSupports: only the kinds of limit a backend says it decides pass, whatever its state.
func TestSupports(t *testing.T) {
	for _, c := range []struct {
		be     backend.Backend
		limits string
		ok     bool
	}{
		{plain{}, "5/s", true},
		{plain{}, "10/h window", false},
		{plain{}, "100/s ramp=1/s..1m", false},
		{(*local.Backend)(nil), "100/s ramp=1/s..1m; 5/s; 10/h window", true},
		{alone{}, "10/h window; 1000/d window", true},
		{alone{}, "5/s; 10/h window", false},
	} {
		err := limitconv.Supports(c.be, sluice.MustParse(c.limits))
		if (err == nil) != c.ok || err != nil && !errors.Is(err, backend.ErrUnsupported) {
			t.Errorf("%T, %s: %v", c.be, c.limits, err)
		}
	}
}

// alone decides windows only beside windows.
type alone struct{ backend.Backend }

func (alone) Capabilities() backend.Capabilities {
	return backend.Capabilities{Windows: true, WindowsAlone: true}
}
