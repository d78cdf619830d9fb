package cli

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gossip"
	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/internal/yamlx"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/strict"
	"github.com/sluicehq/sluice/strict/cas"
)

// backendLike stands in for the back end a config names in `--check-config`, which
// reaches none: a nil pointer of the type serveBackend makes, whose method set says which
// limits it decides (backend.Capabilities); nil for local.
func backendLike(cfg server.Config) backend.Backend {
	switch cfg.Backend {
	case "strict":
		if cfg.StrictOnRedis() {
			return (*strict.Backend)(nil)
		}
		return (*cas.Backend)(nil)
	case "lease":
		return (*lease.Backend)(nil)
	case "gossip":
		return (*gossip.Backend)(nil)
	}
	return nil
}

// serveBackend builds the back end a config names, other than local (which the server
// builds itself): nil for local. The caller closes it after the server's shutdown.
func serveBackend(cfg server.Config, clk clock.Clock, log *slog.Logger) (backend.Backend, error) {
	switch cfg.Backend {
	case "local":
		return nil, nil
	case "strict":
		if cfg.Store == "memory://" {
			return cas.New(store.NewMemory(clk)), nil // one daemon alone
		}
		opts := []strict.Option{strict.WithTimeout(cfg.RedisTimeout.D()), strict.WithClock(clk)}
		if cfg.StrictOnRedis() {
			opts = append(opts, strict.WithReplicaAcks(cfg.RedisAcks, 0))
			if cfg.FailMode == "local" {
				opts = append(opts, strict.WithFailLocal(cfg.FallbackShare))
			}
		} else {
			opts = []strict.Option{strict.WithPrefix("sluice:strict:")}
		}
		// Open, not Dial: the daemon starts while its store is down, answers by its fail
		// mode, and reports not ready (/readyz) until the store answers.
		return strict.Open(cfg.Store, opts...)
	case "lease":
		st, closeStore, err := openStore(cfg.Store, "sluice:lease:")
		if err != nil {
			return nil, err
		}
		if st == nil {
			st = store.NewMemory(clk) // one daemon alone: its rules' limits in memory
		}
		b, err := lease.New(st, lease.WithClock(clk), lease.WithLogger(log))
		if err != nil {
			closeStore()
			return nil, err
		}
		return closingBackend{b, closeStore}, nil
	case "gossip":
		return openGossip(cfg, clk)
	}
	return nil, fmt.Errorf("backend %q is not available in this build", cfg.Backend)
}

// closingBackend closes a lease store's client after its backend.
type closingBackend struct {
	*lease.Backend
	closeStore func()
}

func (c closingBackend) Close() error {
	err := c.Backend.Close()
	c.closeStore()
	return err
}

func init() { register(func(env Env) *cobra.Command { return newServeFlags(env).cmd }) }

// ruleFlags collects repeated --limit / --shared-limit flags, in order.
type ruleFlags struct {
	rules  *[]server.Rule
	shared bool
}

func (f ruleFlags) String() string { return "" }

func (f ruleFlags) Type() string { return "rule" }

func (f ruleFlags) Set(s string) error {
	r, err := server.ParseRuleFlag(s, f.shared)
	if err != nil {
		return err
	}
	*f.rules = append(*f.rules, r)
	return nil
}

// penaltyFlag is --max-penalty.
type penaltyFlag struct{ *server.PenaltyCap }

func (penaltyFlag) Type() string { return "penalty" }

type serveFlags struct {
	cmd         *cobra.Command
	fs          *pflag.FlagSet
	config      string
	format      string
	rules       []server.Rule
	dflt        string
	defShare    bool
	checkConfig bool
	watch       time.Duration
}

