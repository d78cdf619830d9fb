package sim

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

var update = flag.Bool("update", false, "rewrite the golden reports in testdata/golden")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func parse(t *testing.T, y string) *Scenario {
	t.Helper()
	sc, err := Parse("test.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func run1(t *testing.T, sc *Scenario, mode string) ModeReport {
	t.Helper()
	r, err := Run(sc, Options{Modes: []string{mode}})
	if err != nil {
		t.Fatal(err)
	}
	return r.Modes[0]
}

func TestScenarioErrorsNameFileAndLine(t *testing.T) {
	cases := []struct{ yaml, want string }{
		{"duration: 10s\nlimit: 1/s\nmembers:\n  - name: w\n    demand: {pattern: constant, rate: 1}\nbogus: 3\n", `test.yaml:6: unknown field "bogus"`},
		{"duration: 10s\nlimit: ten per sec\nmembers: []\n", "test.yaml:2: sluice: bad limit"},
		{"duration: ten\nlimit: 1/s\n", "test.yaml:1: bad duration"},
		{"duration: 10s\nlimit: 1/s\nmembers:\n  - name: w\n    demand: {pattern: sometimes}\n", "test.yaml:5: pattern: want constant"},
		{"duration: 10s\nlimit: 1/s\nmembers:\n  - name: w\n    demand: {pattern: constant, rate: 1}\n    colour: red\n", "test.yaml:6: unknown field \"colour\""},
		{"duration: 10s\nlimit: 1/s\nmembers:\n  - name: w\n    demand: {pattern: constant, rate: 1}\nevents:\n  - {at: 5s, crash: nobody}\n", "test.yaml:7: events[0]: no member or group named \"nobody\""},
		{"duration: 10s\nlimit: 1/s\nmembers:\n  - name: w\n    demand: {pattern: constant, rate: 1}\nevents:\n  - {at: 5s, crash: w1, leave: w1}\n", "test.yaml:7: events[0]: want exactly one"},
		{"duration: 10s\nlimit: 1/s\nmembers:\n  - name: w\n    demand: {pattern: constant, rate: 1}\nevents:\n  - {at: 50s, heal: true}\n", "test.yaml:7: events[0].at: outside the run"},
		{"duration: 10s\nlimit: 1/s\nstore: {fail_mode: sideways}\nmembers:\n  - name: w\n    demand: {pattern: constant, rate: 1}\n", "test.yaml:3: fail_mode"},
		{"duration: 10s\nlimit: 1/s\nnetwork:\n  api: {latency: {dist: gamma}}\nmembers:\n  - name: w\n    demand: {pattern: constant, rate: 1}\n", "test.yaml:4: dist: want fixed"},
		{"duration: 10s\nlimit: 1/s\nmodes: [quantum]\nmembers:\n  - name: w\n    demand: {pattern: constant, rate: 1}\n", "test.yaml: modes: unknown mode \"quantum\""},
		{"duration: 10s\nlimit: 1/s\nmodes: [adaptive:aimd]\nmembers:\n  - name: w\n    demand: {pattern: constant, rate: 1}\n", "test.yaml: modes: adaptive: unknown strategy \"aimd\""},
		{"duration: 10s\nlimit: 1/s\nreferee: {style: azure}\nmembers:\n  - name: w\n    demand: {pattern: constant, rate: 1}\n", "test.yaml:3: referee.style: want ietf, openai, anthropic, heroku or bare"},
		{"duration: 10s\nlimit: 1/s\nreferee: {tokens: 100/s}\nmembers:\n  - name: w\n    demand: {pattern: constant, rate: 1, tokens: {min: 1, max: 200}}\n", "test.yaml:6: tokens: max 200 is more than the token limit's burst (100)"},
		{"duration: 10s\nlimit: 1/s\nmembers:\n  - name: w\n    demand: {pattern: constant, rate: 1, tokens: {min: 9, max: 2}}\n", "test.yaml:5: tokens: want 0 <= min <= max"},
		{"duration: 10s\nlimit: 1/s\nmembers:\n  - name: w\n    priority: urgent\n    demand: {pattern: constant, rate: 1}\n", "test.yaml:4: members[0].priority: \"urgent\": want critical, standard or sheddable"},
		{"duration: 10s\nlimit: 1/s\nlocal: {processes: many}\nmembers:\n  - name: w\n    demand: {pattern: constant, rate: 1}\n", "test.yaml:3: local.processes: want one or each, not \"many\""},
		{"duration: 10s\nlimit: 1/s\n", "test.yaml: members: none"},
		{"", "test.yaml: empty file"},
		{"duration: 10s\nlimit: 1/s\nmembers: [\n", "test.yaml:3:"},
	}
	for i, c := range cases {
		_, err := Parse("test.yaml", []byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("case %d: got %v, want an error containing %q", i, err, c.want)
		}
	}
}

func TestDurationsWithDays(t *testing.T) {
	for in, want := range map[string]time.Duration{"2d": 48 * time.Hour, "1d12h": 36 * time.Hour, "90s": 90 * time.Second, "0": 0} {
		got, err := parseDuration(in)
		if err != nil || got != want {
			t.Errorf("%q: got %v %v, want %v", in, got, err, want)
		}
	}
}

// TestOneEverySixSecondsTimeline: four requests at t=2, 8, 13, 14 s under one request
// every 6 seconds (the strict mode's example). The third is denied (and dropped by the
// pessimistic client); the others are permitted.
func TestOneEverySixSecondsTimeline(t *testing.T) {
	sc, err := Load("../scenarios/one-every-6s-timeline.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"strict", "local"} {
		r := run1(t, sc, mode)
		if r.Accepted != 3 || r.Dropped != 1 || r.Violations != 0 {
			t.Errorf("%s: accepted %d dropped %d violations %d, want 3 1 0", mode, r.Accepted, r.Dropped, r.Violations)
		}
	}
}

const pool = `
duration: 2m
seed: 7
limit: 10/s burst=5
sample: 1s
network:
  store: {latency: {dist: fixed, value: 2ms}}
  api: {latency: {dist: fixed, value: 10ms}}
client: {max_wait: 2s}
members:
  - name: w
    count: 8
    goroutines: 3
    demand: {pattern: backlog, n: 1000000}
`

// TestCentralIsExactWithFixedLatency: with fixed latencies every permit reaches the API
// shifted by the same delay, so central decisions with no margin are exact: no
// violation, and the limit fully used.
func TestCentralIsExactWithFixedLatency(t *testing.T) {
	r := run1(t, parse(t, pool), "strict")
	if r.Violations != 0 {
		t.Errorf("violations %d, want 0", r.Violations)
	}
	if r.Utilization < 0.99 || r.Jain < 0.99 {
		t.Errorf("utilization %v jain %v, want at least 0.99", r.Utilization, r.Jain)
	}
}

// TestCentralNeedsAMarginUnderJitter: with varying latency the same pool breaks a strict
// limit, and a margin as wide as the spread restores it.
func TestCentralNeedsAMarginUnderJitter(t *testing.T) {
	jitter := strings.Replace(pool, "api: {latency: {dist: fixed, value: 10ms}}", "api: {latency: {dist: uniform, min: 5ms, max: 25ms}}", 1)
	if r := run1(t, parse(t, jitter), "strict"); r.Violations == 0 {
		t.Errorf("no violation under 20 ms of jitter with no margin: the test no longer tests")
	}
	withMargin := strings.Replace(jitter, "client: {max_wait: 2s}", "client: {max_wait: 2s, margin: 20ms}", 1)
	r := run1(t, parse(t, withMargin), "strict")
	if r.Violations != 0 || r.Utilization < 0.95 {
		t.Errorf("with a 20 ms margin: violations %d utilization %v, want 0 and at least 0.95", r.Violations, r.Utilization)
	}
}

// TestLocalModeWithoutCoordination: members that each think they own the limit flood the
// API; members on an equal share keep it.
func TestLocalModeWithoutCoordination(t *testing.T) {
	if r := run1(t, parse(t, pool+"local: {processes: each}\n"), "local"); r.Violations == 0 || r.Ratio429 < 0.5 {
		t.Errorf("8 uncoordinated members: violations %d ratio %v, want most rejected", r.Violations, r.Ratio429)
	}
	// An eighth of 10/s burst 16 each: rates and bursts sum to the limit's.
	share := parse(t, strings.Replace(pool, "limit: 10/s burst=5", "limit: 10/s burst=16", 1)+"local: {share: 0.125, processes: each}\n")
	if r := run1(t, share, "local"); r.Violations != 0 {
		t.Errorf("8 members on an eighth each: violations %d, want 0", r.Violations)
	}
}

const outage = `
duration: 2m
seed: 3
limit: 50/s burst=10
sample: 1s
network:
  store: {latency: {dist: fixed, value: 1ms}}
  api: {latency: {dist: fixed, value: 5ms}}
store: {timeout: 20ms, fail_mode: FAILMODE, fallback_share: 0.25}
client: {max_wait: 500ms}
members:
  - name: m
    count: 4
    goroutines: 4
    demand: {pattern: poisson, rate: 20}
events:
  - {at: 30s, store_outage: 30s}
`

func TestStoreOutageFailModes(t *testing.T) {
	get := func(mode string) ModeReport {
		return run1(t, parse(t, strings.Replace(outage, "FAILMODE", mode, 1)), "strict")
	}
	closed, open, local := get("closed"), get("open"), get("local")
	if closed.Violations != 0 || closed.Timeouts == 0 {
		t.Errorf("closed: violations %d timeouts %d, want 0 and some", closed.Violations, closed.Timeouts)
	}
	if open.Violations == 0 || open.FailOpen == 0 {
		t.Errorf("open: violations %d fail-open %d: 80/s sent unthrottled past 50/s must show", open.Violations, open.FailOpen)
	}
	// Degrading to a local share can over-admit at the two edges of the outage (DESIGN.md
	// §2): permits the store had reserved land beside the fallbacks' (at most max_wait ×
	// rate = 25), the fallbacks start with their bursts (4 × 2), and the store, back,
	// grants its burst (10) to an API the fallbacks kept busy.
	if local.Violations > 25+8+10 {
		t.Errorf("local at a quarter each: violations %d, want at most 43", local.Violations)
	}
	if local.Accepted <= closed.Accepted {
		t.Errorf("degrading to a local share admitted %d, no more than failing closed (%d)", local.Accepted, closed.Accepted)
	}
	if len(closed.Events) != 1 || closed.Events[0].ConvergenceS < 0 {
		t.Errorf("closed: events %+v", closed.Events)
	}
}

// TestPartitionAndPause: a partitioned member (fail closed) gets nothing from the store
// while cut off; a paused member sends nothing while frozen.
func TestPartitionAndPause(t *testing.T) {
	y := pool + `events:
  - {at: 10s, partition: [w1, w2], for: 30s}
  - {at: 50s, pause: w3, for: 20s}
`
	r := run1(t, parse(t, y), "strict")
	if r.Violations != 0 {
		t.Errorf("violations %d", r.Violations)
	}
	var w1, w4 int64
	for _, m := range r.PerMember {
		switch m.Name {
		case "w1":
			w1 = m.Granted
		case "w4":
			w4 = m.Granted
		}
	}
	if w1 >= w4 {
		t.Errorf("w1, cut off for 30 s, got %d; w4 got %d", w1, w4)
	}
	if len(r.Events) != 2 || r.Events[0].Event != "partition w1,w2 for 30s" {
		t.Errorf("events %+v", r.Events)
	}
}

func TestCrashAndRejoin(t *testing.T) {
	y := pool + `events:
  - {at: 30s, crash: [w1, w2, w3]}
  - {at: 60s, join: w1}
  - {at: 90s, leave: w4}
`
	r := run1(t, parse(t, y), "strict")
	if r.Violations != 0 || r.Utilization < 0.98 {
		t.Errorf("violations %d utilization %v", r.Violations, r.Utilization)
	}
	if r.Jain < 0.95 {
		t.Errorf("jain %v: members present for less time must not count as unfair", r.Jain)
	}
}

func TestLimitChange(t *testing.T) {
	y := pool + `events:
  - {at: 60s, limit: 5/s burst=5}
`
	r := run1(t, parse(t, y), "strict")
	// 10/s for 60 s then 5/s for 60 s: about 5 + 600 + 300.
	if r.Accepted < 880 || r.Accepted > 920 {
		t.Errorf("accepted %d, want about 905", r.Accepted)
	}
	// Permits reserved before the decrease (up to max_wait × the old rate) may land too
	// close under the new limit; nothing else may.
	if r.Violations > 20 {
		t.Errorf("violations %d after a decrease both sides know of, want at most 20", r.Violations)
	}
}

// TestHotLoopDoesNotAllocatePerRequest: a run's allocations do not grow with its requests.
func TestHotLoopDoesNotAllocatePerRequest(t *testing.T) {
	short := parse(t, strings.Replace(pool, "duration: 2m", "duration: 1m", 1))
	long := parse(t, strings.Replace(pool, "duration: 2m", "duration: 20m", 1))
	allocs := func(sc *Scenario) uint64 {
		var a, b runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&a)
		if _, err := Run(sc, Options{Modes: []string{"strict"}}); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&b)
		return b.Mallocs - a.Mallocs
	}
	s, l := allocs(short), allocs(long)
	// 20 times the requests (about 11,400 more); allow for the per-sample series and the
	// report, which grow with time, not requests.
	if l > s+3000 {
		t.Errorf("allocations: %d for 1 minute, %d for 20 minutes: the hot loop allocates per request", s, l)
	}
}

