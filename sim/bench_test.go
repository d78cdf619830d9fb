package sim

import (
	"testing"
)

// BenchmarkHerokuDay is the first target: 24 virtual hours of 25 clients on a
// 4,500/h limit (the shipped heroku-day scenario, redis mode), under 10 s.
func BenchmarkHerokuDay(b *testing.B) {
	sc, err := Load("../scenarios/heroku-day.yaml")
	if err != nil {
		b.Fatal(err)
	}
	var sent int64
	for b.Loop() {
		r, err := Run(sc, Options{Modes: []string{"redis"}})
		if err != nil {
			b.Fatal(err)
		}
		sent = r.Modes[0].Sent
	}
	b.ReportMetric(float64(sent), "requests/run")
}

// BenchmarkHour100Members is the second target: one virtual hour of 100 members at 1,000
// requests/s in all (10/s each, Poisson) against 800/s burst 100, redis mode, under 30 s.
func BenchmarkHour100Members(b *testing.B) {
	sc, err := Parse("bench.yaml", []byte(`
duration: 1h
seed: 1
limit: 800/s burst=100
sample: 10s
network:
  store: {latency: {dist: uniform, min: 200us, max: 1ms}}
  api: {latency: {dist: uniform, min: 5ms, max: 10ms}}
client: {max_wait: 500ms, margin: 6ms}
members:
  - name: m
    count: 100
    goroutines: 16
    demand: {pattern: poisson, rate: 10}
`))
	if err != nil {
		b.Fatal(err)
	}
	var r *Report
	for b.Loop() {
		r, err = Run(sc, Options{Modes: []string{"redis"}})
		if err != nil {
			b.Fatal(err)
		}
	}
	m := r.Modes[0]
	b.ReportMetric(float64(m.Arrivals), "requests/run")
	b.ReportMetric(float64(m.Violations), "violations")
}
