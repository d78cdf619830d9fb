package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestShippedMatrixCoversTheGrid: the shipped matrix names every value of every dimension
// in at least one shape (so each meets every mode, which every shape runs), holds at least
// 150 cells over the five modes, and its quick shapes at least 40; every shape builds a
// scenario.
func TestShippedMatrixCoversTheGrid(t *testing.T) {
	m, err := ShippedMatrix()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]map[string]bool{"limit": {}, "pool": {}, "demand": {}, "event": {}}
	for _, s := range m.Shapes {
		seen["limit"][s.Limit], seen["pool"][s.Pool], seen["demand"][s.Demand], seen["event"][s.Event] = true, true, true, true
	}
	want := map[string][]string{"demand": Demands(), "event": Events()}
	for k := range m.Limits {
		want["limit"] = append(want["limit"], k)
	}
	for k := range m.Pools {
		want["pool"] = append(want["pool"], k)
	}
	for dim, vals := range want {
		for _, v := range vals {
			if !seen[dim][v] {
				t.Errorf("the %s %q is in no shape", dim, v)
			}
		}
	}
	modes := len(MatrixModes())
	if n := len(m.Select(false)) * modes; n < 150 {
		t.Errorf("%d cells in the full matrix, want at least 150", n)
	}
	if n := len(m.Select(true)) * modes; n < 40 {
		t.Errorf("%d cells in the quick matrix, want at least 40", n)
	}
}

// TestMatrixCriteria: each criterion, at fixed figures, step by step.
func TestMatrixCriteria(t *testing.T) {
	m, err := ShippedMatrix()
	if err != nil {
		t.Fatal(err)
	}
	under := MatrixShape{Limit: "ten-a-second", Pool: "four-unequal", Demand: "poisson-85", Event: "none"}
	over := under
	over.Demand = "backlog"
	outage := over
	outage.Event = "outage"
	change := under
	change.Event = "limit-change"
	slow := MatrixShape{Limit: "one-every-6s", Pool: "four-unequal", Demand: "poisson-85", Event: "none"}
	good := MatrixCell{Served: 1, Jain: 1}
	for i, c := range []struct {
		mode  string
		shape MatrixShape
		cell  func(MatrixCell) MatrixCell
		fails bool
	}{
		{"strict", under, func(c MatrixCell) MatrixCell { return c }, false},
		{"strict", under, func(c MatrixCell) MatrixCell { c.Violations = 1; return c }, true},
		{"gossip", under, func(c MatrixCell) MatrixCell { c.Violations, c.Ratio429 = 1, 0.005; return c }, false},
		{"adaptive", under, func(c MatrixCell) MatrixCell { c.Ratio429 = 0.02; return c }, true},
		{"lease", under, func(c MatrixCell) MatrixCell { c.Served = 0.965; return c }, true},
		{"lease", over, func(c MatrixCell) MatrixCell { c.Served = 0.965; return c }, false},
		{"lease", over, func(c MatrixCell) MatrixCell { c.Served = 0.94; return c }, true},
		{"lease", outage, func(c MatrixCell) MatrixCell { c.Served = 0.86; return c }, false},
		{"gossip", outage, func(c MatrixCell) MatrixCell { c.Served = 0.86; return c }, true},
		{"strict", under, func(c MatrixCell) MatrixCell { c.Jain = 0.96; return c }, true},
		{"strict", under, func(c MatrixCell) MatrixCell { c.ExtraP99WaitMs = 1001; return c }, true},
		{"strict", outage, func(c MatrixCell) MatrixCell { c.ExtraP99WaitMs = 30000; return c }, false},
		// three of the limit's intervals: on 1/6s a tail 17 s longer is a few turns, 19 s is not
		{"strict", slow, func(c MatrixCell) MatrixCell { c.ExtraP99WaitMs = 17000; return c }, false},
		{"strict", slow, func(c MatrixCell) MatrixCell { c.ExtraP99WaitMs = 19000; return c }, true},
		// over the limit, waits are not judged (a queue grows whatever the throttle)
		{"lease", over, func(c MatrixCell) MatrixCell { c.ExtraP99WaitMs = 300000; return c }, false},
		// a queue the ideal has too: a tenth of its p99 more is within bounds, not more
		{"lease", under, func(c MatrixCell) MatrixCell { c.IdealP99WaitMs, c.ExtraP99WaitMs = 20000, 1900; return c }, false},
		{"lease", under, func(c MatrixCell) MatrixCell { c.IdealP99WaitMs, c.ExtraP99WaitMs = 20000, 2100; return c }, true},
		// where the ideal's own index is low (arrivals' noise), a mode's is judged against it
		{"lease", under, func(c MatrixCell) MatrixCell { c.IdealJain, c.Jain = 0.75, 0.74; return c }, false},
		{"lease", under, func(c MatrixCell) MatrixCell { c.IdealJain, c.Jain = 0.75, 0.72; return c }, true},
		// across a limit change, what was granted under the old limit: at most its burst
		{"strict", change, func(c MatrixCell) MatrixCell { c.Violations = 10; return c }, false},
		{"strict", change, func(c MatrixCell) MatrixCell { c.Violations = 11; return c }, true},
	} {
		sc, err := m.Scenario(c.shape)
		if err != nil {
			t.Fatal(err)
		}
		why := criteria(c.mode, c.shape, sc, c.cell(good))
		if (why != "") != c.fails {
			t.Errorf("step %d: %s on %s: got %q, want a failure: %v", i, c.mode, c.shape.Name(), why, c.fails)
		}
	}
	// The local mode is one process: its members are groups of goroutines, in its
	// envelope; members that are each a process of their own (local.processes: each) are not.
	one, err := m.Scenario(under)
	if err != nil {
		t.Fatal(err)
	}
	if in, _ := envelope("local", under, 4, one); !in {
		t.Error("the local mode does not claim one process of four members")
	}
	each := *one
	each.Local.Processes = "each"
	if in, why := envelope("local", under, 4, &each); in || !strings.Contains(why, "one process") {
		t.Errorf("the local mode claims a pool of four processes (%q)", why)
	}
	if in, _ := envelope("local", under, 1, &each); !in {
		t.Error("the local mode does not claim one process")
	}
	if in, why := envelope("lease", under, 200, nil); in || !strings.Contains(why, "strict") {
		t.Errorf("the lease mode claims 200 members on one limit (%q)", why)
	}
	if in, _ := envelope("lease", under, 24, nil); !in {
		t.Error("the lease mode does not claim 24 members")
	}
	// The adaptive mode's published strategies are reported beside its default, and
	// claim nothing.
	for _, mode := range []string{"adaptive:heroku", "adaptive:cubic", "adaptive:sre"} {
		if in, why := envelope(mode, under, 4, nil); in || why == "" {
			t.Errorf("%s claims a shape (%q)", mode, why)
		}
	}
	if in, _ := envelope("adaptive", under, 4, nil); !in {
		t.Error("the adaptive mode's default does not claim its shapes")
	}
	// The gossip mode refuses windowed quotas and ramps at configuration (the daemon, and
	// a scenario file): outside its envelope, as any limit is inside it.
	for lim, want := range map[string]bool{"10000/24h window": false, "100/s ramp=10/s..1m": false, "100/s burst=20": true} {
		sc, err := Parse("x.yaml", []byte("duration: 1m\nlimit: '"+lim+"'\nmembers:\n  - {name: a, demand: {pattern: poisson, rate: 1}}\n"))
		if err != nil {
			t.Fatal(err)
		}
		if in, why := envelope("gossip", under, 4, sc); in != want || (!in && !strings.Contains(why, "--check-config")) {
			t.Errorf("gossip on %s: in its envelope %v (%q), want %v", lim, in, why, want)
		}
	}
}