// TestLargeScenarioRuns: scenarios/large/pool-1000-hour.yaml, the hour BenchmarkHour1000Members
// runs (too long for make test in full), loads and runs: a second of it brings about
// 10,000 requests and no violation.
func TestLargeScenarioRuns(t *testing.T) {
	sc, err := Load("../scenarios/large/pool-1000-hour.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if sc.Duration != Duration(time.Hour) || len(sc.Members) != 1 || sc.Members[0].Count != 1000 {
		t.Fatalf("the file holds %s of %d groups, want an hour of 1,000 members", sc.Duration.D(), len(sc.Members))
	}
	sc.Duration = Duration(time.Second)
	r, err := Run(sc, Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := r.Modes[0]
	if m.Arrivals < 9_500 || m.Arrivals > 10_500 || m.Violations != 0 {
		t.Errorf("%d requests and %d violations in 1 s, want about 10,000 and none", m.Arrivals, m.Violations)
	}
}

// --- lease mode ---

// TestLeaseKeepsTheLimitEverywhere: in every shipped scenario that runs the lease mode,
// and in the others run under it, the referee sees no violation and the shares in use
// (member side) and counted (store side) never sum past the limit at any check — through
// joins, graceful leaves, crashes, pauses longer than a lease, partitions, store outages
// and store restarts. The scenarios that run the lease mode already run (twice) in the
// golden test: their golden reports are judged here.
func TestLeaseKeepsTheLimitEverywhere(t *testing.T) {
	for _, f := range shippedScenarios(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			t.Parallel() // each its own simulation: the cores share them
			sc, err := Load(f)
			if err != nil {
				t.Fatal(err)
			}
			if sc.Referee.Tokens != nil {
				t.Skip("an LLM-style API's token limits are known to the adaptive mode only")
			}
			var r ModeReport
			if slices.Contains(sc.Modes, "lease") {
				b, err := os.ReadFile(filepath.Join("testdata", "golden", strings.TrimSuffix(filepath.Base(f), ".yaml")+".json"))
				if err != nil {
					t.Fatal(err)
				}
				var rep Report
				if err := json.Unmarshal(b, &rep); err != nil {
					t.Fatal(err)
				}
				for _, m := range rep.Modes {
					if m.Mode == "lease" {
						r = m
					}
				}
			} else {
				// Three minutes of the others (the hour- and day-long ones are slow
				// under -race).
				sc.Duration = min(sc.Duration, Duration(3*time.Minute))
				sc.Events = slices.DeleteFunc(sc.Events, func(e Event) bool { return e.At > sc.Duration })
				// And without the API's jitter where the scenario gives no margin for it: a
				// request that overtakes the one before on its way to the API arrives early
				// after any exact decision (strict-processes.yaml: the strict mode's one
				// violation, and the lease mode's once it shares the store's line by process as
				// the strict mode does; TestCentralNeedsAMarginUnderJitter). Here the referee
				// judges the decisions.
				if sc.Client.Margin == 0 && sc.Network.API.Latency.Kind != "fixed" {
					sc.Network.API.Latency = Dist{Kind: "fixed", Value: sc.Network.API.Latency.Min}
				}
				r = run1(t, sc, "lease")
			}
			if r.Violations != 0 || r.Lease == nil || r.Lease.Breaches != 0 {
				t.Fatalf("violations %d, lease %+v", r.Violations, r.Lease)
			}
			if r.Lease.MaxRatePPM > 1_000_000 || r.Lease.MaxBurst > r.Lease.Burst {
				t.Errorf("in use at most %d ppm and %d of %d burst", r.Lease.MaxRatePPM, r.Lease.MaxBurst, r.Lease.Burst)
			}
			t.Logf("accepted %d utilization %.4f jain %.4f store ops/member/s %.2f", r.Accepted, r.Utilization, r.Jain, r.Lease.StoreOpsPerMemberS)
		})
	}
}

