package sim

import (
	"cmp"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/internal/measure"
	"github.com/sluicehq/sluice/priority"
)

// Options changes how a scenario runs.
type Options struct {
	// Modes, if set, replaces the scenario's list of modes.
	Modes []string
	// Progress, if set, is told how far each mode's run is (0 to 1), often.
	Progress func(mode string, done float64)
}

// Report is the outcome of a scenario under each of its modes.
type Report struct {
	Scenario  string  `json:"scenario"`
	Seed      uint64  `json:"seed"`
	DurationS float64 `json:"duration_s"`
	Limit     string  `json:"limit"`
	Members   int     `json:"members"`
	// Partial is set when the run was cut short (RunContext's ctx done): the modes that
	// ran in full come first, then the one interrupted (its Partial set), measured from
	// the start to InterruptedAtS of virtual time; the modes after it (NotRun) did not run.
	Partial         bool         `json:"partial,omitempty"`
	InterruptedMode string       `json:"interrupted_mode,omitempty"`
	InterruptedAtS  *float64     `json:"interrupted_at_s,omitempty"`
	NotRun          []string     `json:"not_run,omitempty"`
	Modes           []ModeReport `json:"modes"`
}

// ModeReport is what one mode did, with the figures docs/concepts.md defines.
type ModeReport struct {
	Mode string `json:"mode"`
	// Models says what the mode simulates where its name alone could mislead: the local
	// mode's, whose members each decide alone (sluice demo's local mode is one process).
	// Empty for the other modes.
	Models string `json:"models,omitempty"`
	// Accepted and Violations are counted by the referee where the API would be: a
	// violation is a request it rejected (a 429).
	Accepted   int64 `json:"accepted"`
	Violations int64 `json:"violations"`
	// PeakOverAdmission is the most violations within one sample of the time series.
	PeakOverAdmission int64 `json:"peak_over_admission"`
	// Utilization is accepted / what a perfect throttle (the same limit, no latency, an
	// unbounded queue) would have admitted from the same arrivals by the end: Burst +
	// Rate × w over a window w in which demand exceeded the limit throughout. With
	// token limits (referee.tokens), it counts tokens, not requests.
	Utilization float64 `json:"utilization"`
	// Jain is Jain's index over each member's accepted / max-min fair share of its demand.
	Jain float64 `json:"jain"`
	// JainByWaiter is Jain's index with each member's fair share weighed by its goroutines:
	// the fairness of a throttle that serves callers in turn rather than members
	// (strict:waiters, sluice.FairWaiters). Absent where every member has as many
	// goroutines.
	JainByWaiter *float64 `json:"jain_by_waiter,omitempty"`
	// NotRun: the guarantee matrix did not run this mode on the shape (outside its
	// envelope, and too costly to simulate); the figures are empty.
	NotRun bool `json:"not_run,omitempty"`
	// Ratio429 is violations / (accepted + violations).
	Ratio429 float64 `json:"ratio_429"`
	// WaitP50Ms and WaitP99Ms are the times from a request's arrival at its member to its
	// departure for the API.
	WaitP50Ms float64 `json:"wait_p50_ms"`
	WaitP99Ms float64 `json:"wait_p99_ms"`
	Arrivals  int64   `json:"arrivals"` // requests that arrived at members (open-loop demand)
	Sent      int64   `json:"sent"`     // requests sent to the API
	Dropped   int64   `json:"dropped"`  // requests given up (on_deny: drop, or abandoned by a leave or crash)
	StoreOps  int64   `json:"store_ops"`
	Messages  int64   `json:"messages"`
	// GossipBytes are the bytes of the gossip mode's reports, counted at each receiver
	// they were sent to (lost ones too): what its daemons would send.
	GossipBytes int64 `json:"gossip_bytes,omitempty"`
	Timeouts    int64 `json:"timeouts"`  // store answers given up on
	FailOpen    int64 `json:"fail_open"` // requests sent without a permit (fail_mode open)
	// Events are the scenario's events with the time the pool took to converge after
	// each ended (an outage's end; a crash's instant): until the first window of 20
	// emission intervals (at least one sample) with no violation and, where demand
	// exceeded the limit, at least 90% of it used. -1: never within the run. It is the
	// throttle's recovery, not the queue's: a backlog the event left may drain for long
	// after the pool converged (the time series' queued column shows it).
	Events    []EventReport  `json:"events"`
	PerMember []MemberReport `json:"per_member"`
	// PerClass is each priority class's part, where the scenario names one (members'
	// priority): its demand (requests that arrived), those the API accepted, served =
	// accepted ÷ demand, and the p99 wait for a permit.
	PerClass map[string]ClassReport `json:"per_class,omitempty"`
	// ClearedS is how long the pool took to have every backlog answered: from the first
	// join of a member with a backlog to the last answer of the last backlog. Absent
	// when there is no backlog, or one was not cleared within the run.
	ClearedS *float64 `json:"cleared_s,omitempty"`
	// Lease holds the lease mode's own figures (absent for the other modes).
	Lease *LeaseReport `json:"lease,omitempty"`
	// ServedVsIdeal is accepted ÷ the ideal mode's accepted on the same arrivals, and
	// ExtraP50WaitMs and ExtraP99WaitMs the waits less the ideal's, when the ideal ran
	// beside this mode in the same run (absent otherwise, and for the ideal itself). With
	// token limits (referee.tokens), served counts tokens, as utilization does.
	ServedVsIdeal  *float64 `json:"served_vs_ideal,omitempty"`
	ExtraP50WaitMs *float64 `json:"extra_p50_wait_ms,omitempty"`
	ExtraP99WaitMs *float64 `json:"extra_p99_wait_ms,omitempty"`
	// Partial is set when this mode's run was cut short: its figures are those of the
	// virtual time it reached (the report's InterruptedAtS).
	Partial bool `json:"partial,omitempty"`

	series      []bucket
	sample      time.Duration
	acceptedTok int64   // the tokens of the accepted requests (with token limits; 0 without)
	ranS        float64 // the virtual time it ran, in seconds (less than the scenario's if Partial)

	interruptedAt int64 // when it was cut short (Partial), in virtual nanoseconds
}

