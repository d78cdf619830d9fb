package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/etcdtest"
	"github.com/sluicehq/sluice/internal/testkit/proctest"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/testkit/zktest"
	"github.com/sluicehq/sluice/lease"
)

// demoMargin is the jitter tolerance of the demos these tests run: they check the wiring
// (modes, stores, flags) and that the limit is kept, judged by the demo's referee on the
// arrival of each request. A grant's request reaches the referee later than it was
// decided by however long the machine takes to send it, and a loaded CI machine took
// more than 20 ms once (one 429 in a Sentinel demo): the margin absorbs that, as it would
// a network's jitter. The modes' guarantees under time are tested from recorded decision
// times, where the machine's load does not blur them.
const demoMargin = "100ms"

func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Main(context.Background(), args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

func TestHelpForEveryCommand(t *testing.T) {
	for name := range commands {
		code, out, _ := run(t, name, "--help")
		if code != 0 || !strings.Contains(out, "Usage: sluice "+name) {
			t.Errorf("%s --help: exit %d, output %q", name, code, out)
		}
	}
	code, out, _ := run(t, "help")
	if code != 0 || !strings.Contains(out, "demo") || !strings.Contains(out, "referee") {
		t.Errorf("help: %d %q", code, out)
	}
}

func TestBadUsage(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"demo", "--limit", "ten per sec"}, "limit"},
		{[]string{"demo", "--limit", "5/fortnight"}, "fortnight"},
		{[]string{"demo", "--workers", "0"}, "--workers"},
		{[]string{"demo", "--mode", "lease", "--lease-renew", "0s"}, "--lease-renew"},
		{[]string{"demo", "--mode", "lease", "--store", "etcd://"}, "etcd://HOST:PORT"},
		{[]string{"demo", "--mode", "lease", "--store", "consul://h:1"}, "consul://"},
		{[]string{"demo", "--mode", "lease", "--store", "zk:///path"}, "zk://HOST"},
		{[]string{"demo", "--mode", "lease", "--store", "redis-sentinel://h:1/"}, "no master name"},
		{[]string{"demo", "--duration", "-1s"}, "--duration"},
		{[]string{"demo", "--mode", "quantum"}, "quantum"},
		{[]string{"demo", "stray"}, "stray"},
		{[]string{"demo", "--mode", "redis", "--fail-mode", "maybe"}, "--fail-mode"},
		{[]string{"demo", "--mode", "redis", "--fail-mode", "local", "--fallback-share", "2"}, "--fallback-share"},
		{[]string{"referee", "--limit", "0/s"}, "limit"},
		{[]string{"nonesuch"}, "nonesuch"},
		{nil, "no command"},
	}
	for _, c := range cases {
		code, _, errs := run(t, c.args...)
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, errs, c.want)
		}
	}
}

func TestDemoJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("real time")
	}
	code, out, errs := run(t, "demo", "--duration", "1s", "--workers", "3", "--margin", demoMargin, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var j map[string]any
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("not JSON: %v: %q", err, out)
	}
	for _, k := range []string{"mode", "limit", "accepted", "violations", "utilization", "jain", "per_worker"} {
		if _, ok := j[k]; !ok {
			t.Errorf("the JSON lacks %q", k)
		}
	}
	if j["mode"] != "local" || j["limit"] != "20/s burst=10" {
		t.Errorf("mode %v limit %v", j["mode"], j["limit"])
	}
	// stderr is not a terminal here: the run still says it is alive, a line at a time.
	if !strings.Contains(errs, "sluice demo:") || !strings.Contains(errs, "accepted") || strings.Contains(errs, "\r") {
		t.Errorf("no progress lines on a non-terminal stderr: %q", errs)
	}
	code, out, errs = run(t, "demo", "--mode", "lease", "--duration", "1s", "--workers", "3", "--margin", demoMargin, "--json")
	if code != 0 {
		t.Fatalf("lease: exit %d: %s", code, errs)
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil || j["mode"] != "lease" || j["violations"] != 0.0 {
		t.Errorf("lease: %v %v", err, out)
	}
}

