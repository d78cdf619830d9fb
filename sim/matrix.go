package sim

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/priority"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/internal/yamlx"
	"github.com/sluicehq/sluice/lease"
)

// The guarantee matrix: every mode across a designed set of pool shapes, each judged
// against the ideal throttle on the same arrivals (docs/simulator.md, "The guarantee
// matrix"). A shape is a limit, a pool, a demand and an event, each named in the matrix
// file; a cell is one mode on one shape.

// Matrix is a matrix file: the values of each dimension and the shapes that combine them.
type Matrix struct {
	// Base is scenario YAML every shape starts from (network, client, store settings).
	Base string `yaml:"base"`
	// Limits name the limits, each with the virtual time a shape on it runs.
	Limits map[string]MatrixLimit `yaml:"limits"`
	// Pools name the pools: groups of members, each with a weight (its part of the demand).
	Pools map[string][]MatrixGroup `yaml:"pools"`
	// Shapes are the combinations run; Quick marks those of --quick.
	Shapes []MatrixShape `yaml:"shapes"`

	file string
}

// MatrixLimit is one limit of the grid.
type MatrixLimit struct {
	Limit    string   `yaml:"limit"`
	Duration Duration `yaml:"duration"`
	// Goroutines multiplies each member's goroutines on this limit (default 1): a
	// goroutine waits 10 to 30 ms for each answer, so a pool of a few needs more of them
	// to use a limit of thousands a second at all, whatever the throttle.
	Goroutines int `yaml:"goroutines"`
}

// MatrixGroup is a group of identical members of a pool.
type MatrixGroup struct {
	Name       string  `yaml:"name"`
	Count      int     `yaml:"count"`
	Goroutines int     `yaml:"goroutines"`
	Weight     float64 `yaml:"weight"` // each member's part of the pool's demand, relative to the others'
	// Priority is the class of the members' calls (critical, standard, sheddable; the
	// default standard): a pool with a critical group is judged on that group too.
	Priority string `yaml:"priority"`
}

// MatrixShape is one combination of the dimensions.
type MatrixShape struct {
	Limit  string `yaml:"limit"`
	Pool   string `yaml:"pool"`
	Demand string `yaml:"demand"`
	Event  string `yaml:"event"`
	Quick  bool   `yaml:"quick"`
	// Duration, if set, is the shape's run instead of its limit's: a large pool makes
	// thousands of decisions a second, and its figures settle in a shorter run.
	Duration Duration `yaml:"duration"`
}

// Name is the shape's name in reports: limit/pool/demand/event.
func (s MatrixShape) Name() string {
	return s.Limit + "/" + s.Pool + "/" + s.Demand + "/" + s.Event
}

// Demands lists the demand patterns a shape may name: a backlog (always busy), Poisson at
// 50, 85 and 120% of the limit, on/off bursts (twice the limit half the time) and a
// diurnal swing (80% of the limit on average, half of it up and down once a run).
func Demands() []string {
	return []string{"backlog", "poisson-50", "poisson-85", "poisson-120", "onoff", "diurnal"}
}

// Events lists the events a shape may name, each at a fixed fraction of the run: none;
// churn (a member leaves at 30% and joins again at 60%); a crash (at 40%, back at 60%); a
// store outage (at 40%, for a tenth of the run); a partition (the first member cut from
// the store and its peers at 40%, for a tenth of the run); a limit change (halved at 50%).
func Events() []string {
	return []string{"none", "churn", "crash", "outage", "partition", "limit-change"}
}

// matrixFile is the shipped matrix: sim/matrix.yaml.
//
//go:embed matrix.yaml
var matrixFile []byte

// ShippedMatrix returns the matrix that ships with Sluice (sim/matrix.yaml).
func ShippedMatrix() (*Matrix, error) { return parseMatrix("sim/matrix.yaml", matrixFile) }

// LoadMatrix reads and checks a matrix file.
func LoadMatrix(path string) (*Matrix, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseMatrix(path, b)
}

func parseMatrix(path string, b []byte) (*Matrix, error) {
	var m Matrix
	if err := yamlx.Decode(path, b, &m); err != nil {
		return nil, err
	}
	m.file = path
	for i, s := range m.Shapes {
		if _, err := m.Scenario(s); err != nil {
			return nil, fmt.Errorf("%s: shapes[%d] (%s): %w", path, i, s.Name(), err)
		}
	}
	return &m, nil
}

