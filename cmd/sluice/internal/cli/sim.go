package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/sim"
)

func init() { register(newSimCmd) }

func newSimCmd(env Env) *cobra.Command {
	var a simArgs
	cmd := &cobra.Command{
		Use:   "sim SCENARIO.yaml",
		Short: "simulate a scenario (a YAML file) in virtual time under one or more modes, and report",
		Example: "  sluice sim scenarios/store-outage.yaml --modes strict,lease,local\n" +
			"  sluice sim scenarios/store-outage.yaml --sweep lease.renew=50ms,250ms --html report.html\n" +
			"  sluice sim --matrix --quick",
		ValidArgsFunction: func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			return []string{"yaml", "yml"}, cobra.ShellCompDirectiveFilterFileExt
		},
		RunE: func(cmd *cobra.Command, args []string) error { return runSim(cmd.Context(), env, a, args) },
	}
	fs := cmd.Flags()
	fs.StringVar(&a.modes, "modes", "", "comma-separated `modes` to run side by side (default: the scenario's; known: "+strings.Join(sim.ModeNames(), ", ")+"; adaptive:heroku, adaptive:cubic and adaptive:sre for the adaptive mode's other strategies; local is every member a process alone on its own limiter, unlike sluice demo's one process)")
	fs.BoolVar(&a.json, "json", false, "print the report as JSON")
	fs.StringVar(&a.csv, "csv", "", "write the time series of every mode to `file` as CSV")
	fs.StringVar(&a.plot, "plot", "", "draw the report's figure to `file` (.svg or .png): per mode, the admitted rate against the limit with the events and 429s, the queue and each member's share")
	fs.StringVar(&a.html, "html", "", "write the report as one self-contained HTML page to `file`: the modes side by side, each mode's figure, its events' convergence and its members")
	fs.Var(&a.sweeps, "sweep", "run the scenario over a grid of settings, `key=v1,v2,...` (repeatable; e.g. lease.renew=50ms,250ms, client.margin=5ms,20ms, members.m.count=10,20), in parallel, and name the best point per mode (fewest violations, then utilization, then store operations); with --plot, --html or --csv each point writes its own files, named after its settings")
	fs.Uint64Var(&a.seed, "seed", 0, "override the scenario's seed")
	fs.BoolVar(&a.matrix, "matrix", false, "run the guarantee matrix instead of a scenario: every mode (or --modes) on each shape of the matrix file beside the ideal throttle, one cell per mode and shape, judged against it (docs/simulator.md, \"The guarantee matrix\"); with --json every cell's figures and a summary")
	fs.StringVar(&a.matrixFile, "matrix-file", "", "with --matrix: the matrix `file` (default: the shipped sim/matrix.yaml)")
	fs.BoolVar(&a.quick, "quick", false, "with --matrix: the quick shapes only (small pools and short runs)")
	fs.StringVar(&a.shape, "shape", "", "with --matrix: only the shapes whose name (limit/pool/demand/event) contains `text`")
	fs.StringVar(&a.record, "record", "", "with --matrix: also write the run as JSON to `file` (make matrix: sim/testdata/matrix.json)")
	fs.StringVar(&a.guarantees, "guarantees", "", "with --matrix: also write what each mode guarantees, from the run, as Markdown to `file` (make matrix: docs/guarantees.md)")
	fs.BoolVar(&a.show, "show", false, "with --matrix: print the selected shapes' scenarios (YAML, one document each) instead of running them, to run a cell alone with 'sluice sim FILE'")
	for _, name := range []string{"csv", "plot", "html", "matrix-file", "record", "guarantees"} {
		_ = cmd.MarkFlagFilename(name)
	}
	return cmd
}

// simArgs are the flags of sluice sim.
type simArgs struct {
	modes, csv, plot, html                string
	matrixFile, shape, record, guarantees string
	json, matrix, quick, show             bool
	seed                                  uint64
	sweeps                                sweepFlags
}

