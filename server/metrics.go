package server

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/buildinfo"
)

// metrics are the daemon's Prometheus collectors, in their own registry.
type metrics struct {
	reg          *prometheus.Registry
	decisions    *prometheus.CounterVec // rule, result
	tagDecisions *prometheus.CounterVec // rule, tag, result: rules with DetailedMetrics
	latency      prometheus.Histogram
	backendErrs  prometheus.Counter
	failActs     *prometheus.CounterVec // fail mode
	badInput     *prometheus.CounterVec // reason
	conns        prometheus.Gauge
	connsRefused prometheus.Counter
	connsDropped *prometheus.CounterVec // reason
	reloads      *prometheus.CounterVec // result
	reloadOK     prometheus.Gauge       // 1 if the last reload succeeded
	reloadTime   prometheus.Gauge       // Unix time of the last successful reload (or the start)
	unmatched    prometheus.Counter     // queries for tags no rule matches
	backendUp    prometheus.Gauge       // 1 while the back end answers its health check
	penalties    *prometheus.CounterVec // rule, result
	lifts        *prometheus.CounterVec // rule, result
	expired      *prometheus.CounterVec // rule: reserved permits not used, too late (clients' reports)
	grpcCalls    [nGRPCOutcomes]prometheus.Counter
}

// newMetrics makes the collectors; keys, if not nil, reads the number of buckets held.
func newMetrics(keys, evictedIdle, evictedLive func() float64) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_decisions_total", Help: "Decisions by rule and result (allowed, denied, error, shadowed).",
		}, []string{"rule", "result"}),
		tagDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_tag_decisions_total", Help: "Decisions by rule, tag and result, for the rules with detailed_metrics (at most 1000 tags a rule; later ones as tag _other).",
		}, []string{"rule", "tag", "result"}),
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
			Name: "sluice_reloads_total", Help: "Configuration reloads (SIGHUP, or the config file changed), by result: ok or error.",
		}, []string{"result"}),
		reloadOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_config_last_reload_successful", Help: "1 if the last configuration reload succeeded (or none was tried), 0 if it was refused.",
		}),
		reloadTime: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_config_last_reload_success_timestamp_seconds", Help: "Unix time of the last successful configuration reload, or of the start.",
		}),
		unmatched: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_unmatched_total", Help: "Queries for tags that no rule matches (allowed: there is no default rule).",
		}),
		backendUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_backend_up", Help: "1 while the back end answers its health check, 0 while it does not (answers then follow the fail mode).",
		}),
		penalties: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_penalties_total", Help: "Penalties clients asked for (p=), by rule and result (applied, capped at max_penalty, refused, error).",
		}, []string{"rule", "result"}),
		lifts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_penalty_lifts_total", Help: "Penalties lifted through the HTTP API, by rule and result.",
		}, []string{"rule", "result"}),
		expired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_permits_expired_total", Help: "Reserved permits (w=) that clients did not use because they came too late (past their margin: a paused or stalled worker), by rule, as the clients report them (~x).",
		}, []string{"rule"}),
	}
	grpcCalls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_grpc_requests_total", Help: "ShouldRateLimit calls by result: ok, over_limit, invalid_argument, unauthenticated.",
	}, []string{"result"})
	m.grpcCalls = newGRPCCounters(grpcCalls)
	bi := buildinfo.Read()
	m.reg.MustRegister(m.decisions, m.tagDecisions, m.latency, m.backendErrs, m.failActs, m.badInput, m.conns, m.connsRefused,
		m.connsDropped, m.reloads, m.reloadOK, grpcCalls, m.reloadTime, m.unmatched, m.backendUp, m.penalties, m.lifts, m.expired,
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_key_evictions_total", Help: "Idle buckets forgotten."}, evictedIdle),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_key_evictions_live_total", Help: "Live buckets evicted to make room (max_keys)."}, evictedLive),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_build_info", Help: "1, labelled with the version and commit of the running build and the Go that built it.",
			ConstLabels: prometheus.Labels{"version": bi.Version, "commit": bi.Commit, "goversion": bi.GoVersion},
		}, func() float64 { return 1 }),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	if keys != nil {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_keys", Help: "Buckets held: in the daemon (local back end), or in Redis under the daemon's prefix (redis back end, counted at most every 30s).",
		}, keys))
	}
	m.reloadOK.Set(1)
	m.backendUp.Set(1)
	return m
}

// result is a decision's result, as the metrics label it.
type result int

const (
	resultAllowed  result = iota
	resultDenied          // by the limit
	resultError           // the back end failed: answered by the fail mode
	resultShadowed        // denied by a shadow rule's limit, answered as allowed
	nResults
)

var resultNames = [nResults]string{"allowed", "denied", "error", "shadowed"}

// ruleCounters are a rule's decision counters, curried once so a decision does no label
// lookup.
type ruleCounters [nResults]prometheus.Counter

func (m *metrics) forRule(name string) ruleCounters {
	var rc ruleCounters
	for r, label := range resultNames {
		rc[r] = m.decisions.WithLabelValues(name, label)
	}
	return rc
}

func (rc *ruleCounters) count(r result) { rc[r].Inc() }

// tagCounters count a rule's decisions by tag (DetailedMetrics), for at most
// MaxDetailedTags tags; later ones under the tag "_other".
type tagCounters struct {
	vec  *prometheus.CounterVec
	rule string
	mu   sync.Mutex
	tags map[string]*ruleCounters
}

func (m *metrics) forTags(rule string) *tagCounters {
	return &tagCounters{vec: m.tagDecisions, rule: rule, tags: map[string]*ruleCounters{}}
}

func (tc *tagCounters) count(tag string, r result) {
	tc.mu.Lock()
	c, ok := tc.tags[tag]
	if !ok {
		if len(tc.tags) >= MaxDetailedTags {
			tag = "_other"
			c, ok = tc.tags[tag]
		}
		if !ok {
			c = new(ruleCounters)
			for r, label := range resultNames {
				c[r] = tc.vec.WithLabelValues(tc.rule, tag, label)
			}
			tc.tags[tag] = c
		}
	}
	tc.mu.Unlock()
	c.count(r)
}

// observe is every rule's limiter's observer. It feeds the metrics the decisions' latency
// (the limiter times each call to the back end) and the back end's failures.
func (m *metrics) observe(e sluice.Event) {
	switch e.Kind {
	case sluice.EventDecision:
		m.latency.Observe(e.Latency.Seconds())
	case sluice.EventError:
		m.backendErrs.Inc()
		m.failActs.WithLabelValues(e.FailMode.String()).Inc()
	}
}

// keyCount is the number of keys a back end holds in shared state (a KeyCounter: Redis).
// A scrape counts again when the last count is older than keysEvery, and otherwise reads
// the last count. Counting may take a while (a SCAN of Redis), so one runs at a time, and
// a scrape that comes meanwhile reads the last count.
type keyCount struct {
	counter backend.KeyCounter
	mu      sync.Mutex // held while counting
	at      time.Time  // of the last count
	n       atomic.Int64
}

// keysEvery is how old the key count may be before a scrape counts again.
const keysEvery = 30 * time.Second

// keysTimeout bounds one count.
const keysTimeout = 5 * time.Second

func (k *keyCount) read() float64 {
	if k.mu.TryLock() {
		if time.Since(k.at) >= keysEvery {
			ctx, cancel := context.WithTimeout(context.Background(), keysTimeout)
			if n, err := k.counter.CountKeys(ctx); err == nil {
				k.n.Store(n)
				k.at = time.Now()
			}
			cancel()
		}
		k.mu.Unlock()
	}
	return float64(k.n.Load())
}
