package strict

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/internal/testkit/agreetest"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// workerEnv, when set, makes the test binary a worker process of the multi-process tests
// (see TestMain): its value is the worker's JSON config.
const workerEnv = "SLUICE_REDIS_WORKER"

type workerConfig struct {
	Addrs      []string      `json:"addrs"`
	URL        string        `json:"url,omitempty"`  // if set, the client is NewClient's for it (Addrs unused)
	Acks       int           `json:"acks,omitempty"` // WithReplicaAcks(Acks, 50ms) if set
	Cluster    bool          `json:"cluster"`
	Prefix     string        `json:"prefix"`
	Keys       []string      `json:"keys"`
	Limits     string        `json:"limits"`
	Goroutines int           `json:"goroutines"`
	Duration   time.Duration `json:"duration"`
	Skew       time.Duration `json:"skew"` // offset of this process' clock
	Seed       uint64        `json:"seed"`
	// Fair makes the worker one of the fair-waiting tests' (fairMain): each goroutine waits
	// for one permit of Keys[0] again and again, giving up a wait with probability GiveUp.
	Fair    bool    `json:"fair"`
	GiveUp  float64 `json:"give_up"`
	PerProc []int   `json:"per_proc,omitempty"` // goroutines of each process, if not Goroutines
	// FairProcesses sets the fair workers' limiter to sluice.FairProcesses.
	FairProcesses bool `json:"fair_processes,omitempty"`
	// Margin is the fair workers' limiter's margin; the first process SIGSTOPs itself at
	// StopAt for StopFor (a shell it starts first sends SIGCONT), if StopFor is set.
	Margin  time.Duration `json:"margin,omitempty"`
	StopAt  time.Duration `json:"stop_at,omitempty"`
	StopFor time.Duration `json:"stop_for,omitempty"`
	// Agree makes the worker one of the agreement tests' (agreeMain): it serves that
	// demand, after waiting at the gate Gate.
	Agree *agreetest.Demand `json:"agree,omitempty"`
	Gate  string            `json:"gate,omitempty"`
}

// grantRecord is one grant as the backend saw it: its Redis time (the ticket's At) and
// cost; grants the worker gave back (cancelled, so never used) are reported with n = 0.
type grantRecord struct {
	key string
	at  int64
	n   int64
	// For failure reports: the worker, the grant's TAT after (first limit), its cost as
	// granted, and what its cancellation returned ("-": not cancelled).
	proc   int
	tat    int64
	orig   int64
	cancel string
}

// recorder is a backend that records every grant of the backend it wraps, and marks
// grants cancelled through it: the worker never uses those, whether the cancellation
// reached Redis or failed (its context may end with the call in flight, after Redis
// refunded).
type recorder struct {
	backend.Backend
	mu     sync.Mutex
	grants []grantRecord
	index  map[grantID][]int // the grants with each key and ticket
}

// grantID identifies a grant by value. Several grants of a key can share one: a grant
// cancelled while it is the newest gives its slot back, and the next grant of the same
// cost takes the very same slot (same At, same TATs after). They are alike to the judge,
// so a cancellation marks any one of them not yet marked: the count is what matters (a
// map to the latest alone marked one twice and left another counted as used).
type grantID struct {
	key string
	t   gcra.Ticket
}

func (r *recorder) Decide(ctx context.Context, key string, req backend.Request) (backend.Grant, error) {
	g, err := r.Backend.Decide(ctx, key, req)
	if err == nil && g.Allowed && g.Ticket.N > 0 {
		r.mu.Lock()
		id := grantID{key, g.Ticket}
		r.index[id] = append(r.index[id], len(r.grants))
		r.grants = append(r.grants, grantRecord{key: key, at: g.Ticket.At, n: g.Ticket.N, tat: g.Ticket.TatAfter[0], orig: g.Ticket.N, cancel: "-"})
		r.mu.Unlock()
	}
	return g, err
}