// Select returns the shapes to run: the quick ones, or all.
func (m *Matrix) Select(quick bool) []MatrixShape {
	var out []MatrixShape
	for _, s := range m.Shapes {
		if s.Quick || !quick {
			out = append(out, s)
		}
	}
	return out
}

// limitOf reads a shape's limit: the limit and the rate of its tightest part, per second.
func (m *Matrix) limitOf(s MatrixShape) (MatrixLimit, sluice.Limits, float64, error) {
	ml, ok := m.Limits[s.Limit]
	if !ok {
		return ml, nil, 0, fmt.Errorf("no limit %q", s.Limit)
	}
	ls, err := sluice.Parse(ml.Limit)
	if err != nil {
		return ml, nil, 0, err
	}
	if ml.Duration <= 0 {
		return ml, nil, 0, fmt.Errorf("limit %q: no duration", s.Limit)
	}
	rate := math.Inf(1)
	for _, l := range ls {
		rate = min(rate, float64(l.Rate)/l.Period.Seconds())
	}
	return ml, ls, rate, nil
}

// Scenario builds the shape's scenario: the base, the limit and its duration, the pool
// with each member's demand, and the event.
func (m *Matrix) Scenario(s MatrixShape) (*Scenario, error) {
	y, err := m.ScenarioYAML(s)
	if err != nil {
		return nil, err
	}
	sc, err := Parse(s.Name(), []byte(y))
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, y)
	}
	return sc, nil
}

// Shape finds a shape by its name (limit/pool/demand/event).
func (m *Matrix) Shape(name string) (MatrixShape, bool) {
	for _, s := range m.Shapes {
		if s.Name() == name {
			return s, true
		}
	}
	return MatrixShape{}, false
}

// ScenarioYAML writes the shape's scenario as a scenario file (what Scenario parses), to
// run one cell alone: `sluice sim --matrix --show SHAPE > cell.yaml`.
func (m *Matrix) ScenarioYAML(s MatrixShape) (string, error) {
	ml, ls, rate, err := m.limitOf(s)
	if err != nil {
		return "", err
	}
	groups, ok := m.Pools[s.Pool]
	if !ok || len(groups) == 0 {
		return "", fmt.Errorf("no pool %q", s.Pool)
	}
	dur := ml.Duration.D()
	if s.Duration > 0 {
		dur = s.Duration.D()
	}
	var total float64 // the pool's weight
	for _, g := range groups {
		total += float64(g.Count) * g.Weight
	}
	if total <= 0 {
		return "", fmt.Errorf("pool %q: no weight", s.Pool)
	}
	burst := float64(burstOf(ls))
	var y strings.Builder
	fmt.Fprintf(&y, "name: %s\nduration: %s\nseed: 1\nlimit: %q\n", s.Name(), dur, ml.Limit)
	y.WriteString(m.Base)
	y.WriteString("\nmembers:\n")
	for _, g := range groups {
		part := g.Weight / total // of the pool's demand, per member
		class := ""
		if g.Priority != "" {
			class = ", priority: " + g.Priority
		}
		fmt.Fprintf(&y, "  - {name: %s, count: %d, goroutines: %d%s, demand: %s}\n", g.Name, g.Count, max(g.Goroutines, 1)*max(ml.Goroutines, 1), class, demandOf(s.Demand, rate*part, (burst+rate*dur.Seconds())*part, dur))
	}
	if ev := eventOf(s.Event, groups[0].Name, ls, dur); ev != "" {
		y.WriteString("events:\n" + ev)
	}
	return y.String(), nil
}

// demandOf writes a member's demand: rate is its part of the limit's rate, capacity its
// part of what the limit admits over the run.
func demandOf(kind string, rate, capacity float64, dur time.Duration) string {
	f := func(x float64) string { return fmt.Sprintf("%.6g", x) }
	switch kind {
	case "backlog":
		return fmt.Sprintf("{pattern: backlog, n: %d}", int64(math.Ceil(2*capacity))+2)
	case "poisson-50", "poisson-85", "poisson-120":
		var pct float64
		fmt.Sscanf(strings.TrimPrefix(kind, "poisson-"), "%g", &pct)
		return "{pattern: poisson, rate: " + f(rate*pct/100) + "}"
	case "onoff":
		return fmt.Sprintf("{pattern: onoff, rate: %s, on: %s, off: %s}", f(2*rate), dur/20, dur/20)
	case "diurnal":
		return fmt.Sprintf("{pattern: diurnal, rate: %s, swing: 0.5, period: %s}", f(0.8*rate), dur)
	}
	return "{pattern: " + kind + "}" // refused by Parse, naming the pattern
}