const leasePool = `
duration: 3m
seed: 5
limit: 100/s burst=20
modes: [lease]
sample: 1s
network:
  store: {latency: {dist: uniform, min: 500us, max: 2ms}}
  api: {latency: {dist: uniform, min: 5ms, max: 15ms}}
store: {timeout: 50ms}
client: {max_wait: 1s, margin: 12ms, backoff: {base: 20ms, max: 1s, jitter: 0.5}}
lease: {ttl: 1s, grace: 500ms, renew: 250ms}
members:
  - name: m
    count: 8
    goroutines: 4
    demand: {pattern: backlog, n: 1000000}
`

// TestLeaseEqualDemand: equal demand above the limit: at least 95% of the limit used and
// Jain's index at least 0.99; a crashed member's share is back in use within TTL + grace
// + one renewal interval.
func TestLeaseEqualDemand(t *testing.T) {
	r := run1(t, parse(t, leasePool), "lease")
	t.Logf("utilization %.4f jain %.4f store ops/member/s %.2f", r.Utilization, r.Jain, r.Lease.StoreOpsPerMemberS)
	if r.Violations != 0 || r.Utilization < 0.95 || r.Jain < 0.99 {
		t.Errorf("violations %d utilization %.4f jain %.4f, want 0, at least 0.95 and 0.99", r.Violations, r.Utilization, r.Jain)
	}
	if ops := r.Lease.StoreOpsPerMemberS; ops > 10 {
		t.Errorf("%.1f store operations per member per second, want a handful", ops)
	}
	crash := parse(t, leasePool+"events:\n  - {at: 60s, crash: m3}\n  - {at: 120s, crash: [m5, m6]}\n")
	r = run1(t, crash, "lease")
	bound := (time.Second + 500*time.Millisecond + 250*time.Millisecond).Seconds()
	if len(r.Lease.ReclaimS) != 3 {
		t.Fatalf("reclaims %v, want one per crash", r.Lease.ReclaimS)
	}
	for i, s := range r.Lease.ReclaimS {
		if s < 0 || s > bound {
			t.Errorf("crash %d: the share was back in use after %.3fs, want within TTL + grace + a renewal (%.2fs)", i, s, bound)
		}
	}
	if r.Violations != 0 || r.Lease.Breaches != 0 || r.Utilization < 0.95 {
		t.Errorf("with crashes: violations %d breaches %d utilization %.4f", r.Violations, r.Lease.Breaches, r.Utilization)
	}
	t.Logf("reclaims %v (bound %.2fs)", r.Lease.ReclaimS, bound)
}

