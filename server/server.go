package server

// The Server: its options, New and Check, the rules a config installs, decisions, and
// the start and shutdown of its listeners (the line protocol is in line.go, reloads in
// reload.go).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/local"
)

// Server is the daemon: the line protocol, the HTTP API and the metrics, over one back
// end. Make one with New, start it with Start, stop it with Shutdown (or Serve, which does
// both around a context). Its methods are safe for concurrent use.
type Server struct {
	log    *slog.Logger
	clock  clock.Clock
	tracer *tracing // nil: decisions are not traced
	be     backend.Backend
	ownBE  bool
	local  *local.Backend // when the back end is the local one: for key counts

	mu    sync.Mutex // guards cfg and reloads
	cfg   Config
	rules atomic.Pointer[ruleSet]
	token atomic.Pointer[string]
	live  atomic.Pointer[liveConfig] // what requests read of the config, without s.mu

	m      *metrics
	penLog logSampler // penalties are logged, but not every one of a flood

	healthEvery time.Duration         // how often the back end's health is checked (a Pinger)
	down        atomic.Pointer[int64] // when the back end was found down (clock Nanotime); nil while up
	keys        keyCount              // the back end's keys, counted now and then (a KeyCounter)
	stopCtx     context.Context       // ends at Shutdown: the health monitor stops
	stop        context.CancelFunc

	lineLn   net.Listener
	httpLn   net.Listener
	httpSrv  *httpServer
	adminLn  net.Listener
	adminSrv *httpServer
	grpcLn   net.Listener
	grpc     *grpcServer
	conns    sync.Map // *conn -> struct{}
	nconns   atomic.Int64
	closing  atomic.Bool
	wg       sync.WaitGroup // accept loops and connections
	stopOnce sync.Once
}

// Option configures a Server.
type Option interface{ apply(*Server) }

type optionFunc func(*Server)

func (f optionFunc) apply(s *Server) { f(s) }

// WithLogger sets the logger (default: per the config's log_format and log_level, to
// stderr).
func WithLogger(l *slog.Logger) Option { return optionFunc(func(s *Server) { s.log = l }) }

// WithClock sets the clock of the local back end and of decisions (tests use a virtual
// one).
func WithClock(c clock.Clock) Option { return optionFunc(func(s *Server) { s.clock = c }) }

// WithBackend makes the server decide in b (the caller keeps ownership: Shutdown does not
// close it). Without it the server builds the local back end; any other back end the
// config names (redis, ...) must be built by the caller and passed here, as the sluice
// command does.
func WithBackend(b backend.Backend) Option { return optionFunc(func(s *Server) { s.be = b }) }

// WithHealthEvery sets how often a back end that depends on something remote (Redis, a
// lease store) is checked (default DefaultHealthEvery). Each change, down or up, is logged
// once, with the fail mode in force, and sets sluice_backend_up.
func WithHealthEvery(d time.Duration) Option {
	return optionFunc(func(s *Server) {
		if d > 0 {
			s.healthEvery = d
		}
	})
}

// DefaultHealthEvery is how often the back end's health is checked.
const DefaultHealthEvery = time.Second

