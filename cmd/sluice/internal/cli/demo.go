package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/cmd/sluice/internal/demo"
	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/strict"
)

func init() { register(newDemoCmd) }

func newDemoCmd(env Env) *cobra.Command {
	a := demoArgs{limits: sluice.MustParse("20/s burst=10")}
	cmd := &cobra.Command{
		Use:               "demo",
		Short:             "run a pool of workers against a local referee through one shared limiter, and report",
		Example:           "  sluice demo\n  sluice demo --mode lease --store redis://127.0.0.1:6379 --workers 8 --duration 10s\n  sluice demo --mode adaptive --limit '1/s' --json\n  sluice demo --mode adaptive --clients 4 --strategy cubic --json",
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE:              func(cmd *cobra.Command, _ []string) error { return runDemo(cmd.Context(), env, &a, cmd.Flags()) },
	}
	fs := cmd.Flags()
	fs.TextVar(&a.limits, "limit", a.limits, "the API's `limit`, enforced by the referee and obeyed by the pool (e.g. '1/6s', '100/s burst=20; 4500/h')")
	fs.StringVar(&a.mode, "mode", "local", "where decisions are made (the `mode`): local (one limiter for the pool), strict (every decision in the store at --store: Redis by a script, etcd or ZooKeeper by compare-and-set), lease (each worker a member deciding on its share, leased from the store at --store), gossip (each worker a gossip member on loopback, sharing hit counts, no store) or adaptive (the workers the goroutines of clients, --clients, pacing themselves by the API's answers)")
	fs.StringVar(&a.storeURL, "store", "", "strict and lease modes: the `url` of the store: memory:// (the default: this process), redis://HOST:PORT[/DB], redis-sentinel://HOST:PORT,.../MASTER, redis-cluster://HOST:PORT,... (lease), etcd://HOST:PORT or zk://HOST:PORT")
	fs.StringVar(&a.redisURL, "redis-url", "", "deprecated: --store")
	fs.DurationVar(&a.storeTimeout, "store-timeout", strict.DefaultTimeout, "strict mode on Redis: the longest wait for Redis before the fail mode answers")
	fs.DurationVar(&a.redisTimeout, "redis-timeout", 0, "deprecated: --store-timeout")
	fs.StringVar(&a.failMode, "fail-mode", "closed", "strict mode: what answers while the store is unreachable (the `mode`): closed (deny), open (allow) or, on Redis, local (a local limiter at --fallback-share of the limit)")
	fs.Float64Var(&a.share, "fallback-share", 1, "strict mode on Redis with --fail-mode local: this process' `share` of the limit while Redis is unreachable (0 to 1)")
	fs.DurationVar(&a.leaseRenew, "lease-renew", demoLeaseRenew, "lease mode: how often each member renews its share; shares follow demand at renewals, and the demo's workers switch on and off about every second (the library's default is 250ms)")
	fs.IntVar(&a.workers, "workers", 8, "workers in the pool (half start at once, the rest join during the first half; two leave early)")
	fs.IntVar(&a.clients, "clients", 1, "adaptive mode: the independent clients the workers are split among (`n`, 1 to --workers): each one adaptive.Transport shared by its workers, as a process's goroutines share one http.Client; --clients equal to --workers makes each worker a client of its own, as separate processes")
	fs.DurationVar(&a.dur, "duration", 10*time.Second, "how long the run lasts")
	fs.DurationVar(&a.margin, "margin", 10*time.Millisecond, "the limiter's jitter tolerance (safety margin): 0 decides the limit exactly")
	fs.Uint64Var(&a.seed, "seed", 1, "seed of the schedule of joins, leaves and bursts")
	fs.Var(strategyFlag{&a}, "strategy", "adaptive mode: how each worker learns its pace (the `strategy`): sluice, heroku (the Heroku client study's), cubic (the AWS SDKs') or sre (Google SRE's client-side throttling)")
	fs.BoolVar(&a.asJSON, "json", false, "print the summary as one JSON object")
	completeWith(cmd, "mode", "local", "strict", "lease", "gossip", "adaptive")
	completeWith(cmd, "fail-mode", "closed", "open", "local")
	completeWith(cmd, "strategy", "sluice", "heroku", "cubic", "sre")
	return cmd
}