// newServeFlags builds the serve command, its flags in sf.fs.
func newServeFlags(env Env) *serveFlags {
	sf := &serveFlags{}
	d := server.DefaultConfig()
	sf.cmd = &cobra.Command{
		Use:   "serve",
		Short: "run the daemon: the line protocol (TAG -> OK/NO), the HTTP API and /metrics",
		Long: `run the daemon: the line protocol (TAG -> OK/NO), the HTTP API and /metrics

Every flag can also be set from the environment: --store as SLUICE_STORE, and so on
(SLUICE_LIMIT and SLUICE_SHARED_LIMIT: one rule a line). Flags win over the environment,
which wins over the config file.`,
		Example:           "  sluice serve --limit 'api=10/s' --limit 'user-*=5/s burst=10'\n  sluice serve --config /etc/sluice/sluice.yaml --check-config",
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE:              func(cmd *cobra.Command, _ []string) error { return sf.run(cmd.Context(), env) },
	}
	fs := sf.cmd.Flags()
	fs.StringVar(&sf.config, "config", "", "YAML config `file` (docs/daemon.md); flags override it; SIGHUP, or a change of the file (--watch-config), reloads it")
	fs.StringVar(&sf.format, "config-format", "sluice", "the `format` of --config: sluice (the daemon's YAML) or envoy (envoyproxy/ratelimit's: a domain and its descriptors, read into rules; the daemon's other settings from flags and the environment; docs/envoy.md)")
	fs.BoolVar(&sf.checkConfig, "check-config", false, "check the config (file, environment and flags) and exit: 0 if it would start, 2 with its errors (file:line) if not; nothing listens or connects")
	fs.DurationVar(&sf.watch, "watch-config", 10*time.Second, "how often to look for a change of the config file (and the token file) and reload it, as a Kubernetes ConfigMap update needs; 0: on SIGHUP only")
	fs.String("listen-line", d.ListenLine, "line protocol `address`: host:port, or a Unix socket path; empty disables it")
	fs.String("listen-http", d.ListenHTTP, "HTTP API and /metrics `address`; empty disables it")
	fs.String("listen-admin", d.ListenAdmin, "`address` of /healthz, /readyz and /metrics without the HTTP token, for probes and scrapers (e.g. 127.0.0.1:7072); empty: none")
	fs.String("listen-grpc", d.ListenGRPC, "`address` of Envoy's rate limit service (gRPC ShouldRateLimit, and the gRPC health service), e.g. 127.0.0.1:8081; empty: none")
	fs.Int("grpc-max-message", d.GRPC.MaxMessage, "the largest gRPC request message, in bytes")
	fs.Uint("grpc-max-streams", uint(d.GRPC.MaxStreams), "concurrent gRPC calls on one connection")
	fs.Bool("grpc-reflection", d.GRPC.Reflection, "serve gRPC server reflection (for grpcurl)")
	fs.String("grpc-transport", d.GRPC.Transport, "the `server` of the gRPC listener: lean (the daemon's own, for ShouldRateLimit and health checks) or grpc-go (every gRPC feature); reflection and tracing use grpc-go")
	fs.Bool("grpc-response-headers", d.GRPC.ResponseHeaders, "ShouldRateLimit answers carry x-ratelimit-limit, -remaining and -reset for Envoy to add to its response")
	fs.String("grpc-priority-entry", d.GRPC.PriorityEntry, "the descriptor entry `key` whose value is a request's class (critical, standard or sheddable; docs/priorities.md), left out of its tag; empty: none")
	fs.Var(ruleFlags{rules: &sf.rules}, "limit", "a rule `tag=limit`, repeatable, first match wins: an exact tag (api=10/s) or a pattern with * and ? ('user-*=5/s burst=10') giving each tag its own bucket")
	fs.Var(ruleFlags{rules: &sf.rules, shared: true}, "shared-limit", "a pattern rule `pattern=limit` whose tags all share one bucket")
	fs.StringVar(&sf.dflt, "default-limit", "", "`limit` for tags no rule matches (each its own bucket); none: such tags are allowed")
	fs.BoolVar(&sf.defShare, "default-shared", false, "tags no rule matches share one bucket")
	fs.String("backend", d.Backend, "the `mode`: local (decisions in this process), strict (every decision in the store at --store: by a script in Redis, by compare-and-set in etcd or ZooKeeper), lease (decisions here, on a share leased from --store) or gossip (decisions here, shared with --peers; no store)")
	fs.String("redis-url", d.RedisURL, "deprecated: --store (a `url`)")
	fs.String("store", d.Store, "the `url` of the store of --backend strict (which keeps each key's state) or lease (which the daemons lease through): redis://HOST:PORT[/DB], rediss://..., redis-sentinel://HOST:PORT,.../MASTER, redis-cluster://HOST:PORT,... (lease), etcd://HOST:PORT,..., zk://HOST:PORT,...[/PATH] or memory://")
	addGossipFlags(fs, d.Gossip)
	fs.String("fail-mode", d.FailMode, "the answer when the back end cannot decide (the `mode`): closed (NO), open (OK), or local (backend strict on Redis: a local share, see --fallback-share)")
	fs.Float64("fallback-share", d.FallbackShare, "with --fail-mode local: the `share` of each limit this daemon uses while Redis is down")
	fs.Duration("redis-timeout", d.RedisTimeout.D(), "with --backend strict on Redis: how long a decision waits for Redis")
	fs.Int("redis-replica-acks", d.RedisAcks, "with --backend strict on Redis: how many replicas must acknowledge each batch's writes (Redis WAIT, within half of --redis-timeout) before its grants are used; else the fail mode answers. 0: none (a failover may lose the last writes; see docs/strict.md)")
	fs.Duration("margin", d.Margin.D(), "jitter tolerance applied to every limit (0: exact)")
	fs.String("http-token-file", d.HTTPTokenFile, "`file` holding a bearer token the HTTP API requires (all but /healthz)")
	fs.Int("max-connections", d.MaxConnections, "line-protocol connections at once; more are closed at once")
	fs.Int("max-keys", d.MaxKeys, "buckets held at once; past it the one closest to idle is evicted")
	fs.Int("max-line", d.MaxLine, "bytes in one query line; a longer one is answered NO and its connection closed")
	mp := d.MaxPenalty
	fs.Var(penaltyFlag{&mp}, "max-penalty", "the longest `hold` a client may put on a tag (p=): off, period (the rule's longest period) or a duration")
	fs.Duration("idle-timeout", d.IdleTimeout.D(), "close a connection idle this long")
	fs.Duration("write-timeout", d.WriteTimeout.D(), "drop a client that does not take its answers for this long")
	fs.Duration("shutdown-grace", d.ShutdownGrace.D(), "on SIGTERM, time to answer the queries already read")
	fs.String("log-format", d.LogFormat, "log `format`: text or json")
	fs.String("log-level", d.LogLevel, "log `level`: debug, info, warn or error")
	for _, name := range []string{"config", "http-token-file", "gossip-key-file"} {
		_ = sf.cmd.MarkFlagFilename(name)
	}
	completeWith(sf.cmd, "config-format", "sluice", "envoy")
	completeWith(sf.cmd, "backend", "local", "strict", "lease", "gossip")
	completeWith(sf.cmd, "fail-mode", "closed", "open", "local")
	completeWith(sf.cmd, "gossip-policy", "auto", "owner", "shares", "equal", "whole")
	completeWith(sf.cmd, "log-format", "text", "json")
	completeWith(sf.cmd, "log-level", "debug", "info", "warn", "error")
	sf.fs = fs
	return sf
}

