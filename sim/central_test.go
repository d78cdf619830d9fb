package sim

import (
	"testing"
	"time"
)

// TestStrictProcessesShareByTurns: seven processes of 1 to 20 goroutines with endless
// work on 4,500/h for 6 h through the store (scenarios/strict-processes.yaml). With
// strict:waiters (sluice.FairWaiters) every goroutine holds a place in the store's line and
// the processes get permits in proportion to their goroutines; with strict, the library's
// default (sluice.FairProcesses), each holds one place at a time on this slow limit:
// Jain's index between the processes at least 0.95, the limit kept and used as fully.
func TestStrictProcessesShareByTurns(t *testing.T) {
	sc, err := Load("../scenarios/strict-processes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	plain, fair := run1(t, sc, "strict:waiters"), run1(t, sc, "strict")
	t.Logf("strict:waiters: Jain %.4f, utilization %.4f; strict: Jain %.4f, utilization %.4f",
		plain.Jain, plain.Utilization, fair.Jain, fair.Utilization)
	if fair.Jain < 0.95 {
		t.Errorf("strict: Jain's index between processes %.4f, want at least 0.95", fair.Jain)
	}
	if plain.Jain > 0.7 {
		t.Errorf("strict:waiters: Jain's index %.4f: the goroutines did not each hold a place", plain.Jain)
	}
	if fair.Utilization < plain.Utilization-0.001 || fair.Violations > plain.Violations {
		t.Errorf("strict: utilization %.4f with %d violations, want what strict:waiters gets (%.4f, %d)",
			fair.Utilization, fair.Violations, plain.Utilization, plain.Violations)
	}
	// Not exactly equal: while the limit's burst has permits to spare, a place is granted at
	// once, and a process whose next goroutine asks as soon as its place is used gets the
	// spare ones more often than a process whose one goroutine is still on its API call
	// (observed 0.88 to 1.25 of the fair share; with burst=1, 0.99 to 1.01).
	for _, m := range fair.PerMember {
		if m.Ratio < 0.8 || m.Ratio > 1.3 {
			t.Errorf("strict: %s got %.3f of its fair share", m.Name, m.Ratio)
		}
	}
}

// TestStoreTicketsAreGivenBack: the tickets the store's messages carry (the charge-backs
// of fail_mode local, the store's grants) go back to the pool whatever becomes of their
// message: answered, lost, too late, to a member that crashed, left, was cut off or
// paused. At the end, the pool lends exactly the tickets of the messages still in flight.
func TestStoreTicketsAreGivenBack(t *testing.T) {
	sc, err := Parse("x.yaml", []byte(`
duration: 2m
seed: 7
limit: 50/s burst=10
network:
  store: {latency: {dist: exp, min: 1ms, mean: 15ms}, loss: 0.05}
  api: {latency: {dist: uniform, min: 2ms, max: 5ms}}
store: {timeout: 30ms, fail_mode: local, fallback_share: 0.25}
client: {max_wait: 300ms, margin: 5ms}
members:
  - name: w
    count: 6
    goroutines: 4
    demand: {pattern: poisson, rate: 15}
events:
  - {at: 10s, store_outage: 5s}
  - {at: 20s, partition: [w1, w2], for: 5s}
  - {at: 30s, pause: w3, for: 2s}
  - {at: 40s, crash: [w4]}
  - {at: 45s, join: w4}
  - {at: 50s, leave: w5}
  - {at: 55s, join: w5}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, end := range []time.Duration{17 * time.Second, 33 * time.Second, 2 * time.Minute} {
		sc.Duration = Duration(end)
		e := newEngine(sc, newMode("strict", sc))
		e.run()
		var carried int
		q := &e.events
		count := func(evs []event) {
			for i := range evs {
				if evs[i].kind == evStoreReq && evs[i].charged || evs[i].kind == evStoreReply && evs[i].ok {
					carried++
				}
			}
		}
		count(q.run[q.head:])
		for l := range q.buckets {
			for d := range q.buckets[l] {
				count(q.buckets[l][d])
			}
		}
		if e.cur.at > e.end {
			count([]event{e.cur}) // popped past the end, never handled
		}
		if lent := len(e.tickets) - len(e.freeTickets); lent != carried {
			t.Errorf("at %s: the pool lends %d tickets, the messages in flight carry %d", end, lent, carried)
		}
		if e.timeouts == 0 || e.failOpen+e.accepted == 0 {
			t.Errorf("at %s: %d time-outs, %d accepted: the faults did not happen", end, e.timeouts, e.accepted)
		}
	}
}

// TestArrivalsAreTheSameInEveryMode: a member's arrivals are drawn apart from its
// back-offs, so that every mode, whatever it denies and however often its goroutines back
// off, sees the same requests arrive: the modes are compared on the same demand.
func TestArrivalsAreTheSameInEveryMode(t *testing.T) {
	sc, err := Load("../scenarios/store-outage.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(sc, Options{Modes: []string{"strict", "local", "lease", "gossip", "adaptive"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range r.Modes[1:] {
		if m.Arrivals != r.Modes[0].Arrivals {
			t.Errorf("%s: %d arrivals, %s: %d", m.Mode, m.Arrivals, r.Modes[0].Mode, r.Modes[0].Arrivals)
		}
	}
	if r.Modes[0].Timeouts == 0 {
		t.Errorf("strict: no store time-out: the outage did not deny anything")
	}
}