// eventOf writes a shape's event, on member first (the pool's first member) where it
// names one.
func eventOf(kind, first string, ls sluice.Limits, dur time.Duration) string {
	at := func(frac float64) time.Duration { return time.Duration(frac * float64(dur)).Round(time.Millisecond) }
	m := first + "1"
	switch kind {
	case "", "none":
		return ""
	case "churn":
		return fmt.Sprintf("  - {at: %s, leave: %s}\n  - {at: %s, join: %s}\n", at(0.3), m, at(0.6), m)
	case "crash":
		return fmt.Sprintf("  - {at: %s, crash: [%s]}\n  - {at: %s, join: %s}\n", at(0.4), m, at(0.6), m)
	case "outage":
		return fmt.Sprintf("  - {at: %s, store_outage: %s}\n", at(0.4), at(0.1))
	case "partition":
		return fmt.Sprintf("  - {at: %s, partition: [%s], for: %s}\n", at(0.4), m, at(0.1))
	case "limit-change":
		half := make(sluice.Limits, len(ls))
		for i, l := range ls {
			half[i] = l
			if half[i].Rate = l.Rate / 2; half[i].Rate == 0 {
				half[i].Rate, half[i].Period = 1, 2*l.Period // 1/s halves to 1/2s
			}
			if l.Burst > 1 {
				half[i].Burst = max(1, l.Burst/2)
			}
		}
		return fmt.Sprintf("  - {at: %s, limit: %q}\n", at(0.5), half.String())
	}
	return "  - {at: 1s, " + kind + ": true}\n" // refused by Parse, naming the event
}

// MatrixCell is one mode on one shape, judged against the ideal.
type MatrixCell struct {
	Mode  string `json:"mode"`
	Shape string `json:"shape"`
	// Pass is whether every criterion held; Why names the first that did not.
	Pass bool   `json:"pass"`
	Why  string `json:"why,omitempty"`
	// InEnvelope is whether the mode claims the shape (docs/guarantees.md); Envelope says
	// why not when it does not.
	InEnvelope bool   `json:"in_envelope"`
	Envelope   string `json:"envelope,omitempty"`
	// The figures judged.
	Served         float64 `json:"served_vs_ideal"`
	ExtraP50WaitMs float64 `json:"extra_p50_wait_ms"`
	ExtraP99WaitMs float64 `json:"extra_p99_wait_ms"`
	Jain           float64 `json:"jain"`
	IdealP99WaitMs float64 `json:"ideal_p99_wait_ms"`
	IdealJain      float64 `json:"ideal_jain"`
	Violations     int64   `json:"violations"`
	Ratio429       float64 `json:"ratio_429"`
	Accepted       int64   `json:"accepted"`
	IdealAccepted  int64   `json:"ideal_accepted"`
	Partial        bool    `json:"partial,omitempty"`
	// CriticalServed and CriticalP99WaitMs are the critical class's part, in a pool with a
	// critical group: its granted ÷ its demand, and its p99 wait.
	CriticalServed    *float64 `json:"critical_served,omitempty"`
	CriticalP99WaitMs *float64 `json:"critical_p99_wait_ms,omitempty"`
	// NotRun: outside the mode's envelope and too costly to simulate: no figures.
	NotRun bool `json:"not_run,omitempty"`
}

// MatrixSummary counts the cells.
type MatrixSummary struct {
	Cells   int `json:"cells"`
	Pass    int `json:"pass"`
	Fail    int `json:"fail"`
	Outside int `json:"outside"` // cells outside their mode's envelope (counted apart, pass or not)
}

// MatrixReport is a matrix run: every cell, and the counts.
type MatrixReport struct {
	Cells   []MatrixCell  `json:"cells"`
	Summary MatrixSummary `json:"summary"`
	Partial bool          `json:"partial,omitempty"`
}

// MatrixModes are the modes a matrix judges by default.
// The adaptive mode's three published strategies run beside its default, reported for
// comparison (outside their envelope: they claim nothing).
func MatrixModes() []string {
	return []string{"local", "strict", "lease", "gossip", "adaptive", "adaptive:heroku", "adaptive:cubic", "adaptive:sre"}
}

