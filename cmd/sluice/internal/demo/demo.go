// Package demo runs `sluice demo`: in one process, a referee (the rate-limited API) on a
// free loopback port, and a pool of workers that call it through the HTTP transport,
// joining and leaving during the run with bursty demand well above the limit: through one
// shared limiter (local mode), or each through its own limiter as separate processes would
// (lease mode: each worker a member of the limit's pool on an in-memory store), or as the
// goroutines of adaptive clients (adaptive mode: one client by default). It reports what
// the referee accepted and rejected, the utilization of the limit and how fairly the
// workers shared it.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/gossip"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/measure"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/referee"
	"github.com/sluicehq/sluice/store"
)

// Config is one demo run.
type Config struct {
	Mode     string        // "local", "strict" (through NewLimiter), "lease" or "gossip" (through NewWorkerLimiter) or "adaptive" (the workers the goroutines of Clients adaptive clients)
	Limits   sluice.Limits // the API's limit, enforced by the referee and obeyed by the pool
	Workers  int           // pool size (default 8)
	Duration time.Duration // run length (default 10s)
	Margin   time.Duration // the limiter's jitter tolerance (default 10ms)
	Seed     uint64        // the schedule of joins, leaves and bursts
	// Progress, if set, is called about every 250ms while the run lasts.
	Progress func(Progress)
	// NewLimiter, if set, makes the pool's limiter for modes other than local (each later
	// mode plugs in here). It gets the limits and the margin.
	NewLimiter func(ctx context.Context, limits sluice.Limits, margin time.Duration) (*sluice.Limiter, func(), error)
	// NewWorkerLimiter, if set, makes each worker its own limiter, as separate processes
	// would have (worker counts from 0). The returned func closes it; a worker calls it
	// when it leaves. Lease mode sets it when it is nil: each worker a member of the
	// limit's pool on one in-memory store.
	NewWorkerLimiter func(ctx context.Context, worker int, limits sluice.Limits, margin time.Duration) (*sluice.Limiter, func(), error)
	// Lease, for lease mode, are the store's settings (zero: lease.DefaultConfig()).
	Lease lease.Config
	// LeaseMember, for lease mode, are the members' settings (zero:
	// lease.DefaultMemberConfig()).
	LeaseMember lease.MemberConfig
	// LeaseStore, for lease mode, is the store the members lease through (nil: one in
	// memory). A shared store (Redis) fences the records it makes for TTL + Grace after
	// it is first used; the run waits that out before it starts (see lease.WaitUnfenced).
	LeaseStore store.Store
	// Log, if set, is told what the run does before it starts (a wait for a store).
	Log func(string)
	// Adaptive, for adaptive mode, tunes each client's controller (its strategy among
	// others; zero: the defaults).
	Adaptive adaptive.Config
	// Clients, for adaptive mode, is how many independent clients the workers are split
	// among (default 1, at most Workers): each client is one adaptive.Transport shared by
	// its workers' goroutines, as a process's goroutines share one http.Client; worker i
	// belongs to client i mod Clients. Clients equal to Workers makes each worker a client
	// that shares nothing with the others, as separate processes would be.
	Clients int
}

// Progress is a snapshot during the run.
type Progress struct {
	Elapsed  time.Duration
	Accepted int64
	Rejected int64
}

// WorkerReport is one worker's part of a run.
type WorkerReport struct {
	ID        string  `json:"id"`
	JoinedS   float64 `json:"joined_s"`
	LeftS     float64 `json:"left_s,omitempty"` // 0: stayed to the end
	Granted   int64   `json:"granted"`          // 200s from the referee
	Rejected  int64   `json:"rejected"`         // 429s from the referee
	FairShare float64 `json:"fair_share"`       // max-min fair share over its demand, in permits
	Ratio     float64 `json:"ratio"`            // granted / fair share
}

// Summary is the outcome of a run, as printed by `sluice demo` (and as its --json).
type Summary struct {
	Mode        string         `json:"mode"`
	Limit       string         `json:"limit"`
	Workers     int            `json:"workers"`
	Clients     int            `json:"clients,omitempty"` // adaptive mode: the independent clients the workers are split among
	MarginMs    float64        `json:"margin_ms"`
	DurationS   float64        `json:"duration_s"`
	Accepted    int64          `json:"accepted"`    // requests the referee accepted
	Violations  int64          `json:"violations"`  // requests the referee rejected (429)
	Rate        float64        `json:"rate"`        // accepted per second
	Capacity    float64        `json:"capacity"`    // burst + rate × duration: what the limit allowed
	Utilization float64        `json:"utilization"` // accepted / capacity
	Jain        float64        `json:"jain"`        // over granted / fair share
	PerWorker   []WorkerReport `json:"per_worker"`
}

