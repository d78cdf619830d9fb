package sim

import (
	"strings"
	"testing"
)

// TestLocalModeIsOneProcess: the local mode's members are groups of goroutines of one
// process sharing one limiter, as sluice demo --mode local: three critical members beside
// four sheddable ones flooding at twice the limit meet in its waiting room, which serves
// the critical class first, and the one limiter admits nothing beyond the limit.
func TestLocalModeIsOneProcess(t *testing.T) {
	sc, err := Load("../scenarios/priorities.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := run1(t, sc, "local")
	crit := r.PerClass["critical"]
	t.Logf("violations %d utilization %.4f critical %+v sheddable %+v", r.Violations, r.Utilization, crit, r.PerClass["sheddable"])
	if r.Violations != 0 || crit.Served < 0.99 || r.Utilization < 0.95 {
		t.Errorf("violations %d, critical served %.4f, utilization %.4f: want 0, at least 0.99 and 0.95", r.Violations, crit.Served, r.Utilization)
	}
	// A critical waiter takes the next place that comes due, one an interval of the limit
	// (10 ms): it waits behind the critical requests that came with it (Poisson), not
	// behind the flood's places, which wait for a minute and more.
	if crit.WaitP99Ms > 50 {
		t.Errorf("critical p99 wait %v ms, want at most five intervals of the limit (50 ms)", crit.WaitP99Ms)
	}
	if !strings.Contains(r.Models, "one process") || !strings.Contains(r.Models, "local.processes: each") {
		t.Errorf("models %q: want one process, naming local.processes: each", r.Models)
	}
}

// TestLocalProcessSharesBetweenMembers: in the one process, members that each want more
// than an equal part get an equal part whatever their goroutines (the waiting room's
// fairness between members, sluice.WithMember), and one that wants less gets all it asks.
func TestLocalProcessSharesBetweenMembers(t *testing.T) {
	sc := parse(t, `
duration: 2m
seed: 7
limit: 10/s burst=5
network:
  api: {latency: {dist: uniform, min: 5ms, max: 15ms}}
client: {max_wait: 1m, margin: 12ms}
members:
  - {name: a, goroutines: 1, demand: {pattern: backlog, n: 100000}}
  - {name: b, goroutines: 4, demand: {pattern: backlog, n: 100000}}
  - {name: c, goroutines: 16, demand: {pattern: backlog, n: 100000}}
  - {name: d, goroutines: 2, demand: {pattern: poisson, rate: 1}}
`)
	r := run1(t, sc, "local")
	t.Logf("violations %d utilization %.4f jain %.4f members %+v", r.Violations, r.Utilization, r.Jain, r.PerMember)
	if r.Violations != 0 || r.Utilization < 0.99 || r.Jain < 0.99 {
		t.Errorf("violations %d, utilization %.4f, jain %.4f: want 0, at least 0.99 and 0.99", r.Violations, r.Utilization, r.Jain)
	}
}

// TestLocalProcessesEach: local.processes: each keeps the model of a pool of processes,
// each alone on its own limiter, which over-admits as many times as there are members.
func TestLocalProcessesEach(t *testing.T) {
	sc := parse(t, pool+"local: {processes: each}\n")
	r := run1(t, sc, "local")
	if r.Violations == 0 || r.Ratio429 < 0.5 || !strings.Contains(r.Models, "each of the 8 members a process of its own") {
		t.Errorf("8 processes alone: violations %d ratio %v models %q, want most rejected", r.Violations, r.Ratio429, r.Models)
	}
	one := run1(t, parse(t, pool), "local")
	if one.Violations != 0 || one.Accepted > r.Accepted {
		t.Errorf("one process: violations %d, accepted %d (each alone: %d): want none, and no more", one.Violations, one.Accepted, r.Accepted)
	}
}

// TestStrictClassesAcrossMembers: in the strict mode each member is a process of its own,
// of one class, sharing the store's line by process. The sheddable members' limiters read
// the store's board of classes and take their places keeping the sheddable headroom while
// a critical member asks, so a critical request goes in a place or two, not behind a turn
// of every member's places (336 ms at p99 before).
func TestStrictClassesAcrossMembers(t *testing.T) {
	sc, err := Load("../scenarios/priorities.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := run1(t, sc, "strict")
	crit := r.PerClass["critical"]
	t.Logf("violations %d utilization %.4f critical %+v sheddable %+v", r.Violations, r.Utilization, crit, r.PerClass["sheddable"])
	if r.Violations != 0 || crit.Served < 0.99 || r.Utilization < 0.99 || crit.WaitP99Ms > 50 {
		t.Errorf("violations %d, critical served %.4f, utilization %.4f, critical p99 wait %v ms: want 0, at least 0.99 and 0.99, at most 50 ms",
			r.Violations, crit.Served, r.Utilization, crit.WaitP99Ms)
	}
}

// TestLocalPessimisticKeepsHeadroom: pessimistic clients (client.max_wait 0) of the one
// process decide now or never, as Allow does: a sheddable decision keeps 40% of the burst
// while a critical caller asked recently, so the critical members' asks find permits
// beside the flood; a denied request backs off and asks again.
func TestLocalPessimisticKeepsHeadroom(t *testing.T) {
	sc, err := Load("../scenarios/priorities.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sc.Client.MaxWait = 0
	r := run1(t, sc, "local")
	crit := r.PerClass["critical"]
	t.Logf("violations %d utilization %.4f critical %+v sheddable %+v", r.Violations, r.Utilization, crit, r.PerClass["sheddable"])
	if r.Violations != 0 || crit.Served < 0.99 || crit.WaitP99Ms > 100 || r.Utilization < 0.95 {
		t.Errorf("violations %d, critical served %.4f, critical p99 wait %v ms, utilization %.4f: want 0, at least 0.99, at most 100 ms, at least 0.95",
			r.Violations, crit.Served, crit.WaitP99Ms, r.Utilization)
	}
}