func runSim(ctx context.Context, env Env, a simArgs, rest []string) error {
	if a.matrix {
		if len(rest) > 0 {
			return usagef("--matrix takes no scenario file (got %q): the shapes come from the matrix file", strings.Join(rest, " "))
		}
		return runMatrix(ctx, env, matrixArgs{file: a.matrixFile, quick: a.quick, shape: a.shape, show: a.show,
			modes: a.modes, json: a.json, record: a.record, guarantees: a.guarantees})
	}
	if a.quick || a.matrixFile != "" || a.shape != "" || a.show || a.record != "" || a.guarantees != "" {
		return usagef("--quick, --shape, --show, --record, --guarantees and --matrix-file go with --matrix")
	}
	switch {
	case len(rest) == 0:
		return usagef("no scenario file given (e.g. sluice sim scenarios/store-outage.yaml)")
	case len(rest) > 1:
		return usagef("want one scenario file, got %q", strings.Join(rest, " "))
	}
	file := rest[0]
	plotFormat := ""
	if a.plot != "" {
		var err error
		if plotFormat, err = sim.PlotFormat(a.plot); err != nil {
			return usagef("--plot: %v", err)
		}
	}
	var opts sim.Options
	if a.modes != "" {
		for _, m := range strings.Split(a.modes, ",") {
			if m = strings.TrimSpace(m); m != "" {
				opts.Modes = append(opts.Modes, m)
			}
		}
	}
	for _, m := range opts.Modes {
		if err := sim.CheckMode(m); err != nil {
			return usagef("--modes: %v", err)
		}
	}
	warnFormerModes(env, "", opts.Modes)
	outs := outputs{csv: a.csv, plot: a.plot, plotFormat: plotFormat, html: a.html}
	if len(a.sweeps) > 0 {
		return runSweep(ctx, env, file, a.sweeps, opts, a.seed, a.json, outs)
	}
	sc, err := sim.Load(file)
	if err != nil {
		return usageError{err}
	}
	warnFormerModes(env, file+": modes: ", sc.Modes)
	if a.seed != 0 {
		sc.Seed = a.seed
	}
	if isTerminal(env.Stderr) {
		opts.Progress = progressBar(env, time.Now())
	}
	rep, err := sim.RunContext(ctx, sc, opts)
	if opts.Progress != nil {
		fmt.Fprint(env.Stderr, "\r\033[K")
	}
	if rep != nil && rep.Partial {
		// Interrupted (SIGINT, SIGTERM): what was measured so far, marked partial, and no
		// files (a figure or a page of a large run could outlast the second a stop takes).
		if a.json {
			_ = rep.WriteJSON(env.Stdout)
		} else {
			rep.WriteText(env.Stdout)
		}
		return exitError{code: interruptedCode(ctx), msg: err.Error() + " (the report is partial)"}
	}
	if err != nil {
		return err
	}
	if err := outs.write(rep, nil); err != nil {
		return err
	}
	if a.json {
		return rep.WriteJSON(env.Stdout)
	}
	rep.WriteText(env.Stdout)
	return nil
}

// interruptedCode is the exit code of a command cut short by ctx: 130 after SIGINT (or a
// cancellation without a signal), 143 after SIGTERM. The signal is read from ctx's cause,
// which signal.NotifyContext (package main) words "<signal> signal received".
func interruptedCode(ctx context.Context) int {
	if c := context.Cause(ctx); c != nil && c.Error() == syscall.SIGTERM.String()+" signal received" {
		return ExitTerminated
	}
	return ExitInterrupted
}

// warnFormerModes prints one line to stderr for each mode named by its former name, which
// still reads for one release (adaptive:seed, now adaptive:heroku). where says where the
// name was read ("" for --modes).
func warnFormerModes(env Env, where string, modes []string) {
	for _, m := range modes {
		if now, ok := sim.FormerModeName(m); ok {
			fmt.Fprintf(env.Stderr, "sluice: %s%s is deprecated, use %s\n", where, m, now)
		}
	}
}

// sweepFlags are the --sweep flags, in order.
type sweepFlags []sim.Sweep

func (s *sweepFlags) String() string { return "" }

func (s *sweepFlags) Type() string { return "sweep" }

func (s *sweepFlags) Set(v string) error {
	sw, err := sim.ParseSweep(v)
	if err != nil {
		return err
	}
	*s = append(*s, sw)
	return nil
}

// outputs are the files --csv, --plot and --html ask for ("" for none).
type outputs struct {
	csv, plot, plotFormat, html string
}