func TestSimCommand(t *testing.T) {
	code, out, errs := run(t, "sim", "../../../../scenarios/one-every-6s-timeline.yaml", "--json", "--modes", "redis")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var j struct {
		Modes []map[string]any `json:"modes"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil || len(j.Modes) != 1 {
		t.Fatalf("report %q: %v", out, err)
	}
	for _, k := range []string{"accepted", "violations", "utilization", "jain"} {
		if _, ok := j.Modes[0][k]; !ok {
			t.Errorf("the report lacks %q", k)
		}
	}
	code, out, _ = run(t, "sim", "--modes", "local", "../../../../scenarios/one-every-6s-timeline.yaml")
	if code != 0 || !strings.Contains(out, "local") {
		t.Errorf("flags before the file: %d %q", code, out)
	}
	// The ideal beside other modes: each of them is compared with it.
	code, out, errs = run(t, "sim", "../../../../scenarios/one-every-6s-timeline.yaml", "--json", "--modes", "ideal,strict")
	if code != 0 {
		t.Fatalf("--modes ideal,strict: exit %d: %s", code, errs)
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil || len(j.Modes) != 2 || j.Modes[0]["mode"] != "ideal" {
		t.Fatalf("report %q: %v", out, err)
	}
	if j.Modes[1]["served_vs_ideal"] != 0.75 || j.Modes[1]["extra_p50_wait_ms"] == nil || j.Modes[0]["served_vs_ideal"] != nil {
		t.Errorf("strict against the ideal: %v; the ideal: %v", j.Modes[1], j.Modes[0])
	}
	code, out, _ = run(t, "sim", "--modes", "ideal,local", "../../../../scenarios/one-every-6s-timeline.yaml")
	if code != 0 || !strings.Contains(out, "served vs ideal") || !strings.Contains(out, "wait p99 vs ideal") {
		t.Errorf("--modes ideal,local: %d %q", code, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sim"}, "no scenario file"},
		{[]string{"sim", "nope.yaml"}, "nope.yaml"},
		{[]string{"sim", "../../../../scenarios/one-every-6s-timeline.yaml", "--modes", "quantum"}, "quantum"},
		{[]string{"sim", "a.yaml", "b.yaml"}, "one scenario file"},
		{[]string{"sim", "../../../../scenarios/one-every-6s-timeline.yaml", "--modes", "local,central"}, "called strict now"},
		{[]string{"sim", "../../../../scenarios/one-every-6s-timeline.yaml", "--sweep", "name=a/b,a_b", "--csv", "x.csv"}, "two points would write the same files (name=a_b)"},
		{[]string{"sim", "../../../../scenarios/one-every-6s-timeline.yaml", "--sweep", "client.margin"}, "want KEY=V1,V2"},
		{[]string{"sim", "../../../../scenarios/one-every-6s-timeline.yaml", "--sweep", "client.margin=later"}, `bad duration "later"`},
		{[]string{"sim", "../../../../scenarios/one-every-6s-timeline.yaml", "--plot", "out.pdf"}, "--plot: want a file ending in .svg or .png"},
	} {
		code, _, errs := run(t, c.args...)
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d stderr %q, want 2 and %q", c.args, code, errs, c.want)
		}
	}
}

// TestFormerStrategyName: the Heroku strategy's former name, seed, still works for one
// release, in --modes, in a scenario file's modes and in demo's --strategy, each with one
// line on stderr that names the new spelling.
func TestFormerStrategyName(t *testing.T) {
	code, out, errs := run(t, "sim", "../../../../scenarios/one-every-6s-timeline.yaml", "--json", "--modes", "adaptive:seed")
	if code != 0 || !strings.Contains(out, `"adaptive:seed"`) {
		t.Fatalf("--modes adaptive:seed: exit %d: %s", code, errs)
	}
	if want := "sluice: adaptive:seed is deprecated, use adaptive:heroku\n"; errs != want {
		t.Errorf("--modes adaptive:seed: stderr %q, want %q", errs, want)
	}
	if _, _, errs := run(t, "sim", "../../../../scenarios/one-every-6s-timeline.yaml", "--json", "--modes", "adaptive:heroku"); errs != "" {
		t.Errorf("--modes adaptive:heroku: stderr %q, want nothing", errs)
	}

	file := filepath.Join(t.TempDir(), "old.yaml")
	src := "duration: 20s\nlimit: 1/6s\nmodes: [adaptive:seed]\nmembers:\n  - name: w\n    demand: {pattern: times, times: [2s, 8s]}\n"
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs = run(t, "sim", file, "--json")
	if want := "sluice: " + file + ": modes: adaptive:seed is deprecated, use adaptive:heroku\n"; code != 0 || errs != want {
		t.Errorf("a scenario's modes: exit %d stderr %q, want 0 and %q", code, errs, want)
	}

	code, _, errs = run(t, "demo", "--mode", "adaptive", "--strategy", "seed", "--duration", "300ms", "--workers", "2", "--json")
	if want := "sluice: --strategy seed is deprecated, use --strategy heroku\n"; code != 0 || !strings.HasPrefix(errs, want) {
		t.Errorf("demo --strategy seed: exit %d stderr %q, want 0 and first %q", code, errs, want)
	}
}

// TestSimPlotAndHTML: --plot writes the figure in the format its name asks for, --html a
// page with every mode, alongside the table.
// TestSimInterrupted: a run of the large scenario (an hour of 1,000 members, most of a
// minute of work) whose context is cancelled after 300 ms returns within a second of it,
// exit 130, with the report of what it measured so far, marked partial: as JSON, and as
// the text table with a line that says so. A sweep stops as soon, with no report.
func TestSimInterrupted(t *testing.T) {
	large := "../../../../scenarios/large/pool-1000-hour.yaml"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sim", large, "--json"}, `"partial": true`},
		{[]string{"sim", large}, "interrupted at "},
		{[]string{"sim", large, "--sweep", "client.margin=5ms,6ms"}, ""},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(300*time.Millisecond, cancel)
		var out, errb bytes.Buffer
		start := time.Now()
		code := Main(ctx, c.args, strings.NewReader(""), &out, &errb)
		took := time.Since(start)
		cancel()
		if took > 1300*time.Millisecond {
			t.Errorf("%q: returned %v after the start, %v after the cancellation: want within a second", c.args, took, took-300*time.Millisecond)
		}
		if code != ExitInterrupted || !strings.Contains(errb.String(), "interrupted") {
			t.Errorf("%q: exit %d, stderr %q; want %d and the interruption said", c.args, code, errb.String(), ExitInterrupted)
		}
		if c.want == "" {
			if out.Len() != 0 {
				t.Errorf("%q: a report of an interrupted sweep: %q", c.args, out.String())
			}
			continue
		}
		if !strings.Contains(out.String(), c.want) {
			t.Errorf("%q: the output lacks %q: %q", c.args, c.want, out.String())
		}
		if !slices.Contains(c.args, "--json") {
			if !strings.Contains(out.String(), "accepted") {
				t.Errorf("%q: no table: %q", c.args, out.String())
			}
			continue
		}
		var r struct {
			Partial        bool    `json:"partial"`
			InterruptedAtS float64 `json:"interrupted_at_s"`
			Modes          []struct {
				Partial    bool              `json:"partial"`
				Accepted   int64             `json:"accepted"`
				Violations int64             `json:"violations"`
				PerMember  []json.RawMessage `json:"per_member"`
			} `json:"modes"`
		}
		if err := json.Unmarshal(out.Bytes(), &r); err != nil || len(r.Modes) != 1 {
			t.Fatalf("%q: %v: %q", c.args, err, out.String())
		}
		m := r.Modes[0]
		if !r.Partial || !m.Partial || r.InterruptedAtS <= 0 || r.InterruptedAtS >= 3600 || m.Accepted == 0 || m.Violations != 0 || len(m.PerMember) != 1000 {
			t.Errorf("%q: partial %v/%v at %v s, accepted %d, %d violations, %d members", c.args, r.Partial, m.Partial,
				r.InterruptedAtS, m.Accepted, m.Violations, len(m.PerMember))
		}
	}
}

func TestSimPlotAndHTML(t *testing.T) {
	dir := t.TempDir()
	png, svg, page := filepath.Join(dir, "out.png"), filepath.Join(dir, "out.svg"), filepath.Join(dir, "r.html")
	code, out, errs := run(t, "sim", "../../../../scenarios/one-every-6s-timeline.yaml", "--plot", png, "--html", page)
	if code != 0 || !strings.Contains(out, "violations (429s)") {
		t.Fatalf("exit %d: %s%s", code, out, errs)
	}
	if code, _, errs := run(t, "sim", "../../../../scenarios/one-every-6s-timeline.yaml", "--plot", svg); code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for file, prefix := range map[string]string{png: "\x89PNG\r\n", svg: "<?xml", page: "<!DOCTYPE html>"} {
		b, err := os.ReadFile(file)
		if err != nil || !bytes.HasPrefix(b, []byte(prefix)) {
			t.Errorf("%s: %v, starts %q", file, err, b[:min(len(b), 16)])
		}
	}
	b, _ := os.ReadFile(page)
	for _, m := range []string{"strict", "local"} {
		if !strings.Contains(string(b), `<section class="mode" id="mode-`+m+`">`) {
			t.Errorf("the page has no section for %s", m)
		}
	}
}

// TestSimSweep: a sweep runs its grid on all the cores and prints the same bytes every
// time, the points in the grid's order, with the best point per mode.
func TestSimSweep(t *testing.T) {
	t.Parallel()
	args := []string{"sim", "testdata/short-outage.yaml", "--modes", "redis,local", "--json",
		"--sweep", "client.margin=0s,10ms,50ms", "--sweep", "members.m.count=5,20", "--seed", "4"}
	code, a, errs := run(t, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if _, b, _ := run(t, args...); a != b {
		t.Errorf("two runs of the sweep differ")
	}
	var j struct {
		Keys   []string `json:"keys"`
		Points []struct {
			Settings []struct{ Key, Value string }
			Modes    []struct{ Mode string }
		}
		Best []struct {
			Mode  string
			Point int
		}
	}
	if err := json.Unmarshal([]byte(a), &j); err != nil {
		t.Fatal(err)
	}
	if len(j.Points) != 6 || len(j.Best) != 2 || strings.Join(j.Keys, " ") != "client.margin members.m.count" {
		t.Fatalf("keys %v, %d points, %d best: %s", j.Keys, len(j.Points), len(j.Best), a)
	}
	if p := j.Points[5]; p.Settings[0].Value != "50ms" || p.Settings[1].Value != "20" || p.Modes[0].Mode != "strict" {
		t.Errorf("the last point: %+v", p)
	}
	code, out, errs := run(t, "sim", "../../../../scenarios/one-every-6s-timeline.yaml", "--sweep", "client.margin=0s,10ms")
	if code != 0 || !strings.Contains(out, "best (fewest violations, then the highest utilization, then the fewest store operations)") {
		t.Errorf("exit %d: %s%s", code, out, errs)
	}
	// A point that is not a valid scenario is skipped with its reason; the others run.
	code, out, errs = run(t, "sim", "../../../../scenarios/one-every-6s-timeline.yaml", "--json", "--sweep", "client.margin=0s,later,10ms")
	var sk struct {
		Points  []json.RawMessage
		Skipped []struct {
			Settings []struct{ Key, Value string }
			Reason   string
		}
	}
	if err := json.Unmarshal([]byte(out), &sk); code != 0 || err != nil || len(sk.Points) != 2 || len(sk.Skipped) != 1 ||
		sk.Skipped[0].Settings[0].Value != "later" || !strings.Contains(sk.Skipped[0].Reason, `bad duration "later"`) ||
		!strings.Contains(errs, "skipped: --sweep client.margin=later") {
		t.Errorf("a sweep with one bad value: exit %d, %v: %s%s", code, err, out, errs)
	}
}

// TestSimSweepWritesEachPoint: with --csv, --plot and --html a sweep writes each point's
// files, named after its settings; a point's files are those of the same point swept
// alone (the grid and its parallel runs change nothing), the points' differ, and two runs
// write the same bytes.
func TestSimSweepWritesEachPoint(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sweep := func(sub string, margins string) {
		t.Helper()
		d := filepath.Join(dir, sub)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		code, out, errs := run(t, "sim", "testdata/short-outage.yaml", "--modes", "redis", "--seed", "4",
			"--sweep", "client.margin="+margins, "--sweep", "members.m.count=5",
			"--csv", filepath.Join(d, "s.csv"), "--plot", filepath.Join(d, "f.png"), "--html", filepath.Join(d, "p.html"))
		if code != 0 || !strings.Contains(out, "best (") {
			t.Fatalf("exit %d: %s%s", code, out, errs)
		}
	}
	sweep("a", "0s,50ms")
	sweep("b", "0s,50ms")
	sweep("c", "50ms")
	read := func(sub, name string) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, sub, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, pt := range []string{"client.margin=0s-members.m.count=5", "client.margin=50ms-members.m.count=5"} {
		for name, prefix := range map[string]string{"s-" + pt + ".csv": "mode,", "f-" + pt + ".png": "\x89PNG\r\n", "p-" + pt + ".html": "<!DOCTYPE html>"} {
			if b := read("a", name); !bytes.HasPrefix(b, []byte(prefix)) {
				t.Errorf("%s starts %q, want %q", name, b[:min(len(b), 16)], prefix)
			} else if !bytes.Equal(b, read("b", name)) {
				t.Errorf("%s: two runs of the sweep wrote different bytes", name)
			}
		}
	}
	csv0, csv50 := read("a", "s-client.margin=0s-members.m.count=5.csv"), read("a", "s-client.margin=50ms-members.m.count=5.csv")
	if bytes.Equal(csv0, csv50) {
		t.Errorf("the two points' series are the same: the setting did not reach them")
	}
	if !bytes.Equal(csv50, read("c", "s-client.margin=50ms-members.m.count=5.csv")) {
		t.Errorf("the point's series in the grid differs from the point swept alone")
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "a"))
	if len(entries) != 6 {
		t.Errorf("%d files written, want 6 (3 per point)", len(entries))
	}
}

// TestDemoStrictOnRedis runs the demo in the strict mode against a real redis-server: it
// keeps the limit, and says so as "mode":"strict". The old spelling (--mode redis
// --redis-url) still works for one release and says what to write instead.
func TestDemoStrictOnRedis(t *testing.T) {
	srv := redistest.New(t)
	for _, args := range [][]string{{"--mode", "strict", "--store", srv.URL()}, {"--mode", "redis", "--redis-url", srv.URL()}} {
		code, out, errs := run(t, append([]string{"demo", "--duration", "1s", "--workers", "3", "--margin", demoMargin, "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errs)
		}
		var j map[string]any
		if err := json.Unmarshal([]byte(out), &j); err != nil {
			t.Fatalf("not JSON: %v: %q", err, out)
		}
		if j["mode"] != "strict" || j["violations"] != 0.0 {
			t.Errorf("%v: mode %v, violations %v: %s", args, j["mode"], j["violations"], out)
		}
		old := args[1] == "redis"
		for _, w := range []string{"--mode redis is deprecated, use --mode strict --store redis://", "--redis-url is deprecated, use --store"} {
			if strings.Contains(errs, w) != old {
				t.Errorf("%v: stderr %q: want %q only for the old spelling", args, errs, w)
			}
		}
	}
}

// TestDemoStrictOnMemoryAndGossip: the strict mode with no store (one in memory) and the
// gossip mode (each worker a member on loopback) run; the strict mode keeps the limit
// exactly.
func TestDemoStrictOnMemoryAndGossip(t *testing.T) {
	for _, mode := range []string{"strict", "gossip"} {
		code, out, errs := run(t, "demo", "--mode", mode, "--duration", "1s", "--workers", "3", "--margin", demoMargin, "--json")
		var j map[string]any
		if code != 0 || json.Unmarshal([]byte(out), &j) != nil {
			t.Fatalf("%s: exit %d: %s%s", mode, code, out, errs)
		}
		if j["mode"] != mode || j["accepted"].(float64) == 0 || mode == "strict" && j["violations"] != 0.0 {
			t.Errorf("%s: %s", mode, out)
		}
	}
}

// TestDemoRedisUnreachable: a Redis that does not answer is a clear error, not a run
// that denies everything.
func TestDemoRedisUnreachable(t *testing.T) {
	srv := redistest.New(t)
	srv.Kill()
	code, _, errs := run(t, "demo", "--mode", "strict", "--store", srv.URL(), "--duration", "1s")
	if code != 1 || !strings.Contains(errs, "unavailable: redis") {
		t.Errorf("exit %d, stderr %q; want 1 and a clear error", code, errs)
	}
}

// TestVersionFlags: --version, -version and -v are the version command (a first user
// tried them before `sluice version`).
func TestVersionFlags(t *testing.T) {
	for _, arg := range []string{"version", "--version", "-version", "-v"} {
		code, out, errs := run(t, arg)
		if code != 0 || !strings.HasPrefix(out, "sluice ") {
			t.Errorf("sluice %s: exit %d, out %q, err %q", arg, code, out, errs)
		}
	}
}

// TestSentinel: the redis demo, the lease demo and the daemon of each back end through a
// real Sentinel set (a master, a replica, three sentinels), named by a redis-sentinel://
// URL.
func TestSentinel(t *testing.T) {
	t.Parallel() // its own servers; mostly waiting on fences and demos
	set := redistest.NewSentinels(t, redistest.SentinelConfig{})
	t.Run("DemoRedis", func(t *testing.T) {
		code, out, errs := run(t, "demo", "--mode", "strict", "--store", set.URL(), "--duration", "1s", "--workers", "3",
			"--margin", demoMargin, "--json")
		var j map[string]any
		if code != 0 || json.Unmarshal([]byte(out), &j) != nil {
			t.Fatalf("exit %d: %s%s", code, out, errs)
		}
		if j["mode"] != "strict" || j["violations"] != 0.0 || j["accepted"].(float64) < 10 {
			t.Errorf("%s", out)
		}
	})
	t.Run("DemoLease", func(t *testing.T) {
		code, out, errs := run(t, "demo", "--mode", "lease", "--store", set.URL(), "--duration", "2s", "--workers", "3",
			"--margin", demoMargin, "--json")
		var j map[string]any
		if code != 0 || json.Unmarshal([]byte(out), &j) != nil {
			t.Fatalf("exit %d: %s%s", code, out, errs)
		}
		if j["mode"] != "lease" || j["violations"] != 0.0 || j["accepted"].(float64) < 10 {
			t.Errorf("%s", out)
		}
	})
	// The state went through the master: it holds keys of both.
	if n, err := set.Master.Do("DBSIZE"); err != nil || n == ":0" {
		t.Errorf("the master holds no key (%s %v)", n, err)
	}
	t.Run("ServeRedis", func(t *testing.T) { serveOn(t, "--backend", "redis", "--redis-url", set.URL()) })
	t.Run("ServeRedisAcks", func(t *testing.T) {
		serveOn(t, "--backend", "redis", "--redis-url", set.URL(), "--redis-replica-acks", "1")
	})
	t.Run("ServeLease", func(t *testing.T) { serveLease(t, set.URL()) })
}

// TestLeaseOnEtcd: the lease demo and the daemon through one real etcd, and the strict
// mode's on the same etcd.
func TestLeaseOnEtcd(t *testing.T) {
	t.Parallel() // its own servers; mostly waiting on fences and demos
	srv := etcdtest.New(t)
	t.Run("Demo", func(t *testing.T) { demoLeaseOnEtcd(t, srv) })
	t.Run("Serve", func(t *testing.T) { serveLease(t, srv.URL()) })
	t.Run("StrictDemo", func(t *testing.T) { demoStrict(t, srv.URL()) })
	t.Run("StrictServe", func(t *testing.T) { serveOn(t, "--backend", "strict", "--store", srv.URL()) })
}

// TestLeaseOnZK: the lease demo and the daemon through one real ZooKeeper, and the strict
// mode's on the same ZooKeeper.
func TestLeaseOnZK(t *testing.T) {
	t.Parallel() // its own servers; mostly waiting on fences and demos
	srv := zktest.New(t)
	t.Run("Demo", func(t *testing.T) { demoLeaseOnZK(t, srv) })
	t.Run("Serve", func(t *testing.T) { serveLease(t, srv.URL()) })
	t.Run("StrictDemo", func(t *testing.T) { demoStrict(t, srv.URL()+"/demo/strict") })
	t.Run("StrictServe", func(t *testing.T) { serveOn(t, "--backend", "strict", "--store", srv.URL()) })
}

// demoStrict runs the demo in the strict mode through store: it keeps the limit.
func demoStrict(t *testing.T, store string) {
	code, out, errs := run(t, "demo", "--mode", "strict", "--store", store, "--duration", "2s", "--workers", "3", "--margin", demoMargin, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var j map[string]any
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("not JSON: %v: %q", err, out)
	}
	if j["mode"] != "strict" || j["violations"] != 0.0 || j["accepted"].(float64) < 10 {
		t.Errorf("mode %v, violations %v, accepted %v: %s", j["mode"], j["violations"], j["accepted"], out)
	}
}

// serveLease runs the daemon on the lease back end through store: it admits once the new
// store's fence has passed, and keeps the rule's limit; a windowed quota's rule (a daily
// count of 20) grants exactly its count.
func serveLease(t *testing.T, store string) {
	serveOn(t, "--backend", "lease", "--store", store, "--limit", "q=20/24h window")
}

// serveOn runs the daemon on the back end the flags name: it admits (at once, or once a
// lease store's fence has passed), and keeps the rule's limit; and if the flags give a
// rule q (a daily quota of 20), it grants exactly its count.
func serveOn(t *testing.T, backendFlags ...string) {
	addr := proctest.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var errb bytes.Buffer
	go func() {
		args := append([]string{"serve"}, backendFlags...)
		done <- Main(ctx, append(args, "--listen-line", addr, "--listen-http", "", "--limit", "api=2/s burst=5"),
			strings.NewReader(""), io.Discard, &errb)
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d: %s", code, errb.String())
		}
	}()
	var c net.Conn
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err = net.Dial("tcp", addr); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not listen: %v: %s", err, errb.String())
		}
	}
	defer c.Close()
	rd := bufio.NewReader(c)
	ask := func(n int) string { return askTag(t, c, rd, "api", n) }
	// The first decision makes the store's records, fenced for TTL + Grace (1.5 s by
	// default): the first OK comes after that.
	for deadline := time.Now().Add(10 * time.Second); ask(1) != "OK"; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no OK 10 s after the daemon started: %s", errb.String())
		}
	}
	// Then 60 queries 50 ms apart (3 s, longer on a loaded machine: the bound counts the
	// time they took): the limit's rate (2/s) and at most its burst (5) more.
	ok := 0
	start := time.Now()
	for range 60 {
		if ask(1) == "OK" {
			ok++
		}
		time.Sleep(50 * time.Millisecond)
	}
	took := time.Since(start)
	if most := int(2*took.Seconds()) + 5 + 1; ok < 4 || ok > most {
		t.Errorf("%d of 60 queries over %v on 2/s burst=5 were OK, want 4 to %d", ok, took.Round(time.Millisecond), most)
	}
	if !slices.Contains(backendFlags, "q=20/24h window") {
		return
	}
	// The daily quota: 30 queries in a row, of which its 20 (more if the day turned
	// meanwhile: a new window).
	day := time.Now().UTC().Truncate(24 * time.Hour)
	got := askTag(t, c, rd, "q", 30)
	turned := !time.Now().UTC().Truncate(24 * time.Hour).Equal(day)
	if n := strings.Count(got, "OK"); n != 20 && !(turned && n > 20) {
		t.Errorf("a daily quota of 20: %d of 30 queries OK (%s), want 20", n, got)
	}
}

// askTag sends n queries for tag on c and returns the answers, concatenated.
func askTag(t *testing.T, c net.Conn, rd *bufio.Reader, tag string, n int) string {
	t.Helper()
	fmt.Fprint(c, strings.Repeat(tag+"\n", n))
	var got strings.Builder
	for range n {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		got.WriteString(strings.TrimSpace(line))
	}
	return got.String()
}

// demoLeaseOnEtcd runs the lease demo through a real etcd: it keeps the limit, and the
// records really went through etcd (its revision moved).
func demoLeaseOnEtcd(t *testing.T, srv *etcdtest.Server) {
	code, out, errs := run(t, "demo", "--mode", "lease", "--store", srv.URL(), "--duration", "2s", "--workers", "3", "--margin", demoMargin, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var j map[string]any
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("not JSON: %v: %q", err, out)
	}
	if j["mode"] != "lease" || j["violations"] != 0.0 || j["accepted"].(float64) < 10 {
		t.Errorf("mode %v, violations %v, accepted %v: %s", j["mode"], j["violations"], j["accepted"], out)
	}
	r, err := http.Post("http://"+srv.Addr()+"/v3/kv/range", "application/json", strings.NewReader(`{"key":"AA==","range_end":"AA==","count_only":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var rng struct{ Header struct{ Revision string } }
	if err := json.NewDecoder(r.Body).Decode(&rng); err != nil {
		t.Fatal(err)
	}
	if rev, _ := strconv.Atoi(rng.Header.Revision); rev < 20 {
		t.Errorf("etcd at revision %q after the demo: its members did not lease through it", rng.Header.Revision)
	}
}

// demoLeaseOnZK runs the lease demo through a real ZooKeeper: it keeps the limit.
func demoLeaseOnZK(t *testing.T, srv *zktest.Server) {
	code, out, errs := run(t, "demo", "--mode", "lease", "--store", srv.URL()+"/demo/test", "--duration", "2s", "--workers", "3", "--margin", demoMargin, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var j map[string]any
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("not JSON: %v: %q", err, out)
	}
	if j["mode"] != "lease" || j["violations"] != 0.0 || j["accepted"].(float64) < 10 {
		t.Errorf("mode %v, violations %v, accepted %v: %s", j["mode"], j["violations"], j["accepted"], out)
	}
}

// TestServeSeesAChangeMadeWhileItStarts: a config file rewritten after the daemon read it
// but before it began to watch the file is reloaded (the watch's first fingerprint was
// taken after the start, so such a change was never seen: TestServeReloadsWhenTheFileChanges
// in cmd/sluice failed on a loaded machine).
func TestServeSeesAChangeMadeWhileItStarts(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "sluice.yaml")
	write := func(text string) {
		tmp := filepath.Join(dir, "next.yaml")
		if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, cfg); err != nil {
			t.Fatal(err)
		}
	}
	write("rules:\n  - {match: api, limit: 1/h}\n")
	t.Setenv("SLUICE_WATCH_CONFIG", "10ms")
	testHookServing = func() { write("rules:\n  - {match: api, limit: 1/h}\n  - {match: fresh, limit: 1/h}\n") }
	t.Cleanup(func() { testHookServing = nil })
	addr := proctest.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	errb := &proctest.LockedBuffer{}
	go func() {
		done <- Main(ctx, []string{"serve", "--config", cfg, "--listen-line", addr, "--listen-http", ""}, strings.NewReader(""), io.Discard, errb)
	}()
	defer func() {
		cancel()
		<-done
	}()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(errb.String(), `trigger="the config file changed"`); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the change made while the daemon started was not reloaded in 10 s: %s", errb.String())
		}
	}
}