// build makes the config: the file (if any) over the defaults, then the flags that were
// set. It is called at start and on every SIGHUP.
func (sf *serveFlags) build() (server.Config, error) {
	cfg := server.DefaultConfig()
	if sf.config != "" {
		load := server.LoadConfig
		switch sf.format {
		case "sluice", "yaml":
		case "envoy":
			load = server.LoadEnvoyConfig
		default:
			return cfg, fmt.Errorf("--config-format: want sluice or envoy, not %q", sf.format)
		}
		var err error
		if cfg, err = load(sf.config); err != nil {
			return cfg, err
		}
	}
	sf.fs.Visit(func(f *pflag.Flag) {
		v := f.Value.String()
		switch f.Name {
		case "listen-line":
			cfg.ListenLine = v
		case "listen-http":
			cfg.ListenHTTP = v
		case "listen-admin":
			cfg.ListenAdmin = v
		case "listen-grpc":
			cfg.ListenGRPC = v
		case "grpc-max-message":
			cfg.GRPC.MaxMessage = must(sf.fs.GetInt(f.Name))
		case "grpc-max-streams":
			cfg.GRPC.MaxStreams = uint32(min(must(sf.fs.GetUint(f.Name)), 1<<32-1))
		case "grpc-reflection":
			cfg.GRPC.Reflection = must(sf.fs.GetBool(f.Name))
		case "grpc-transport":
			cfg.GRPC.Transport = v
		case "grpc-response-headers":
			cfg.GRPC.ResponseHeaders = must(sf.fs.GetBool(f.Name))
		case "grpc-priority-entry":
			cfg.GRPC.PriorityEntry = v
		case "backend":
			cfg.Backend = v
		case "redis-url":
			cfg.RedisURL = v
		case "store":
			cfg.Store = v
		case "fail-mode":
			cfg.FailMode = v
		case "http-token-file":
			cfg.HTTPTokenFile = v
		case "log-format":
			cfg.LogFormat = v
		case "log-level":
			cfg.LogLevel = v
		case "gossip-bind", "gossip-advertise", "peers", "gossip-key-file", "gossip-interval", "gossip-hold", "gossip-policy":
			setGossip(&cfg.Gossip, sf.fs, f)
		case "max-penalty":
			cfg.MaxPenalty = *f.Value.(penaltyFlag).PenaltyCap
		case "fallback-share":
			cfg.FallbackShare = must(sf.fs.GetFloat64(f.Name))
		case "margin", "idle-timeout", "write-timeout", "shutdown-grace", "redis-timeout":
			dur := yamlx.Duration(must(sf.fs.GetDuration(f.Name)))
			switch f.Name {
			case "margin":
				cfg.Margin = dur
			case "idle-timeout":
				cfg.IdleTimeout = dur
			case "write-timeout":
				cfg.WriteTimeout = dur
			case "shutdown-grace":
				cfg.ShutdownGrace = dur
			case "redis-timeout":
				cfg.RedisTimeout = dur
			}
		case "redis-replica-acks":
			cfg.RedisAcks = must(sf.fs.GetInt(f.Name))
		case "max-connections", "max-keys", "max-line":
			n := must(sf.fs.GetInt(f.Name))
			switch f.Name {
			case "max-connections":
				cfg.MaxConnections = n
			case "max-keys":
				cfg.MaxKeys = n
			case "max-line":
				cfg.MaxLine = n
			}
		}
	})
	// Flag rules come first: the first match wins, so they override the file's.
	cfg.Rules = append(append([]server.Rule(nil), sf.rules...), cfg.Rules...)
	if sf.dflt != "" {
		ls, perr := sluice.Parse(sf.dflt)
		if perr != nil {
			return cfg, fmt.Errorf("--default-limit: %w", perr)
		}
		cfg.Default = &server.DefaultRule{Limit: ls, Shared: sf.defShare}
	}
	return cfg, cfg.Validate()
}