// EventReport is one scenario event and the convergence after it.
type EventReport struct {
	AtS   float64 `json:"at_s"`
	Event string  `json:"event"`
	// EndS is when its effect ended: an outage's, a partition's or a pause's end; AtS for
	// an instant one (a crash, a leave, a limit change).
	EndS float64 `json:"end_s"`
	// ConvergenceS is measured from EndS (see ModeReport.Events).
	ConvergenceS float64 `json:"convergence_s"`
	store        bool    // the store's event (an outage, a restart)
}

// lasts reports whether the event has a span (an outage, a partition, a pause).
func (ev EventReport) lasts() bool { return ev.EndS > ev.AtS }

// ClassReport is one priority class's part of a mode's run.
type ClassReport struct {
	Demand    int64   `json:"demand"`
	Granted   int64   `json:"granted"`
	Served    float64 `json:"served"`
	WaitP99Ms float64 `json:"wait_p99_ms"`
}

// MemberReport is one member's part.
type MemberReport struct {
	Name      string  `json:"name"`
	Granted   int64   `json:"granted"`
	Rejected  int64   `json:"rejected"`
	Dropped   int64   `json:"dropped"`
	FairShare float64 `json:"fair_share"`
	Ratio     float64 `json:"ratio"`
}

// Run runs a scenario under each of its modes, one after the other, each from the same
// seed. The same scenario and options give the same report, to the byte.
func Run(sc *Scenario, opts Options) (*Report, error) {
	return RunContext(context.Background(), sc, opts)
}