// write writes a report's files. A sweep's point (settings not nil) writes its own, each
// named after the file asked for with the point's settings before its extension (see
// pointPath).
func (o outputs) write(rep *sim.Report, settings []sim.Setting) error {
	if o.csv != "" {
		if err := writeFile(pointPath(o.csv, settings), rep.WriteCSV); err != nil {
			return err
		}
	}
	if o.plot != "" {
		if err := writeFile(pointPath(o.plot, settings), func(w io.Writer) error { return rep.WritePlot(w, o.plotFormat) }); err != nil {
			return err
		}
	}
	if o.html != "" {
		if err := writeFile(pointPath(o.html, settings), rep.WriteHTML); err != nil {
			return err
		}
	}
	return nil
}

// pointPath names a sweep point's file: out.png at client.margin=5ms and
// members.m.count=20 is out-client.margin=5ms-members.m.count=20.png. A character other
// than a letter, a digit, '.', '=', '-' or '+' in a setting becomes '_' (lease.renew=1/s
// gives lease.renew=1_s).
func pointPath(path string, settings []sim.Setting) string {
	if len(settings) == 0 {
		return path
	}
	ext := filepath.Ext(path)
	var b strings.Builder
	b.WriteString(strings.TrimSuffix(path, ext))
	for _, s := range settings {
		b.WriteByte('-')
		for _, r := range s.Key + "=" + s.Value {
			if unicode.IsLetter(r) || unicode.IsDigit(r) || strings.ContainsRune(".=-+", r) {
				b.WriteRune(r)
			} else {
				b.WriteByte('_')
			}
		}
	}
	b.WriteString(ext)
	return b.String()
}

// runSweep runs every point of the grid, on all the machine's cores, and prints the
// figures in the grid's order: each point is deterministic, so the output is too. With
// --csv, --plot or --html, each point writes its own files (pointPath).
func runSweep(ctx context.Context, env Env, file string, sweeps []sim.Sweep, opts sim.Options, seed uint64, asJSON bool, outs outputs) error {
	src, err := os.ReadFile(file)
	if err != nil {
		return usageError{err}
	}
	var adjust func(*sim.Scenario)
	if seed != 0 && !slices.ContainsFunc(sweeps, func(s sim.Sweep) bool { return s.Key == "seed" }) {
		adjust = func(sc *sim.Scenario) { sc.Seed = seed }
	}
	points, err := sim.SweepGrid(file, src, sweeps, adjust)
	if err != nil {
		return usageError{err}
	}
	// A point that is not a valid scenario is skipped with its reason (SweepGrid fails
	// when none is valid): one bad value costs the others nothing.
	valid := slices.IndexFunc(points, func(p sim.SweepPoint) bool { return p.Err == nil })
	warnFormerModes(env, file+": modes: ", points[valid].Scenario.Modes)
	for _, p := range points {
		if p.Err != nil && asJSON {
			// The JSON's "skipped" has it too; the text report lists them at its end.
			fmt.Fprintf(env.Stderr, "sluice: skipped: %v\n", p.Err)
		}
	}
	if outs != (outputs{}) {
		// Two points whose settings differ only in characters a file name replaces
		// would write the same files: refuse before running.
		seen := map[string]bool{}
		for _, p := range points {
			if p.Err != nil {
				continue
			}
			name := pointPath("x", p.Settings)
			if seen[name] {
				return usagef("--sweep: two points would write the same files (%s): their values differ only in characters a file name leaves out", name[2:])
			}
			seen[name] = true
		}
	}
	reports := make([]*sim.Report, len(points))
	errs := make([]error, len(points))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(points)) {
		wg.Go(func() {
			for i := range next {
				if points[i].Err == nil {
					reports[i], errs[i] = sim.RunContext(ctx, points[i].Scenario, opts)
				}
			}
		})
	}
	for i := range points {
		next <- i
	}
	close(next)
	wg.Wait()
	if ctx.Err() != nil {
		// Interrupted: the points' runs stopped where they were; a sweep's best points
		// need them all, so there is no report.
		return exitError{code: interruptedCode(ctx), msg: fmt.Sprintf("sim: sweep interrupted (%v): no report", context.Cause(ctx))}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for i, p := range points {
		if p.Err != nil {
			continue
		}
		if err := outs.write(reports[i], p.Settings); err != nil {
			return err
		}
	}
	sr := sim.NewSweepReport(sweeps, points, reports)
	if asJSON {
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(sr)
	}
	sr.WriteText(env.Stdout)
	return nil
}