// demoArgs are the flags of sluice demo.
type demoArgs struct {
	limits                                 sluice.Limits
	mode, storeURL, redisURL, failMode     string
	storeTimeout, redisTimeout, leaseRenew time.Duration
	dur, margin                            time.Duration
	share                                  float64
	workers, clients                       int
	seed                                   uint64
	strategy                               adaptive.Strategy
	formerStrategy                         string // the strategy's former name, when --strategy gave it
	asJSON                                 bool
}

// strategyFlag is --strategy: an adaptive.Strategy, by its name or its former name.
type strategyFlag struct{ a *demoArgs }

func (f strategyFlag) String() string { return f.a.strategy.String() }

func (f strategyFlag) Set(v string) error {
	if _, ok := adaptive.FormerName(v); ok {
		f.a.formerStrategy = v
	}
	return f.a.strategy.UnmarshalText([]byte(v))
}

func (strategyFlag) Type() string { return "strategy" }

func runDemo(ctx context.Context, env Env, a *demoArgs, fs *pflag.FlagSet) error {
	deprecated := func(old, now string) { fmt.Fprintf(env.Stderr, "sluice: %s is deprecated, use %s\n", old, now) }
	if a.formerStrategy != "" {
		deprecated("--strategy "+a.formerStrategy, "--strategy "+a.strategy.String())
	}
	if a.mode == "redis" {
		deprecated("--mode redis", "--mode strict --store redis://HOST:PORT")
		a.mode = "strict"
		if a.storeURL == "" && a.redisURL == "" {
			a.redisURL = "redis://127.0.0.1:6379" // the old mode's default
		}
	}
	if fs.Changed("redis-url") {
		deprecated("--redis-url", "--store")
	}
	if a.storeURL == "" {
		a.storeURL = a.redisURL
	}
	if fs.Changed("redis-timeout") {
		deprecated("--redis-timeout", "--store-timeout")
		if !fs.Changed("store-timeout") {
			a.storeTimeout = a.redisTimeout
		}
	}
	switch {
	case a.workers < 1 || a.workers > 10000:
		return usagef("--workers %d: want 1 to 10000", a.workers)
	case a.dur <= 0 || a.dur > 24*time.Hour:
		return usagef("--duration %v: want more than 0 and at most 24h", a.dur)
	case a.margin < 0:
		return usagef("--margin %v: want 0 or more", a.margin)
	case a.leaseRenew < time.Millisecond || a.leaseRenew > time.Minute:
		return usagef("--lease-renew %v: want 1ms to 1m", a.leaseRenew)
	case fs.Changed("clients") && a.mode != "adaptive":
		return usagef("--clients goes with --mode adaptive (the other modes' workers each have a limiter of their own, or share one)")
	case a.clients < 1 || a.clients > a.workers:
		return usagef("--clients %d: want 1 to --workers (%d)", a.clients, a.workers)
	}
	cfg := demo.Config{Mode: a.mode, Limits: a.limits, Workers: a.workers, Duration: a.dur, Margin: a.margin, Seed: a.seed}
	switch a.mode {
	case "local":
	case "lease":
		cfg.LeaseMember = lease.DefaultMemberConfig()
		cfg.LeaseMember.RenewEvery = a.leaseRenew
		st, closeStore, err := openStore(a.storeURL, fmt.Sprintf("sluice:demo:%d:", time.Now().UnixNano()))
		if err != nil {
			return err
		}
		defer closeStore()
		cfg.LeaseStore = st
		cfg.Log = func(s string) { fmt.Fprintln(env.Stderr, "sluice demo:", s) }
	case "gossip":
	case "adaptive":
		cfg.Adaptive.Strategy = a.strategy
		cfg.Clients = a.clients
		// Outside the adaptive mode's envelope (docs/adaptive.md): said, not refused.
		switch b := minLimitBurst(a.limits); {
		case a.clients > 1 && b < 4:
			fmt.Fprintf(env.Stderr, "sluice demo: warning: %d adaptive clients on a burst of %d: a 200 tells a client nothing of the others, so they collide (expect 429s well above 1%%); the adaptive mode claims several clients on a burst of 4 or more, or one client on any limit (--clients 1); a pool on a smaller burst shares a store (--mode lease or strict)\n", a.clients, b)
		case int64(a.clients) > b:
			// The demo's workers are always busy in their spells: more than the limit.
			fmt.Fprintf(env.Stderr, "sluice demo: warning: %d adaptive clients, always busy, on a burst of %d: with more clients than permits of burst nearly every 200 says nothing is left, so they learn of each other only when they collide (expect 429s above 1%%); the adaptive mode claims at most as many busy clients as the burst has permits; a larger pool shares a store (--mode lease or strict)\n", a.clients, b)
		}
	case "strict":
		nl, err := strictLimiter(a.storeURL, a.storeTimeout, a.failMode, a.share)
		if err != nil {
			return err
		}
		cfg.NewLimiter = nl
	default:
		return usagef("--mode %q: want local, strict, lease, gossip or adaptive", a.mode)
	}
	tty := isTerminal(env.Stderr)
	var nextLine time.Duration
	// The burst is spent at the start, all at once: the rate since is what to hold against
	// the limit's (a first line of 51.8/s on 20/s burst=10 is the burst, not a breach).
	burst := int64(0)
	if len(cfg.Limits) > 0 {
		burst = cfg.Limits[0].Burst
	}
	cfg.Progress = func(p demo.Progress) {
		since := float64(max(p.Accepted-burst, 0)) / max(p.Elapsed.Seconds(), 1e-9)
		line := fmt.Sprintf("%5.1fs  accepted %d (a burst of %d, then %.1f/s)  429s %d", p.Elapsed.Seconds(), p.Accepted, min(burst, p.Accepted), since, p.Rejected)
		switch {
		case tty: // one line, redrawn
			fmt.Fprintf(env.Stderr, "\r\033[K  %s", line)
		case p.Elapsed >= nextLine: // a log or a pipe: a line a second, so a run never looks hung
			nextLine = p.Elapsed.Truncate(time.Second) + time.Second
			fmt.Fprintf(env.Stderr, "sluice demo: %s\n", line)
		}
	}
	sum, err := demo.Run(ctx, cfg)
	if tty {
		fmt.Fprint(env.Stderr, "\r\033[K")
	}
	if err != nil {
		return err
	}
	if a.asJSON {
		enc := json.NewEncoder(env.Stdout)
		return enc.Encode(sum)
	}
	printSummary(env.Stdout, sum)
	return nil
}

