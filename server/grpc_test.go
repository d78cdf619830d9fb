package server

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/local"
	"github.com/sluicehq/sluice/referee"
	"github.com/sluicehq/sluice/store"
	redisstore "github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/strict"
)

// eachTransport runs f on each server of the gRPC listener (grpc.transport).
func eachTransport(t *testing.T, f func(t *testing.T, transport string)) {
	for _, tr := range []string{"lean", "grpc-go"} {
		t.Run(tr, func(t *testing.T) { f(t, tr) })
	}
}

// envoyTestConfig is a config in Envoy's format, served on gRPC alone.
func envoyTestConfig(t *testing.T, yaml string) Config {
	t.Helper()
	cfg, err := ParseEnvoyConfig("envoy.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ListenLine, cfg.ListenHTTP, cfg.ListenGRPC = "127.0.0.1:0", "", "127.0.0.1:0"
	return cfg
}

func rlsClient(t *testing.T, s *Server) (rls.RateLimitServiceClient, *grpc.ClientConn) {
	t.Helper()
	conn, err := grpc.NewClient(s.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rls.NewRateLimitServiceClient(conn), conn
}

// desc is a descriptor of key=value pairs.
func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

const testEnvoyYAML = `
domain: edge
descriptors:
  - key: api
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: remote_address
    value: 10.0.0.9
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: remote_address
    value: 10.0.0.1
    rate_limit: {unlimited: true}
  - key: user
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
`

func TestGRPCShouldRateLimit(t *testing.T) {
	eachTransport(t, func(t *testing.T, transport string) {
		cfg := envoyTestConfig(t, testEnvoyYAML)
		cfg.GRPC.Transport = transport
		cfg.GRPC.ResponseHeaders = true
		s := start(t, cfg)
		c, conn := rlsClient(t, s)
		ctx := context.Background()
		ask := func(hits uint32, ds ...*rlcommon.RateLimitDescriptor) *rls.RateLimitResponse {
			t.Helper()
			resp, err := c.ShouldRateLimit(ctx, &rls.RateLimitRequest{Domain: "edge", Descriptors: ds, HitsAddend: hits})
			if err != nil {
				t.Fatal(err)
			}
			return resp
		}
		ok, over := rls.RateLimitResponse_OK, rls.RateLimitResponse_OVER_LIMIT
		// A burst of 3 (requests_per_unit), each answer with the limit and what remains.
		for i := range 3 {
			r := ask(0, desc("api", "")) // hits_addend 0 counts as 1
			st := r.Statuses[0]
			if r.OverallCode != ok || st.Code != ok || st.LimitRemaining != uint32(2-i) ||
				st.CurrentLimit.GetRequestsPerUnit() != 3 || st.CurrentLimit.GetUnit() != rls.RateLimitResponse_RateLimit_SECOND ||
				st.CurrentLimit.GetName() != "edge/api=*" || st.DurationUntilReset.AsDuration() <= 0 {
				t.Fatalf("step %d: got %v, want OK with %d remaining of 3/s", i, r, 2-i)
			}
		}
		r := ask(1, desc("api", ""))
		if r.OverallCode != over || r.Statuses[0].Code != over || r.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("step 3: got %v, want OVER_LIMIT", r)
		}
		hdr := map[string]string{}
		for _, h := range r.ResponseHeadersToAdd {
			hdr[h.Key] = h.Value
		}
		if hdr["x-ratelimit-limit"] != "3, 3;w=1" || hdr["x-ratelimit-remaining"] != "0" || hdr["x-ratelimit-reset"] != "1" {
			t.Errorf("response headers %v", hdr)
		}
		// Several descriptors: each its own status, OVER_LIMIT overall if any is; an unknown
		// descriptor is OK without a limit; unlimited is OK without one; requests_per_unit 0
		// denies; shadow_mode answers OK past its limit.
		r = ask(1, desc("nothing", "here"), desc("remote_address", "10.0.0.1"), desc("user", "u1"), desc("user", "u1"))
		if r.OverallCode != ok || len(r.Statuses) != 4 || r.Statuses[0].CurrentLimit != nil || r.Statuses[1].CurrentLimit != nil ||
			r.Statuses[2].CurrentLimit.GetUnit() != rls.RateLimitResponse_RateLimit_HOUR || r.Statuses[3].Code != ok {
			t.Fatalf("unknown, unlimited and shadowed: got %v", r)
		}
		r = ask(1, desc("remote_address", "10.0.0.2"), desc("remote_address", "10.0.0.9"))
		if r.OverallCode != over || r.Statuses[0].Code != ok || r.Statuses[1].Code != over || r.Statuses[1].CurrentLimit.GetRequestsPerUnit() != 0 {
			t.Fatalf("a denied address: got %v", r)
		}
		if got := testutil.ToFloat64(s.m.decisions.WithLabelValues("edge/user=*", "shadowed")); got != 1 {
			t.Errorf("shadowed decisions %v, want 1", got)
		}
		if got := testutil.ToFloat64(s.m.unmatched); got != 2 {
			t.Errorf("unmatched %v, want 2", got)
		}
		// The same rules answer the line protocol, for the same tag.
		lc := dial(t, s)
		if got := exchange(t, lc, "edge/api=\nedge/remote_address=10.0.0.9\nedge/remote_address=10.0.0.1\n", 9); got != "NO\nNO\nOK\n" {
			t.Errorf("line protocol: %q", got)
		}
		// The health service, without a token.
		h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: rlsServiceName})
		if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health: %v, %v", h, err)
		}
		// Reflection is off by default.
		if err := conn.Invoke(ctx, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{}); status.Code(err) != codes.Unimplemented {
			t.Errorf("reflection: %v, want Unimplemented", err)
		}
	})
}

