package sluice

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/local"
)

// TestWindowQuotaResetsAtMidnightUTC: a daily quota counts from 00:00 UTC, whenever the
// limiter's clock started, and takes weighted requests.
func TestWindowQuotaResetsAtMidnightUTC(t *testing.T) {
	start := time.Date(2026, 3, 1, 22, 0, 0, 0, time.UTC) // two hours before midnight
	clk := clock.NewVirtualAt(start)
	l, err := New(MustParse("10/24h window"), WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	steps := []struct {
		at        time.Duration // since start
		n         int64
		allowed   bool
		remaining int64
		retry     time.Duration
	}{
		{0, 4, true, 6, 0},
		{time.Hour, 6, true, 0, 0},
		{time.Hour, 1, false, 0, time.Hour},          // full until midnight
		{2*time.Hour - 1, 1, false, 0, 1},            // a nanosecond before it
		{2 * time.Hour, 10, true, 0, 0},              // 00:00 UTC: the whole count
		{25 * time.Hour, 1, false, 0, 1 * time.Hour}, // 23:00 the next day, still full
		{26*time.Hour + time.Minute, 3, true, 7, 0},  // the day after
		{26*time.Hour + 2*time.Minute, 8, false, 7, 24*time.Hour - 2*time.Minute},
	}
	for i, s := range steps {
		clk.Set(int64(s.at))
		d, err := l.AllowN(bg, "k", s.n)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if d.Allowed != s.allowed || d.Remaining != s.remaining || d.RetryAfter != s.retry {
			t.Errorf("step %d at %v: got allowed=%v remaining=%d retry=%v, want %v %d %v", i, clk.Now(), d.Allowed, d.Remaining, d.RetryAfter, s.allowed, s.remaining, s.retry)
		}
	}
}

// TestWaitForTheNextWindow: Wait on a full window waits for the next one.
func TestWaitForTheNextWindow(t *testing.T) {
	clk := clock.NewVirtualAt(time.Date(2026, 3, 1, 10, 59, 0, 0, time.UTC))
	l := MustNew(MustParse("2/h window"), WithClock(clk))
	defer l.Close()
	for i, want := range []bool{true, true, false} {
		if got := l.Allow(bg, "k"); got != want {
			t.Fatalf("request %d of 2/h: got %v, want %v", i, got, want)
		}
	}
	done := make(chan error, 1)
	go func() { done <- l.Wait(bg, "k") }()
	if err := clk.BlockUntil(bg, 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(59*time.Second + 999*time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Wait returned before 11:00: %v", err)
	default:
	}
	clk.Advance(time.Millisecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := clk.Now(); !got.Equal(time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)) {
		t.Errorf("Wait ended at %v, want 11:00", got)
	}
}

// TestRampAdmitsAlongTheLine: "100/s ramp=10/s..60s" admits, second by second, what the
// line from 10/s to 100/s allows (within a permit of rounding and the scaled burst), then
// 100/s; SetLimits with the same ramp does not restart it, and a new ramp does.
func TestRampAdmitsAlongTheLine(t *testing.T) {
	l, clk := newVirtual(t, "100/s ramp=10/s..60s")
	var total int64
	step := 10 * time.Millisecond
	for sec := range 70 {
		var got int64
		for range int(time.Second / step) {
			for l.Allow(bg, "k") {
				got++
			}
			clk.Advance(step)
		}
		total += got
		// The rate over second sec lies between the line at its start and at its end.
		lo := 10 + 90*float64(sec)/60
		hi := 10 + 90*float64(sec+1)/60
		if sec >= 60 {
			lo, hi = 100, 100
		}
		burst := 0.0
		if sec == 0 {
			burst = 10 // the first second also takes the (scaled) burst
		}
		if float64(got) < lo-2 || float64(got) > hi+burst+1 {
			t.Errorf("second %d: admitted %d, want %.1f to %.1f", sec, got, lo, hi+burst)
		}
		if sec == 30 {
			if err := l.SetLimits(MustParse("100/s ramp=10/s..60s")); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("admitted %d in 70 s", total)
	if err := l.SetLimits(MustParse("200/s ramp=10/s..60s")); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second) // a full burst of the new ramp's start
	var got int64
	for range 100 {
		for l.Allow(bg, "k") {
			got++
		}
		clk.Advance(step)
	}
	if got < 8 || got > 30 {
		t.Errorf("a new ramp: admitted %d in its first second, want about 10 (it restarts)", got)
	}
}

// unkinded is a backend that says nothing of the limits it decides beyond GCRA.
type unkinded struct{ backend.Backend }

// TestUnsupportedKindsRefused: a backend that does not say it decides windows or ramps
// (backend.Capable) is refused them by New and SetLimits, with backend.ErrUnsupported.
func TestUnsupportedKindsRefused(t *testing.T) {
	be := unkinded{local.New()}
	defer be.Close()
	for _, s := range []string{"10/h window", "100/s ramp=1/s..1m", "5/s; 10/h window"} {
		if _, err := New(MustParse(s), WithBackend(be)); !errors.Is(err, backend.ErrUnsupported) {
			t.Errorf("New(%q): got %v, want backend.ErrUnsupported", s, err)
		}
	}
	l := MustNew(MustParse("5/s"), WithBackend(be))
	if err := l.SetLimits(MustParse("10/h window")); !errors.Is(err, backend.ErrUnsupported) || l.Limits().String() != "5/s" {
		t.Errorf("SetLimits to a window: got %v, limits %v", err, l.Limits())
	}
}

// TestWithRampStart: a limiter told its ramp started 30 s ago is 30 s into it (a burst of
// 55 of "100/s ramp=10/s..60s"), and RampStart says when it started.
func TestWithRampStart(t *testing.T) {
	clk := clock.NewVirtual()
	clk.Advance(time.Hour)
	began := clk.Now().Add(-30 * time.Second)
	l := MustNew(MustParse("100/s ramp=10/s..60s"), WithClock(clk), WithRampStart(began))
	defer l.Close()
	n := 0
	for l.Allow(bg, "k") {
		n++
	}
	if n != 55 {
		t.Errorf("30 s into the ramp: %d at once, want 55", n)
	}
	if at, ok := l.rampStart(); !ok || !at.Equal(began) {
		t.Errorf("RampStart: %v %v, want %v", at, ok, began)
	}
	if _, ok := MustNew(MustParse("5/s"), WithClock(clk)).rampStart(); ok {
		t.Error("RampStart of a limit without a ramp reported one")
	}
}

// sharedRamps is a backend that ramps limits itself (backend.Capabilities.SharedRamps),
// recording the limits it is asked to decide under.
type sharedRamps struct {
	backend.Backend
	seen [][]gcra.Limit
}

func (s *sharedRamps) Capabilities() backend.Capabilities {
	return backend.Capabilities{Windows: true, Ramps: true, SharedRamps: true}
}
func (s *sharedRamps) Decide(ctx context.Context, key string, req backend.Request) (backend.Grant, error) {
	s.seen = append(s.seen, slices.Clone(req.Limits))
	return backend.Grant{Result: gcra.Result{Allowed: true}}, nil
}

// TestSharedRampsGetTheRampedLimitWhole: a backend that ramps limits itself is given, at
// every decision, the limit as it is once the ramp is over with the ramp in core units
// (100/s from 10/s over 60 s: T 10 ms, T0 100 ms), never the limit the ramp has reached;
// the limiter then reports no ramp start of its own.
func TestSharedRampsGetTheRampedLimitWhole(t *testing.T) {
	clk := clock.NewVirtual()
	be := &sharedRamps{Backend: local.New()}
	defer be.Close()
	l := MustNew(MustParse("100/s ramp=10/s..60s; 5/s"), WithClock(clk), WithBackend(be))
	defer l.Close()
	for range 3 {
		l.AllowN(bg, "k", 1)
		clk.Advance(7 * time.Second)
	}
	want := []gcra.Limit{
		{T: int64(10 * time.Millisecond), Tau: 100 * int64(10*time.Millisecond), Ramp: gcra.Ramp{T0: int64(100 * time.Millisecond), Over: int64(time.Minute)}},
		{T: int64(200 * time.Millisecond), Tau: 5 * int64(200*time.Millisecond)},
	}
	for i, got := range be.seen {
		if !slices.Equal(got, want) {
			t.Errorf("decision %d: limits %+v, want %+v", i, got, want)
		}
	}
	if _, ok := l.rampStart(); ok {
		t.Error("RampStart: the limiter reported a ramp start of its own; the backend keeps it")
	}
}

// TestRampBookingsFollowTheRamp: permits booked far ahead on a ramp are spaced at the
// ramp's pace where each falls, not at the pace of the instant they were booked: a
// thousand permits reserved at once on "100/s ramp=10/s..60s" come along the ramp's line
// (the k-th by when the line has admitted k, less the burst of 10, give or take a
// permit's interval at the start, 0.1 s), never ahead of it. Booked at the start's pace
// (10/s) they lagged the line by up to 37 s (the 1,000th at 99 s instead of 31 s).
func TestRampBookingsFollowTheRamp(t *testing.T) {
	l, _ := newVirtual(t, "100/s ramp=10/s..60s")
	line := func(s float64) float64 { // permits the ramp's line admits by time s
		if s <= 60 {
			return 10*s + 0.75*s*s
		}
		return 3300 + 100*(s-60)
	}
	due := func(k float64) float64 { // when the line has admitted k
		if k > 3300 {
			return 60 + (k-3300)/100
		}
		return (-10 + math.Sqrt(100+3*k)) / 1.5
	}
	bad := 0
	for k := 1; k <= 4000; k++ {
		r, err := l.Reserve(bg, "k", 1)
		if err != nil || !r.Allowed {
			t.Fatalf("permit %d: %+v %v", k, r.Decision, err)
		}
		at := r.Delay.Seconds()
		if k == 1000 {
			t.Logf("the 1,000th permit at %.3f s (the line reaches 990 at %.3f s)", at, due(990))
		}
		if lag := at - due(max(0, float64(k-10))); (lag > 0.1 || float64(k) > line(at)+10+1) && bad < 5 {
			bad++
			t.Errorf("permit %d at %.3f s: the line admits %.1f by then (and a burst of 10), and reaches %d at %.3f s", k, at, line(at), k-10, due(float64(k-10)))
		}
	}
}
