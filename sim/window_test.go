package sim

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/lease/allot"
)

// TestDailyQuotaScenario: in the 24-hour scenario, the referee (whose limit is the daily
// quota) sees no request beyond the count in any mode, and the redis and lease modes,
// whose demand exceeds the quota, spend all of it (the lease mode's members draw chunks
// of the day's count); the local mode's fixed fifths leave some. The scenario's report is
// judged as the golden test (built without -race: a simulated day is slow under it) finds
// that a run writes it.
func TestDailyQuotaScenario(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "golden", "daily-quota.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Modes) < 3 {
		t.Fatalf("%d modes in the report, want local, redis and lease", len(r.Modes))
	}
	for _, m := range r.Modes {
		if m.Violations != 0 || m.Accepted > 10000 {
			t.Errorf("%s: %d accepted, %d violations, want at most 10000 and none", m.Mode, m.Accepted, m.Violations)
		}
		if (m.Mode == "strict" || m.Mode == "lease") && m.Utilization < 0.99 {
			t.Errorf("%s: utilization %v, want at least 0.99 of the quota used", m.Mode, m.Utilization)
		}
	}
}

// TestRampScenarioFollowsTheLine: second by second, what the API accepts from the pool
// lags the ramp's line by at most the longest reservation (max_wait, 1 s: a permit booked
// ahead by a local member is spaced at the rate of when it was booked; the strict mode's
// store spaces it where it falls), one ramp step (a tenth of a second)
// and the network's latency: the line runs from 10/s to 100/s over 60 s, then 100/s,
// give or take two permits a deciding state (the strict mode's one; the local mode's four
// pods, each ramping its quarter in step with the others, whose permits land in a second
// or the next; the lease mode's four members, whose shares follow the ramp at their
// renewals, a renewal interval later); and never runs ahead of the line. So does the
// running total.
func TestRampScenarioFollowsTheLine(t *testing.T) {
	sc, err := Load("../scenarios/ramp-up.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"strict", "local", "lease"} {
		e := newEngine(sc, newMode(mode, sc))
		e.run()
		line := func(s float64) float64 { // permits by time s on the ramp
			if s <= 60 {
				return 10*s + 0.75*s*s
			}
			return 3300 + 100*(s-60)
		}
		lag := sc.Client.MaxWait.D().Seconds() + 0.1 + 0.015
		slack := 2.0
		switch mode {
		case "local":
			slack = 8
		case "lease":
			slack = 8
			lag += allot.DefaultMemberConfig().RenewEvery.Seconds()
		}
		total := float64(e.series[0].accepted)
		for k := 1; k < len(e.series)-1; k++ {
			got := float64(e.series[k].accepted)
			total += got
			lo := line(float64(k)-lag) - line(float64(k)-lag-1)
			hi := line(float64(k+1)) - line(float64(k))
			if got < lo-slack || got > hi+slack {
				t.Errorf("%s: second %d: %v accepted, want %.1f to %.1f", mode, k, got, lo, hi)
			}
			if lo, hi := line(float64(k+1)-lag), line(float64(k+1))+10; total < lo-slack || total > hi+slack {
				t.Errorf("%s: by %d s: %v accepted in all, want %.1f to %.1f", mode, k+1, total, lo, hi)
			}
		}
	}
}

// TestWindowAndRampNeedTheirModes: a scenario with a windowed quota or a ramp in a mode
// that decides neither is refused, naming the mode.
func TestWindowAndRampNeedTheirModes(t *testing.T) {
	for _, lim := range []string{"10/h window", "10/s ramp=1/s..1m"} {
		_, err := Parse("x.yaml", []byte("duration: 1m\nlimit: "+lim+"\nmodes: [gossip]\nmembers:\n  - name: a\n    demand: {pattern: poisson, rate: 1}\n"))
		if err == nil || !strings.Contains(err.Error(), "gossip decides no windowed quota or ramp") {
			t.Errorf("%s in the gossip mode: got %v", lim, err)
		}
	}
}

// TestRampBookingsFollowTheLine: a thousand processes always busy on "100/s
// ramp=10/s..1m" (the matrix's ramp/thousand/backlog/crash) book permits up to a minute
// ahead. The store spaces each booking at the ramp's pace where it falls, so what the API
// accepts follows the ramp's line second by second, a second behind it at most, never
// ahead of it in all, and the pool is served what the ideal throttle serves. Spaced at the pace of the
// decision (10/s at the start, bookings a minute ahead), the line was never reached:
// 0.427 of the ideal.
func TestRampBookingsFollowTheLine(t *testing.T) {
	m, err := ShippedMatrix()
	if err != nil {
		t.Fatal(err)
	}
	s, ok := m.Shape("ramp/thousand/backlog/crash")
	if !ok {
		t.Fatal("no shape ramp/thousand/backlog/crash in the shipped matrix")
	}
	sc, err := m.Scenario(s)
	if err != nil {
		t.Fatal(err)
	}
	line := func(s float64) float64 { // permits by time s on the ramp
		if s <= 60 {
			return 10*s + 0.75*s*s
		}
		return 3300 + 100*(s-60)
	}
	for _, mode := range []string{"strict", "strict:waiters"} {
		e := newEngine(sc, newMode(mode, sc))
		e.run()
		if e.ref.Stats().Rejected != 0 {
			t.Errorf("%s: %d requests refused by the API", mode, e.ref.Stats().Rejected)
		}
		if served := float64(e.accepted) / float64(e.idealN); served < 0.97 {
			t.Errorf("%s: served %.3f of the ideal (%d of %d), want at least 0.97", mode, served, e.accepted, e.idealN)
		}
		bad := 0
		total := float64(e.series[0].accepted)
		for k := 1; k < len(e.series)-1; k++ {
			got := float64(e.series[k].accepted)
			total += got
			lo := line(float64(k)-1) - line(float64(k)-2)
			if k < 2 {
				lo = 0
			}
			// Never ahead: by the end of second k, the line and the first second's burst
			// (10); within a second a key may take up to its burst after a gap.
			if hi := line(float64(k+1)) + 10; (got < lo-2 || total > hi+2) && bad < 5 {
				bad++
				t.Errorf("%s: second %d: %v accepted, want at least %.1f; %v in all, want at most %.1f", mode, k, got, lo, total, hi)
			}
		}
	}
}
