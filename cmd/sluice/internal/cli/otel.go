package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	promBridge "go.opentelemetry.io/contrib/bridges/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sluicehq/sluice/internal/buildinfo"
)

// telemetry is what the daemon exports over OpenTelemetry's protocol (OTLP), configured
// by the standard OTEL_* environment variables, and off unless they ask for it:
//
//   - OTEL_TRACES_EXPORTER=otlp: a span of every decision (and of every gRPC call);
//   - OTEL_METRICS_EXPORTER=otlp: the metrics of /metrics, read from the daemon's
//     Prometheus registry by OpenTelemetry's Prometheus bridge and pushed every
//     OTEL_METRIC_EXPORT_INTERVAL (60 s);
//
// to OTEL_EXPORTER_OTLP_ENDPOINT (or the _TRACES_ / _METRICS_ one) over
// OTEL_EXPORTER_OTLP_PROTOCOL, http/protobuf (the default) or grpc, with the exporters'
// other variables (headers, time-outs, certificates, compression), the sampler's
// (OTEL_TRACES_SAMPLER), the batcher's (OTEL_BSP_*) and the resource's
// (OTEL_SERVICE_NAME, default "sluice", and OTEL_RESOURCE_ATTRIBUTES).
// OTEL_SDK_DISABLED=true turns both off.
type telemetry struct {
	tp *sdktrace.TracerProvider // nil: traces off
	mp *sdkmetric.MeterProvider // nil: metrics not exported
}

// otelEnv reads the OTEL_* variables through lookup.
type otelEnv func(string) (string, bool)

func (e otelEnv) get(name string) string {
	v, _ := e(name)
	return strings.TrimSpace(v)
}

// enabled reads OTEL_<SIGNAL>_EXPORTER: otlp turns the signal on; none, or nothing, off.
func (e otelEnv) enabled(signal string) (bool, error) {
	if strings.EqualFold(e.get("OTEL_SDK_DISABLED"), "true") {
		return false, nil
	}
	name := "OTEL_" + signal + "_EXPORTER"
	switch v := strings.ToLower(e.get(name)); v {
	case "", "none":
		return false, nil
	case "otlp":
		return true, nil
	default:
		return false, fmt.Errorf("%s=%q: the daemon exports otlp or none (its Prometheus metrics are at /metrics)", name, v)
	}
}

// protocol reads the OTLP protocol of a signal: grpc or http/protobuf (the default).
func (e otelEnv) protocol(signal string) (string, error) {
	v := e.get("OTEL_EXPORTER_OTLP_" + signal + "_PROTOCOL")
	if v == "" {
		v = e.get("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch v {
	case "", "http/protobuf":
		return "http/protobuf", nil
	case "grpc":
		return v, nil
	}
	return "", fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: want grpc or http/protobuf", v)
}

func (e otelEnv) resource(ctx context.Context) (*resource.Resource, error) {
	bi := buildinfo.Read()
	return resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "sluice"), attribute.String("service.version", bi.Version)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
		resource.WithTelemetrySDK())
}

// signal reads whether a signal (TRACES, METRICS) is exported, and if so over which
// protocol ("" if not) and with which resource; the exporters' errors go to log from then on.
func (e otelEnv) signal(ctx context.Context, signal string, log *slog.Logger) (string, *resource.Resource, error) {
	on, err := e.enabled(signal)
	if err != nil || !on {
		return "", nil, err
	}
	proto, err := e.protocol(signal)
	if err != nil {
		return "", nil, err
	}
	res, err := e.resource(ctx)
	if err != nil {
		log.Warn("opentelemetry: resource", "err", err) // a partial resource is still usable
	}
	setOTelErrorLog(log)
	return proto, res, nil
}

// startTracing returns the tracer provider OTEL_TRACES_EXPORTER asks for (nil: none).
func (t *telemetry) startTracing(ctx context.Context, env otelEnv, log *slog.Logger) error {
	proto, res, err := env.signal(ctx, "TRACES", log)
	if err != nil || proto == "" {
		return err
	}
	var exp sdktrace.SpanExporter
	if proto == "grpc" {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return fmt.Errorf("opentelemetry: traces: %w", err)
	}
	t.tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	log.Info("opentelemetry: tracing decisions", "protocol", proto)
	return nil
}

// startMetrics exports the metrics of reg as OTEL_METRICS_EXPORTER asks (or nothing).
func (t *telemetry) startMetrics(ctx context.Context, env otelEnv, reg prometheus.Gatherer, log *slog.Logger) error {
	proto, res, err := env.signal(ctx, "METRICS", log)
	if err != nil || proto == "" {
		return err
	}
	var exp sdkmetric.Exporter
	if proto == "grpc" {
		exp, err = otlpmetricgrpc.New(ctx)
	} else {
		exp, err = otlpmetrichttp.New(ctx)
	}
	if err != nil {
		return fmt.Errorf("opentelemetry: metrics: %w", err)
	}
	reader := sdkmetric.NewPeriodicReader(exp, sdkmetric.WithProducer(promBridge.NewMetricProducer(promBridge.WithGatherer(reg))))
	t.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader), sdkmetric.WithResource(res))
	log.Info("opentelemetry: exporting the metrics of /metrics", "protocol", proto)
	return nil
}

// shutdown flushes what is left to export and stops the exporters.
func (t *telemetry) shutdown(ctx context.Context) error {
	var errs []error
	if t.tp != nil {
		errs = append(errs, t.tp.Shutdown(ctx))
	}
	if t.mp != nil {
		errs = append(errs, t.mp.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

// setOTelErrorLog sends the exporters' errors (a collector that does not answer) to the
// daemon's log rather than the standard library's.
func setOTelErrorLog(log *slog.Logger) {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("opentelemetry", "err", err) }))
}