// NewLogger returns the logger a config asks for, writing to w.
func NewLogger(cfg Config, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: lvl}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// New checks cfg and builds a server; it listens only on Start.
func New(cfg Config, opts ...Option) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{clock: clock.Default, cfg: cfg, healthEvery: DefaultHealthEvery}
	s.stopCtx, s.stop = context.WithCancel(context.Background())
	for _, o := range opts {
		o.apply(s)
	}
	if s.log == nil {
		s.log = NewLogger(cfg, os.Stderr)
	}
	if s.be == nil {
		if cfg.Backend != "local" {
			return nil, fmt.Errorf("sluice serve: backend %s: build it and pass it with WithBackend", cfg.Backend)
		}
		s.local = local.New(local.WithClock(s.clock), local.WithMaxKeys(cfg.MaxKeys), local.WithEvictLive())
		s.be = s.local
		s.ownBE = true
	} else if lb, ok := s.be.(*local.Backend); ok {
		s.local = lb
	}
	var keys func() float64
	switch kc, ok := s.be.(backend.KeyCounter); {
	case s.local != nil:
		keys = func() float64 { return float64(s.local.Len()) }
	case ok:
		s.keys.counter = kc
		keys = s.keys.read
	}
	s.m = newMetrics(
		keys,
		func() float64 {
			if s.local != nil {
				return float64(s.local.Evicted())
			}
			return 0
		},
		func() float64 {
			if s.local != nil {
				return float64(s.local.EvictedLive())
			}
			return 0
		},
	)
	if c, ok := s.be.(prometheus.Collector); ok { // a back end's own figures (gossip: peers, messages)
		if err := s.m.reg.Register(c); err != nil {
			return nil, fmt.Errorf("sluice serve: the back end's metrics: %w", err)
		}
	}
	if err := s.apply(cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// Check reports whether cfg would start, without listening or reaching its back end: it
// validates cfg, compiles the rules, builds each rule's limiter (logging to log what a
// start would warn of, such as a margin that eats a rule's rate) and reads the token file.
// It checks the rules on the in-process back end; CheckOn checks them on another.
func Check(cfg Config, log *slog.Logger) error { return CheckOn(cfg, log, nil) }

// CheckOn is Check for a daemon on back end like (nil: the in-process one): it also
// refuses a rule whose limits like does not decide (a windowed quota or a ramp; see
// limitconv.Supports), as starting on it would. Only like's type is asked: a backend not
// connected, or a nil pointer of its type, will do. `sluice serve --check-config` runs it.
func CheckOn(cfg Config, log *slog.Logger, like backend.Backend) error {
	lb := local.New(local.WithMaxKeys(max(cfg.MaxKeys, 1)))
	defer lb.Close()
	s, err := New(cfg, WithLogger(log), WithBackend(lb))
	if err != nil {
		return err
	}
	s.stop()
	if like == nil {
		return nil
	}
	rs, err := cfg.ruleSet()
	if err != nil {
		return err
	}
	for _, c := range rs.rules {
		if c.noLimit() {
			continue
		}
		if err := limitconv.Supports(like, c.Limit); err != nil {
			return fmt.Errorf("rule %q: %w (--backend %s)", c.Name, err, cfg.Backend)
		}
	}
	return nil
}

// apply installs a config's rules and token.
// It is called with s.mu held, or before the server is shared.
func (s *Server) apply(cfg Config) error {
	rs, err := cfg.ruleSet()
	if err != nil {
		return err
	}
	fm, _ := backend.ParseFailMode(cfg.FailMode) // local: the back end answers failures itself
	for _, c := range rs.rules {
		c.counters = s.m.forRule(c.Name)
		rpu, unit := envoyLimit(c.Limit)
		c.envoyRPU, c.envoyUnit = rpu, envoyUnitEnum[unit]
		if c.DetailedMetrics {
			c.detailed = s.m.forTags(c.Name)
		}
		if c.noLimit() {
			continue // no bucket, no penalties
		}
		opts := []sluice.Option{sluice.WithBackend(s.be), sluice.WithClock(s.clock), sluice.WithFailMode(fm),
			sluice.WithMargin(cfg.Margin.D()), sluice.WithObserver(s.m.observe),
			sluice.WithLogger(s.log.With("rule", c.Name)), // a margin that eats a rule's rate is logged
			sluice.WithMaxKeys(cfg.MaxKeys)}               // bounds the penalties each limiter remembers
		at, ok := s.rampOf(c.Name, c.Limit) // a reload goes on with the rule's ramp
		if !ok {
			at = s.clock.Now()
		}
		c.rampStart = at
		opts = append(opts, sluice.WithRampStart(at))
		lim, err := sluice.New(c.Limit, opts...)
		if err != nil {
			return fmt.Errorf("rule %q: %w", c.Name, err)
		}
		c.limiter = lim
		pc := c.MaxPenalty
		if pc.IsZero() {
			pc = cfg.MaxPenalty
		}
		c.penMax, c.penOK = pc.limit(c.Limit)
	}
	var tok string
	if cfg.HTTPTokenFile != "" {
		if tok, err = readToken(cfg.HTTPTokenFile); err != nil {
			return err
		}
	}
	s.rules.Store(rs)
	s.token.Store(&tok)
	s.live.Store(&liveConfig{maxLine: cfg.MaxLine, grpcHeaders: cfg.GRPC.ResponseHeaders, priorityEntry: cfg.GRPC.PriorityEntry})
	s.cfg = cfg
	return nil
}

// rampOf returns when the ramp of the rule in force named name started, if it has the
// same ramps as limits: a reload keeps a ramp going rather than start it again.
func (s *Server) rampOf(name string, limits sluice.Limits) (time.Time, bool) {
	old := s.rules.Load()
	if old == nil {
		return time.Time{}, false
	}
	for _, c := range old.rules {
		if c.Name == name && c.limiter != nil && limitconv.SameRamps(c.Limit, limits) {
			return c.rampStart, true
		}
	}
	return time.Time{}, false
}

// liveConfig is what requests read of the config in force.
type liveConfig struct {
	maxLine       int    // the longest tag, newline included
	grpcHeaders   bool   // gRPC answers carry x-ratelimit-* headers
	priorityEntry string // the descriptor entry that carries a request's class ("": none)
}

// Config returns the config in force.
func (s *Server) Config() Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg
}

