package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/h2grpc"
	"github.com/sluicehq/sluice/priority"
)

// MaxDescriptors is the most descriptors one ShouldRateLimit request may carry; a request
// with more is refused (InvalidArgument).
const MaxDescriptors = 64

// grpcWorkersPerCPU is how many goroutines per CPU serve gRPC calls (grpc.NumStreamWorkers).
const grpcWorkersPerCPU = 4

// The gRPC listener's bounds: the bytes of a request's header list, and the time a new
// connection has to send its preface.
const (
	grpcMaxHeaderList    = 16 << 10
	grpcHandshakeTimeout = 10 * time.Second
)

// rlsServiceName is Envoy's rate limit service, as the health service names it.
const rlsServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// grpcServer is the gRPC listener: Envoy's rate limit service (ShouldRateLimit), the
// standard health service, and reflection when asked for. It is served by the lean
// transport (internal/h2grpc) or by grpc-go's server (grpc.transport; docs/envoy.md).
type grpcServer struct {
	srv    *grpc.Server   // grpc-go's, or nil
	lean   *h2grpc.Server // the lean transport's, or nil
	svc    *rlsService
	health *health.Server
	s      *Server
	conns  atomic.Int64
}

func (s *Server) newGRPCServer(cfg Config) *grpcServer {
	g := &grpcServer{s: s, health: health.NewServer()}
	if cfg.GRPC.Transport == "lean" && !cfg.GRPC.Reflection && s.tracer == nil {
		g.svc = &rlsService{s: s, pooled: true}
		g.lean = h2grpc.New(h2grpc.Config{
			MaxStreams:       cfg.GRPC.MaxStreams,
			MaxMessage:       cfg.GRPC.MaxMessage,
			MaxHeaderList:    grpcMaxHeaderList,
			IdleTimeout:      cfg.IdleTimeout.D(),
			WriteTimeout:     cfg.WriteTimeout.D(),
			HandshakeTimeout: grpcHandshakeTimeout,
			Inline:           s.local != nil, // the back end is the local one: it decides in process, never waits
		}, g.leanCall)
		g.setServing(s.down.Load() == nil)
		return g
	}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(cfg.GRPC.MaxMessage),
		grpc.MaxConcurrentStreams(cfg.GRPC.MaxStreams),
		grpc.MaxHeaderListSize(grpcMaxHeaderList),
		grpc.ConnectionTimeout(grpcHandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: cfg.IdleTimeout.D()}),
		grpc.ChainUnaryInterceptor(g.authUnary),
		grpc.ChainStreamInterceptor(g.authStream),
		// Calls are served by long-lived goroutines instead of one new goroutine each,
		// whose stack grew on every call (a tenth of the server's CPU); a call that finds
		// every worker busy, as while the strict mode waits for Redis, still gets its own.
		grpc.NumStreamWorkers(uint32(grpcWorkersPerCPU * runtime.GOMAXPROCS(0))),
	}
	if s.tracer != nil {
		opts = append(opts, grpc.StatsHandler(s.tracer.grpcHandler()))
	}
	svc := &rlsService{s: s, pooled: s.tracer == nil}
	// The rate limit service's codec, and its handler with messages kept from one call to
	// the next (see rlscodec.go). A stats handler (the tracer's) may read a response after
	// it is encoded: then responses are not recycled.
	opts = append(opts, grpc.ForceServerCodecV2(newRLSCodec()))
	g.srv = grpc.NewServer(opts...)
	g.srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: rlsServiceName,
		HandlerType: (*rls.RateLimitServiceServer)(nil),
		Methods:     []grpc.MethodDesc{{MethodName: "ShouldRateLimit", Handler: svc.handle}},
		Metadata:    "envoy/service/ratelimit/v3/rls.proto",
	}, svc)
	healthpb.RegisterHealthServer(g.srv, g.health)
	g.setServing(s.down.Load() == nil)
	if cfg.GRPC.Reflection {
		reflection.Register(g.srv)
	}
	return g
}

