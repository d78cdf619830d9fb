package sim

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseSweep(t *testing.T) {
	sw, err := ParseSweep("lease.renew = 50ms, 100ms,250ms")
	if err != nil || sw.Key != "lease.renew" || !slices.Equal(sw.Values, []string{"50ms", "100ms", "250ms"}) {
		t.Errorf("%+v %v", sw, err)
	}
	for _, bad := range []string{"", "lease.renew", "=1,2", "lease.renew=", "lease.renew=1,,2"} {
		if _, err := ParseSweep(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

const sweepBase = `
duration: 30s
seed: 3
limit: 50/s burst=10
modes: [strict, lease]
network:
  store: {latency: {dist: uniform, min: 500us, max: 2ms}}
  api: {latency: {dist: uniform, min: 5ms, max: 15ms}}
client: {max_wait: 200ms}
members:
  - name: a
    count: 2
    goroutines: 4
    demand: {pattern: poisson, rate: 20}
  - name: b
    demand: {pattern: poisson, rate: 5}
`

// TestSweepGrid: the grid has every combination, the first key varying slowest; each
// point's scenario has its settings (a section the file lacks is added, a group is found
// by name); a bad key or value is refused with the setting named.
func TestSweepGrid(t *testing.T) {
	sweeps := []Sweep{{Key: "lease.renew", Values: []string{"50ms", "250ms"}}, {Key: "members.b.count", Values: []string{"1", "2", "3"}}}
	points, err := SweepGrid("s.yaml", []byte(sweepBase), sweeps, func(sc *Scenario) { sc.Seed = 9 })
	if err != nil {
		t.Fatal(err)
	}
	if len(points) != 6 {
		t.Fatalf("%d points, want 6", len(points))
	}
	for i, p := range points {
		renew, count := []time.Duration{50 * time.Millisecond, 250 * time.Millisecond}[i/3], i%3+1
		if p.Scenario.Lease.Renew.D() != renew || p.Scenario.Members[1].Count != count || p.Scenario.Members[0].Count != 2 || p.Scenario.Seed != 9 {
			t.Errorf("point %d: renew %v, b %d, a %d, seed %d; want %v, %d, 2, 9", i, p.Scenario.Lease.Renew.D(), p.Scenario.Members[1].Count,
				p.Scenario.Members[0].Count, p.Scenario.Seed, renew, count)
		}
		if want := "lease.renew=" + renew.String(); p.Settings[0].Key+"="+p.Settings[0].Value != want {
			t.Errorf("point %d: settings %v, want %s first", i, p.Settings, want)
		}
	}
	// An index finds a group too; a whole mapping is a value.
	points, err = SweepGrid("s.yaml", []byte(sweepBase), []Sweep{{Key: "members.0.demand", Values: []string{"{pattern: constant, rate: 7}"}}}, nil)
	if err != nil || points[0].Scenario.Members[0].Demand.Pattern != "constant" || points[0].Scenario.Members[0].Demand.Rate != 7 {
		t.Errorf("members.0.demand: %v", err)
	}
	for _, c := range []struct {
		sweeps []Sweep
		want   string
	}{
		{[]Sweep{{Key: "client.nope", Values: []string{"1"}}}, `--sweep client.nope=1: s.yaml: unknown field "nope"`},
		{[]Sweep{{Key: "client.margin", Values: []string{"soon"}}}, `--sweep client.margin=soon: s.yaml: bad duration "soon"`},
		{[]Sweep{{Key: "members.c.count", Values: []string{"1"}}}, `no element named "c"`},
		{[]Sweep{{Key: "seed.x", Values: []string{"1"}}}, "seed is a value, not a section"},
		{[]Sweep{{Key: "seed", Values: []string{"1"}}, {Key: "seed", Values: []string{"2"}}}, "given twice"},
		{[]Sweep{{Key: "seed", Values: slices.Repeat([]string{"1"}, 101)}, {Key: "duration", Values: slices.Repeat([]string{"1s"}, 100)}}, "more than 10000 points"},
		{nil, "at least one"},
	} {
		if _, err := SweepGrid("s.yaml", []byte(sweepBase), c.sweeps, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.sweeps, err, c.want)
		}
	}
}

// TestSweepSkipsInvalidPoints: a point that is not a valid scenario is kept with its
// reason and skipped; the others run, and the report lists it.
func TestSweepSkipsInvalidPoints(t *testing.T) {
	sweeps := []Sweep{{Key: "client.margin", Values: []string{"5ms", "soon", "20ms"}}}
	points, err := SweepGrid("s.yaml", []byte(sweepBase), sweeps, nil)
	if err != nil {
		t.Fatalf("one bad value of three: %v", err)
	}
	if len(points) != 3 || points[0].Err != nil || points[2].Err != nil || points[1].Scenario != nil ||
		points[1].Err == nil || !strings.Contains(points[1].Err.Error(), `--sweep client.margin=soon: s.yaml: bad duration "soon"`) {
		t.Fatalf("points %+v, want the second skipped with its reason", points)
	}
	reports := make([]*Report, len(points))
	for i, p := range points {
		if p.Err == nil {
			if reports[i], err = Run(p.Scenario, Options{Modes: []string{"strict"}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	sr := NewSweepReport(sweeps, points, reports)
	if len(sr.Points) != 2 || sr.Points[1].Settings[0].Value != "20ms" || len(sr.Best) != 1 || sr.Best[0].Point > 1 {
		t.Errorf("points %+v, best %+v: want the two valid points", sr.Points, sr.Best)
	}
	if len(sr.Skipped) != 1 || sr.Skipped[0].Settings[0].Value != "soon" || !strings.HasPrefix(sr.Skipped[0].Reason, `bad duration "soon"`) {
		t.Errorf("skipped %+v, want client.margin=soon with its reason", sr.Skipped)
	}
	var buf bytes.Buffer
	sr.WriteText(&buf)
	if !strings.Contains(buf.String(), "skipped (not valid scenarios): 1 of 3 points\n  client.margin=soon: bad duration \"soon\"") {
		t.Errorf("the text report does not list the skipped point:\n%s", buf.String())
	}
}

// TestSweepBest: the best point per mode is the one with the fewest violations, then the
// highest utilization, then the fewest store operations, the first of equals.
func TestSweepBest(t *testing.T) {
	rep := func(figs ...ModeReport) *Report { return &Report{Scenario: "x", Modes: figs} }
	points := make([]SweepPoint, 5)
	for i := range points {
		points[i].Settings = []Setting{{Key: "k", Value: string(rune('a' + i))}}
	}
	reports := []*Report{
		rep(ModeReport{Mode: "strict", Violations: 1, Utilization: 1, StoreOps: 1}, ModeReport{Mode: "local", Violations: 5}),
		rep(ModeReport{Mode: "strict", Violations: 0, Utilization: 0.9, StoreOps: 10}, ModeReport{Mode: "local", Violations: 4}),
		rep(ModeReport{Mode: "strict", Violations: 0, Utilization: 0.95, StoreOps: 50}, ModeReport{Mode: "local", Violations: 4}),
		rep(ModeReport{Mode: "strict", Violations: 0, Utilization: 0.95, StoreOps: 20}, ModeReport{Mode: "local", Violations: 9}),
		rep(ModeReport{Mode: "strict", Violations: 0, Utilization: 0.95, StoreOps: 20}, ModeReport{Mode: "local", Violations: 4}),
	}
	sr := NewSweepReport([]Sweep{{Key: "k"}}, points, reports)
	if len(sr.Best) != 2 || sr.Best[0].Mode != "strict" || sr.Best[0].Point != 3 || sr.Best[1].Mode != "local" || sr.Best[1].Point != 1 {
		t.Errorf("best %+v, want redis at point 3 (0 violations, 0.95, 20 ops) and local at 1", sr.Best)
	}
	if sr.Best[0].Settings[0].Value != "d" || sr.Best[0].StoreOps != 20 {
		t.Errorf("best redis %+v", sr.Best[0])
	}
}

// TestSweepIsDeterministic: the same grid, run in any order, gives the same bytes.
func TestSweepIsDeterministic(t *testing.T) {
	sweeps := []Sweep{{Key: "client.margin", Values: []string{"0s", "10ms"}}, {Key: "lease.renew", Values: []string{"100ms", "250ms"}}}
	out := func(reverse bool) []byte {
		points, err := SweepGrid("s.yaml", []byte(sweepBase), sweeps, nil)
		if err != nil {
			t.Fatal(err)
		}
		reports := make([]*Report, len(points))
		for k := range points {
			i := k
			if reverse {
				i = len(points) - 1 - k
			}
			if reports[i], err = Run(points[i].Scenario, Options{}); err != nil {
				t.Fatal(err)
			}
		}
		var buf bytes.Buffer
		sr := NewSweepReport(sweeps, points, reports)
		if err := json.NewEncoder(&buf).Encode(sr); err != nil {
			t.Fatal(err)
		}
		sr.WriteText(&buf)
		return buf.Bytes()
	}
	a, b := out(false), out(true)
	if !bytes.Equal(a, b) {
		t.Errorf("two runs of the grid differ:\n%s\n%s", a, b)
	}
	if !bytes.Contains(a, []byte("best (fewest violations")) || !bytes.Contains(a, []byte(`"key":"lease.renew","value":"250ms"`)) {
		t.Errorf("the output lacks the best points or the settings:\n%s", a)
	}
}