// TestLeasePauseLongerThanALease: a member frozen for longer than its lease finds, when
// it wakes, that its permits came due too late: it gives them up (they would break the
// limit's spacing) and asks again; its lease ended meanwhile, so it joins again.
func TestLeasePauseLongerThanALease(t *testing.T) {
	r := run1(t, parse(t, leasePool+"events:\n  - {at: 30s, pause: [m1, m2], for: 3s}\n"), "lease")
	if r.Violations != 0 || r.Lease.Breaches != 0 || r.Lease.ExpiredPermits == 0 {
		t.Errorf("violations %d breaches %d expired permits %d, want 0, 0 and some", r.Violations, r.Lease.Breaches, r.Lease.ExpiredPermits)
	}
}

// TestLeaseStoreRestartFences: after the store restarts empty, nothing is granted until
// every lease granted before has ended (TTL + grace); the limit holds throughout.
func TestLeaseStoreRestartFences(t *testing.T) {
	r := run1(t, parse(t, leasePool+"events:\n  - {at: 60s, store_restart: true}\n"), "lease")
	if r.Violations != 0 || r.Lease.Breaches != 0 || r.Utilization < 0.95 {
		t.Errorf("violations %d breaches %d utilization %.4f", r.Violations, r.Lease.Breaches, r.Utilization)
	}
	if len(r.Events) != 1 || r.Events[0].Event != "store restart" || r.Events[0].ConvergenceS < 0 || r.Events[0].ConvergenceS > 5 {
		t.Errorf("events %+v", r.Events)
	}
}