// envPrefix names the environment variables that set serve's flags: SLUICE_STORE is
// --store.
const envPrefix = "SLUICE_"

// envName is the environment variable of a flag.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// must returns v; err is a flag read as a type it was not defined with, a mistake in the
// command's definition.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// fromEnv sets the flags not given on the command line from the environment (as if they
// had been): flags win over the environment, which wins over the config file. A rule flag
// takes one rule a line. --check-config and --help are commands, not settings: they are
// not read.
func (sf *serveFlags) fromEnv(lookup func(string) (string, bool)) error {
	given := map[string]bool{"check-config": true, "help": true}
	sf.fs.Visit(func(f *pflag.Flag) { given[f.Name] = true })
	var err error
	sf.fs.VisitAll(func(f *pflag.Flag) {
		v, ok := lookup(envName(f.Name))
		if !ok || given[f.Name] || err != nil {
			return
		}
		vals := []string{v}
		if f.Name == "limit" || f.Name == "shared-limit" {
			vals = strings.FieldsFunc(v, func(r rune) bool { return r == '\n' })
		}
		for _, v := range vals {
			v = strings.TrimSpace(v)
			if serr := sf.fs.Set(f.Name, v); serr != nil {
				if bad := (*pflag.InvalidValueError)(nil); errors.As(serr, &bad) {
					serr = bad.Unwrap()
				}
				err = usagef("%s=%q (--%s): %s", envName(f.Name), v, f.Name, valueProblem(v, serr))
				return
			}
		}
	})
	return err
}