func TestGRPCToken(t *testing.T) {
	eachTransport(t, func(t *testing.T, transport string) {
		cfg := envoyTestConfig(t, testEnvoyYAML)
		cfg.GRPC.Transport = transport
		cfg.HTTPTokenFile = writeToken(t, "s3cret")
		s := start(t, cfg)
		c, conn := rlsClient(t, s)
		req := &rls.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("api", "")}}
		for _, tc := range []struct {
			auth string
			want codes.Code
		}{{"", codes.Unauthenticated}, {"Bearer wrong", codes.Unauthenticated}, {"Bearer s3cret", codes.OK}, {"bearer s3cret", codes.OK}} {
			ctx := context.Background()
			if tc.auth != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", tc.auth)
			}
			if _, err := c.ShouldRateLimit(ctx, req); status.Code(err) != tc.want {
				t.Errorf("authorization %q: %v, want %v", tc.auth, err, tc.want)
			}
		}
		if _, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Errorf("health needs no token: %v", err)
		}
		if got := testutil.ToFloat64(s.m.grpcCalls[grpcUnauthenticated]); got != 2 {
			t.Errorf("unauthenticated calls counted %v, want 2", got)
		}
	})
}

func TestGRPCBadInput(t *testing.T) {
	eachTransport(t, func(t *testing.T, transport string) {
		cfg := envoyTestConfig(t, testEnvoyYAML)
		cfg.GRPC.Transport = transport
		cfg.GRPC.MaxMessage = 4 << 10
		s := start(t, cfg)
		c, _ := rlsClient(t, s)
		ctx := context.Background()
		flood := make([]*rlcommon.RateLimitDescriptor, MaxDescriptors+1)
		for i := range flood {
			flood[i] = desc("api", "")
		}
		big := make([]*rlcommon.RateLimitDescriptor, 200)
		for i := range big {
			big[i] = desc("api", strings.Repeat("v", 30))
		}
		override := desc("api", "")
		override.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1000, Unit: 1}
		negative := desc("api", "")
		negative.IsNegativeHits = true
		cases := []struct {
			req  *rls.RateLimitRequest
			want codes.Code
			msg  string
		}{
			{&rls.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("api", "")}}, codes.InvalidArgument, "domain: empty"},
			{&rls.RateLimitRequest{Domain: "edge"}, codes.InvalidArgument, "descriptors: none"},
			{&rls.RateLimitRequest{Domain: "edge", Descriptors: flood}, codes.InvalidArgument, "at most 64"},
			{&rls.RateLimitRequest{Domain: "edge", Descriptors: big}, codes.ResourceExhausted, "larger than max"},
			{&rls.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{}}}, codes.InvalidArgument, "no entries"},
			{&rls.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("", "x")}}, codes.InvalidArgument, "key: empty"},
			{&rls.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("api", strings.Repeat("x", 1100))}}, codes.InvalidArgument, "longer than max_line"},
			{&rls.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{override}}, codes.InvalidArgument, "limit overrides are not supported"},
			{&rls.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{negative}}, codes.InvalidArgument, "is_negative_hits"},
		}
		for i, tc := range cases {
			_, err := c.ShouldRateLimit(ctx, tc.req)
			if status.Code(err) != tc.want || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("case %d: %v, want %v with %q", i, err, tc.want, tc.msg)
			}
		}
		// A cost no burst can hold is OVER_LIMIT (never a crash, never granted), and takes
		// nothing: the next request of one is granted.
		huge := desc("api", "")
		huge.HitsAddend = wrapperspb.UInt64(math.MaxUint64)
		for _, req := range []*rls.RateLimitRequest{
			{Domain: "edge", HitsAddend: math.MaxUint32, Descriptors: []*rlcommon.RateLimitDescriptor{desc("api", "")}},
			{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{huge}},
		} {
			r, err := c.ShouldRateLimit(ctx, req)
			if err != nil || r.OverallCode != rls.RateLimitResponse_OVER_LIMIT {
				t.Errorf("hits %d/%v: %v, %v; want OVER_LIMIT", req.HitsAddend, req.Descriptors[0].HitsAddend, r, err)
			}
		}
		r, err := c.ShouldRateLimit(ctx, &rls.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("api", "")}})
		if err != nil || r.OverallCode != rls.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 2 {
			t.Errorf("after the huge costs: %v, %v; want OK with 2 remaining", r, err)
		}
		if got := testutil.ToFloat64(s.m.badInput.WithLabelValues("cost_over_burst")); got != 2 {
			t.Errorf("cost_over_burst %v, want 2", got)
		}
		if got := testutil.ToFloat64(s.m.grpcCalls[grpcInvalid]); got != 8 {
			t.Errorf("invalid calls %v, want 8 (the oversized message is refused by gRPC itself)", got)
		}
	})
}