// demoLeaseRenew is the demo's lease renewal interval: shares follow demand at renewals,
// and the demo's workers switch on and off every second or so, which makes the handover of
// a quiet member's share the demo's main cost (the share is unused from the member going
// quiet until a starved member picks it up). Measured on the 8 s demo, 20 seeds, with
// starved members renewing at a quarter of the interval: at 50ms utilization 0.947 to
// 0.976 (19 of 20 runs at 0.95 or more), Jain 0.96 to 0.998; at 100ms 0.93 to 0.94. Since
// members spread their renewals (they no longer renew in step, when the losers of the
// compare-and-set got a fresh look at once, an accidental extra renewal), the demo through
// Redis lost about one permit in 170 at 50ms; at 40ms it is back (seeds 1-8: 162 to 166
// permits of 170). 25 renewals a second per member (in memory: nothing; through Redis: 50
// commands a second per member).
const demoLeaseRenew = 40 * time.Millisecond

// strictLimiter makes the demo's limiter for the strict mode on the store url names
// (memory:// or "": one in this process), its keys under a prefix of their own, so that a
// run never meets the state of an earlier one: one backend for the pool, as one process.
func strictLimiter(url string, timeout time.Duration, failMode string, share float64) (func(context.Context, sluice.Limits, time.Duration) (*sluice.Limiter, func(), error), error) {
	if url == "" {
		url = "memory://"
	}
	onRedis := strings.HasPrefix(url, "redis://") || strings.HasPrefix(url, "rediss://") || strings.HasPrefix(url, "redis-sentinel://")
	opts := []strict.Option{strict.WithPrefix(fmt.Sprintf("sluice:demo:%d:", time.Now().UnixNano()))}
	if onRedis {
		if timeout <= 0 {
			return nil, usagef("--store-timeout %v: want more than 0", timeout)
		}
		opts = append(opts, strict.WithTimeout(timeout))
	}
	fm := backend.FailClosed
	switch failMode {
	case "closed":
	case "open":
		fm = backend.FailOpen
	case "local":
		if !onRedis {
			return nil, usagef("--fail-mode local: the strict mode degrades to a local share on Redis only; on %s want closed or open", url)
		}
		if share <= 0 || share > 1 {
			return nil, usagef("--fallback-share %g: want more than 0 and at most 1", share)
		}
		opts = append(opts, strict.WithFailLocal(share))
	default:
		return nil, usagef("--fail-mode %q: want closed, open or local", failMode)
	}
	return func(ctx context.Context, limits sluice.Limits, margin time.Duration) (*sluice.Limiter, func(), error) {
		b, err := strict.Dial(ctx, url, opts...)
		if err != nil {
			return nil, nil, fmt.Errorf("demo: strict mode: %w", err)
		}
		l, err := sluice.New(limits, sluice.WithBackend(b), sluice.WithMargin(margin), sluice.WithFailMode(fm))
		if err != nil {
			b.Close()
			return nil, nil, err
		}
		return l, func() { l.Close(); b.Close() }, nil
	}, nil
}