// fingerprint is what a change of the config file or the token file changes: their
// contents, or the errors reading them.
func fingerprint(paths ...string) string {
	h := sha256.New()
	for _, p := range paths {
		if p == "" {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			b = []byte(err.Error())
		}
		fmt.Fprintf(h, "%s\x00%d\x00", p, len(b))
		h.Write(b)
	}
	return string(h.Sum(nil))
}

// testHookServing, if set (by tests), runs once the daemon serves, before it watches its
// files.
var testHookServing func()

func (sf *serveFlags) run(ctx context.Context, env Env) error {
	if err := sf.fromEnv(os.LookupEnv); err != nil {
		return err
	}
	// The config file's fingerprint is taken before it is read: a change made while the
	// daemon starts is seen by the first look (at worst one reload of what it read).
	seenConfig := fingerprint(sf.config)
	cfg, err := sf.build()
	if err != nil {
		return usageError{err}
	}
	log := server.NewLogger(cfg, env.Stderr)
	for _, w := range cfg.Warnings() {
		fmt.Fprintln(env.Stderr, "sluice serve:", w)
	}
	if sf.checkConfig {
		if err := server.CheckOn(cfg, log, backendLike(cfg)); err != nil {
			return usageError{err}
		}
		src := "flags and environment"
		if sf.config != "" {
			src = sf.config
		}
		rules := fmt.Sprintf("%d rules", len(cfg.Rules))
		if len(cfg.Rules) == 1 {
			rules = "1 rule"
		}
		dflt := "no default rule"
		if cfg.Default != nil {
			dflt = "a default rule"
		}
		fmt.Fprintf(env.Stdout, "%s: ok: %s, %s, backend %s\n", src, rules, dflt, cfg.Backend)
		return nil
	}
	opts := []server.Option{server.WithLogger(log)}
	var tel telemetry
	otelVars := otelEnv(os.LookupEnv)
	if err := tel.startTracing(ctx, otelVars, log); err != nil {
		return usageError{err}
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tel.shutdown(sctx); err != nil {
			log.Warn("opentelemetry: flushing at the stop", "err", err)
		}
	}()
	if tel.tp != nil {
		opts = append(opts, server.WithTracerProvider(tel.tp))
	}
	be, err := serveBackend(cfg, clock.Default, log)
	if err != nil {
		return fmt.Errorf("serve: backend %s: %w", cfg.Backend, err)
	}
	if be != nil {
		defer be.Close() // after the server's shutdown
		opts = append(opts, server.WithBackend(be))
	}
	srv, err := server.New(cfg, opts...)
	if err != nil {
		return usageError{err} // a rule the back end refuses, a token file unread: the config's
	}
	if err := tel.startMetrics(ctx, otelVars, srv.Gatherer(), log); err != nil {
		return usageError{err}
	}
	if err := srv.Start(); err != nil {
		_ = srv.Shutdown(context.Background())
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var changed <-chan time.Time // ticks when the config file is watched
	if sf.config != "" && sf.watch > 0 {
		t := time.NewTicker(sf.watch)
		defer t.Stop()
		changed = t.C
	}
	if testHookServing != nil {
		testHookServing()
	}
	files := func() string { return fingerprint(sf.config) + fingerprint(srv.Config().HTTPTokenFile) }
	seen := seenConfig + fingerprint(srv.Config().HTTPTokenFile)
	for {
		select {
		case <-hup:
			_ = srv.ReloadFrom("SIGHUP", sf.build) // refused, logged and counted on error
			seen = files()
		case <-changed:
			if fp := files(); fp != seen {
				seen = fp
				_ = srv.ReloadFrom("the config file changed", sf.build)
			}
		case <-ctx.Done():
			log.Info("stopping: answering the queries already read")
			if err := srv.Shutdown(context.Background()); err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			return nil
		}
	}
}

// check asks a running daemon from the shell.
func init() { register(newCheckCmd) }

func newCheckCmd(env Env) *cobra.Command {
	var a checkArgs
	cmd := &cobra.Command{
		Use:               "check TAG",
		Short:             "ask a running daemon about a tag: prints OK or NO (exit 0 allowed, 1 throttled, 2 bad usage, 3 no answer)",
		Example:           "  sluice check api\n  sluice check api --n 5 --addr 127.0.0.1:7070 --quiet",
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE:              func(cmd *cobra.Command, args []string) error { return runCheck(cmd.Context(), env, a, args) },
	}
	fs := cmd.Flags()
	fs.StringVar(&a.addr, "addr", server.DefaultConfig().ListenLine, "the daemon's line protocol `address` (host:port or a Unix socket path)")
	fs.Int64Var(&a.n, "n", 1, "permits to take (0 asks without taking)")
	fs.BoolVar(&a.quiet, "quiet", false, "print nothing; the exit code says it")
	return cmd
}

// checkArgs are the flags of sluice check.
type checkArgs struct {
	addr  string
	n     int64
	quiet bool
}

// exitError ends a command with a given exit code (and a message, if any).
type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return e.msg }
func (e exitError) ExitCode() int { return e.code }