// TestSimMatrix: `sluice sim --matrix --quick --json` prints every cell (mode, shape, pass,
// in_envelope and the figures) and a summary, and exits 1 while a cell within its mode's
// envelope fails; --matrix takes no scenario file.
func TestSimMatrix(t *testing.T) {
	code, out, errs := run(t, "sim", "--matrix", "--quick", "--json", "--modes", "local,strict")
	var j struct {
		Cells []struct {
			Mode, Shape string
			Pass        bool
			InEnvelope  bool     `json:"in_envelope"`
			Served      *float64 `json:"served_vs_ideal"`
		}
		Summary struct{ Cells, Pass, Fail, Outside int }
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("exit %d, not JSON: %v: %s%s", code, err, out, errs)
	}
	if len(j.Cells) < 18 || j.Summary.Cells != len(j.Cells) || j.Cells[0].Served == nil {
		t.Errorf("%d cells, summary %+v", len(j.Cells), j.Summary)
	}
	if want := map[bool]int{true: 1, false: 0}[j.Summary.Fail > 0]; code != want {
		t.Errorf("exit %d with %d failing cells, want %d", code, j.Summary.Fail, want)
	}
	if code, _, errs := run(t, "sim", "--matrix", "../../../../scenarios/store-outage.yaml"); code != ExitUsage || !strings.Contains(errs, "takes no scenario file") {
		t.Errorf("--matrix with a file: exit %d, %q", code, errs)
	}
	// One cell alone: --shape selects, --show prints the scenario, which sluice sim runs.
	const shape = "one-every-6s/one/backlog/none"
	code, out, errs = run(t, "sim", "--matrix", "--shape", shape, "--show", "--modes", "strict")
	if code != 0 || !strings.Contains(out, "name: "+shape) || !strings.Contains(out, "modes: [ideal, strict]") {
		t.Fatalf("--show: exit %d, %s%s", code, out, errs)
	}
	file := filepath.Join(t.TempDir(), "cell.yaml")
	if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := run(t, "sim", file); code != 0 || !strings.Contains(out, "served vs ideal") {
		t.Errorf("the shown cell did not run: exit %d, %s%s", code, out, errs)
	}
	if code, _, errs := run(t, "sim", "--matrix", "--shape", "no-such-shape"); code != ExitUsage || !strings.Contains(errs, "no shape") {
		t.Errorf("--shape matching nothing: exit %d, %q", code, errs)
	}
}