// TestLeaseFollowsLimitChanges: the limit drops from 100/s to 50/s, then rises to 200/s;
// the lease mode follows both without a breach of the shares (a member hands its shares of
// the old limit back and joins the new one's record). Permits granted under the old limit
// before the drop still land after it (as in the strict mode, which decides each one at
// the store): the lease mode may cause no more such 429s than the strict mode.
func TestLeaseFollowsLimitChanges(t *testing.T) {
	r, err := Run(parse(t, leasePool+"events:\n  - {at: 60s, limit: 50/s}\n  - {at: 120s, limit: 200/s burst=20}\n"), Options{Modes: []string{"lease", "strict"}})
	if err != nil {
		t.Fatal(err)
	}
	m, c := r.Modes[0], r.Modes[1]
	if m.Lease.Breaches != 0 || m.Violations > c.Violations {
		t.Fatalf("lease: violations %d (central %d), breaches %d", m.Violations, c.Violations, m.Lease.Breaches)
	}
	if m.Utilization < 0.9 {
		t.Errorf("utilization %.3f across the changes", m.Utilization)
	}
	t.Logf("utilization %.3f, jain %.3f", m.Utilization, m.Jain)
}

// TestWaitText: the table's waits read as durations, not as millions of milliseconds.
func TestWaitText(t *testing.T) {
	for ms, want := range map[float64]string{0: "0.0ms", 12.46: "12.5ms", 9712: "9.7s", 3161095.9: "52m41s"} {
		if got := waitText(ms); got != want {
			t.Errorf("waitText(%v) = %q, want %q", ms, got, want)
		}
	}
}

