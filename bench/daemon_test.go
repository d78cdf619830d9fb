package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	guber "github.com/gubernator-io/gubernator/v2"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/testkit/daemontest"
	"github.com/sluicehq/sluice/internal/testkit/proctest"
	"github.com/sluicehq/sluice/server"
)

// The daemon benchmarks: one sluice daemon (local back end) and one gubernator node, each
// in this process on loopback, the load generator sharing the same 2 cores. Every
// sub-benchmark reports decisions/s and the p50/p99 latency of one call (a call carries
// one decision, or a batch where the name says so).

// startSluice starts a daemon on the local back end, or on be (named gossip) if not nil.
func startSluice(b *testing.B, be ...backend.Backend) *server.Server {
	cfg := server.DefaultConfig()
	cfg.ListenLine, cfg.ListenHTTP, cfg.ListenGRPC = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	r, _ := server.ParseRuleFlag("t-*=1000000000/s burst=1000", false)
	e, _ := server.ParseRuleFlag("bench/*=1000000000/s burst=1000", false) // Envoy's descriptors: bench/k=...
	cfg.Rules = []server.Rule{r, e}
	var opts []server.Option
	if len(be) > 0 {
		cfg.Backend = "gossip"
		opts = append(opts, server.WithBackend(be[0]))
	}
	return daemontest.Start(b, cfg, opts...)
}

var (
	guberOnce sync.Once
	guberAddr string
	guberErr  error
)

// startGubernator starts one gubernator node for the whole run (it cannot be stopped and
// restarted cleanly on the same registry within one process).
func startGubernator(b *testing.B) string {
	guberOnce.Do(func() {
		log := logrus.New()
		log.SetOutput(io.Discard)
		conf := guber.DaemonConfig{GRPCListenAddress: proctest.FreeAddr(b), HTTPListenAddress: proctest.FreeAddr(b), Logger: log}
		conf.AdvertiseAddress = conf.GRPCListenAddress
		_, guberErr = guber.SpawnDaemon(context.Background(), conf)
		guberAddr = conf.GRPCListenAddress
	})
	if guberErr != nil {
		b.Fatal(guberErr)
	}
	return guberAddr
}

// latencies collects per-call durations from parallel workers.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(ds []time.Duration) { l.mu.Lock(); l.d = append(l.d, ds...); l.mu.Unlock() }

func (l *latencies) report(b *testing.B, perCall int) {
	slices.Sort(l.d)
	if len(l.d) == 0 {
		return
	}
	b.ReportMetric(float64(l.d[len(l.d)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(l.d[len(l.d)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(b.N*perCall)/b.Elapsed().Seconds(), "decisions/s")
}

// parallel runs f on conc goroutines (conc a multiple of GOMAXPROCS) through RunParallel,
// each with its own state made by setup.
func parallel(b *testing.B, conc, perCall int, setup func(worker int) func() error) {
	var lat latencies
	p := max(1, conc/2)
	b.SetParallelism(p)
	var n sync.Mutex
	worker := 0
	cpu0 := processCPU()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		n.Lock()
		w := worker
		worker++
		n.Unlock()
		call := setup(w)
		var ds []time.Duration
		for pb.Next() {
			t0 := time.Now()
			if err := call(); err != nil {
				b.Error(err)
				return
			}
			ds = append(ds, time.Since(t0))
		}
		lat.add(ds)
	})
	// CPU per decision (this process: the callers and the daemon, so a back end's own cost
	// is diluted by theirs alike): steadier than decisions/s on a machine shared with
	// other work, which takes wall time but not this process' CPU.
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N*perCall), "cpu-ns/decision")
	lat.report(b, perCall)
}

func lineCaller(b *testing.B, addr string, worker, batch int) func() error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	var q bytes.Buffer
	for i := 0; i < batch; i++ {
		fmt.Fprintf(&q, "t-%d-%d\n", worker, i%16)
	}
	query := q.Bytes()
	r := bufio.NewReaderSize(c, 64<<10)
	ans := make([]byte, 3*batch)
	return func() error {
		if _, err := c.Write(query); err != nil {
			return err
		}
		_, err := io.ReadFull(r, ans)
		return err
	}
}