func (r *recorder) Adjust(ctx context.Context, key string, ls []gcra.Limit, t gcra.Ticket, newN int64) error {
	err := r.Backend.Adjust(ctx, key, ls, t, newN)
	if newN == 0 {
		r.mu.Lock()
		for _, i := range r.index[grantID{key, t}] {
			if r.grants[i].n > 0 {
				r.grants[i].n = 0
				r.grants[i].cancel = fmt.Sprint(err == nil)
				break
			}
		}
		r.mu.Unlock()
	}
	return err
}

// skewed is a clock offset from the real one by a constant: a machine whose clock is
// wrong by seconds.
type skewed struct {
	clock.Clock
	off time.Duration
}

func (s skewed) Now() time.Time  { return s.Clock.Now().Add(s.off) }
func (s skewed) Nanotime() int64 { return s.Clock.Nanotime() + int64(s.off) }

// workerMain is one worker process: goroutines that share one limiter (Redis backend,
// this process' possibly skewed clock) wait for permits, reserve and cancel, with random
// weights, on random keys, and print every grant as "key at n".
func workerMain() int {
	var cfg workerConfig
	if err := json.Unmarshal([]byte(os.Getenv(workerEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	if cfg.Agree != nil {
		return agreeMain(cfg)
	}
	var client Client
	if cfg.URL != "" {
		c, err := redisstore.NewClient(cfg.URL, 2*time.Second)
		if err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			return 2
		}
		defer c.Close()
		client = c
	} else if cfg.Cluster {
		c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cfg.Addrs, MaxRetries: -1, ReadTimeout: 2 * time.Second})
		defer c.Close()
		client = c
	} else {
		o, _ := redisstore.ClientOptions("redis://"+cfg.Addrs[0], 2*time.Second)
		c := goredis.NewClient(o)
		defer c.Close()
		client = c
	}
	clk := skewed{clock.NewReal(), cfg.Skew}
	rb := New(client, WithPrefix(cfg.Prefix), WithTimeout(2*time.Second), WithClock(clk), WithReplicaAcks(cfg.Acks, 50*time.Millisecond))
	defer rb.Close()
	rec := &recorder{Backend: rb, index: map[grantID][]int{}}
	opts := []sluice.Option{sluice.WithBackend(rec), sluice.WithClock(clk)}
	if !cfg.Fair {
		opts = append(opts, sluice.WithMaxWait(300*time.Millisecond))
	}
	if cfg.Margin > 0 {
		opts = append(opts, sluice.WithMargin(cfg.Margin))
	}
	if cfg.FairProcesses {
		opts = append(opts, sluice.WithFairness(sluice.FairProcesses))
	} else if cfg.Fair {
		// Each waiter its own place, whatever the backend's default: the fair-waiting
		// tests judge waiters served in arrival order across processes.
		opts = append(opts, sluice.WithFairness(sluice.FairWaiters))
	}
	if cfg.Fair {
		opts = append(opts, sluice.WithObserver(countExpired))
	}
	lim, err := sluice.New(sluice.MustParse(cfg.Limits), opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	defer lim.Close()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration)
	defer cancel()
	if cfg.Fair {
		return fairMain(ctx, cfg, lim, rec)
	}
	maxN := int(gcra.MaxCost(limitconv.Core(lim.Limits(), cfg.Margin)))
	var wg sync.WaitGroup
	var failures sync.Map
	for g := 0; g < cfg.Goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(cfg.Seed, uint64(g)))
			for ctx.Err() == nil {
				key := cfg.Keys[rng.IntN(len(cfg.Keys))]
				n := int64(1 + rng.IntN(min(maxN, 3)))
				switch op := rng.IntN(10); {
				case op < 2: // pessimistic
					if _, err := lim.AllowN(ctx, key, n); err != nil && ctx.Err() == nil {
						failures.Store(err.Error(), true)
					}
				case op < 4: // reserve, and give back the far ones at once
					r, err := lim.Reserve(ctx, key, n)
					if err != nil {
						if ctx.Err() == nil {
							failures.Store(err.Error(), true)
						}
						continue
					}
					if r.Allowed && r.Delay >= 100*time.Millisecond {
						_ = r.Cancel(ctx)
					} else {
						_ = r.Wait(ctx)
					}
				default: // wait for the permits, as a worker before its API call
					_, _ = lim.WaitN(ctx, key, n)
				}
			}
		}()
	}
	wg.Wait()
	failures.Range(func(k, _ any) bool { fmt.Fprintln(os.Stderr, "worker: error:", k); return true })
	w := bufio.NewWriter(os.Stdout)
	for _, g := range rec.grants {
		fmt.Fprintf(w, "%s %d %d %d %d %s\n", g.key, g.at, g.n, g.tat, g.orig, g.cancel)
	}
	w.Flush()
	return 0
}