// TestRunContextCutsShort: a run whose context is done stops where it is and reports what
// it measured, marked partial: the mode interrupted measured up to the time it reached
// (its time series that long, its utilization against what the ideal throttle admitted by
// then), the modes after it not run, and the error says so. (The context is cancelled
// from the progress callback, after 65,536 events, so that the cut is deterministic.)
func TestRunContextCutsShort(t *testing.T) {
	sc := parse(t, strings.Replace(strings.Replace(backlogPool, "LATENCY", "{dist: fixed, value: 0s}", 1), "duration: 1m", "duration: 1h", 1))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err := RunContext(ctx, sc, Options{Modes: []string{"ideal", "strict"}, Progress: func(string, float64) { cancel() }})
	if err == nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "interrupted at") {
		t.Fatalf("error %v, want an interruption that wraps context.Canceled", err)
	}
	if !r.Partial || r.InterruptedMode != "ideal" || !slices.Equal(r.NotRun, []string{"strict"}) || len(r.Modes) != 1 || !r.Modes[0].Partial {
		t.Fatalf("partial %v in %q, not run %q, %d modes", r.Partial, r.InterruptedMode, r.NotRun, len(r.Modes))
	}
	at, m := *r.InterruptedAtS, r.Modes[0]
	if at <= 0 || at >= 3600 {
		t.Fatalf("interrupted at %v s", at)
	}
	// A backlog, the API no time away: the ideal's burst, then one every 100 ms.
	if want := 5 + int64(at*10); m.Accepted < want-1 || m.Accepted > want || m.Utilization != 1 || m.Violations != 0 {
		t.Errorf("at %v s: accepted %d (want %d), utilization %v (want 1), %d violations", at, m.Accepted, want, m.Utilization, m.Violations)
	}
	if n, want := len(m.series), int(at/sc.Sample.D().Seconds())+1; n != want {
		t.Errorf("at %v s: %d samples of %v, want %d", at, n, sc.Sample.D(), want)
	}
	var text strings.Builder
	r.WriteText(&text)
	if !strings.Contains(text.String(), "interrupted at ") || !strings.Contains(text.String(), "not run: strict") {
		t.Errorf("the text report does not say it was interrupted:\n%s", text.String())
	}
}