func runCheck(ctx context.Context, env Env, a checkArgs, rest []string) error {
	switch {
	case len(rest) == 0:
		return usagef("no tag given (e.g. sluice check api)")
	case len(rest) > 1:
		return usagef("want one tag, got %d: %q", len(rest), strings.Join(rest, " "))
	}
	tag := rest[0]
	switch {
	case !wire.ValidTag(tag):
		return usagef("tag %q: want a non-empty UTF-8 tag without control characters", tag)
	case a.n < 0 || a.n > wire.MaxN:
		return usagef("--n %d: want 0 to %d permits", a.n, int64(wire.MaxN))
	}
	c := client.New(a.addr, client.WithTimeout(2*time.Second), client.WithConns(1))
	defer c.Close()
	say := func(format string, args ...any) {
		if !a.quiet {
			fmt.Fprintf(env.Stdout, format, args...)
		}
	}
	ans, err := c.Query(ctx, tag, a.n, 0)
	var refused *wire.RefusedError
	switch {
	case errors.As(err, &refused):
		// The daemon answered: the query can never be granted (a cost above the burst).
		say("NO %s\n", refused.Reason)
		return exitError{code: ExitDenied}
	case err != nil:
		return exitError{code: ExitUnreachable, msg: fmt.Sprintf("check %q at %s: %v", tag, a.addr, err)}
	}
	switch ans.Why {
	case wire.WhyNoRule:
		say("OK no rule matches this tag: it is not limited\n")
	case wire.WhyUnlimited:
		say("OK its rule is unlimited\n")
	case wire.WhyDeny:
		say("NO its rule denies every request\n")
	case wire.WhyDown:
		verdict := "NO"
		if ans.Allowed {
			verdict = "OK"
		}
		say("%s the daemon's back end is down: its fail mode answered (ask again in %v)\n", verdict, ans.RetryAfter)
		return exitError{code: ExitUnreachable}
	default:
		if ans.Allowed {
			say("OK remaining=%d reset_after=%v\n", ans.Remaining, ans.ResetAfter)
		} else {
			say("NO retry_after=%v remaining=%d reset_after=%v\n", ans.RetryAfter, ans.Remaining, ans.ResetAfter)
		}
	}
	if !ans.Allowed {
		return exitError{code: ExitDenied}
	}
	return nil
}