// RunMatrix runs shapes under modes (and the ideal beside them), judging each cell.
// progress, if set, is told each shape as it starts. A cancelled ctx ends the run with
// the cells judged so far, marked partial.
func RunMatrix(ctx context.Context, m *Matrix, shapes []MatrixShape, modes []string, progress func(i, n int, s MatrixShape)) (*MatrixReport, error) {
	r := &MatrixReport{}
	all := append([]string{"ideal"}, modes...)
	for _, md := range all {
		if err := CheckMode(md); err != nil {
			return r, err
		}
	}
	scs := make([]*Scenario, len(shapes))
	for i, s := range shapes {
		sc, err := m.Scenario(s)
		if err != nil {
			return r, err
		}
		scs[i] = sc
	}
	// Every cell (a shape under one mode) runs alone, on all the machine's cores, the
	// cells taken in order; each is deterministic, and the reports are put together in
	// order, so the matrix is the same whatever the cores.
	type cell struct {
		rep *ModeReport
		ok  bool
	}
	cells := make([][]cell, len(shapes))
	for i := range cells {
		cells[i] = make([]cell, len(all))
	}
	// A cell outside its mode's envelope that the simulator cannot afford is not run
	// (skipsCell): reported outside, with no figures.
	skip := func(i, k int) bool {
		members := 0
		for _, g := range scs[i].Members {
			members += g.Count
		}
		return skipsCell(all[k], members, scs[i])
	}
	var mu sync.Mutex
	next, started := 0, -1
	take := func() (int, int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if next == len(shapes)*len(all) || ctx.Err() != nil {
			return 0, 0, false
		}
		i, k := next/len(all), next%len(all)
		next++
		if i > started {
			started = i
			if progress != nil {
				progress(i, len(shapes), shapes[i])
			}
		}
		return i, k, true
	}
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(shapes)*len(all)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i, k, ok := take()
				if !ok {
					return
				}
				if skip(i, k) {
					cells[i][k] = cell{&ModeReport{Mode: all[k], NotRun: true}, true}
					continue
				}
				rep, done := runMode(ctx, scs[i], all[k], nil)
				cells[i][k] = cell{rep, done}
			}
		}()
	}
	wg.Wait()
	for i, s := range shapes {
		rep := newReport(scs[i])
		var err error
		for k, c := range cells[i] {
			if c.rep == nil { // never started: the run was cut short before
				rep.Partial, rep.NotRun = true, all[k:]
				break
			}
			rep.Modes = append(rep.Modes, *c.rep)
			if !c.ok {
				err = rep.interrupted(ctx, all[k], all[k+1:])
				break
			}
		}
		if !rep.Partial {
			rep.compareWithIdeal()
		}
		if len(rep.Modes) > 0 {
			r.Cells = append(r.Cells, judge(s, scs[i], rep)...)
		}
		if rep.Partial || err != nil {
			r.Partial = true
			break
		}
	}
	for _, c := range r.Cells {
		r.Summary.Cells++
		switch {
		case !c.InEnvelope:
			r.Summary.Outside++
		case c.Pass:
			r.Summary.Pass++
		default:
			r.Summary.Fail++
		}
	}
	return r, nil
}

// judge judges each mode of rep on shape s against the ideal's figures.
func judge(s MatrixShape, sc *Scenario, rep *Report) []MatrixCell {
	var ideal *ModeReport
	for i := range rep.Modes {
		if rep.Modes[i].Mode == "ideal" {
			ideal = &rep.Modes[i]
		}
	}
	members := 0
	for _, g := range sc.Members {
		members += g.Count
	}
	var out []MatrixCell
	for _, mr := range rep.Modes {
		if mr.Mode == "ideal" {
			continue
		}
		c := MatrixCell{Mode: mr.Mode, Shape: s.Name(), Jain: mr.Jain, Violations: mr.Violations,
			Ratio429: mr.Ratio429, Accepted: mr.Accepted, Partial: mr.Partial, InEnvelope: true}
		if ideal != nil {
			c.IdealAccepted = ideal.Accepted
			c.IdealP99WaitMs = ideal.WaitP99Ms
			c.IdealJain = ideal.Jain
		}
		if mr.ServedVsIdeal != nil {
			c.Served = *mr.ServedVsIdeal
		} else if ideal != nil && ideal.Accepted == 0 {
			c.Served = 1
		}
		if mr.ExtraP50WaitMs != nil {
			c.ExtraP50WaitMs = *mr.ExtraP50WaitMs
		}
		if mr.ExtraP99WaitMs != nil {
			c.ExtraP99WaitMs = *mr.ExtraP99WaitMs
		}
		if cr, ok := mr.PerClass[priority.Critical.String()]; ok {
			c.CriticalServed, c.CriticalP99WaitMs = &cr.Served, &cr.WaitP99Ms
		}
		c.InEnvelope, c.Envelope = envelope(mr.Mode, s, members, sc)
		if mr.NotRun {
			c.NotRun, c.Why = true, "not run: "+c.Envelope
			out = append(out, c)
			continue
		}
		c.Why = criteria(mr.Mode, s, sc, c)
		c.Pass = c.Why == "" && !c.Partial
		out = append(out, c)
	}
	return out
}

