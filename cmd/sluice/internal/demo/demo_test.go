package demo

import (
	"context"
	"math"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/measure"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// TestSummarizeHandComputed: 20/s burst 10 for 10 s, two workers. w1 wants permits the
// whole run; w2 from 5 s to 10 s. Capacity 10 + 20×10 = 210. Fair shares of the rate:
// w1 20×5 + 10×5 = 150, w2 10×5 = 50; the burst of 10 goes to w1, who alone wanted it at
// the start: 160 and 50. Granted 155 and 50: ratios 155/160 and 1.
func TestSummarizeHandComputed(t *testing.T) {
	inf := math.Inf(1)
	ws := []WorkerReport{{ID: "w1", Granted: 155}, {ID: "w2", JoinedS: 5, Granted: 50}}
	spans := []measure.Span{{Member: 0, Start: 0, End: 10, Demand: inf}, {Member: 1, Start: 5, End: 10, Demand: inf}}
	s := Summarize("local", sluice.MustParse("20/s burst=10"), 10*time.Millisecond, 10*time.Second, 205, 3, ws, spans)
	if s.Capacity != 210 || !near(s.Utilization, 205.0/210) || !near(s.Rate, 20.5) || s.Violations != 3 {
		t.Errorf("capacity %v utilization %v rate %v violations %d", s.Capacity, s.Utilization, s.Rate, s.Violations)
	}
	if !near(ws[0].FairShare, 160) || !near(ws[1].FairShare, 50) {
		t.Errorf("fair shares %v %v, want 160 50", ws[0].FairShare, ws[1].FairShare)
	}
	x1, x2 := 155.0/160, 1.0
	want := (x1 + x2) * (x1 + x2) / (2 * (x1*x1 + x2*x2))
	if !near(s.Jain, want) || !near(ws[0].Ratio, x1) {
		t.Errorf("jain %v, want %v; ratio %v", s.Jain, want, ws[0].Ratio)
	}
	if s.MarginMs != 10 || s.Limit != "20/s burst=10" {
		t.Errorf("margin %v limit %q", s.MarginMs, s.Limit)
	}
}

func TestScheduleIsDeterministicAndBounded(t *testing.T) {
	a, b := schedule(8, 10, 7), schedule(8, 10, 7)
	left := 0
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("worker %d: %+v then %+v for the same seed", i, a[i], b[i])
		}
		if a[i].join < 0 || a[i].join > 5 || a[i].leave <= a[i].join || a[i].leave > 10 {
			t.Errorf("worker %d: %+v out of bounds", i, a[i])
		}
		if a[i].leave < 10 {
			left++
		}
	}
	if !a[0].steady || a[0].join != 0 || a[0].leave != 10 {
		t.Errorf("the first worker must be steady and stay: %+v", a[0])
	}
	if left != 2 {
		t.Errorf("%d workers leave early, want 2", left)
	}
}

// TestRunShort is the demo in real time, judged loosely for liveness and for safety by
// the referee.
func TestRunShort(t *testing.T) {
	if testing.Short() {
		t.Skip("real time")
	}
	s, err := Run(context.Background(), Config{Limits: sluice.MustParse("20/s burst=10"), Workers: 6, Duration: 2 * time.Second, Margin: 100 * time.Millisecond, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("accepted %d violations %d utilization %.3f jain %.3f", s.Accepted, s.Violations, s.Utilization, s.Jain)
	// The referee judges arrival times, which a loaded machine delays by more than any
	// margin now and then (one 429 in 47 was seen with four builds running beside it): a
	// loose bound here, which a limiter that does not hold the pool back fails by dozens.
	// The local mode's exact conformance is proved in virtual time (the conformance suite).
	if s.Violations > 1+s.Accepted/50 {
		t.Errorf("the referee saw %d violations in %d accepted", s.Violations, s.Accepted)
	}
	if s.Utilization < 0.75 || s.Jain < 0.75 {
		t.Errorf("utilization %.3f jain %.3f: far below what the pool should reach", s.Utilization, s.Jain)
	}
	var granted int64
	for _, w := range s.PerWorker {
		granted += w.Granted
	}
	// A request in flight when the run ends may be accepted by the referee while its
	// worker, whose context ended, never reads the answer: at most one per worker.
	if granted > s.Accepted || s.Accepted-granted > int64(len(s.PerWorker)) {
		t.Errorf("workers counted %d grants, the referee %d", granted, s.Accepted)
	}
}

// TestRunLeaseShort: lease mode in real time, each worker its own member of the limit's
// pool on an in-memory store, joining, going idle and leaving. The referee must see no
// 429; liveness is judged loosely (the acceptance check and the simulator judge it
// closely). The margin is wide enough for a loaded test machine under the race detector.
func TestRunLeaseShort(t *testing.T) {
	if testing.Short() {
		t.Skip("real time")
	}
	s, err := Run(context.Background(), Config{Mode: "lease", Limits: sluice.MustParse("20/s burst=10"), Workers: 6, Duration: 3 * time.Second, Margin: 100 * time.Millisecond, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("accepted %d violations %d utilization %.3f jain %.3f", s.Accepted, s.Violations, s.Utilization, s.Jain)
	if s.Mode != "lease" || s.Violations != 0 {
		t.Errorf("mode %q: the referee saw %d violations", s.Mode, s.Violations)
	}
	if s.Utilization < 0.7 || s.Jain < 0.7 {
		t.Errorf("utilization %.3f jain %.3f: far below what the pool should reach", s.Utilization, s.Jain)
	}
}

// TestRunAdaptiveShort: workers split among three clients that share nothing, each client
// one adaptive.Transport shared by its workers' goroutines, keep the referee's refusals
// rare and use most of the limit (loose bounds: real time; the tight figures are the
// acceptance check's and docs/adaptive.md's).
func TestRunAdaptiveShort(t *testing.T) {
	if testing.Short() {
		t.Skip("real time")
	}
	s, err := Run(context.Background(), Config{Mode: "adaptive", Limits: sluice.MustParse("20/s burst=10"), Workers: 6, Clients: 3, Duration: 4 * time.Second, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("accepted %d violations %d utilization %.3f jain %.3f", s.Accepted, s.Violations, s.Utilization, s.Jain)
	if s.Mode != "adaptive" || s.Clients != 3 || s.Violations*10 > s.Accepted {
		t.Errorf("mode %q, %d clients: %d violations to %d accepted", s.Mode, s.Clients, s.Violations, s.Accepted)
	}
	if s.Utilization < 0.6 {
		t.Errorf("utilization %.3f: far below what the pool should reach", s.Utilization)
	}
}

// TestRunAdaptiveClientsAtMostWorkers: a client is at least one worker.
func TestRunAdaptiveClientsAtMostWorkers(t *testing.T) {
	if _, err := Run(context.Background(), Config{Mode: "adaptive", Limits: sluice.MustParse("1/s"), Workers: 2, Clients: 3, Duration: time.Second}); err == nil {
		t.Fatal("three clients of two workers ran")
	}
}

func TestRunRejectsUnknownMode(t *testing.T) {
	_, err := Run(context.Background(), Config{Mode: "quantum", Limits: sluice.MustParse("1/s"), Duration: time.Second})
	if err == nil {
		t.Fatal("an unknown mode ran")
	}
}
