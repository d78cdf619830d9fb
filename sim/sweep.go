package sim

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/yamlx"
)

// A sweep runs a scenario over a grid of settings (sluice sim --sweep lease.renew=50ms,250ms
// --sweep client.margin=5ms,20ms) and names the best point for an objective: fewest
// violations, then the highest utilization, then the fewest store operations.

// Sweep is one setting and the values it takes: Key is a dotted path into the scenario
// (client.margin, lease.renew, store.fail_mode, members.m.count: a list's element by its
// name or its index), each value YAML (5ms, local, [a, b]).
type Sweep struct {
	Key    string
	Values []string
}

// ParseSweep reads KEY=V1,V2,...
func ParseSweep(s string) (Sweep, error) {
	key, vals, ok := strings.Cut(s, "=")
	key = strings.TrimSpace(key)
	if !ok || key == "" || strings.TrimSpace(vals) == "" {
		return Sweep{}, fmt.Errorf("want KEY=V1,V2,... (e.g. lease.renew=50ms,100ms), not %q", s)
	}
	sw := Sweep{Key: key}
	for _, v := range strings.Split(vals, ",") {
		if v = strings.TrimSpace(v); v == "" {
			return Sweep{}, fmt.Errorf("%s: an empty value in %q", key, s)
		}
		sw.Values = append(sw.Values, v)
	}
	return sw, nil
}

// maxSweepPoints bounds a sweep's grid.
const maxSweepPoints = 10_000

// Setting is one key's value at a point of the grid.
type Setting struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// SweepPoint is one point of the grid: its settings and its scenario, or, for a point
// that is not a valid scenario, why (Err; Scenario is nil).
type SweepPoint struct {
	Settings []Setting
	Scenario *Scenario
	Err      error
}

// SweepGrid builds every point of the grid from a scenario's source (file names it in
// errors), the first key varying slowest; adjust, if set, changes each point's scenario
// after it is read (the command line's --seed). Each point is checked as a scenario file
// is: a point that fails is kept with its error (SweepPoint.Err), to be skipped, so that
// one bad value does not cost the others their runs. SweepGrid fails when the grid itself
// is wrong (a key given twice, too many points, a base file that is not a scenario) or no
// point is valid (with the first point's error).
func SweepGrid(file string, src []byte, sweeps []Sweep, adjust func(*Scenario)) ([]SweepPoint, error) {
	if len(sweeps) == 0 {
		return nil, fmt.Errorf("sim: a sweep needs at least one KEY=V1,V2")
	}
	n := 1
	seen := map[string]bool{}
	for _, sw := range sweeps {
		if seen[sw.Key] {
			return nil, fmt.Errorf("sim: --sweep %s given twice", sw.Key)
		}
		seen[sw.Key] = true
		n *= len(sw.Values)
		if n > maxSweepPoints {
			return nil, fmt.Errorf("sim: the sweep's grid has more than %d points", maxSweepPoints)
		}
	}
	if _, err := Parse(file, src); err != nil {
		return nil, err
	}
	points := make([]SweepPoint, 0, n)
	idx := make([]int, len(sweeps))
	for range n {
		var doc yaml.Node
		if err := yaml.Unmarshal(src, &doc); err != nil {
			return nil, err // Parse read it
		}
		pt := SweepPoint{}
		for k, sw := range sweeps {
			v := sw.Values[idx[k]]
			if err := setPath(&doc, sw.Key, v); err != nil && pt.Err == nil {
				pt.Err = &pointError{where: "--sweep " + sw.Key + "=" + v, err: err}
			}
			pt.Settings = append(pt.Settings, Setting{Key: sw.Key, Value: v})
		}
		if pt.Err == nil {
			pt.Scenario, pt.Err = pointScenario(file, &doc, pt.Settings)
		}
		if pt.Scenario != nil && adjust != nil {
			adjust(pt.Scenario)
		}
		points = append(points, pt)
		// The next point: the last key varies fastest.
		for k := len(idx) - 1; k >= 0; k-- {
			if idx[k]++; idx[k] < len(sweeps[k].Values) {
				break
			}
			idx[k] = 0
		}
	}
	if k := slices.IndexFunc(points, func(p SweepPoint) bool { return p.Err == nil }); k < 0 {
		return nil, points[0].Err
	}
	return points, nil
}