// TestLeaseOnOffAboveTheLimit: eight members with on/off demand far above 20/s burst=10
// (spells of about 1.25 s at 200/s, pauses of about 0.35 s, one goroutine each, renewals
// every 40 ms: the demo's pool). The burst has too few spare permits to pool a reserve,
// and the members held back while the limit is all handed out ask for as much as they can
// get: at least 0.99 of the limit used. Members that asked half as much again as the rate
// they were served (which lags the share that serves them) moved the shares at every
// renewal, and used 0.78 of it.
func TestLeaseOnOffAboveTheLimit(t *testing.T) {
	sc := parse(t, `
duration: 2m
seed: 1
limit: 20/s burst=10
modes: [lease]
sample: 1s
network:
  store: {latency: {dist: uniform, min: 200us, max: 1ms}}
  api: {latency: {dist: uniform, min: 1ms, max: 3ms}}
store: {timeout: 100ms}
client: {max_wait: 2s, margin: 10ms, backoff: {base: 10ms, max: 1s, jitter: 0.5}}
lease: {renew: 40ms}
members:
  - name: w
    count: 8
    demand: {pattern: onoff, rate: 200, on: 1250ms, off: 350ms}
`)
	r := run1(t, sc, "lease")
	t.Logf("utilization %.4f jain %.4f store ops/member/s %.2f", r.Utilization, r.Jain, r.Lease.StoreOpsPerMemberS)
	if r.Violations != 0 || r.Lease.Breaches != 0 || r.Utilization < 0.99 || r.Jain < 0.99 {
		t.Errorf("violations %d breaches %d utilization %.4f jain %.4f, want 0, 0, at least 0.99 and 0.99",
			r.Violations, r.Lease.Breaches, r.Utilization, r.Jain)
	}
}

// TestPerClassReport: a scenario whose members name a priority reports each class's part,
// and the parts add up to the run's; one that names none reports no per_class.
func TestPerClassReport(t *testing.T) {
	sc, err := Load("../scenarios/priorities.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sc.Duration = Duration(30 * time.Second)
	r := run1(t, sc, "strict")
	crit, shed := r.PerClass["critical"], r.PerClass["sheddable"]
	if len(r.PerClass) != 2 || crit.Demand+shed.Demand != r.Arrivals || crit.Granted+shed.Granted != r.Accepted {
		t.Fatalf("per_class %+v: the classes do not add up to the run's %d arrivals and %d accepted", r.PerClass, r.Arrivals, r.Accepted)
	}
	if crit.Served < 0.99 || shed.Served > 0.6 {
		t.Errorf("critical served %.3f, sheddable %.3f: want the critical processes' demand served (at most an equal part each)", crit.Served, shed.Served)
	}
	sc.Members[0].Priority, sc.Members[1].Priority = "", ""
	if r := run1(t, sc, "strict"); r.PerClass != nil {
		t.Errorf("no priority named, per_class %+v", r.PerClass)
	}
}