// writeFile creates a file and writes it with write, reporting the first error.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// progressBar draws a bar on stderr once a run has lasted a second, at most ten times a
// second.
func progressBar(env Env, start time.Time) func(string, float64) {
	var mu sync.Mutex
	var last time.Time
	return func(mode string, done float64) {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		if now.Sub(start) < time.Second || now.Sub(last) < 100*time.Millisecond {
			return
		}
		last = now
		const width = 30
		n := int(done * width)
		fmt.Fprintf(env.Stderr, "\r\033[K  %-8s [%s%s] %3.0f%%", mode, strings.Repeat("=", n), strings.Repeat(" ", width-n), done*100)
	}
}

// matrixArgs are the flags of sluice sim --matrix.
type matrixArgs struct {
	file, shape, modes string
	record, guarantees string // files to write the run to, as JSON and as docs/guarantees.md
	quick, show, json  bool
}

// runMatrix runs the guarantee matrix and prints its table (or JSON); it fails (exit 1)
// when a cell within its mode's envelope fails.
func runMatrix(ctx context.Context, env Env, a matrixArgs) error {
	var m *sim.Matrix
	var err error
	if a.file == "" {
		m, err = sim.ShippedMatrix()
	} else {
		m, err = sim.LoadMatrix(a.file)
	}
	if err != nil {
		return usageError{err}
	}
	modes := sim.MatrixModes()
	if a.modes != "" {
		modes = nil
		for _, md := range strings.Split(a.modes, ",") {
			if md = strings.TrimSpace(md); md != "" {
				if err := sim.CheckMode(md); err != nil {
					return usagef("--modes: %v", err)
				}
				modes = append(modes, md)
			}
		}
	}
	shapes := m.Select(a.quick)
	if a.shape != "" {
		shapes = slices.DeleteFunc(shapes, func(s sim.MatrixShape) bool { return !strings.Contains(s.Name(), a.shape) })
		if len(shapes) == 0 {
			return usagef("--shape %q: no shape of the matrix has it in its name", a.shape)
		}
	}
	if a.show {
		for i, s := range shapes {
			y, err := m.ScenarioYAML(s)
			if err != nil {
				return err
			}
			if i > 0 {
				fmt.Fprintln(env.Stdout, "---")
			}
			fmt.Fprintf(env.Stdout, "# sluice sim --matrix --shape %s --show\nmodes: [ideal, %s]\n%s", s.Name(), strings.Join(modes, ", "), y)
		}
		return nil
	}
	start := time.Now()
	rep, err := sim.RunMatrix(ctx, m, shapes, modes, func(i, n int, s sim.MatrixShape) {
		fmt.Fprintf(env.Stderr, "matrix: %d/%d %s (%s)\n", i+1, n, s.Name(), time.Since(start).Round(time.Second))
	})
	if err != nil && rep == nil {
		return err
	}
	if a.record != "" {
		b, jerr := json.MarshalIndent(rep, "", "  ")
		if jerr == nil {
			jerr = os.WriteFile(a.record, append(b, '\n'), 0o644)
		}
		if jerr != nil {
			return jerr
		}
	}
	if a.guarantees != "" {
		if gerr := os.WriteFile(a.guarantees, []byte(sim.Guarantees(rep)), 0o644); gerr != nil {
			return gerr
		}
	}
	if a.json {
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(rep); jerr != nil {
			return jerr
		}
	} else {
		fmt.Fprint(env.Stdout, sim.MatrixTable(rep))
	}
	switch {
	case rep.Partial:
		return exitError{code: interruptedCode(ctx), msg: "interrupted: the matrix is partial"}
	case err != nil:
		return err
	case rep.Summary.Fail > 0:
		return exitError{code: 1, msg: fmt.Sprintf("matrix: %d cells fail", rep.Summary.Fail)}
	}
	return nil
}