// runWorkers runs procs worker processes (re-executions of this test binary) at once and
// returns their grants.
func runWorkers(t *testing.T, procs int, cfg workerConfig, skews []time.Duration) []grantRecord {
	t.Helper()
	grants, _ := runWorkersOut(t, procs, cfg, skews)
	return grants
}

// runWorkersOut is runWorkers that returns the lines of each worker's output too.
func runWorkersOut(t *testing.T, procs int, cfg workerConfig, skews []time.Duration) ([]grantRecord, [][]string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		out, errOut []byte
		err         error
	}
	results := make([]result, procs)
	var wg sync.WaitGroup
	for p := 0; p < procs; p++ {
		c := cfg
		c.Seed = uint64(p + 1)
		if p < len(c.PerProc) {
			c.Goroutines = c.PerProc[p]
		}
		if skews != nil {
			c.Skew = skews[p]
		}
		js, _ := json.Marshal(c)
		cmd := exec.Command(exe, "-test.run", "^$")
		cmd.Env = append(os.Environ(), workerEnv+"="+string(js))
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := cmd.Run()
			results[p] = result{out.Bytes(), errOut.Bytes(), err}
		}()
	}
	wg.Wait()
	lines := make([][]string, procs)
	var grants []grantRecord
	for p, r := range results {
		if r.err != nil {
			t.Fatalf("worker %d: %v: %s", p, r.err, r.errOut)
		}
		if len(r.errOut) > 0 {
			t.Logf("worker %d: %s", p, r.errOut)
		}
		n := 0
		lines[p] = strings.Split(strings.TrimSpace(string(r.out)), "\n")
		for _, line := range lines[p] {
			f := strings.Fields(line)
			if len(f) != 6 {
				continue
			}
			at, _ := strconv.ParseInt(f[1], 10, 64)
			cost, _ := strconv.ParseInt(f[2], 10, 64)
			tat, _ := strconv.ParseInt(f[3], 10, 64)
			orig, _ := strconv.ParseInt(f[4], 10, 64)
			grants = append(grants, grantRecord{key: f[0], at: at, n: cost, proc: p, tat: tat, orig: orig, cancel: f[5]})
			n++
		}
		if n == 0 {
			t.Fatalf("worker %d made no grant", p)
		}
	}
	return grants, lines
}

// judge checks the grants of each key exactly: fed in Redis-time order to a strict GCRA
// that never reserves, every grant must be accepted. It returns the utilization of each
// key over the span of its grants.
func judge(t *testing.T, grants []grantRecord, limits sluice.Limits) map[string]float64 {
	t.Helper()
	core := limitconv.Core(limits, 0)
	byKey, all := map[string][]grantRecord{}, map[string][]grantRecord{}
	for _, g := range grants {
		all[g.key] = append(all[g.key], g)
		if g.n > 0 {
			byKey[g.key] = append(byKey[g.key], g)
		}
	}
	util := map[string]float64{}
	for key, gs := range byKey {
		sort.SliceStable(gs, func(i, j int) bool { return gs[i].at < gs[j].at })
		tats := make([]int64, len(core))
		var used int64
		for i, g := range gs {
			r, _, err := gcra.Decide(tats, core, g.at, g.n, 0)
			if err != nil || !r.Allowed {
				// Every grant of the key near it, cancelled ones too, in order of TAT after.
				near := all[key]
				sort.SliceStable(near, func(i, j int) bool { return near[i].tat < near[j].tat })
				var b strings.Builder
				for _, h := range near {
					if d := h.at - g.at; d > -int64(200*time.Millisecond) && d < int64(200*time.Millisecond) {
						fmt.Fprintf(&b, "\n  proc %d at %+v n %d (of %d) tatAfter %+v cancelled %s", h.proc, time.Duration(h.at-g.at), h.n, h.orig, time.Duration(h.tat-g.at), h.cancel)
					}
				}
				t.Fatalf("key %s: grant %d of %d (n=%d at +%v) breaks %s; grants near it:%s", key, i, len(gs), g.n, time.Duration(g.at-gs[0].at), limits, b.String())
			}
			used += g.n
		}
		w := float64(gs[len(gs)-1].at-gs[0].at) / float64(time.Second)
		// The tightest limit's capacity over the span: burst + rate × w.
		capacity := 0.0
		for i, l := range core {
			c := float64(l.Burst()) + w*float64(time.Second)/float64(l.T)
			if i == 0 || c < capacity {
				capacity = c
			}
		}
		util[key] = float64(used) / capacity
	}
	return util
}