// pointScenario reads a point's document, the file's with the point's settings, as a
// scenario.
func pointScenario(file string, doc *yaml.Node, settings []Setting) (*Scenario, error) {
	b, err := yaml.Marshal(doc)
	if err != nil {
		return nil, err
	}
	sc, err := Parse(file, b)
	if err != nil {
		// The line is the rewritten document's, not the file's: the message alone.
		var ye *yamlx.Error
		if errors.As(err, &ye) {
			err = errors.New(ye.Msg)
		}
		return nil, &pointError{where: "--sweep " + settingsText(settings) + ": " + file, err: err}
	}
	return sc, nil
}

// pointError is why a point of a sweep is not a valid scenario: where names the point
// (and the file), err is the reason.
type pointError struct {
	where string
	err   error
}

func (e *pointError) Error() string { return e.where + ": " + e.err.Error() }
func (e *pointError) Unwrap() error { return e.err }

func settingsText(ss []Setting) string {
	var parts []string
	for _, s := range ss {
		parts = append(parts, s.Key+"="+s.Value)
	}
	return strings.Join(parts, " ")
}

// setPath sets the value at a dotted path of a YAML document, adding the mappings it
// lacks.
func setPath(doc *yaml.Node, path, value string) error {
	var val yaml.Node
	if err := yaml.Unmarshal([]byte(value), &val); err != nil || len(val.Content) != 1 {
		return fmt.Errorf("not a YAML value")
	}
	n := doc
	if n.Kind == yaml.DocumentNode {
		n = n.Content[0]
	}
	segs := strings.Split(path, ".")
	for i, seg := range segs {
		last := i == len(segs)-1
		switch n.Kind {
		case yaml.MappingNode:
			var next *yaml.Node
			for k := 0; k+1 < len(n.Content); k += 2 {
				if n.Content[k].Value == seg {
					next = n.Content[k+1]
					if last {
						n.Content[k+1] = val.Content[0]
						return nil
					}
				}
			}
			if next == nil {
				key := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: seg}
				next = val.Content[0]
				if !last {
					next = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
				}
				n.Content = append(n.Content, key, next)
				if last {
					return nil
				}
			}
			n = next
		case yaml.SequenceNode:
			k, err := elementOf(n, seg)
			if err != nil {
				return err
			}
			if last {
				n.Content[k] = val.Content[0]
				return nil
			}
			n = n.Content[k]
		default:
			return fmt.Errorf("%s is a value, not a section", strings.Join(segs[:i], "."))
		}
	}
	return nil
}

// elementOf finds a list's element by its name (members: the group's name) or index.
func elementOf(seq *yaml.Node, seg string) (int, error) {
	for k, el := range seq.Content {
		if el.Kind != yaml.MappingNode {
			continue
		}
		for j := 0; j+1 < len(el.Content); j += 2 {
			if el.Content[j].Value == "name" && el.Content[j+1].Value == seg {
				return k, nil
			}
		}
	}
	if k, err := strconv.Atoi(seg); err == nil && k >= 0 && k < len(seq.Content) {
		return k, nil
	}
	return 0, fmt.Errorf("no element named %q (or an index below %d) in the list", seg, len(seq.Content))
}

// SweepReport is a sweep's outcome: each point's figures per mode, the best point per
// mode, and the points skipped because they are not valid scenarios.
type SweepReport struct {
	Scenario  string         `json:"scenario"`
	Keys      []string       `json:"keys"`
	Objective string         `json:"objective"`
	Points    []PointFigs    `json:"points"`
	Best      []BestPoint    `json:"best"`
	Skipped   []SkippedPoint `json:"skipped,omitempty"`
}

// SkippedPoint is a point of the grid that did not run, and why.
type SkippedPoint struct {
	Settings []Setting `json:"settings"`
	Reason   string    `json:"reason"`
}

// PointFigs is one point of the grid and its figures under each mode.
type PointFigs struct {
	Settings []Setting  `json:"settings"`
	Modes    []ModeFigs `json:"modes"`
}

// ModeFigs are the figures a sweep compares.
type ModeFigs struct {
	Mode        string  `json:"mode"`
	Violations  int64   `json:"violations"`
	Utilization float64 `json:"utilization"`
	Jain        float64 `json:"jain"`
	StoreOps    int64   `json:"store_ops"`
	WaitP99Ms   float64 `json:"wait_p99_ms"`
}

// BestPoint is the best point of the grid for one mode.
type BestPoint struct {
	Mode     string    `json:"mode"`
	Point    int       `json:"point"` // index in Points
	Settings []Setting `json:"settings"`
	ModeFigs
}

