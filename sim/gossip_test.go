package sim

import (
	"strings"
	"testing"
)

// TestDThrottleTwoDaemons: the DThrottle example in the simulator. As written (policy
// whole) the two daemons serve all 17 requests at t=0.1 and one more at t=0.2: the API
// refuses 7; with shares nothing is refused.
func TestDThrottleTwoDaemons(t *testing.T) {
	sc, err := Load("../scenarios/gossip-two-daemons.yaml")
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

// TestGossipFiveDaemonsThroughPartitions: five gossip daemons through a partition shorter than the hold
// (no refusal during or after it) and one of 20 s (refusals only from when the hold is
// over to the healing, within docs/gossip.md's bound of 1,770); the lease mode through the
// same partitions refuses nothing.
func TestGossipFiveDaemonsThroughPartitions(t *testing.T) {
	sc, err := Load("../scenarios/gossip-five-daemons.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := run1(t, sc, "gossip")
	if r.Violations == 0 || r.Violations > 1770 {
		t.Errorf("gossip: %d violations, want some and at most 1,770", r.Violations)
	}
	for i, b := range r.series {
		// The long partition: 120 s to 140 s; its hold and the loss of contact end by 123 s,
		// the last reports of the healing arrive within a second.
		if b.rejected > 0 && (i < 122 || i > 141) {
			t.Errorf("gossip: %d refused in second %d, outside the long partition", b.rejected, i)
		}
	}
	if r := run1(t, sc, "lease"); r.Violations != 0 || r.Lease.Breaches != 0 {
		t.Errorf("lease: %d violations, %d breaches", r.Violations, r.Lease.Breaches)
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

// TestGossipJoinStorm: 200 gossip daemons join within 5 s (scenarios/gossip-join-storm.yaml).
// Past 32 they report over each tag's tree, not to every peer. Once every daemon has
// joined and the owner's line has formed (from 10 s), the pool uses at least 0.95 of the
// limit; over the run, Jain's index is at least 0.97, with no 429. A daemon sends a
// fiftieth of the messages it did all-to-all: under 2,000 a daemon in the run, forwarded
// requests and answers included (all-to-all, 54,000).
func TestGossipJoinStorm(t *testing.T) {
	sc, err := Load("../scenarios/gossip-join-storm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := run1(t, sc, "gossip")
	var acc int64
	var capacity float64
	for _, b := range r.series[10:] {
		acc += b.accepted
		capacity += b.capacity
	}
	util := float64(acc) / capacity
	t.Logf("utilization from 10 s %.3f, Jain %.4f, violations %d, messages %d, %.0f report bytes a daemon a second",
		util, r.Jain, r.Violations, r.Messages, float64(r.GossipBytes)/200/30)
	if util < 0.95 || r.Jain < 0.97 || r.Violations != 0 {
		t.Errorf("utilization from 10 s %.3f, Jain %.4f, violations %d; want at least 0.95, at least 0.97 and none", util, r.Jain, r.Violations)
	}
	if r.Messages > 200*2000 {
		t.Errorf("%d messages, want under 2,000 a daemon", r.Messages)
	}
}

// TestGossipClassesAcrossMembers: in the gossip mode each member is a daemon of its own,
// of one class, and the key of scenarios/priorities.yaml (a small limit) is decided at its
// owner, whose line every member shares by process. The sheddable members' limiters learn
// from the key's board of classes, at its owner, that a critical member asks, and take
// their places keeping the sheddable headroom, so a critical request goes in a place or
// two, not behind a turn of every member's places (336 to 386 ms at p99 over these seeds
// before). The target: the critical p99 wait within a sync interval (100 ms), critical
// served at least 0.99, utilization at least 0.95, no violation (the owner decides
// exactly).
func TestGossipClassesAcrossMembers(t *testing.T) {
	sc, err := Load("../scenarios/priorities.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for seed := uint64(1); seed <= 5; seed++ {
		sc.Seed = seed
		r := run1(t, sc, "gossip")
		crit := r.PerClass["critical"]
		t.Logf("seed %d: violations %d utilization %.4f critical %+v sheddable %+v", seed, r.Violations, r.Utilization, crit, r.PerClass["sheddable"])
		if r.Violations != 0 || crit.Served < 0.99 || r.Utilization < 0.95 || crit.WaitP99Ms > 100 {
			t.Errorf("seed %d: violations %d, critical served %.4f, utilization %.4f, critical p99 wait %v ms: want 0, at least 0.99 and 0.95, at most 100 ms",
				seed, r.Violations, crit.Served, r.Utilization, crit.WaitP99Ms)
		}
	}
}