func multiConfig(t *testing.T, addrs []string, keys int) workerConfig {
	ks := make([]string, keys)
	for i := range ks {
		ks[i] = fmt.Sprintf("tenant-%d", i)
	}
	return workerConfig{
		Addrs: addrs, Prefix: prefix(t), Keys: ks, Limits: "400/s burst=10", Goroutines: 16, Duration: 2 * time.Second,
	}
}

func checkUtilization(t *testing.T, util map[string]float64, keys int) {
	t.Helper()
	if len(util) != keys {
		t.Fatalf("grants on %d keys, want %d", len(util), keys)
	}
	for k, u := range util {
		t.Logf("key %s: utilization %.3f", k, u)
		// Loose: cancelled reservations may leave slots unused (refunds are partial), and
		// the race detector slows the workers. Tight figures belong to benchmarks and soak.
		if u < 0.5 {
			t.Errorf("key %s: utilization %.3f, want at least 0.5", k, u)
		}
	}
}

// TestMultiProcess: 3 OS processes of 16 goroutines share one limit through one real
// Redis; every grant, judged by its Redis time, conforms exactly.
func TestMultiProcess(t *testing.T) {
	cfg := multiConfig(t, []string{shared.Addr()}, 1)
	grants := runWorkers(t, 3, cfg, nil)
	util := judge(t, grants, sluice.MustParse(cfg.Limits))
	t.Logf("%d grants from 3 processes", len(grants))
	checkUtilization(t, util, 1)
}

// TestMultiProcessClockSkew: the same with the processes' clocks seconds apart (-3s, 0,
// +5s, through the clock interface): decisions use Redis' clock, so the grants still
// conform exactly.
func TestMultiProcessClockSkew(t *testing.T) {
	cfg := multiConfig(t, []string{shared.Addr()}, 1)
	grants := runWorkers(t, 3, cfg, []time.Duration{-3 * time.Second, 0, 5 * time.Second})
	util := judge(t, grants, sluice.MustParse(cfg.Limits))
	checkUtilization(t, util, 1)
}

// TestMultiProcessCluster: 3 processes share 12 keys spread over the slots of a
// 3-master Redis Cluster; each key's grants conform exactly.
func TestMultiProcessCluster(t *testing.T) {
	cl := redistest.NewCluster(t)
	cfg := multiConfig(t, cl.Addrs(), 12)
	cfg.Cluster = true
	cfg.Limits = "100/s burst=5; 1000/m"
	grants := runWorkers(t, 3, cfg, nil)
	// Every master holds some of the keys.
	for _, n := range cl.Nodes {
		if size, err := n.Do("DBSIZE"); err != nil || size == ":0" {
			t.Errorf("node %s holds no key (%s %v): keys not spread over slots", n.Addr(), size, err)
		}
	}
	util := judge(t, grants, sluice.MustParse(cfg.Limits))
	checkUtilization(t, util, 12)
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range util {
			if !yield(k) {
				return
			}
		}
	})
	t.Logf("%d grants on keys %v", len(grants), keys)
}