// recorder records the slot of every grant its back end makes: the time, in the back
// end's own time base (the local clock, or Redis TIME), at which the permits were granted.
type recorder struct {
	backend.Backend
	mu    sync.Mutex
	slots []int64
}

func (r *recorder) Decide(ctx context.Context, key string, req backend.Request) (backend.Grant, error) {
	g, err := r.Backend.Decide(ctx, key, req)
	if err == nil && g.Allowed && req.N > 0 {
		r.mu.Lock()
		r.slots = append(r.slots, g.Ticket.At)
		r.mu.Unlock()
	}
	return g, err
}

// TestGRPCKeepsTheLimit: on the local, lease (one daemon, its store in memory) and strict
// (on Redis) back ends, 16 concurrent streams ask ShouldRateLimit as fast as they can. The
// slot of every grant, recorded in the back end, is judged by the referee (strict GCRA at
// the same limit): none may be over it. Liveness is judged loosely.
func TestGRPCKeepsTheLimit(t *testing.T) {
	const yaml = "domain: rl\ndescriptors:\n  - key: api\n    rate_limit: {unit: second, requests_per_unit: 50}\n"
	run := func(t *testing.T, be backend.Backend, backendName, transport string) {
		rec := &recorder{Backend: be}
		cfg := envoyTestConfig(t, yaml)
		cfg.Backend = backendName
		cfg.GRPC.Transport = transport
		cfg.Store = "redis://unused" // strict and lease: the back end is passed built
		s := start(t, cfg, WithBackend(rec))
		c, _ := rlsClient(t, s)
		req := &rls.RateLimitRequest{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{desc("api", "")}}
		var ok, over, errs atomic.Int64
		begin := time.Now()
		const dur = time.Second
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for time.Since(begin) < dur {
					r, err := c.ShouldRateLimit(context.Background(), req)
					switch {
					case err != nil:
						errs.Add(1)
						return
					case r.OverallCode == rls.RateLimitResponse_OK:
						ok.Add(1)
					default:
						over.Add(1)
					}
				}
			})
		}
		wg.Wait()
		elapsed := time.Since(begin)
		rec.mu.Lock()
		slots := slices.Clone(rec.slots)
		rec.mu.Unlock()
		if errs.Load() > 0 || int64(len(slots)) != ok.Load() {
			t.Fatalf("%d errors; %d OK answers for %d grants recorded", errs.Load(), ok.Load(), len(slots))
		}
		slices.Sort(slots)
		ref, _ := referee.New(sluice.MustParse("50/s"))
		for _, at := range slots {
			if _, err := ref.Judge("api", 1, at); err != nil {
				t.Fatal(err)
			}
		}
		st := ref.Stats()
		t.Logf("%s: %d OK, %d over the limit in %v; referee: %d accepted, %d violations", backendName, ok.Load(), over.Load(), elapsed, st.Accepted, st.Rejected)
		if st.Rejected != 0 {
			t.Errorf("%d grants over the limit, by the referee", st.Rejected)
		}
		if bound := 50 + 50*elapsed.Seconds(); float64(ok.Load()) < 0.5*bound || over.Load() == 0 {
			t.Errorf("%d granted, %d refused: want about %.0f granted and some refused", ok.Load(), over.Load(), bound)
		}
	}
	eachTransport(t, func(t *testing.T, transport string) {
		t.Run("local", func(t *testing.T) {
			lb := local.New()
			defer lb.Close()
			run(t, lb, "local", transport)
		})
		t.Run("lease", func(t *testing.T) {
			lb, err := lease.New(store.NewMemory(clock.Default))
			if err != nil {
				t.Fatal(err)
			}
			defer lb.Close()
			run(t, lb, "lease", transport)
		})
		t.Run("strict", func(t *testing.T) {
			srv := redistest.New(t)
			o, _ := redisstore.ClientOptions(srv.URL(), time.Second)
			client := goredis.NewClient(o)
			defer client.Close()
			be := strict.New(client, strict.WithTimeout(time.Second), strict.WithPrefix("sluice:test:"+t.Name()+":"))
			defer be.Close()
			run(t, be, "strict", transport)
		})
	})
}

