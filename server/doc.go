// Package server is the Sluice daemon (`sluice serve`): one process per host (or a few
// behind a load balancer) that answers "serve or throttle?" for tags, so that workers in
// any language share limits without linking Sluice.
//
// It speaks four ways:
//   - the line protocol (docs/protocol.md): a client sends a tag and '\n' and gets exactly
//     "OK\n" or "NO\n", pipelined, in order; extensions behind a leading '~' ask for
//     weights, reservations, details and penalties;
//   - an HTTP/JSON API for decisions, rules, keys and lifting penalties, behind an
//     optional bearer token (docs/daemon.md);
//   - Prometheus metrics at /metrics, and /healthz and /readyz;
//   - Envoy's rate limit service over gRPC (ShouldRateLimit, docs/envoy.md), each
//     descriptor decided as one tag (EnvoyTag) by the same rules; ParseEnvoyConfig reads
//     envoyproxy/ratelimit's config files into rules.
//
// Decisions can be traced with OpenTelemetry (WithTracerProvider), and the metrics
// registry (Gatherer) exported over OTLP.
//
// Rules map tags to limits (an exact tag, or a glob giving each tag its own bucket or one
// shared bucket; the first match wins). Decisions are made by a backend.Backend: the
// in-process local back end by default, or one the caller builds and passes with
// WithBackend (Redis, a lease store, gossiping peers). Every resource is bounded: buckets
// (max_keys, evicting at a constant cost), connections, line length, unread answers, and
// the penalties clients may set (max_penalty). A Server is built with New from a Config
// (DefaultConfig, LoadConfig, Validate), started with Start, reloaded in place with
// Reload (SIGHUP) and stopped with Shutdown, which answers every query already read.
package server