// RunContext is Run, cut short when ctx is done: the mode running stops within about a
// millisecond of work (the engine looks at ctx every few thousand events, and reads no
// clock), and RunContext returns the report of what was measured so far, marked Partial,
// with an error that wraps ctx's cause (context.Canceled or a signal's).
func RunContext(ctx context.Context, sc *Scenario, opts Options) (*Report, error) {
	modes := sc.Modes
	if len(opts.Modes) > 0 {
		modes = opts.Modes
	}
	r := newReport(sc)
	for k, name := range modes {
		mr, ok := runMode(ctx, sc, name, opts.Progress)
		if mr == nil {
			return nil, fmt.Errorf("sim: unknown mode %q (known: %v)", name, ModeNames())
		}
		r.Modes = append(r.Modes, *mr)
		if !ok {
			return r, r.interrupted(ctx, name, modes[k+1:])
		}
		if opts.Progress != nil {
			opts.Progress(name, 1)
		}
	}
	r.compareWithIdeal()
	return r, nil
}

// newReport returns the report of sc without its modes.
func newReport(sc *Scenario) *Report {
	r := &Report{Scenario: sc.Name, Seed: sc.Seed, DurationS: sc.Duration.D().Seconds(), Limit: sc.Limit.String()}
	if r.Scenario == "" {
		r.Scenario = sc.file
	}
	for _, g := range sc.Members {
		r.Members += g.Count
	}
	return r
}

// runMode runs sc under one mode; ok is false if ctx cut it short (the report is then
// marked Partial), and the report nil for an unknown mode. sc is only read: modes may run
// at once on one scenario.
func runMode(ctx context.Context, sc *Scenario, name string, progress func(string, float64)) (mr *ModeReport, ok bool) {
	m := newMode(name, sc)
	if m == nil {
		return nil, false
	}
	e := newEngine(sc, m)
	if progress != nil {
		e.progress = func(f float64) { progress(name, f) }
	}
	e.done = ctx.Done()
	e.run()
	rep := e.report()
	if e.interrupted {
		rep.Partial = true
		rep.interruptedAt = e.now
	}
	return &rep, !e.interrupted
}

// interrupted marks r, whose last mode was cut short, partial: the modes after it did not
// run. It returns the error that says so.
func (r *Report) interrupted(ctx context.Context, name string, notRun []string) error {
	last := &r.Modes[len(r.Modes)-1]
	at := round(float64(last.interruptedAt) / 1e9)
	r.Partial, r.InterruptedMode, r.InterruptedAtS = true, name, &at
	r.NotRun = notRun
	r.compareWithIdeal()
	return fmt.Errorf("sim: interrupted at %v of virtual time in mode %s: %w",
		time.Duration(last.interruptedAt).Round(time.Millisecond), name, context.Cause(ctx))
}

// compareWithIdeal gives each mode its figures against the ideal mode's, if it ran.
func (r *Report) compareWithIdeal() {
	k := slices.IndexFunc(r.Modes, func(m ModeReport) bool { return m.Mode == "ideal" })
	if k < 0 {
		return
	}
	ideal := r.Modes[k]
	if ideal.Partial {
		return // the others ran longer: nothing to compare on the same arrivals
	}
	for i := range r.Modes {
		m := &r.Modes[i]
		if i == k || m.Partial {
			continue
		}
		switch {
		case ideal.acceptedTok > 0:
			m.ServedVsIdeal = ptr(round(float64(m.acceptedTok) / float64(ideal.acceptedTok)))
		case ideal.Accepted > 0:
			m.ServedVsIdeal = ptr(round(float64(m.Accepted) / float64(ideal.Accepted)))
		}
		m.ExtraP50WaitMs = ptr(round(m.WaitP50Ms - ideal.WaitP50Ms))
		m.ExtraP99WaitMs = ptr(round(m.WaitP99Ms - ideal.WaitP99Ms))
	}
}

func ptr[T any](v T) *T { return &v }

// round keeps reports stable to compare: four decimals.
func round(v float64) float64 {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return 0
	}
	return math.Round(v*1e4) / 1e4
}