// Decision is the daemon's answer to one query.
type Decision struct {
	sluice.Decision
	Rule   string        // the rule that decided; "" if none matched (allowed)
	Limits sluice.Limits // that rule's limits
	Slot   int64         // for a grant asked with a stamp: its slot in the back end's time base
	rule   *compiled     // the rule that decided, if any
}

// why says what decided where no limit did (the line protocol's why=): no rule, an
// unlimited or deny rule, or a back end that could not decide (err); "" for a limit.
func (d Decision) why(err error) string {
	switch {
	case d.rule == nil:
		return wire.WhyNoRule
	case d.rule.Unlimited:
		return wire.WhyUnlimited
	case d.rule.Deny:
		return wire.WhyDeny
	case err != nil && !errors.Is(err, gcra.ErrCostExceedsBurst): // that one is the request's
		return wire.WhyDown
	}
	return ""
}

// Decide decides n permits for tag (n = 0 is a query of the state), now or, with maxWait
// > 0, as a reservation up to maxWait ahead (the decision's Delay says when).
func (s *Server) Decide(ctx context.Context, tag string, n int64, maxWait time.Duration) (Decision, error) {
	return s.decide(ctx, tag, n, maxWait, false)
}

func (s *Server) decide(ctx context.Context, tag string, n int64, maxWait time.Duration, stamp bool) (Decision, error) {
	if s.tracer != nil {
		return s.decideTraced(ctx, tag, n, maxWait.Milliseconds(), stamp, func(ctx context.Context) (Decision, error) {
			return s.decideNow(ctx, tag, n, maxWait, stamp)
		})
	}
	return s.decideNow(ctx, tag, n, maxWait, stamp)
}

func (s *Server) decideNow(ctx context.Context, tag string, n int64, maxWait time.Duration, stamp bool) (Decision, error) {
	c := s.rules.Load().lookup(tag)
	if c == nil {
		if n > 0 {
			s.m.unmatched.Inc()
		}
		return Decision{Decision: sluice.Decision{Allowed: true}, Slot: -1}, nil
	}
	var d sluice.Decision
	var err error
	slot := int64(-1)
	switch {
	case c.Unlimited:
		d = sluice.Decision{Allowed: true}
	case c.Deny:
		d = sluice.Decision{}
	case maxWait > 0 || stamp:
		var r *sluice.Reservation
		r, err = c.limiter.ReserveWithin(ctx, c.key(tag), n, maxWait)
		d = r.Decision
		if stamp && err == nil && d.Allowed {
			slot = r.Slot()
		}
	default:
		d, err = c.limiter.AllowN(ctx, c.key(tag), n)
	}
	if n == 0 { // a look at the state, not a decision
		return Decision{Decision: d, Rule: c.Name, Limits: c.Limit, Slot: slot, rule: c}, err
	}
	result := resultAllowed
	switch {
	case err != nil:
		result = resultError
	case !d.Allowed && c.Shadow:
		result = resultShadowed
		d.Allowed, d.RetryAfter, d.Delay = true, 0, 0
	case !d.Allowed:
		result = resultDenied
	}
	c.counters.count(result)
	if c.detailed != nil {
		c.detailed.count(tag, result)
	}
	return Decision{Decision: d, Rule: c.Name, Limits: c.Limit, Slot: slot, rule: c}, err
}

