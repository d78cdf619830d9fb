package sim

import (
	"strings"
	"testing"
)

// TestSeed004TwoDaemons: the DThrottle example in the simulator. As written (policy
// whole) the two daemons serve all 17 requests at t=0.1 and one more at t=0.2: the API
// refuses 7; with shares nothing is refused.
func TestSeed004TwoDaemons(t *testing.T) {
	sc, err := Load("../scenarios/seed004-two-daemons.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if r := run1(t, sc, "gossip"); r.Violations != 0 || r.Accepted < 10 {
		t.Errorf("shares: accepted %d, violations %d; want at least 10 and none", r.Accepted, r.Violations)
	}
	sc.Gossip.Policy = "whole"
	if r := run1(t, sc, "gossip"); r.Accepted+r.Violations != 18 || r.Violations != 7 {
		t.Errorf("whole: accepted %d, violations %d; want 18 sent, 7 refused (the example's excess)", r.Accepted, r.Violations)
	}
}

// TestGossipModeUnderFaults: five gossiping members with endless backlogs share 100/s
// burst 20 over a lossy network; one crashes, two are cut off for 30 s. Over-admission at
// the referee stays within what the partition's sides may take beyond the hold.
func TestGossipModeUnderFaults(t *testing.T) {
	sc, err := Parse("faults.yaml", []byte(strings.TrimSpace(`
duration: 2m
seed: 3
limit: 100/s burst=20
modes: [gossip]
sample: 1s
network:
  store: {latency: {dist: uniform, min: 200us, max: 3ms}, loss: 0.02}
  api: {latency: {dist: fixed, value: 5ms}}
client: {max_wait: 0s, on_deny: drop}
members:
  - name: d
    count: 5
    goroutines: 4
    demand: {pattern: poisson, rate: 60}
events:
  - {at: 30s, crash: d5}
  - {at: 60s, partition: [d1, d2], for: 30s}
`)))
	if err != nil {
		t.Fatal(err)
	}
	r := run1(t, sc, "gossip")
	// The referee refuses what passes the limit; beyond the hold (2 s) and the loss of
	// contact (0.5 s), each of the two sides takes the whole limit for the rest of the 30 s.
	maxExcess := int64(20 + 100*(30-2.5) + 5*2)
	t.Logf("accepted %d, violations %d, utilization %.3f", r.Accepted, r.Violations, r.Utilization)
	if r.Violations > maxExcess {
		t.Errorf("violations %d, want at most %d", r.Violations, maxExcess)
	}
	if r.Utilization < 0.9 {
		t.Errorf("utilization %.3f, want at least 0.9", r.Utilization)
	}
}