func (e *engine) report() ModeReport {
	r := ModeReport{
		Mode: e.mode.name(), Accepted: e.accepted, Violations: e.rejected,
		Arrivals: e.arrivals, Sent: e.sent, Dropped: e.dropped,
		StoreOps: e.storeOps, Messages: e.messages, Timeouts: e.timeouts, FailOpen: e.failOpen,
		GossipBytes: e.gossipBytes,
		WaitP50Ms:   round(float64(e.waits.quantile(0.5)) / 1e6),
		WaitP99Ms:   round(float64(e.waits.quantile(0.99)) / 1e6),
		series:      e.series,
		sample:      time.Duration(e.sample),
		ranS:        float64(e.end) / 1e9,
	}
	if e.idealTokCore != nil {
		r.acceptedTok = e.acceptedTok
	}
	if e.classes {
		r.PerClass = map[string]ClassReport{}
		for i := range e.byClass {
			c := &e.byClass[i]
			if c.arrivals == 0 && c.accepted == 0 {
				continue
			}
			cr := ClassReport{Demand: c.arrivals, Granted: c.accepted, WaitP99Ms: round(float64(c.waits.quantile(0.99)) / 1e6)}
			if c.arrivals > 0 {
				cr.Served = round(float64(c.accepted) / float64(c.arrivals))
			}
			r.PerClass[priority.Class(1-i).String()] = cr
		}
	}
	if total := e.accepted + e.rejected; total > 0 {
		r.Ratio429 = round(float64(e.rejected) / float64(total))
	}
	// Utilization: accepted over what a perfect throttle would have admitted from the
	// same arrivals (Burst + Rate × w where demand exceeded the limit throughout).
	for _, b := range e.series {
		r.PeakOverAdmission = max(r.PeakOverAdmission, b.rejected)
	}
	if e.idealN > 0 {
		r.Utilization = round(float64(e.accepted) / float64(e.idealN))
	}
	if e.idealTokCore != nil && e.idealTokN > 0 {
		// With token limits, what is used is tokens: a pool that sends the cheap requests
		// and loses the dear ones to refusals would look better in requests.
		r.Utilization = round(float64(e.acceptedTok) / float64(e.idealTokN))
	}
	// Fairness over each member's demand spans.
	var spans []measure.Span
	for i, m := range e.members {
		e.closeSpan(m)
		for _, s := range m.spans {
			s.Member = i
			spans = append(spans, s)
		}
	}
	burst, rate0 := measure.Capacity(e.sc.Limit.Limits, 0)
	steps := []measure.Step{{At: 0, Capacity: rate0}} // the limit's rate over the run
	for _, ev := range e.sc.Events {
		if ev.Limit != nil {
			_, r := measure.Capacity(ev.Limit.Limits, 0)
			steps = append(steps, measure.Step{At: ev.At.D().Seconds(), Capacity: r})
		}
	}
	slices.SortStableFunc(steps, func(a, b measure.Step) int { return cmp.Compare(a.At, b.At) })
	fair := measure.FairSharesOver(steps, len(e.members), spans, nil)
	measure.ShareBurst(fair, spans, burst, 0)
	if limitconv.Windowed(e.limits) || limitconv.RampOver(e.limits) > 0 {
		// The fair shares are of a constant rate; a ramp's or a window's pool admits what
		// the ideal throttle does: scale them to it (Jain's index is the same either way).
		var sum float64
		for _, f := range fair {
			sum += f
		}
		if sum > 0 && e.idealN > 0 {
			for i := range fair {
				fair[i] *= float64(e.idealN) / sum
			}
		}
	}
	granted := make([]float64, len(e.members))
	for i, m := range e.members {
		granted[i] = float64(m.granted)
		mr := MemberReport{Name: m.name, Granted: m.granted, Rejected: m.rejected, Dropped: m.dropped, FairShare: round(fair[i])}
		if fair[i] > 0 {
			mr.Ratio = round(granted[i] / fair[i])
		}
		r.PerMember = append(r.PerMember, mr)
	}
	r.Jain = round(measure.JainOfShares(granted, fair))
	weights := make([]float64, len(e.members))
	unequal := false
	for i, m := range e.members {
		weights[i] = float64(len(m.gs))
		unequal = unequal || weights[i] != weights[0]
	}
	if unequal {
		fairW := measure.FairSharesOver(steps, len(e.members), spans, weights)
		measure.ShareBurst(fairW, spans, burst, 0)
		j := round(measure.JainOfShares(granted, fairW))
		r.JainByWaiter = &j
	}
	r.ClearedS = e.cleared()
	if _, ok := e.mode.(localMode); ok {
		r.Models = localModels(e.sc)
	}
	if lr, ok := e.mode.(leaseReporter); ok {
		r.Lease = lr.leaseReport(e)
	}
	// Convergence after each event.
	window := 1
	if t := tightestInterval(e); t > 0 {
		window = max(1, int(math.Ceil(20*float64(t)/float64(e.sample))))
	}
	for _, ev := range e.eventLog {
		r.Events = append(r.Events, EventReport{AtS: round(float64(ev.at) / 1e9), Event: ev.what,
			EndS: round(float64(ev.end) / 1e9), ConvergenceS: e.convergence(ev.end, window), store: ev.store})
	}
	if r.Events == nil {
		r.Events = []EventReport{}
	}
	return r
}