// plan is one worker's schedule, in seconds from the start.
type plan struct {
	join, leave float64 // leave = duration for workers that stay
	steady      bool    // never pauses: demand never drops below the limit
}

func schedule(workers int, dur float64, seed uint64) []plan {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	ps := make([]plan, workers)
	for i := range ps {
		ps[i] = plan{join: 0, leave: dur}
		if i == 0 {
			ps[i].steady = true
			continue
		}
		if i >= (workers+1)/2 {
			ps[i].join = dur * (0.1 + 0.4*rng.Float64())
		}
	}
	// Two workers (not the steady one) leave before the end.
	for k, i := 0, workers-1; k < 2 && i >= 1; k, i = k+1, i-2 {
		ps[i].leave = math.Max(ps[i].join+0.1*dur, dur*(0.6+0.3*rng.Float64()))
		if ps[i].leave >= dur {
			ps[i].leave = dur
		}
	}
	return ps
}

// worker is one member of the pool at run time.
type worker struct {
	id       string
	plan     plan
	rng      *rand.Rand
	granted  atomic.Int64
	rejected atomic.Int64
	mu       sync.Mutex
	spans    []measure.Span // demand spans, in seconds from the start
}

// Run runs the demo and returns its summary.
func Run(ctx context.Context, cfg Config) (Summary, error) {
	if cfg.Workers <= 0 {
		cfg.Workers = 8
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 10 * time.Second
	}
	if err := cfg.Limits.Validate(); err != nil {
		return Summary{}, err
	}
	if cfg.Mode == "" {
		cfg.Mode = "local"
	}
	if cfg.Clients <= 0 {
		cfg.Clients = 1
	}
	if cfg.Mode == "adaptive" && cfg.Clients > cfg.Workers {
		return Summary{}, fmt.Errorf("demo: %d clients for %d workers: want at most one client a worker", cfg.Clients, cfg.Workers)
	}

	ref, err := referee.New(cfg.Limits)
	if err != nil {
		return Summary{}, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Summary{}, fmt.Errorf("demo: listen for the referee: %w", err)
	}
	srv := &http.Server{Handler: ref, ReadHeaderTimeout: 5 * time.Second}
	srvDone := make(chan struct{})
	go func() { defer close(srvDone); _ = srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-srvDone
	}()

	if cfg.Mode == "lease" && cfg.NewWorkerLimiter == nil {
		f, err := leaseWorkers(cfg)
		if err != nil {
			return Summary{}, err
		}
		cfg.NewWorkerLimiter = f
	}
	if cfg.Mode == "gossip" && cfg.NewWorkerLimiter == nil {
		cfg.NewWorkerLimiter = gossipWorkers()
	}
	base := &http.Transport{MaxIdleConnsPerHost: 2 * cfg.Workers, IdleConnTimeout: 30 * time.Second}
	defer base.CloseIdleConnections()
	client := func(l *sluice.Limiter) *http.Client {
		return &http.Client{Transport: &sluice.Transport{Limiter: l, Base: base, Key: httplimit.KeyByToken}}
	}
	// One shared limiter (local mode, or NewLimiter), or one per worker.
	clients := make([]*http.Client, cfg.Workers)
	closers := make([]func(), cfg.Workers)
	if cfg.Mode == "adaptive" {
		// Clients that share nothing with each other, as separate processes would be: no
		// limiter, no store, only the API's answers. A client's workers are its goroutines,
		// sharing one Transport (one http.Client, as a Go program has it).
		shared := make([]*http.Client, cfg.Clients)
		for i := range shared {
			shared[i] = &http.Client{Transport: &adaptive.Transport{Base: base, Config: cfg.Adaptive}}
		}
		for i := range clients {
			clients[i] = shared[i%cfg.Clients]
		}
	} else if cfg.NewWorkerLimiter != nil {
		defer func() {
			for _, c := range closers {
				if c != nil {
					c()
				}
			}
		}()
		for i := range clients {
			l, closeL, err := cfg.NewWorkerLimiter(ctx, i, cfg.Limits, cfg.Margin)
			if err != nil {
				return Summary{}, err
			}
			var once sync.Once
			clients[i], closers[i] = client(l), func() { once.Do(closeL) }
		}
	} else {
		var lim *sluice.Limiter
		closeLim := func() {}
		switch {
		case cfg.NewLimiter != nil:
			lim, closeLim, err = cfg.NewLimiter(ctx, cfg.Limits, cfg.Margin)
		case cfg.Mode == "local":
			lim, err = sluice.New(cfg.Limits, sluice.WithMargin(cfg.Margin))
			closeLim = func() { lim.Close() }
		default:
			err = fmt.Errorf("demo: unknown mode %q (want local, strict, lease, gossip or adaptive)", cfg.Mode)
		}
		if err != nil {
			return Summary{}, err
		}
		defer closeLim()
		for i := range clients {
			clients[i] = client(lim)
		}
	}
	url := "http://" + ln.Addr().String() + "/v1/work"

	dur := cfg.Duration.Seconds()
	plans := schedule(cfg.Workers, dur, cfg.Seed)
	workers := make([]*worker, cfg.Workers)
	start := time.Now()
	runCtx, cancel := context.WithDeadline(ctx, start.Add(cfg.Duration))
	defer cancel()
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{id: fmt.Sprintf("w%d", i+1), plan: plans[i], rng: rand.New(rand.NewPCG(cfg.Seed, uint64(i)+1))}
		workers[i] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(runCtx, clients[i], url, start)
			if closers[i] != nil {
				closers[i]() // a worker that leaves hands its share back at once
			}
		}()
	}
	if cfg.Progress != nil {
		tick := time.NewTicker(250 * time.Millisecond)
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
	loop:
		for {
			select {
			case <-done:
				break loop
			case <-tick.C:
				st := ref.Stats()
				cfg.Progress(Progress{Elapsed: time.Since(start), Accepted: st.Accepted, Rejected: st.Rejected})
			}
		}
		tick.Stop()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return Summary{}, fmt.Errorf("demo: interrupted: %w", err)
	}
	st := ref.Stats()
	reports := make([]WorkerReport, len(workers))
	var spans []measure.Span
	for i, w := range workers {
		reports[i] = WorkerReport{ID: w.id, JoinedS: w.plan.join, Granted: w.granted.Load(), Rejected: w.rejected.Load()}
		if w.plan.leave < dur {
			reports[i].LeftS = w.plan.leave
		}
		for _, s := range w.spans {
			s.Member = i
			spans = append(spans, s)
		}
	}
	sum := Summarize(cfg.Mode, cfg.Limits, cfg.Margin, cfg.Duration, st.Accepted, st.Rejected, reports, spans)
	if cfg.Mode == "adaptive" {
		sum.Clients = cfg.Clients
	}
	return sum, nil
}