// skipsCell says whether the matrix skips mode on a pool of members: the lease mode past the
// members it claims (leaseClaims), where each renewal's allocation costs the simulator a
// pass over every member (minutes a cell at 1,000 members under overload), for a cell it
// would report outside the envelope anyway.
func skipsCell(mode string, members int, sc *Scenario) bool {
	return mode == "lease" && !leaseClaims(members, sc)
}

// leaseClaims says whether the lease mode claims a pool of members on the scenario's
// limits: up to lease.MaxMembers on any limit, and up to lease.MaxBucketMembers on limits
// it decides on their buckets (more members than permits of burst, no windowed quota or
// ramp: past allot.BucketAbove members such a limit is decided on its bucket, whose members
// confirm their registrations by reading its record).
func leaseClaims(members int, sc *Scenario) bool {
	if members <= lease.MaxMembers {
		return true
	}
	if members > lease.MaxBucketMembers || sc == nil {
		return false
	}
	ls := sc.Limit.Limits
	return len(ls) > 0 && maxBurst(ls) < int64(members) && !limitconv.Windowed(ls) && limitconv.RampOver(ls) == 0
}

// maxBurst is the largest burst of ls.
func maxBurst(ls sluice.Limits) int64 {
	b := int64(0)
	for _, l := range ls {
		b = max(b, limitconv.Burst(l))
	}
	return b
}

// envelope says whether mode claims shape s (run as sc), and why not when it does not.
func envelope(mode string, s MatrixShape, members int, sc *Scenario) (bool, string) {
	switch base, _, _ := strings.Cut(mode, ":"); base {
	case "gossip":
		if sc != nil && (limitconv.Windowed(sc.Limit.Limits) || limitconv.RampOver(sc.Limit.Limits) > 0) {
			// As a scenario file with this limit is refused (Parse).
			return false, "the gossip mode decides no windowed quota or ramp: `sluice serve --backend gossip` refuses the rule at configuration (--check-config too), naming the strict, local and lease modes"
		}
	case "local":
		// The matrix's local mode is one process whose members are groups of goroutines
		// (local.processes: one); processes each on a limiter of their own share nothing.
		if members > 1 && sc != nil && !sc.Local.oneProcess() {
			return false, "the local mode is one process: a pool of processes shares a limit through strict, lease or gossip"
		}
	case "lease":
		if !leaseClaims(members, sc) {
			// The simulated store serialises writes at no cost; a real one does not: every
			// member of a limit shared out writes its one record (past sixteen, their
			// renewals through one allocator, which falls behind at a thousand). A limit
			// decided on its bucket is written about once in BucketKeep/2, and its members
			// read it (BENCHMARKS.md). The backend warns past the claim, naming strict.
			return false, fmt.Sprintf("the lease mode claims %d members on a limit it shares out, %d on one decided on its bucket (more members than permits of burst, no window or ramp): a larger pool's writes to its one record collide on a real store (the backend warns, naming strict)", lease.MaxMembers, lease.MaxBucketMembers)
		}
	case adaptivePrefix:
		if s, ok, _ := parseAdaptive(mode); ok && s != adaptive.Sluice {
			return false, "a published design the adaptive mode's default strategy is measured against (docs/adaptive.md), reported beside it: it claims nothing"
		}
		if sc != nil && members > 1 && minBurst(sc.Limit.Limits) < adaptiveMinSharedBurst {
			return false, fmt.Sprintf("several clients on a burst under %d: on a burst of one or two a 200 tells a client nothing of the others, so independent clients collide whatever they do (docs/adaptive.md, \"What it does not do\"); `sluice demo --mode adaptive` warns of it; such a pool shares a store (lease or strict)", adaptiveMinSharedBurst)
		}
		if sc != nil && !underLimit(s.Demand) && int64(members) > minBurst(sc.Limit.Limits) {
			return false, "more clients than the burst has permits, wanting more than the limit: nearly every 200 then says nothing is left, so a client learns of the others only by being refused, and each one's probe for more costs a 429 (docs/adaptive.md, \"What it does not do\"); `sluice demo --mode adaptive` warns of it; such a pool shares a store (lease or strict)"
		}
	}
	return true, ""
}