// TestStoreInit: `sluice store init URL` marks a new Redis and waits out its fence (TTL +
// grace), so that a lease member started after it is not fenced; run again it says the
// store was marked already, at once. Bad URLs are usage errors; a Redis Cluster is refused
// with why.
func TestStoreInit(t *testing.T) {
	srv := redistest.New(t)
	start := time.Now()
	code, out, errs := run(t, "store", "init", srv.URL(), "--lease-ttl", "300ms", "--lease-grace", "100ms")
	if code != 0 || !strings.Contains(out, "fence waited out") || time.Since(start) < 400*time.Millisecond {
		t.Fatalf("store init on a new Redis: exit %d, %q %q after %v", code, out, errs, time.Since(start))
	}
	if code, out, errs = run(t, "store", "init", srv.URL(), "--lease-ttl", "300ms", "--lease-grace", "100ms"); code != 0 || !strings.Contains(out, "marked already") {
		t.Fatalf("store init again: exit %d, %q %q", code, out, errs)
	}
	st, closeStore, err := openStore(srv.URL(), "sluice:lease:")
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	cfg := lease.DefaultConfig()
	cfg.TTL, cfg.Grace = 300*time.Millisecond, 100*time.Millisecond
	snap, err := st.Load(context.Background(), nil)
	if err != nil || snap.Now < cfg.FenceAfterRestart(snap.Since) {
		t.Errorf("after store init the store still fences: %+v %v", snap, err)
	}
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"store", "init"}, 2, "want the store's URL"},
		{[]string{"store", "init", "127.0.0.1:6379"}, 2, "write redis://127.0.0.1:6379"},
		{[]string{"store", "init", "memory://"}, 2, "never fenced"},
		{[]string{"store", "init", "redis-cluster://127.0.0.1:1"}, 1, "keeps no incarnation mark"},
	} {
		if code, _, errs := run(t, c.args...); code != c.code || !strings.Contains(errs, c.says) {
			t.Errorf("%v: exit %d, %q; want %d saying %q", c.args, code, errs, c.code, c.says)
		}
	}
}

