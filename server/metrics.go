package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
)

// metrics are the daemon's Prometheus collectors, in their own registry.
type metrics struct {
	reg          *prometheus.Registry
	decisions    *prometheus.CounterVec // rule, result
	latency      prometheus.Histogram
	backendErrs  prometheus.Counter
	failActs     *prometheus.CounterVec // fail mode
	badInput     *prometheus.CounterVec // reason
	conns        prometheus.Gauge
	connsRefused prometheus.Counter
	connsDropped *prometheus.CounterVec // reason
	reloads      *prometheus.CounterVec // result
	penalties    *prometheus.CounterVec // rule, result
	lifts        *prometheus.CounterVec // rule, result
}

func newMetrics(keys, evictedIdle, evictedLive func() float64) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_decisions_total", Help: "Decisions by rule and result (allowed, denied, error).",
		}, []string{"rule", "result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sluice_decision_duration_seconds", Help: "Time to decide one query, back end included.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 11), // 1µs to about 1s
		}),
		backendErrs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_backend_errors_total", Help: "Back-end failures answered by the fail mode.",
		}),
		failActs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_fail_mode_activations_total", Help: "Queries answered by the fail mode, by mode.",
		}, []string{"mode"}),
		badInput: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_bad_queries_total", Help: "Query lines refused, by reason.",
		}, []string{"reason"}),
		conns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_connections", Help: "Line-protocol connections open.",
		}),
		connsRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_connections_refused_total", Help: "Connections closed at once: max_connections reached.",
		}),
		connsDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_connections_dropped_total", Help: "Connections the daemon closed, by reason.",
		}, []string{"reason"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_reloads_total", Help: "Configuration reloads, by result.",
		}, []string{"result"}),
		penalties: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_penalties_total", Help: "Penalties clients asked for (p=), by rule and result (applied, capped at max_penalty, refused, error).",
		}, []string{"rule", "result"}),
		lifts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_penalty_lifts_total", Help: "Penalties lifted through the HTTP API, by rule and result.",
		}, []string{"rule", "result"}),
	}
	m.reg.MustRegister(m.decisions, m.latency, m.backendErrs, m.failActs, m.badInput, m.conns, m.connsRefused,
		m.connsDropped, m.reloads, m.penalties, m.lifts,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_keys", Help: "Buckets held by the back end."}, keys),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_key_evictions_total", Help: "Idle buckets forgotten."}, evictedIdle),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_key_evictions_live_total", Help: "Live buckets evicted to make room (max_keys)."}, evictedLive),
	)
	return m
}

// ruleCounters are a rule's decision counters, curried once so a decision does no label
// lookup.
type ruleCounters struct{ allowed, denied, failed prometheus.Counter }

func (m *metrics) forRule(name string) ruleCounters {
	return ruleCounters{
		allowed: m.decisions.WithLabelValues(name, "allowed"),
		denied:  m.decisions.WithLabelValues(name, "denied"),
		failed:  m.decisions.WithLabelValues(name, "error"),
	}
}

// observer feeds back-end errors from the limiters to the metrics.
// observe is every rule's limiter's observer: the decisions' latency (the limiter times
// each call to the back end) and the back end's failures.
func (m *metrics) observe(e sluice.Event) {
	switch e.Kind {
	case sluice.EventDecision:
		m.latency.Observe(e.Latency.Seconds())
	case sluice.EventError:
		m.backendErrs.Inc()
		m.failActs.WithLabelValues(e.FailMode.String()).Inc()
	}
}