// Start listens on the configured addresses and serves in the background.
func (s *Server) Start() error {
	cfg := s.Config()
	var lns []net.Listener
	fail := func(what string, err error) error {
		for _, ln := range lns {
			ln.Close()
		}
		s.lineLn, s.httpLn, s.adminLn, s.grpcLn = nil, nil, nil, nil
		return fmt.Errorf("sluice serve: %s: %w", what, err)
	}
	if cfg.ListenLine != "" {
		ln, err := listen(cfg.ListenLine)
		if err != nil {
			return fail("listen_line", err)
		}
		s.lineLn, lns = ln, append(lns, ln)
	}
	if cfg.ListenHTTP != "" {
		ln, err := net.Listen("tcp", cfg.ListenHTTP)
		if err != nil {
			return fail("listen_http", err)
		}
		s.httpLn, lns = ln, append(lns, ln)
	}
	if cfg.ListenAdmin != "" {
		ln, err := net.Listen("tcp", cfg.ListenAdmin)
		if err != nil {
			return fail("listen_admin", err)
		}
		s.adminLn, lns = ln, append(lns, ln)
	}
	if cfg.ListenGRPC != "" {
		ln, err := net.Listen("tcp", cfg.ListenGRPC)
		if err != nil {
			return fail("listen_grpc", err)
		}
		s.grpcLn = ln
	}
	if s.lineLn != nil {
		s.wg.Add(1)
		go s.acceptLoop(s.lineLn)
	}
	if s.httpLn != nil {
		s.httpSrv = s.newHTTPServer()
		s.serveHTTP(s.httpSrv, s.httpLn)
	}
	if s.adminLn != nil {
		s.adminSrv = s.newAdminServer()
		s.serveHTTP(s.adminSrv, s.adminLn)
	}
	if s.grpcLn != nil {
		s.grpc = s.newGRPCServer(cfg)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.grpc.serve(s.grpcLn); err != nil {
				s.log.Error("grpc server", "addr", s.grpcLn.Addr().String(), "err", err)
			}
		}()
	}
	s.m.reloadTime.Set(float64(time.Now().UnixNano()) / 1e9)
	s.log.Info("serving", "line", addrString(s.lineLn), "http", addrString(s.httpLn), "admin", addrString(s.adminLn),
		"grpc", addrString(s.grpcLn), "backend", cfg.Backend, "rules", len(cfg.Rules), "fail_mode", cfg.FailMode)
	if cfg.Backend == "local" && len(cfg.Rules) > 0 {
		// The local mode's envelope is one process (docs/guarantees.md): said at the start,
		// since two daemons each holding the whole limit cannot see each other.
		s.log.Info(localAloneNote)
	}
	if *s.token.Load() != "" && s.adminLn == nil && s.httpLn != nil {
		s.log.Info("the HTTP token guards /readyz and /metrics too: set listen_admin (--listen-admin) to serve them without it to probes and scrapers")
	}
	if p, ok := s.be.(backend.Pinger); ok {
		s.checkHealth(p) // a back end down at start is logged now
		s.wg.Add(1)
		go s.monitorHealth(p)
	}
	return nil
}

// serveHTTP serves h on ln in the background until Shutdown.
func (s *Server) serveHTTP(h *httpServer, ln net.Listener) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := h.srv.Serve(ln); err != nil && !errors.Is(err, errHTTPClosed) {
			s.log.Error("http server", "addr", ln.Addr().String(), "err", err)
		}
	}()
}

// monitorHealth checks the back end every healthEvery until Shutdown.
func (s *Server) monitorHealth(p backend.Pinger) {
	defer s.wg.Done()
	t := s.clock.NewTimer(s.healthEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stopCtx.Done():
			return
		case <-t.C():
		}
		s.checkHealth(p)
		t.Reset(s.healthEvery)
	}
}

