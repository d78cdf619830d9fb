package server

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/metadata"
)

// TestDecisionsTraced: with a tracer provider, a gRPC call is a server span continuing
// the caller's trace (traceparent in its metadata), each descriptor a sluice.decide span
// under it, and POST /v1/decide continues its traceparent; a span names the tag by its
// fingerprint only.
func TestDecisionsTraced(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	cfg := envoyTestConfig(t, testEnvoyYAML)
	cfg.ListenHTTP = "127.0.0.1:0"
	s := start(t, cfg, WithTracerProvider(tp))
	c, _ := rlsClient(t, s)
	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+trace+"-00f067aa0ba902b7-01")
	if _, err := c.ShouldRateLimit(ctx, &rls.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("api", "secret-token"), desc("user", "u")}}); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", "http://"+s.HTTPAddr().String()+"/v1/decide", strings.NewReader(`{"key":"edge/api=k"}`))
	const trace2 = "0af7651916cd43dd8448eb211c80319c"
	req.Header.Set("traceparent", "00-"+trace2+"-b7ad6b7169203331-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// The RPC's server span ends after its answer is sent (the stats handler's End
	// event), so the client may read the answer first: wait for the spans (a loaded
	// machine once read them with the RPC's span not yet ended).
	var rpc, decide, fromHTTP int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		rpc, decide, fromHTTP = 0, 0, 0
		for _, sp := range exp.GetSpans() {
			switch {
			case sp.Name == "sluice.decide" && sp.SpanContext.TraceID().String() == trace:
				decide++
			case sp.Name == "sluice.decide" && sp.SpanContext.TraceID().String() == trace2:
				fromHTTP++
			case strings.Contains(sp.Name, "ShouldRateLimit") && sp.SpanContext.TraceID().String() == trace:
				rpc++
			}
		}
		if (rpc >= 1 && decide >= 2 && fromHTTP >= 1) || time.Now().After(deadline) {
			break
		}
	}
	for _, sp := range exp.GetSpans() {
		for _, a := range sp.Attributes {
			if strings.Contains(a.Value.String(), "secret-token") {
				t.Errorf("span %s carries the tag: %s=%s", sp.Name, a.Key, a.Value.String())
			}
		}
	}
	if rpc != 1 || decide != 2 || fromHTTP != 1 {
		t.Errorf("spans: %d RPC and %d decisions in the caller's trace, %d from HTTP; want 1, 2, 1 (all: %d)", rpc, decide, fromHTTP, len(exp.GetSpans()))
	}
}