// run is one worker's life: wait for its join time, then alternate spells of calling the
// API as fast as the pool's limiter lets it and pauses, until it leaves.
func (w *worker) run(ctx context.Context, client *http.Client, url string, start time.Time) {
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	if !sleepUntil(ctx, at(w.plan.join)) {
		return
	}
	leave := at(w.plan.leave)
	lctx, cancel := context.WithDeadline(ctx, leave)
	defer cancel()
	for lctx.Err() == nil {
		on := 0.5 + 1.5*w.rng.Float64()
		if w.plan.steady {
			on = math.Inf(1)
		}
		spellStart := time.Now()
		spellEnd := leave
		if !math.IsInf(on, 1) {
			spellEnd = minTime(leave, spellStart.Add(time.Duration(on*float64(time.Second))))
		}
		sctx, scancel := context.WithDeadline(lctx, spellEnd)
		for sctx.Err() == nil {
			w.call(sctx, client, url)
		}
		scancel()
		end := minTime(time.Now(), spellEnd)
		w.mu.Lock()
		w.spans = append(w.spans, measure.Span{Start: spellStart.Sub(start).Seconds(), End: end.Sub(start).Seconds(), Demand: math.Inf(1)})
		w.mu.Unlock()
		off := 0.1 + 0.5*w.rng.Float64()
		if !sleepUntil(lctx, time.Now().Add(time.Duration(off*float64(time.Second)))) {
			return
		}
	}
}