// localModels says what the local mode simulates in sc: one process whose members are
// groups of goroutines sharing one limiter, as sluice demo --mode local (local.processes:
// one, the default), or each member a process of its own with its own limiter, none
// coordinating (each).
func localModels(sc *Scenario) string {
	n := 0
	for _, g := range sc.Members {
		n += g.Count
	}
	share := "the whole limit"
	if sc.Local.Share > 0 && sc.Local.Share < 1 {
		share = strconv.FormatFloat(sc.Local.Share, 'g', -1, 64) + " of the limit"
	}
	if n == 1 {
		return "one process with its own limiter on " + share + " (local.share), as sluice demo --mode local"
	}
	if sc.Local.oneProcess() {
		return fmt.Sprintf("one process, as sluice demo --mode local: its %d members are groups of goroutines sharing one limiter on %s (local.share), "+
			"whose waiting room serves a higher class first and shares between the members (sluice.WithMember); "+
			"local.processes: each makes each member a process of its own with its own limiter", n, share)
	}
	together := "their shares summing to at most the limit"
	if total := float64(n) * wholeIfZero(sc.Local.Share); total > 1 {
		together = "so together they may admit " + strconv.FormatFloat(total, 'g', 4, 64) + " times it"
	}
	return fmt.Sprintf("each of the %d members a process of its own with its own limiter on %s (local.share, local.processes: each), "+
		"none coordinating, %s; sluice demo --mode local is one process whose workers share one limiter "+
		"(local.processes: one, the default)", n, share, together)
}

// cleared is how long the backlogs took to clear (nil if none did, or one did not).
func (e *engine) cleared() *float64 {
	first, last := int64(math.MaxInt64), int64(0)
	for _, m := range e.members {
		if m.demand.Pattern != "backlog" {
			continue
		}
		if m.cleared == 0 {
			return nil
		}
		first, last = min(first, m.joined), max(last, m.cleared)
	}
	if last == 0 {
		return nil
	}
	s := round(float64(last-first) / 1e9)
	return &s
}

func tightestInterval(e *engine) int64 {
	var t int64
	for _, l := range e.core {
		t = max(t, l.T)
	}
	return t
}