// adaptiveMinSharedBurst is the least burst the adaptive mode claims for a limit several
// independent clients share (docs/adaptive.md).
const adaptiveMinSharedBurst = 4

// minBurst is the smallest burst of ls (a windowed quota's count is its burst).
func minBurst(ls sluice.Limits) int64 {
	b := int64(math.MaxInt64)
	for _, l := range ls {
		b = min(b, limitconv.Burst(l))
	}
	return b
}

// underLimit reports whether a demand pattern asks at most the limit on average.
func underLimit(demand string) bool {
	return demand == "poisson-50" || demand == "poisson-85" || demand == "diurnal"
}

// criteria returns the first criterion cell c fails, or "" (docs/simulator.md, "The
// guarantee matrix"): violations within the mode's bound; served at least 0.97 of the
// ideal where demand is at or under the limit, 0.95 over it (less the share of the run a
// store outage or partition took from a mode that fails closed without its store);
// Jain's index at least 0.97 of the ideal's; extra p99 wait at most max(1 s, two renewal
// or sync intervals, a tenth of the ideal's p99 wait, three of the limit's intervals) where demand is not over the limit (a backlog, Poisson
// at 120%: a queue grows whatever the throttle) and there is no outage or partition
// (whose waits are the fail mode's).
func criteria(mode string, s MatrixShape, sc *Scenario, c MatrixCell) string {
	base, _, _ := strings.Cut(mode, ":")
	switch base {
	case "adaptive", "gossip":
		if c.Ratio429 > 0.01 {
			return fmt.Sprintf("429s %.2f%% of requests (bound 1%%)", 100*c.Ratio429)
		}
	default:
		// A limit lowered at the API refuses what was granted under the old one and is
		// still on its way, whatever the throttle (the ideal alone decides for the instant
		// a request arrives): at most the old limit's burst.
		bound := int64(0)
		if s.Event == "limit-change" {
			bound = burstOf(sc.Limit.Limits)
		}
		if c.Violations > bound {
			return fmt.Sprintf("%d violations (bound %d)", c.Violations, bound)
		}
	}
	want := 0.95
	if underLimit(s.Demand) {
		want = 0.97
	}
	faulted := s.Event == "outage" || s.Event == "partition"
	if faulted && (base == "strict" || base == "lease") {
		want *= 0.9 // the run's tenth without the store
	}
	if c.Served < want {
		return fmt.Sprintf("served %.3f of the ideal (want %.2f)", c.Served, want)
	}
	if c.CriticalServed != nil {
		// Classes: the critical members are served first, at least 0.99 of their demand
		// (docs/priorities.md); the lower classes yield to them, so the pool is not judged
		// by fairness across its members.
		if *c.CriticalServed < minCriticalServed {
			return fmt.Sprintf("critical served %.3f of its demand (want %.2f)", *c.CriticalServed, minCriticalServed)
		}
	}
	jain := c.Jain
	// The ideal serves the members round robin: max-min fair by construction. Its own index
	// is below 1 only where the arrivals' noise departs from the demand's rate (a few
	// requests a member over a run): a mode is judged against it there.
	wantJain := 0.97
	if c.IdealJain > 0 {
		wantJain = 0.97 * min(1, c.IdealJain)
	}
	if c.CriticalServed == nil && jain < wantJain {
		return fmt.Sprintf("Jain's index %.3f (want %.3f)", jain, wantJain)
	}
	// Over the limit (a backlog, Poisson at 120%) a queue grows whatever the throttle, up
	// to the longest wait: waits then say whose request is served first, which fairness
	// judges. Across an outage or partition, waits are the fail mode's.
	if !faulted && s.Demand != "backlog" && s.Demand != "poisson-120" {
		// A wait the ideal has too is the queue the demand made; a mode a little slower to
		// drain it waits a little longer in proportion: a tenth of the ideal's own p99. And
		// a turn is a permit's interval: in a line of tens, a mode whose turns fall a round
		// trip later than the ideal's (which decides for the instant a request arrives)
		// moves its tail by a few of them: three.
		bound := max(1000.0, c.IdealP99WaitMs/10, 3*intervalMs(sc.Limit.Limits))
		if base == "lease" && sc.Lease.Renew > 0 {
			bound = max(bound, 2*float64(sc.Lease.Renew.D().Milliseconds()))
		}
		if base == "gossip" && sc.Gossip.Interval > 0 {
			bound = max(bound, 2*float64(sc.Gossip.Interval.D().Milliseconds()))
		}
		if c.ExtraP99WaitMs > bound {
			return fmt.Sprintf("extra p99 wait %.0f ms (bound %.0f ms)", c.ExtraP99WaitMs, bound)
		}
	}
	return ""
}