func (w *worker) call(ctx context.Context, client *http.Client, url string) {
	// The worker names itself as the member it waits for: the limiter shares a key fairly
	// between members, and owes one whose waits end (its spell) before its turn.
	req, err := http.NewRequestWithContext(sluice.WithMember(ctx, w.id), http.MethodGet, url, nil)
	if err != nil {
		return
	}
	req.Header.Set("Authorization", "Bearer demo-token")
	resp, err := client.Do(req)
	if err != nil {
		var te *sluice.ThrottledError
		switch {
		case errors.As(err, &te):
			// The permit lies beyond the spell (or the wait bound): honour RetryAfter,
			// within the spell, rather than ask again at once.
			sleepUntil(ctx, time.Now().Add(max(te.RetryAfter, time.Millisecond)))
		case !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled):
			time.Sleep(10 * time.Millisecond) // a transport error: do not spin
		}
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		w.granted.Add(1)
	case http.StatusTooManyRequests:
		w.rejected.Add(1)
	}
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// leaseWorkers returns lease mode's per-worker limiters: one in-memory store, and each
// worker a member of the limit's pool (named w1, w2, ...), deciding in its own process's
// stead on its leased share.
func leaseWorkers(cfg Config) (func(context.Context, int, sluice.Limits, time.Duration) (*sluice.Limiter, func(), error), error) {
	lc := cfg.Lease
	if lc == (lease.Config{}) {
		lc = lease.DefaultConfig()
	}
	mc := cfg.LeaseMember
	if mc == (lease.MemberConfig{}) {
		mc = lease.DefaultMemberConfig()
	}
	if err := lc.Validate(); err != nil {
		return nil, err
	}
	st := cfg.LeaseStore
	if st == nil {
		st = store.NewMemory(nil)
	} else {
		if cfg.Log != nil {
			cfg.Log(fmt.Sprintf("lease: waiting up to %v for the store's records to be made unfenced (a store seen for the first time cannot know no lease was granted from it before)", lc.TTL+lc.Grace))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*(lc.TTL+lc.Grace)+5*time.Second)
		defer cancel()
		if err := lease.WaitUnfenced(ctx, st, lc); err != nil {
			return nil, fmt.Errorf("demo: lease store: %w", err)
		}
	}
	return func(_ context.Context, i int, limits sluice.Limits, margin time.Duration) (*sluice.Limiter, func(), error) {
		b, err := lease.New(st, lease.WithID(fmt.Sprintf("w%d", i+1)), lease.WithConfig(lc), lease.WithMemberConfig(mc))
		if err != nil {
			return nil, nil, err
		}
		l, err := sluice.New(limits, sluice.WithMargin(margin), sluice.WithBackend(b))
		if err != nil {
			b.Close()
			return nil, nil, err
		}
		return l, func() { l.Close(); b.Close() }, nil
	}, nil
}

// gossipWorkers makes each worker a gossip member of its own on a loopback port (named
// w1, w2, ...), joined to the first: processes that share the limit with no store, each
// deciding at once on its share and reporting its hits to the others every sync interval.
func gossipWorkers() func(context.Context, int, sluice.Limits, time.Duration) (*sluice.Limiter, func(), error) {
	var first string // the first member's address, every later member's peer
	return func(_ context.Context, i int, limits sluice.Limits, margin time.Duration) (*sluice.Limiter, func(), error) {
		gc := gossip.DefaultConfig()
		gc.Bind = "127.0.0.1:0"
		gc.Name = fmt.Sprintf("w%d", i+1)
		if first != "" {
			gc.Peers = []string{first}
		}
		b, err := gossip.New(gc)
		if err != nil {
			return nil, nil, fmt.Errorf("demo: gossip member %s: %w", gc.Name, err)
		}
		if first == "" {
			first = b.Addr()
		}
		l, err := sluice.New(limits, sluice.WithMargin(margin), sluice.WithBackend(b))
		if err != nil {
			b.Close()
			return nil, nil, err
		}
		return l, func() { l.Close(); b.Close() }, nil
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// burstWindow is how soon after the start a worker must want permits to share the
// initial burst.
const burstWindow = 0.05

// Summarize computes the summary's figures as docs/concepts.md defines them: utilization is
// accepted over burst + rate × duration (the tightest of the limits), and Jain's index is
// over each worker's granted / max-min fair share of the rate during its demand spans
// (plus an equal part of the initial burst for those who wanted permits at the start).
func Summarize(mode string, limits sluice.Limits, margin, dur time.Duration, accepted, rejected int64, workers []WorkerReport, spans []measure.Span) Summary {
	d := dur.Seconds()
	capacity, rate := measure.Capacity(limits, d)
	fair := measure.FairShares(rate, len(workers), spans)
	measure.ShareBurst(fair, spans, capacity-rate*d, burstWindow)
	granted := make([]float64, len(workers))
	for i := range workers {
		granted[i] = float64(workers[i].Granted)
		workers[i].FairShare = fair[i]
		if fair[i] > 0 {
			workers[i].Ratio = granted[i] / fair[i]
		}
	}
	s := Summary{
		Mode:        mode,
		Limit:       limits.String(),
		Workers:     len(workers),
		MarginMs:    float64(margin) / float64(time.Millisecond),
		DurationS:   d,
		Accepted:    accepted,
		Violations:  rejected,
		Capacity:    capacity,
		Utilization: measure.Utilization(float64(accepted), capacity),
		Jain:        measure.JainOfShares(granted, fair),
		PerWorker:   workers,
	}
	if d > 0 {
		s.Rate = float64(accepted) / d
	}
	return s
}
