package sim

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkHerokuDay is the first target: 24 virtual hours of 25 clients on a
// 4,500/h limit (the shipped heroku-day scenario, strict mode), under 10 s.
func BenchmarkHerokuDay(b *testing.B) {
	sc, err := Load("../scenarios/heroku-day.yaml")
	if err != nil {
		b.Fatal(err)
	}
	var sent int64
	for b.Loop() {
		r, err := Run(sc, Options{Modes: []string{"strict"}})
		if err != nil {
			b.Fatal(err)
		}
		sent = r.Modes[0].Sent
	}
	b.ReportMetric(float64(sent), "requests/run")
}

// hourPool is one virtual hour of n members at 10 requests/s each (Poisson), 16
// goroutines each, against limit.
func hourPool(b *testing.B, n int, limit string) *Scenario {
	return poolFor(b, "1h", n, limit)
}

// poolFor is hourPool for another duration of virtual time.
func poolFor(b *testing.B, duration string, n int, limit string) *Scenario {
	sc, err := Parse("bench.yaml", []byte(fmt.Sprintf(`
duration: %s
seed: 1
limit: %s
sample: 10s
network:
  store: {latency: {dist: uniform, min: 200us, max: 1ms}}
  api: {latency: {dist: uniform, min: 5ms, max: 10ms}}
client: {max_wait: 500ms, margin: 6ms}
members:
  - name: m
    count: %d
    goroutines: 16
    demand: {pattern: poisson, rate: 10}
`, duration, limit, n)))
	if err != nil {
		b.Fatal(err)
	}
	return sc
}

func benchPool(b *testing.B, sc *Scenario) {
	var r *Report
	var err error
	for b.Loop() {
		r, err = Run(sc, Options{Modes: []string{"strict"}})
		if err != nil {
			b.Fatal(err)
		}
	}
	m := r.Modes[0]
	b.ReportMetric(float64(m.Arrivals), "requests/run")
	b.ReportMetric(float64(m.Violations), "violations")
}

// BenchmarkHour100Members is the second target: one virtual hour of 100 members at 1,000
// requests/s in all (10/s each, Poisson) against 800/s burst 100, strict mode, under 30 s.
func BenchmarkHour100Members(b *testing.B) { benchPool(b, hourPool(b, 100, "800/s burst=100")) }

// pool1000 is the scenario of scenarios/large/pool-1000-hour.yaml: one virtual hour of
// 1,000 members at 10,000 requests/s in all (10/s each, Poisson) against 8,000/s burst
// 1,000, strict mode; run for d of virtual time if d is not 0.
func pool1000(b *testing.B, d time.Duration) *Scenario {
	sc, err := Load("../scenarios/large/pool-1000-hour.yaml")
	if err != nil {
		b.Fatal(err)
	}
	if d > 0 {
		sc.Duration = Duration(d)
	}
	return sc
}

// BenchmarkHour1000Members is part two's target: the hour of scenarios/large/pool-1000-hour.yaml
// (1,000 members at 10,000 requests/s in all), under 60 s.
func BenchmarkHour1000Members(b *testing.B) { benchPool(b, pool1000(b, 0)) }

// BenchmarkMinutes1000Members is five virtual minutes of BenchmarkHour1000Members's pool:
// the same work per request, for profiling in a shorter run.
func BenchmarkMinutes1000Members(b *testing.B) { benchPool(b, pool1000(b, 5*time.Minute)) }

// minute1000 is scenarios/large/pool-1000-minute.yaml with n members (1,000 if 0) for d
// of virtual time (a minute if 0).
func minute1000(b *testing.B, n int, d time.Duration) *Scenario {
	sc, err := Load("../scenarios/large/pool-1000-minute.yaml")
	if err != nil {
		b.Fatal(err)
	}
	if n > 0 {
		sc.Members[0].Count = n
	}
	if d > 0 {
		sc.Duration = Duration(d)
	}
	return sc
}

// BenchmarkMinute1000Members is the virtual minute of scenarios/large/pool-1000-minute.yaml
// (1,000 members) in the lease mode: 4,000 renewals a second at the store, each deciding
// the renewing member's share from every member's (BENCHMARKS.md). The gossip mode's
// minute is not run here: its 1,000 members send each other about 10 million reports a
// virtual second, each received by the receiver's core (two minutes of CPU or more);
// BenchmarkMembersScale runs 10 virtual seconds of it.
func BenchmarkMinute1000Members(b *testing.B) { benchMode(b, minute1000(b, 0, 0), "lease") }

// BenchmarkMembersScale is 10 virtual seconds of the pool of pool-1000-minute.yaml with
// 100, 200, 400 and 1,000 members, in the lease and the gossip mode: how the cost grows
// with the members (the gossip mode's reports grow as their square).
func BenchmarkMembersScale(b *testing.B) {
	for _, mode := range []string{"lease", "gossip"} {
		for _, n := range []int{100, 200, 400, 1000} {
			b.Run(fmt.Sprintf("%s/members=%d", mode, n), func(b *testing.B) {
				benchMode(b, minute1000(b, n, 10*time.Second), mode)
			})
		}
	}
}

func benchMode(b *testing.B, sc *Scenario, mode string) {
	var r *Report
	var err error
	for b.Loop() {
		r, err = Run(sc, Options{Modes: []string{mode}})
		if err != nil {
			b.Fatal(err)
		}
	}
	m := r.Modes[0]
	b.ReportMetric(float64(m.Arrivals), "requests/run")
	b.ReportMetric(float64(m.Violations), "violations")
}

// BenchmarkQueueHold is the classic hold model: a queue of n events, each step popping
// the earliest and scheduling one a random latency (0 to 20 ms) or, one in ten, a random
// back-off (0 to 30 s) later.
func BenchmarkQueueHold(b *testing.B) {
	for _, n := range []int{100, 1000, 20000} {
		for _, q := range []string{"radix", "heap", "calendar"} {
			b.Run(fmt.Sprintf("n=%d/queue=%s", n, q), func(b *testing.B) {
				var r eventQueue
				var h heapQueue
				var c calendarQueue
				push, pop := r.push, r.pop
				switch q {
				case "heap":
					push, pop = h.push, h.pop
				case "calendar":
					push, pop = c.push, c.pop
				}
				rng := rand.New(rand.NewPCG(1, 2))
				var ev event
				next := func(now int64) {
					d := rng.Int64N(20e6)
					if rng.IntN(10) == 0 {
						d = rng.Int64N(30e9)
					}
					ev = event{at: now + d}
					push(&ev)
				}
				for range n {
					next(0)
				}
				for b.Loop() {
					pop(&ev)
					next(ev.at)
				}
			})
		}
	}
}