// setServing sets what the health service answers (nil g: no gRPC listener).
func (g *grpcServer) setServing(ok bool) {
	if g == nil {
		return
	}
	st := healthpb.HealthCheckResponse_SERVING
	if !ok {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	g.health.SetServingStatus("", st)
	g.health.SetServingStatus(rlsServiceName, st)
}

// stop stops the gRPC server gracefully (calls in flight are answered), or at once when
// ctx ends first. The channel closes when it has stopped (at once for a nil g).
func (g *grpcServer) stop(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	if g == nil {
		close(done)
		return done
	}
	g.health.Shutdown() // NOT_SERVING from now on
	graceful, now := g.srv.GracefulStop, g.srv.Stop
	if g.lean != nil {
		graceful, now = g.lean.GracefulStop, g.lean.Stop
	}
	go func() {
		defer close(done)
		stopped := make(chan struct{})
		go func() { graceful(); close(stopped) }()
		select {
		case <-stopped:
		case <-ctx.Done():
			now()
			<-stopped
		}
	}()
	return done
}

// serve serves ln until the server stops.
func (g *grpcServer) serve(ln net.Listener) error {
	if g.lean != nil {
		return g.lean.Serve(g.limit(ln))
	}
	return g.srv.Serve(g.limit(ln))
}

// The methods the lean transport serves.
const (
	shouldRateLimitMethod = "/" + rlsServiceName + "/ShouldRateLimit"
	healthCheckMethod     = healthPrefix + "Check"
)

// leanCall answers a call of the lean transport (an h2grpc.Handler): ShouldRateLimit, the
// health service's Check; any other method is Unimplemented, as grpc-go answers a method
// it does not serve.
func (g *grpcServer) leanCall(ctx context.Context, c *h2grpc.Call, out []byte) ([]byte, error) {
	switch c.Method {
	case shouldRateLimitMethod:
		if err := g.tokenOK(c.Authorization); err != nil {
			return out, err
		}
		return g.svc.appendAnswer(ctx, c.Message, out)
	case healthCheckMethod:
		var req healthpb.HealthCheckRequest
		if err := proto.Unmarshal(c.Message, &req); err != nil {
			return out, status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
		}
		resp, err := g.health.Check(ctx, &req)
		if err != nil {
			return out, err
		}
		return proto.MarshalOptions{}.MarshalAppend(out, resp)
	}
	return out, status.Errorf(codes.Unimplemented, "unknown method %s", c.Method)
}

// limit bounds the gRPC connections at max_connections: more are closed at once (and
// counted in sluice_connections_refused_total).
func (g *grpcServer) limit(ln net.Listener) net.Listener { return &limitListener{Listener: ln, g: g} }

type limitListener struct {
	net.Listener
	g *grpcServer
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.g.conns.Add(1) > int64(l.g.s.Config().MaxConnections) {
			l.g.conns.Add(-1)
			l.g.s.m.connsRefused.Inc()
			c.Close()
			continue
		}
		return &countedConn{Conn: c, n: &l.g.conns}, nil
	}
}

type countedConn struct {
	net.Conn
	n    *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.n.Add(-1) })
	return c.Conn.Close()
}

// authorized checks the bearer token, when one is set, in the call's metadata
// ("authorization: Bearer TOKEN"), for every service but health.
func (g *grpcServer) authorized(ctx context.Context, method string) error {
	if len(method) > len(healthPrefix) && method[:len(healthPrefix)] == healthPrefix {
		return nil
	}
	if *g.s.token.Load() == "" {
		return nil // no token to check: the metadata is not read (its copy costs allocations)
	}
	var got string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			got = v[0]
		}
	}
	return g.tokenOK(got)
}

// tokenOK checks an authorization header's value ("Bearer TOKEN") against the token, if
// one is set.
func (g *grpcServer) tokenOK(authorization string) error {
	if !g.s.tokenOK(authorization) {
		g.s.m.grpcCalls[grpcUnauthenticated].Inc()
		return status.Error(codes.Unauthenticated, "sluice: a bearer token is required")
	}
	return nil
}

const healthPrefix = "/grpc.health.v1.Health/"