// checkHealth pings the back end and logs a change, once: down (with the fail mode that
// answers meanwhile) or up again (with how long it was down).
func (s *Server) checkHealth(p backend.Pinger) {
	err := p.Ping(s.stopCtx)
	if s.stopCtx.Err() != nil {
		return // shutting down: not the back end's failure
	}
	cfg := s.Config()
	now := s.clock.Nanotime()
	switch since := s.down.Load(); {
	case err != nil && since == nil:
		s.down.Store(&now)
		s.m.backendUp.Set(0)
		s.grpc.setServing(false)
		attrs := []any{"backend", cfg.Backend, "fail_mode", cfg.FailMode, "err", err}
		if cfg.FailMode == "local" {
			attrs = append(attrs, "fallback_share", cfg.FallbackShare)
		}
		s.log.Warn("backend unavailable: answers follow the fail mode until it is back", attrs...)
	case err == nil && since != nil:
		s.down.Store(nil)
		s.m.backendUp.Set(1)
		s.grpc.setServing(true)
		s.log.Info("backend available again", "backend", cfg.Backend, "down_for", time.Duration(now-*since).Round(time.Millisecond))
	}
}

// listen opens a TCP address, or a Unix socket for a path (one with a '/').
func listen(addr string) (net.Listener, error) {
	if strings.Contains(addr, "/") {
		_ = os.Remove(addr) // a stale socket from a previous run
		return net.Listen("unix", addr)
	}
	return net.Listen("tcp", addr)
}

// localAloneNote is what a daemon in the local mode says as it starts.
const localAloneNote = "backend local decides each limit in this daemon alone: daemons or processes that share one limit share it through backend strict, lease or gossip (docs/guarantees.md)"

func addrString(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}

// LineAddr is the line protocol's address (nil if not listening).
func (s *Server) LineAddr() net.Addr {
	if s.lineLn == nil {
		return nil
	}
	return s.lineLn.Addr()
}

// AdminAddr is the admin listener's address (nil if not listening).
func (s *Server) AdminAddr() net.Addr {
	if s.adminLn == nil {
		return nil
	}
	return s.adminLn.Addr()
}

// GRPCAddr is the gRPC listener's address (nil if not listening).
func (s *Server) GRPCAddr() net.Addr {
	if s.grpcLn == nil {
		return nil
	}
	return s.grpcLn.Addr()
}

// HTTPAddr is the HTTP API's address (nil if not listening).
func (s *Server) HTTPAddr() net.Addr {
	if s.httpLn == nil {
		return nil
	}
	return s.httpLn.Addr()
}

// Serve starts the server and runs it until ctx ends, then shuts it down gracefully.
func (s *Server) Serve(ctx context.Context) error {
	if err := s.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	return s.Shutdown(context.Background())
}

// Shutdown stops accepting, answers every query already read on every connection, closes
// them, and releases the back end it built. It waits at most the config's shutdown grace
// (or until ctx ends), then closes what is left.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.stopOnce.Do(func() {
		cfg := s.Config()
		s.closing.Store(true)
		s.stop()
		if s.lineLn != nil {
			s.lineLn.Close()
		}
		ctx, cancel := context.WithTimeout(ctx, cfg.ShutdownGrace.D())
		defer cancel()
		grpcDone := s.grpc.stop(ctx) // in parallel with the rest
		for _, h := range []*httpServer{s.httpSrv, s.adminSrv} {
			if h != nil {
				_ = h.srv.Shutdown(ctx)
			}
		}
		// Wake every connection blocked in a read: it answers what it has buffered and
		// closes.
		s.conns.Range(func(k, _ any) bool {
			k.(*conn).c.SetReadDeadline(time.Now())
			return true
		})
		done := make(chan struct{})
		go func() { <-grpcDone; s.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			s.conns.Range(func(k, _ any) bool { k.(*conn).c.Close(); return true })
			<-done
			err = fmt.Errorf("sluice serve: shutdown: %w", ctx.Err())
		}
		if s.ownBE {
			if cerr := s.be.Close(); cerr != nil && err == nil {
				err = cerr
			}
		}
		if s.lineLn != nil && s.lineLn.Addr().Network() == "unix" {
			_ = os.Remove(s.lineLn.Addr().String())
		}
		s.log.Info("stopped")
	})
	return err
}
