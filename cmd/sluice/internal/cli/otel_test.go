package cli

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metricspb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	tracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/testkit/proctest"
)

// collector is an OTLP/HTTP receiver on loopback: it records the names of the spans and
// metrics exported to it.
type collector struct {
	mu      sync.Mutex
	spans   []string
	metrics []string
	attrs   []string // the decision spans' attribute keys
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch r.URL.Path {
	case "/v1/traces":
		var req tracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, sp := range ss.Spans {
					c.spans = append(c.spans, sp.Name)
					for _, a := range sp.Attributes {
						c.attrs = append(c.attrs, a.Key)
					}
				}
			}
		}
		b, _ := proto.Marshal(&tracepb.ExportTraceServiceResponse{})
		w.Write(b)
	case "/v1/metrics":
		var req metricspb.ExportMetricsServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		for _, rm := range req.ResourceMetrics {
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					c.metrics = append(c.metrics, m.Name)
				}
			}
		}
		b, _ := proto.Marshal(&metricspb.ExportMetricsServiceResponse{})
		w.Write(b)
	default:
		http.NotFound(w, r)
	}
}

func (c *collector) has(spans, metrics []string, attr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range spans {
		if !slices.Contains(c.spans, s) {
			return false
		}
	}
	for _, m := range metrics {
		if !slices.Contains(c.metrics, m) {
			return false
		}
	}
	return attr == "" || slices.Contains(c.attrs, attr)
}

// TestServeExportsOverOTLP: with the OTEL_* variables set, the daemon sends a span of
// each decision and the metrics of /metrics to an OTLP/HTTP collector; without them it
// sends nothing.
func TestServeExportsOverOTLP(t *testing.T) {
	col := &collector{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: col}
	go hs.Serve(ln)
	defer hs.Close()

	serve := func(t *testing.T) {
		t.Helper()
		addr := proctest.FreeAddr(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int)
		var errb bytes.Buffer
		go func() {
			done <- Main(ctx, []string{"serve", "--listen-line", addr, "--listen-http", "", "--limit", "api=10/s"}, strings.NewReader(""), io.Discard, &errb)
		}()
		var c net.Conn
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if c, err = net.Dial("tcp", addr); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the daemon did not listen: %v", err)
			}
		}
		if _, err := c.Write([]byte("api\n")); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "OK\n" {
			t.Fatalf("answer %q, %v", line, err)
		}
		if t.Name() == "TestServeExportsOverOTLP/on" {
			want := []string{"sluice_decisions_total", "sluice_decision_duration_seconds", "go_goroutines"}
			for deadline := time.Now().Add(10 * time.Second); !col.has([]string{"sluice.decide"}, want, "sluice.tag_sha256"); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					col.mu.Lock()
					spans, metrics := slices.Clone(col.spans), slices.Clone(col.metrics)
					col.mu.Unlock()
					t.Fatalf("exported: spans %v, metrics %v; want the span sluice.decide and the metrics %v", spans, metrics, want)
				}
			}
		}
		c.Close()
		cancel()
		if code := <-done; code != 0 {
			t.Fatalf("serve exit %d: %s", code, errb.String())
		}
	}
	t.Run("off", func(t *testing.T) {
		serve(t)
		col.mu.Lock()
		defer col.mu.Unlock()
		if len(col.spans)+len(col.metrics) > 0 {
			t.Errorf("exported with no OTEL_* variable set: %v %v", col.spans, col.metrics)
		}
	})
	t.Run("on", func(t *testing.T) {
		t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
		t.Setenv("OTEL_METRICS_EXPORTER", "otlp")
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+ln.Addr().String())
		t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")
		t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
		serve(t)
	})
	t.Run("bad", func(t *testing.T) {
		t.Setenv("OTEL_TRACES_EXPORTER", "zipkin")
		code, _, errs := run(t, "serve", "--listen-line", "127.0.0.1:0", "--listen-http", "")
		if code != ExitUsage || !strings.Contains(errs, `OTEL_TRACES_EXPORTER="zipkin"`) {
			t.Errorf("exit %d, %q", code, errs)
		}
	})
}