func httpCaller(b *testing.B, addr string, worker int) func() error {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	url := "http://" + addr + "/v1/decide"
	body := []byte(fmt.Sprintf(`{"key":"t-%d"}`, worker))
	return func() error {
		resp, err := client.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			return err
		}
		var d server.DecideResponse
		err = json.NewDecoder(resp.Body).Decode(&d)
		resp.Body.Close()
		if err == nil && !d.Allowed {
			err = fmt.Errorf("denied")
		}
		return err
	}
}

// rlsConn is one gRPC connection to the daemon's rate limit service, shared by every
// caller of a benchmark as Envoy shares its connections: each caller is a stream on it.
func rlsConn(b *testing.B, addr string) rls.RateLimitServiceClient {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return rls.NewRateLimitServiceClient(conn)
}

// rlsCaller asks ShouldRateLimit for one descriptor of its own.
func rlsCaller(c rls.RateLimitServiceClient, worker int) func() error {
	req := &rls.RateLimitRequest{Domain: "bench", HitsAddend: 1, Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: fmt.Sprint(worker)}}}}}
	return func() error {
		resp, err := c.ShouldRateLimit(context.Background(), req)
		if err == nil && (resp.OverallCode != rls.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit == nil) {
			err = fmt.Errorf("answer %v", resp)
		}
		return err
	}
}

func guberCaller(b *testing.B, addr string, worker, batch int) func() error {
	c, err := guber.DialV1Server(addr, nil)
	if err != nil {
		b.Fatal(err)
	}
	req := &guber.GetRateLimitsReq{}
	for i := 0; i < batch; i++ {
		req.Requests = append(req.Requests, &guber.RateLimitReq{
			Name: "bench", UniqueKey: fmt.Sprintf("t-%d-%d", worker, i%16), Hits: 1,
			Limit: 1000000000, Duration: 1000, Algorithm: guber.Algorithm_TOKEN_BUCKET,
		})
	}
	return func() error {
		resp, err := c.GetRateLimits(context.Background(), req)
		if err == nil && len(resp.Responses) != batch {
			err = fmt.Errorf("%d responses for %d requests", len(resp.Responses), batch)
		}
		return err
	}
}

// BenchmarkDaemon: one decision per call, at 1, 16 and 64 concurrent callers (each its
// own connection), over the line protocol, the HTTP API, Envoy's ShouldRateLimit over gRPC
// (the callers are concurrent streams on one connection, as Envoy multiplexes them), and
// gubernator's GetRateLimits.
func BenchmarkDaemon(b *testing.B) {
	for _, conc := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("conc=%d/impl=sluice-line", conc), func(b *testing.B) {
			s := startSluice(b)
			parallel(b, conc, 1, func(w int) func() error { return lineCaller(b, s.LineAddr().String(), w, 1) })
		})
		b.Run(fmt.Sprintf("conc=%d/impl=sluice-grpc", conc), func(b *testing.B) {
			s := startSluice(b)
			c := rlsConn(b, s.GRPCAddr().String())
			parallel(b, conc, 1, func(w int) func() error { return rlsCaller(c, w) })
		})
		b.Run(fmt.Sprintf("conc=%d/impl=sluice-http", conc), func(b *testing.B) {
			s := startSluice(b)
			parallel(b, conc, 1, func(w int) func() error { return httpCaller(b, s.HTTPAddr().String(), w) })
		})
		b.Run(fmt.Sprintf("conc=%d/impl=gubernator", conc), func(b *testing.B) {
			addr := startGubernator(b)
			parallel(b, conc, 1, func(w int) func() error { return guberCaller(b, addr, w, 1) })
		})
	}
}

// BenchmarkDaemonBatch100: 100 decisions per call: 100 pipelined queries in one write on
// the line protocol, against 100 requests in one GetRateLimits call.
func BenchmarkDaemonBatch100(b *testing.B) {
	for _, conc := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("conc=%d/impl=sluice-line", conc), func(b *testing.B) {
			s := startSluice(b)
			parallel(b, conc, 100, func(w int) func() error { return lineCaller(b, s.LineAddr().String(), w, 100) })
		})
		b.Run(fmt.Sprintf("conc=%d/impl=gubernator", conc), func(b *testing.B) {
			addr := startGubernator(b)
			parallel(b, conc, 100, func(w int) func() error { return guberCaller(b, addr, w, 100) })
		})
	}
}