// TestGRPCPriorityEntry: with grpc.priority_entry set, a descriptor entry of that key is the
// request's class and not part of its tag. On a burst of 10 a minute, a critical request
// takes one; a sheddable flood then leaves 4 (40%), which critical requests take. An unknown
// class is INVALID_ARGUMENT.
func TestGRPCPriorityEntry(t *testing.T) {
	eachTransport(t, func(t *testing.T, transport string) {
		cfg := envoyTestConfig(t, `
domain: edge
descriptors:
  - key: api
    rate_limit: {unit: minute, requests_per_unit: 10}
`)
		cfg.GRPC.Transport = transport
		cfg.GRPC.PriorityEntry = "criticality"
		s := start(t, cfg)
		c, _ := rlsClient(t, s)
		ctx := context.Background()
		ask := func(class string) rls.RateLimitResponse_Code {
			t.Helper()
			resp, err := c.ShouldRateLimit(ctx, &rls.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("api", "", "criticality", class)}})
			if err != nil {
				t.Fatal(err)
			}
			return resp.OverallCode
		}
		if ask("critical") != rls.RateLimitResponse_OK {
			t.Fatal("the first critical request is over the limit")
		}
		count := func(class string, n int) int {
			ok := 0
			for range n {
				if ask(class) == rls.RateLimitResponse_OK {
					ok++
				}
			}
			return ok
		}
		if shed, crit := count("sheddable", 20), count("critical", 6); shed != 5 || crit != 4 {
			t.Errorf("sheddable flood granted %d, critical after it %d; want 5 and the 4 kept (one bucket: the class is not part of the tag)", shed, crit)
		}
		_, err := c.ShouldRateLimit(ctx, &rls.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("api", "", "criticality", "urgent")}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `criticality "urgent"`) {
			t.Errorf("an unknown class: %v, want INVALID_ARGUMENT naming it", err)
		}
	})
}