func (g *grpcServer) authUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := g.authorized(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (g *grpcServer) authStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := g.authorized(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return h(srv, ss)
}

// The outcomes of gRPC calls, as sluice_grpc_requests_total labels them.
const (
	grpcOK = iota
	grpcOverLimit
	grpcInvalid
	grpcUnauthenticated
	nGRPCOutcomes
)

var grpcOutcomeNames = [nGRPCOutcomes]string{"ok", "over_limit", "invalid_argument", "unauthenticated"}

func newGRPCCounters(vec *prometheus.CounterVec) (c [nGRPCOutcomes]prometheus.Counter) {
	for i, name := range grpcOutcomeNames {
		c[i] = vec.WithLabelValues(name)
	}
	return c
}

// rlsService is Envoy's rate limit service over the server's rules.
type rlsService struct {
	rls.UnimplementedRateLimitServiceServer
	s      *Server
	pooled bool // handle answers with recycled responses (*rlsAnswer)
}

// requests are ShouldRateLimit's requests, kept from one call to the next with their
// descriptors and entries (the codec decodes into them: see decodeRequest).
var requests = sync.Pool{New: func() any { return new(rls.RateLimitRequest) }}

// shouldRateLimitInfo is the UnaryServerInfo of every call, made once.
var shouldRateLimitInfo = &grpc.UnaryServerInfo{FullMethod: rls.RateLimitService_ShouldRateLimit_FullMethodName}

// handle is ShouldRateLimit's gRPC handler (a grpc.MethodHandler): the generated one's
// work, with a request from the pool, and a recycled response (an *rlsAnswer, which the
// codec encodes and recycles) when r.pooled.
func (r *rlsService) handle(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := requests.Get().(*rls.RateLimitRequest)
	defer requests.Put(in) // the answer holds nothing of it
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return r.answerAny(ctx, in)
	}
	return interceptor(ctx, in, shouldRateLimitInfo, r.answerAny)
}

// answerAny answers req (an *rls.RateLimitRequest): an *rlsAnswer when r.pooled, else its
// response.
func (r *rlsService) answerAny(ctx context.Context, req any) (any, error) {
	a, err := r.answer(ctx, req.(*rls.RateLimitRequest))
	if err != nil || r.pooled {
		return a, err
	}
	return &a.resp, nil
}

// envoyUnitEnum maps the units of envoyUnits to the API's.
var envoyUnitEnum = map[string]rls.RateLimitResponse_RateLimit_Unit{
	"second": rls.RateLimitResponse_RateLimit_SECOND,
	"minute": rls.RateLimitResponse_RateLimit_MINUTE,
	"hour":   rls.RateLimitResponse_RateLimit_HOUR,
	"day":    rls.RateLimitResponse_RateLimit_DAY,
	"week":   rls.RateLimitResponse_RateLimit_WEEK,
	"month":  rls.RateLimitResponse_RateLimit_MONTH,
	"year":   rls.RateLimitResponse_RateLimit_YEAR,
}

// invalid refuses a request: counted, and answered InvalidArgument with the reason.
func (r *rlsService) invalid(reason, format string, a ...any) error {
	r.s.m.badInput.WithLabelValues(reason).Inc()
	r.s.m.grpcCalls[grpcInvalid].Inc()
	return status.Errorf(codes.InvalidArgument, "sluice: "+format, a...)
}

// ShouldRateLimit decides each descriptor of the request as one tag (EnvoyTag) by the
// rules, taking hits_addend permits (1 if 0; a descriptor's own hits_addend wins), and
// answers each descriptor's status, OVER_LIMIT overall if any is. A descriptor no rule
// matches is OK without a limit. A cost above the rule's burst can never be granted: it
// is OVER_LIMIT (and counted as a bad query). A back-end failure is answered by the fail
// mode (closed: OVER_LIMIT), never as an error Envoy would read as its own failure mode.
// Each descriptor is decided on its own: one that allows the request is charged even if
// another refuses it, as envoyproxy/ratelimit does.
func (r *rlsService) ShouldRateLimit(ctx context.Context, req *rls.RateLimitRequest) (*rls.RateLimitResponse, error) {
	a, err := r.answer(ctx, req)
	if err != nil {
		return nil, err
	}
	return &a.resp, nil // never recycled
}