// TestDemoAdaptiveWarnsOutsideItsEnvelope: several adaptive clients on a burst under 4 are
// outside the adaptive mode's envelope (they collide whatever they do), as are more busy
// clients than the burst's permits: the demo says so before it runs. One client (the
// default: the workers are its goroutines, sharing one Transport), or few enough clients
// on a burst of 4 or more, it does not. --clients goes with the adaptive mode, and at most
// one client a worker.
func TestDemoAdaptiveWarnsOutsideItsEnvelope(t *testing.T) {
	for _, c := range []struct {
		limit, workers, clients string
		warn                    bool
	}{
		{"2/s burst=2", "3", "3", true}, {"4/s burst=4", "3", "3", false}, {"1/s", "1", "1", false},
		{"1/s", "8", "1", false}, {"1/s", "8", "2", true}, {"10/s", "12", "12", true}, {"10/s", "12", "10", false},
	} {
		code, out, errs := run(t, "demo", "--mode", "adaptive", "--limit", c.limit, "--workers", c.workers, "--clients", c.clients, "--duration", "300ms", "--json")
		if code != 0 || strings.Contains(errs, "collide") != c.warn {
			t.Errorf("--limit %q --workers %s --clients %s: exit %d, stderr %q; want a warning %v", c.limit, c.workers, c.clients, code, errs, c.warn)
		}
		if want := `"clients":` + c.clients + `,`; !strings.Contains(out, want) {
			t.Errorf("--clients %s: the summary %q does not say %s", c.clients, out, want)
		}
	}
	for _, args := range [][]string{{"--mode", "adaptive", "--clients", "9"}, {"--mode", "adaptive", "--clients", "0"}, {"--mode", "local", "--clients", "2"}} {
		if code, _, errs := run(t, append([]string{"demo", "--duration", "300ms"}, args...)...); code != 2 || !strings.Contains(errs, "--clients") {
			t.Errorf("%v: exit %d, %q; want 2 naming --clients", args, code, errs)
		}
	}
}