// convergence is the time from `at` to the start of the first window of good samples.
func (e *engine) convergence(at int64, window int) float64 {
	first := int(at / e.sample)
	for k := first; k+window <= len(e.series); k++ {
		var acc, rej, capa float64
		sat := true
		for _, b := range e.series[k : k+window] {
			acc += float64(b.accepted)
			rej += float64(b.rejected)
			capa += b.capacity // the limit in force then, which an event may have changed
			sat = sat && b.saturated
		}
		if rej == 0 && (!sat || acc >= 0.9*capa) {
			return round(math.Max(0, float64(int64(k)*e.sample-at)/1e9))
		}
	}
	return -1
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// waitText formats a wait given in milliseconds for the table: "12.5ms" under a second,
// "9.7s" under a minute, "52m41s" beyond (not "3161095.9ms").
func waitText(ms float64) string {
	d := time.Duration(ms * float64(time.Millisecond))
	switch {
	case d < time.Second:
		return fmt.Sprintf("%.1fms", ms)
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

// Row is one figure of the report, side by side: its value under each mode.
type Row struct {
	Group string   // what the figure tells: strictness, utilization, fairness, ...
	Label string   // the figure
	Cells []string // one per mode, in the report's order
}

// SideBySide is the report's figures in one table, a column per mode, grouped by the
// trade-off they show: strictness, utilization, fairness, waits, store load, and the
// behaviour through each event (an outage, a crash, a partition).
func (r *Report) SideBySide() []Row {
	var rows []Row
	add := func(group, label string, f func(m *ModeReport) string) {
		row := Row{Group: group, Label: label}
		for i := range r.Modes {
			row.Cells = append(row.Cells, f(&r.Modes[i]))
		}
		rows = append(rows, row)
	}
	num := func(v int64) string { return strconv.FormatInt(v, 10) }
	frac := func(v float64) string { return strconv.FormatFloat(v, 'f', 4, 64) }
	add("strictness", "violations (429s)", func(m *ModeReport) string { return num(m.Violations) })
	add("strictness", "429 ratio", func(m *ModeReport) string { return frac(m.Ratio429) })
	add("strictness", "peak 429s in a sample", func(m *ModeReport) string { return num(m.PeakOverAdmission) })
	add("utilization", "accepted", func(m *ModeReport) string { return num(m.Accepted) })
	add("utilization", "utilization", func(m *ModeReport) string { return frac(m.Utilization) })
	vsIdeal := slices.ContainsFunc(r.Modes, func(m ModeReport) bool { return m.ExtraP50WaitMs != nil })
	if vsIdeal {
		add("utilization", "served vs ideal", func(m *ModeReport) string {
			if m.ServedVsIdeal == nil {
				return "-"
			}
			return frac(*m.ServedVsIdeal)
		})
	}
	add("fairness", "Jain's index", func(m *ModeReport) string { return frac(m.Jain) })
	add("waits", "wait p50", func(m *ModeReport) string { return waitText(m.WaitP50Ms) })
	add("waits", "wait p99", func(m *ModeReport) string { return waitText(m.WaitP99Ms) })
	if vsIdeal {
		extra := func(v *float64) string {
			switch {
			case v == nil:
				return "-"
			case *v < 0:
				return "-" + waitText(-*v)
			}
			return "+" + waitText(*v)
		}
		add("waits", "wait p50 vs ideal", func(m *ModeReport) string { return extra(m.ExtraP50WaitMs) })
		add("waits", "wait p99 vs ideal", func(m *ModeReport) string { return extra(m.ExtraP99WaitMs) })
	}
	add("waits", "dropped", func(m *ModeReport) string { return num(m.Dropped) })
	if slices.ContainsFunc(r.Modes, func(m ModeReport) bool { return m.ClearedS != nil }) {
		add("waits", "backlog cleared in", func(m *ModeReport) string {
			if m.ClearedS == nil {
				return "not cleared"
			}
			return (time.Duration(*m.ClearedS * 1e9)).Round(time.Second).String()
		})
	}
	add("store load", "store ops", func(m *ModeReport) string { return num(m.StoreOps) })
	add("store load", "store ops/member/s", func(m *ModeReport) string {
		if r.Members == 0 || m.ranS == 0 {
			return "0"
		}
		return strconv.FormatFloat(float64(m.StoreOps)/float64(r.Members)/m.ranS, 'f', 2, 64)
	})
	add("store load", "messages", func(m *ModeReport) string { return num(m.Messages) })
	add("faults", "store time-outs", func(m *ModeReport) string { return num(m.Timeouts) })
	add("faults", "sent without a permit", func(m *ModeReport) string { return num(m.FailOpen) })
	if len(r.Modes) > 0 {
		for k, ev := range r.Modes[0].Events {
			// Convergence counts from the event's end: a lasting one is labelled with it,
			// so that "0s" reads as "at once after the outage", not "at its start".
			label := fmt.Sprintf("converged after %q at %s", ev.Event, time.Duration(ev.AtS*1e9))
			if ev.lasts() {
				label = fmt.Sprintf("converged after %q ended at %s", ev.Event, time.Duration(ev.EndS*1e9))
			}
			add("faults", label, func(m *ModeReport) string {
				if k >= len(m.Events) {
					return ""
				}
				if c := m.Events[k].ConvergenceS; c >= 0 {
					return time.Duration(c * 1e9).String()
				}
				return "never"
			})
		}
	}
	if slices.ContainsFunc(r.Modes, func(m ModeReport) bool { return m.Lease != nil }) {
		add("lease", "share breaches", func(m *ModeReport) string {
			if m.Lease == nil {
				return "-"
			}
			return num(m.Lease.Breaches)
		})
	}
	return rows
}

// WriteText writes the report as one table, a column per mode, so that the trade-off
// between modes shows in one look.
func (r *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "scenario %s: %d members, limit %s, %v of virtual time, seed %d\n\n", r.Scenario, r.Members, r.Limit,
		time.Duration(r.DurationS*1e9), r.Seed)
	if r.Partial {
		fmt.Fprintf(w, "interrupted at %v of virtual time in mode %s: its figures are of that time",
			time.Duration(*r.InterruptedAtS*1e9).Round(time.Millisecond), r.InterruptedMode)
		if len(r.NotRun) > 0 {
			fmt.Fprintf(w, "; not run: %s", strings.Join(r.NotRun, ", "))
		}
		fmt.Fprint(w, "\n\n")
	}
	rows := r.SideBySide()
	// The labels flush left (padded here), the figures flush right.
	width := 0
	for _, row := range rows {
		width = max(width, len(row.Label)+2, len(row.Group))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-*s\t", width, "")
	for _, m := range r.Modes {
		fmt.Fprintf(tw, "%s\t", m.Mode)
	}
	fmt.Fprint(tw, "\n")
	group := ""
	for _, row := range rows {
		if row.Group != group {
			group = row.Group
			fmt.Fprintf(tw, "%-*s\t%s\n", width, group, strings.Repeat("\t", len(r.Modes)))
		}
		fmt.Fprintf(tw, "%-*s\t%s\t\n", width, "  "+row.Label, strings.Join(row.Cells, "\t"))
	}
	tw.Flush()
	for _, m := range r.Modes {
		if m.Models != "" {
			fmt.Fprintf(w, "\n%s: %s.\n", m.Mode, m.Models)
		}
	}
}

// WriteCSV writes the time series of every mode: one row per mode and sample.
func (r *Report) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"mode", "t_s", "accepted", "rejected", "arrivals", "sent", "queued", "live_members", "store_ops", "messages", "saturated"})
	for _, m := range r.Modes {
		for i, b := range m.series {
			t := time.Duration(i) * m.sample
			if t.Seconds() > r.DurationS {
				break
			}
			_ = cw.Write([]string{m.Mode, strconv.FormatFloat(t.Seconds(), 'f', -1, 64),
				strconv.FormatInt(b.accepted, 10), strconv.FormatInt(b.rejected, 10), strconv.FormatInt(b.arrivals, 10),
				strconv.FormatInt(b.sent, 10), strconv.FormatInt(b.queued, 10), strconv.FormatInt(b.live, 10),
				strconv.FormatInt(b.storeOps, 10), strconv.FormatInt(b.messages, 10), strconv.FormatBool(b.saturated)})
		}
	}
	cw.Flush()
	return cw.Error()
}