// answer is ShouldRateLimit's answer to req, in an answer from the pool (nil on error).
func (r *rlsService) answer(ctx context.Context, req *rls.RateLimitRequest) (*rlsAnswer, error) {
	s := r.s
	switch n := len(req.GetDescriptors()); {
	case req.GetDomain() == "":
		return nil, r.invalid("grpc_bad_request", "domain: empty")
	case n == 0:
		return nil, r.invalid("grpc_bad_request", "descriptors: none")
	case n > MaxDescriptors:
		return nil, r.invalid("grpc_too_many_descriptors", "descriptors: %d, at most %d", n, MaxDescriptors)
	}
	live := s.live.Load()
	hits := int64(req.GetHitsAddend())
	if hits == 0 {
		hits = 1
	}
	a := newAnswer(len(req.Descriptors))
	resp := &a.resp
	invalid := func(reason, format string, args ...any) (*rlsAnswer, error) {
		a.release()
		return nil, r.invalid(reason, format, args...)
	}
	var tightest *rls.RateLimitResponse_DescriptorStatus
	var tag [128]byte
	buf := tag[:0]
	for i, d := range req.Descriptors {
		switch {
		case len(d.GetEntries()) == 0:
			return invalid("grpc_bad_request", "descriptors[%d]: no entries", i)
		case d.GetLimit() != nil:
			return invalid("grpc_bad_request", "descriptors[%d].limit: limit overrides are not supported: the daemon's rules decide", i)
		case d.GetIsNegativeHits():
			return invalid("grpc_bad_request", "descriptors[%d].is_negative_hits: not supported: permits are not given back", i)
		}
		n := hits
		if h := d.GetHitsAddend(); h != nil {
			n = int64(min(h.GetValue(), math.MaxInt64))
		}
		buf = appendTagPart(buf[:0], req.Domain)
		class := priority.Standard
		for j, e := range d.Entries {
			if e.GetKey() == "" {
				return invalid("grpc_bad_request", "descriptors[%d].entries[%d].key: empty", i, j)
			}
			if live.priorityEntry != "" && e.Key == live.priorityEntry {
				c, err := priority.Parse(e.Value)
				if err != nil {
					return invalid("grpc_bad_request", "descriptors[%d].entries[%d]: %s %q: want critical, standard or sheddable", i, j, e.Key, e.Value)
				}
				class = c
				continue // the class, not part of the tag
			}
			buf = appendEntry(buf, e.Key, e.Value)
			if len(buf) >= live.maxLine {
				return invalid("too_long", "descriptors[%d]: its tag is longer than max_line (%d bytes)", i, live.maxLine-1)
			}
		}
		dctx := ctx
		if class != priority.Standard {
			dctx = priority.With(ctx, class)
		}
		dec, err := s.decide(dctx, string(buf), n, 0, false)
		st := resp.Statuses[i]
		if errors.Is(err, gcra.ErrCostExceedsBurst) {
			s.m.badInput.WithLabelValues("cost_over_burst").Inc()
		}
		if err != nil || !dec.Allowed {
			st.Code = rls.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rls.RateLimitResponse_OVER_LIMIT
		}
		if c := dec.rule; c != nil && !c.Unlimited {
			l, reset := a.limits[i], a.resets[i]
			l.Name, l.RequestsPerUnit, l.Unit = c.Name, c.envoyRPU, c.envoyUnit
			reset.Seconds, reset.Nanos = durationParts(dec.ResetAfter)
			st.CurrentLimit, st.DurationUntilReset = l, reset
			st.LimitRemaining = uint32(min(max(dec.Remaining, 0), math.MaxUint32))
			if tightest == nil || st.LimitRemaining < tightest.LimitRemaining {
				tightest = st
			}
		}
	}
	if live.grpcHeaders && tightest != nil {
		resp.ResponseHeadersToAdd = rateLimitHeaders(tightest)
	}
	if resp.OverallCode == rls.RateLimitResponse_OK {
		s.m.grpcCalls[grpcOK].Inc()
	} else {
		s.m.grpcCalls[grpcOverLimit].Inc()
	}
	return a, nil
}

// durationParts is d as durationpb.New writes it: whole seconds, and nanoseconds of the
// same sign.
func durationParts(d time.Duration) (int64, int32) {
	return int64(d / time.Second), int32(d % time.Second)
}

// rateLimitHeaders are the x-ratelimit-* headers of a descriptor's status, in the form
// envoyproxy/ratelimit sends: the limit with its window ("10, 10;w=60"), the requests
// remaining, and the seconds until the limit is whole again.
func rateLimitHeaders(st *rls.RateLimitResponse_DescriptorStatus) []*corev3.HeaderValue {
	rpu := strconv.FormatUint(uint64(st.CurrentLimit.RequestsPerUnit), 10)
	w := int64(unitPeriod(st.CurrentLimit.Unit) / time.Second)
	reset := st.DurationUntilReset.AsDuration()
	return []*corev3.HeaderValue{
		{Key: "x-ratelimit-limit", Value: fmt.Sprintf("%s, %s;w=%d", rpu, rpu, w)},
		{Key: "x-ratelimit-remaining", Value: strconv.FormatUint(uint64(st.LimitRemaining), 10)},
		{Key: "x-ratelimit-reset", Value: strconv.FormatInt(int64((reset+time.Second-1)/time.Second), 10)},
	}
}

// unitPeriod is the period of an Envoy unit.
func unitPeriod(u rls.RateLimitResponse_RateLimit_Unit) time.Duration {
	for name, e := range envoyUnitEnum {
		if e == u {
			return envoyUnits[name]
		}
	}
	return time.Second
}