// TestMatrixLimitChangeHalves: a limit change halves each limit's rate, where a rate of
// one becomes one in twice the period, and its burst.
func TestMatrixLimitChangeHalves(t *testing.T) {
	for in, want := range map[string]string{"1/s": "1/2s", "10/s": "5/s", "100/s burst=20": "50/s burst=10", "1/6s": "1/12s"} {
		ev := eventOf("limit-change", "m", sluice.MustParse(in), time.Minute)
		if !strings.Contains(ev, fmt.Sprintf("limit: %q", want)) {
			t.Errorf("%s changes as %q, want to %s", in, ev, want)
		}
	}
}

// TestQuickMatrixIsDeterministic: the quick matrix gives every mode a cell on every quick
// shape, the same to the byte on a second run.
func TestQuickMatrixIsDeterministic(t *testing.T) {
	m, err := ShippedMatrix()
	if err != nil {
		t.Fatal(err)
	}
	shapes := m.Select(true)
	run := func() []byte {
		r, err := RunMatrix(context.Background(), m, shapes, MatrixModes(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Cells) != len(shapes)*len(MatrixModes()) || r.Summary.Cells != len(r.Cells) ||
			r.Summary.Pass+r.Summary.Fail+r.Summary.Outside != r.Summary.Cells {
			t.Fatalf("%d cells for %d shapes, summary %+v", len(r.Cells), len(shapes), r.Summary)
		}
		for _, mode := range MatrixModes() {
			if !slices.ContainsFunc(r.Cells, func(c MatrixCell) bool { return c.Mode == mode }) {
				t.Errorf("no cell of %s", mode)
			}
		}
		b, _ := json.Marshal(r)
		return b
	}
	a, b := run(), run()
	if string(a) != string(b) {
		t.Error("two runs of the quick matrix differ")
	}
	// docs/guarantees.md is what make matrix wrote from the run it recorded, and that
	// run's quick cells are today's.
	rec, err := os.ReadFile("testdata/matrix.json")
	if err != nil {
		t.Fatal(err)
	}
	var recorded, fresh MatrixReport
	if err := json.Unmarshal(rec, &recorded); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(a, &fresh); err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../docs/guarantees.md")
	if err != nil {
		t.Fatal(err)
	}
	if string(doc) != Guarantees(&recorded) {
		t.Error("docs/guarantees.md is not what the run in sim/testdata/matrix.json gives: run make matrix")
	}
	was := map[[2]string]MatrixCell{}
	for _, c := range recorded.Cells {
		was[[2]string{c.Mode, c.Shape}] = c
	}
	for _, c := range fresh.Cells {
		old, ok := was[[2]string{c.Mode, c.Shape}]
		cj, _ := json.Marshal(c)
		oj, _ := json.Marshal(old)
		if !ok || string(cj) != string(oj) {
			t.Errorf("the recorded matrix (sim/testdata/matrix.json, docs/guarantees.md) is stale: run make matrix\n today:    %s\n recorded: %s", cj, oj)
			break
		}
	}
}

// TestMatrixInterrupted: a cancelled run ends with the cells judged so far, marked
// partial.
func TestMatrixInterrupted(t *testing.T) {
	m, err := ShippedMatrix()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	shapes := m.Select(true)
	r, _ := RunMatrix(ctx, m, shapes, []string{"strict"}, func(i, n int, s MatrixShape) {
		if i == 2 {
			cancel()
		}
	})
	if !r.Partial || len(r.Cells) > 3 {
		t.Errorf("partial %v, %d cells after a cancel at the third shape", r.Partial, len(r.Cells))
	}
}