// minCriticalServed is the part of its demand the critical class of a pool with classes
// must be served.
const minCriticalServed = 0.99

// intervalMs is the longest interval between permits of ls (its tightest rate's), in ms.
func intervalMs(ls sluice.Limits) float64 {
	var ms float64
	for _, l := range ls {
		ms = max(ms, float64(l.Period.Milliseconds())/float64(l.Rate))
	}
	return ms
}

// burstOf is the largest burst of ls, in requests.
func burstOf(ls sluice.Limits) int64 {
	var b int64
	for _, l := range ls {
		if l.Burst > 0 {
			b = max(b, l.Burst)
		} else {
			b = max(b, l.Rate)
		}
	}
	return b
}

// outcome names a cell's result, as the tables show it: "pass" or "fail", and for a cell
// outside its mode's envelope how it would be judged, "out:pass" or "out:fail", or
// "out:not run".
func (c MatrixCell) outcome() string {
	switch {
	case c.NotRun:
		return "out:not run"
	case !c.InEnvelope && c.Pass:
		return "out:pass"
	case !c.InEnvelope:
		return "out:fail"
	case c.Pass:
		return "pass"
	}
	return "fail"
}

// MatrixTable writes the matrix as one table, a row per shape and a column per mode:
// "pass", "out" (outside the mode's envelope: "out:pass" or "out:fail", how it would be
// judged, so that modes reported for comparison are compared) or the figure that falls
// short.
func MatrixTable(r *MatrixReport) string {
	var shapes, modes []string
	cell := map[[2]string]MatrixCell{}
	for _, c := range r.Cells {
		if !slices.Contains(shapes, c.Shape) {
			shapes = append(shapes, c.Shape)
		}
		if !slices.Contains(modes, c.Mode) {
			modes = append(modes, c.Mode)
		}
		cell[[2]string{c.Shape, c.Mode}] = c
	}
	w := 0
	for _, s := range shapes {
		w = max(w, len(s))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-*s", w+2, "shape")
	for _, m := range modes {
		fmt.Fprintf(&b, "  %-10s", m)
	}
	b.WriteString("\n")
	var why []string
	for _, s := range shapes {
		fmt.Fprintf(&b, "%-*s", w+2, s)
		for _, m := range modes {
			c, ok := cell[[2]string{s, m}]
			v := "-"
			switch {
			case !ok:
			case c.outcome() != "fail":
				v = c.outcome()
			default:
				v = fmt.Sprintf("FAIL[%d]", len(why)+1)
				why = append(why, fmt.Sprintf("[%d] %s on %s: %s", len(why)+1, m, s, c.Why))
			}
			fmt.Fprintf(&b, "  %-10s", v)
		}
		b.WriteString("\n")
	}
	if len(why) > 0 {
		b.WriteString("\n" + strings.Join(why, "\n") + "\n")
	}
	sum := r.Summary
	fmt.Fprintf(&b, "\nmatrix: %d cells, %d pass, %d fail, %d outside a mode's envelope", sum.Cells, sum.Pass, sum.Fail, sum.Outside)
	if r.Partial {
		b.WriteString(" (interrupted: partial)")
	}
	b.WriteString("\n")
	return b.String()
}
