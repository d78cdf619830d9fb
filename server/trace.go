package server

import (
	"context"
	"errors"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/stats"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
)

// WithTracerProvider traces decisions with tp. Every decision (line protocol, HTTP and
// gRPC alike) gets a span "sluice.decide", with the rule, the permits asked, the result
// and the tag's SHA-256 fingerprint (never the tag). Each gRPC call gets a server span,
// the child of the caller's trace (Envoy's, when it traces). HTTP decisions continue the
// trace their traceparent header names. Without it (the default) nothing is traced, at no
// cost.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(s *Server) {
		if tp != nil {
			s.tracer = &tracing{tp: tp, t: tp.Tracer("github.com/sluicehq/sluice/server")}
		}
	})
}

// tracing is what the server traces with.
type tracing struct {
	tp trace.TracerProvider
	t  trace.Tracer
}

var traceContext = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// grpcHandler makes a span of each gRPC call.
func (tr *tracing) grpcHandler() stats.Handler {
	return otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tr.tp), otelgrpc.WithPropagators(traceContext),
		otelgrpc.WithMeterProvider(noop.NewMeterProvider())) // the daemon's metrics are its own
}

// httpContext continues the trace an HTTP request names, if any.
func (s *Server) httpContext(r *http.Request) context.Context {
	if s.tracer == nil {
		return r.Context()
	}
	return traceContext.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
}

// decideTraced is decide in a span.
func (s *Server) decideTraced(ctx context.Context, tag string, n int64, maxWait int64, stamp bool,
	decide func(context.Context) (Decision, error)) (Decision, error) {
	ctx, span := s.tracer.t.Start(ctx, "sluice.decide", trace.WithSpanKind(trace.SpanKindInternal))
	defer span.End()
	d, err := decide(ctx)
	attrs := []attribute.KeyValue{
		attribute.String("sluice.rule", d.Rule),
		attribute.String("sluice.tag_sha256", fingerprint(tag)),
		attribute.Int64("sluice.n", n),
		attribute.Bool("sluice.allowed", d.Allowed && err == nil),
		attribute.Int64("sluice.remaining", d.Remaining),
	}
	if maxWait > 0 {
		attrs = append(attrs, attribute.Int64("sluice.max_wait_ms", maxWait), attribute.Int64("sluice.delay_ms", d.Delay.Milliseconds()))
	}
	if stamp {
		attrs = append(attrs, attribute.Int64("sluice.slot", d.Slot))
	}
	if !d.Allowed {
		attrs = append(attrs, attribute.Int64("sluice.retry_after_ms", d.RetryAfter.Milliseconds()))
	}
	span.SetAttributes(attrs...)
	if err != nil { // named by kind: the error's text carries the tag
		span.SetStatus(codes.Error, errorKind(err))
	}
	return d, err
}

// errorKind names a decision's error without its text.
func errorKind(err error) string {
	switch {
	case errors.Is(err, gcra.ErrCostExceedsBurst):
		return "cost exceeds the burst"
	case errors.Is(err, backend.ErrUnavailable):
		return "back end unavailable"
	case errors.Is(err, backend.ErrClosed):
		return "closed"
	}
	return "error"
}

// Gatherer is the server's metrics registry, the one /metrics serves: an OpenTelemetry
// Prometheus bridge reads it to export the same metrics over OTLP.
func (s *Server) Gatherer() prometheus.Gatherer { return s.m.reg }