func printSummary(w io.Writer, s demo.Summary) {
	workers := fmt.Sprintf("%d workers", s.Workers)
	if s.Clients > 0 {
		workers += fmt.Sprintf(" in %d client", s.Clients)
		if s.Clients > 1 {
			workers += "s"
		}
	}
	fmt.Fprintf(w, "sluice demo: mode %s, limit %s, %s, %gs, margin %gms\n\n", s.Mode, s.Limit, workers, s.DurationS, s.MarginMs)
	fmt.Fprintf(w, "  accepted     %d requests (%.2f/s)\n", s.Accepted, s.Rate)
	fmt.Fprintf(w, "  violations   %d (429s from the referee)\n", s.Violations)
	fmt.Fprintf(w, "  utilization  %.3f (of burst + rate × duration = %.0f)\n", s.Utilization, s.Capacity)
	fmt.Fprintf(w, "  fairness     %.3f (Jain's index over each worker's granted / fair share)\n\n", s.Jain)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  worker\tjoined\tleft\tgranted\t429s\tfair share\tratio")
	for _, r := range s.PerWorker {
		left := "-"
		if r.LeftS > 0 {
			left = fmt.Sprintf("%.1fs", r.LeftS)
		}
		fmt.Fprintf(tw, "  %s\t%.1fs\t%s\t%d\t%d\t%.1f\t%.2f\n", r.ID, r.JoinedS, left, r.Granted, r.Rejected, r.FairShare, r.Ratio)
	}
	tw.Flush()
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// minLimitBurst is the smallest burst of ls (0 for none).
func minLimitBurst(ls sluice.Limits) int64 {
	var b int64
	for i, l := range ls {
		if lb := limitconv.Burst(l); i == 0 || lb < b {
			b = lb
		}
	}
	return b
}