// Objective is how a sweep ranks its points.
const Objective = "fewest violations, then the highest utilization, then the fewest store operations"

// better reports whether a is better than b by the objective.
func better(a, b ModeFigs) bool {
	if a.Violations != b.Violations {
		return a.Violations < b.Violations
	}
	if a.Utilization != b.Utilization {
		return a.Utilization > b.Utilization
	}
	return a.StoreOps < b.StoreOps
}

// NewSweepReport gathers the reports of a grid's points (reports[i] is points[i]'s, nil
// for a point skipped: SweepPoint.Err), in the grid's order, and picks the best point per
// mode (the first of equals).
func NewSweepReport(sweeps []Sweep, points []SweepPoint, reports []*Report) *SweepReport {
	sr := &SweepReport{Objective: Objective}
	for _, sw := range sweeps {
		sr.Keys = append(sr.Keys, sw.Key)
	}
	best := map[string]int{}
	var order []string
	for i, r := range reports {
		if points[i].Err != nil || r == nil {
			sr.Skipped = append(sr.Skipped, SkippedPoint{Settings: points[i].Settings, Reason: skipReason(points[i].Err)})
			continue
		}
		if sr.Scenario == "" {
			sr.Scenario = r.Scenario
		}
		pf := PointFigs{Settings: points[i].Settings}
		k := len(sr.Points) // the point's index in sr.Points
		for _, m := range r.Modes {
			f := ModeFigs{Mode: m.Mode, Violations: m.Violations, Utilization: m.Utilization, Jain: m.Jain, StoreOps: m.StoreOps, WaitP99Ms: m.WaitP99Ms}
			pf.Modes = append(pf.Modes, f)
			b, ok := best[m.Mode]
			if !ok {
				order = append(order, m.Mode)
				best[m.Mode] = k
				continue
			}
			if better(f, figsOf(sr.Points[b], m.Mode)) {
				best[m.Mode] = k
			}
		}
		sr.Points = append(sr.Points, pf)
	}
	for _, mode := range order {
		i := best[mode]
		sr.Best = append(sr.Best, BestPoint{Mode: mode, Point: i, Settings: sr.Points[i].Settings, ModeFigs: figsOf(sr.Points[i], mode)})
	}
	return sr
}

// skipReason is a skipped point's error as the report words it.
func skipReason(err error) string {
	var pe *pointError
	switch {
	case err == nil:
		return "not run"
	case errors.As(err, &pe):
		return pe.err.Error() // the settings are the point's own
	}
	return err.Error()
}

func figsOf(p PointFigs, mode string) ModeFigs {
	for _, f := range p.Modes {
		if f.Mode == mode {
			return f
		}
	}
	return ModeFigs{}
}

// WriteText writes a row per point and mode, then the best point per mode.
func (sr *SweepReport) WriteText(w io.Writer) {
	fmt.Fprintf(w, "sweep of %s: %d points", sr.Scenario, len(sr.Points))
	if len(sr.Skipped) > 0 {
		fmt.Fprintf(w, " (%d more skipped: not valid scenarios, listed below)", len(sr.Skipped))
	}
	fmt.Fprint(w, "\n\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	for _, k := range sr.Keys {
		fmt.Fprintf(tw, "%s\t", k)
	}
	fmt.Fprint(tw, "mode\tviolations\tutilization\tjain\tstore ops\twait p99\t\n")
	for _, p := range sr.Points {
		for _, f := range p.Modes {
			for _, s := range p.Settings {
				fmt.Fprintf(tw, "%s\t", s.Value)
			}
			fmt.Fprintf(tw, "%s\t%d\t%.4f\t%.4f\t%d\t%s\t\n", f.Mode, f.Violations, f.Utilization, f.Jain, f.StoreOps, waitText(f.WaitP99Ms))
		}
	}
	tw.Flush()
	fmt.Fprintf(w, "\nbest (%s):\n", sr.Objective)
	for _, b := range sr.Best {
		fmt.Fprintf(w, "  %-10s %s: %d violations, utilization %.4f, %d store ops\n", b.Mode, settingsText(b.Settings), b.Violations, b.Utilization, b.StoreOps)
	}
	if len(sr.Skipped) > 0 {
		fmt.Fprintf(w, "\nskipped (not valid scenarios): %d of %d points\n", len(sr.Skipped), len(sr.Skipped)+len(sr.Points))
		for _, p := range sr.Skipped {
			fmt.Fprintf(w, "  %s: %s\n", settingsText(p.Settings), p.Reason)
		}
	}
}
