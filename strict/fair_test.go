package strict

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/internal/measure"
)

// expired counts the permits the limiter did not use because they came too late.
var expired atomic.Int64

func countExpired(e sluice.Event) {
	if e.Kind == sluice.EventExpired {
		expired.Add(e.N)
	}
}

// fairMain is a worker process of the fair-waiting tests. Each goroutine waits for one
// permit of Keys[0] again and again, as a worker does before each API call. A wait is
// given up with probability GiveUp after a random time under 4 s. It prints the backend's
// grants (as workerMain does) and then each permit used: "use goroutine slot wait_ns".
func fairMain(ctx context.Context, cfg workerConfig, lim *sluice.Limiter, rec *recorder) int {
	type use struct {
		g                int
		slot, wait, late int64
	}
	if cfg.StopFor > 0 && cfg.Seed == 1 {
		time.AfterFunc(cfg.StopAt, func() {
			pid := os.Getpid()
			cont := exec.Command("sh", "-c", fmt.Sprintf("sleep %.3f; kill -CONT %d", cfg.StopFor.Seconds(), pid))
			if err := cont.Start(); err != nil {
				fmt.Fprintln(os.Stderr, "worker: error:", err)
				return
			}
			_ = syscall.Kill(pid, syscall.SIGSTOP)
			_ = cont.Wait()
		})
	}
	var mu sync.Mutex
	var uses []use
	var gaveUp atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < cfg.Goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(cfg.Seed, uint64(g)))
			for ctx.Err() == nil {
				// Giving up is a cancellation, not a deadline: a deadline known in advance
				// refuses at once a place beyond it, and nothing would be given up.
				wctx, cancel := context.WithCancel(ctx)
				if rng.Float64() < cfg.GiveUp {
					stop := time.AfterFunc(time.Duration(rng.Int64N(int64(4*time.Second))), cancel)
					defer stop.Stop()
				}
				start := time.Now()
				var r *sluice.Reservation
				var err error
				if cfg.StopFor > 0 && g%2 == 1 {
					// A reservation waited for by its holder (Reservation.Wait).
					if r, err = lim.Reserve(wctx, cfg.Keys[0], 1); err == nil {
						err = r.Wait(wctx)
					}
				} else {
					r, err = lim.WaitN(wctx, cfg.Keys[0], 1)
				}
				wait := time.Since(start)
				late := time.Since(r.TimeToAct())
				cancel()
				if errors.Is(err, sluice.ErrPermitExpired) {
					continue // counted by the limiter; ask again
				}
				if err == nil {
					mu.Lock()
					uses = append(uses, use{g, r.Slot(), int64(wait), int64(late)})
					mu.Unlock()
				} else if ctx.Err() == nil && errors.Is(err, context.Canceled) {
					gaveUp.Add(1)
				} else if ctx.Err() == nil && !errors.Is(err, sluice.ErrThrottled) { // the run's end is near
					fmt.Fprintln(os.Stderr, "worker: error:", err)
				}
			}
		}()
	}
	wg.Wait()
	w := bufio.NewWriter(os.Stdout)
	for _, g := range rec.grants {
		fmt.Fprintf(w, "%s %d %d %d %d %s\n", g.key, g.at, g.n, g.tat, g.orig, g.cancel)
	}
	for _, u := range uses {
		fmt.Fprintf(w, "use %d %d %d %d\n", u.g, u.slot, u.wait, u.late)
	}
	fmt.Fprintf(w, "gave up %d\n", gaveUp.Load())
	fmt.Fprintf(w, "expired %d\n", expired.Load())
	w.Flush()
	return 0
}

type fairUse struct {
	worker           string
	slot, wait, late int64
}

// fairUses reads the permits used from the workers' output.
func fairUses(t *testing.T, lines [][]string) []fairUse {
	t.Helper()
	var uses []fairUse
	for p, ls := range lines {
		for _, line := range ls {
			f := strings.Fields(line)
			if len(f) != 5 || f[0] != "use" {
				continue
			}
			slot, err1 := strconv.ParseInt(f[2], 10, 64)
			wait, err2 := strconv.ParseInt(f[3], 10, 64)
			late, err3 := strconv.ParseInt(f[4], 10, 64)
			if err1 != nil || err2 != nil || err3 != nil {
				t.Fatalf("worker %d: bad line %q", p, line)
			}
			uses = append(uses, fairUse{fmt.Sprintf("p%d.g%s", p, f[1]), slot, wait, late})
		}
	}
	sort.Slice(uses, func(i, j int) bool { return uses[i].slot < uses[j].slot })
	return uses
}

// TestFairWaitingMultiProcess: 50 workers in 3 OS processes wait on one key of 10/s
// through one real Redis. Judged from the permits used (their Redis times): no violation;
// no slot left unused; every wait at most about (workers + 1) intervals; and, once every
// worker is in line, each one served once per round (Jain's index of the grants over whole
// rounds at least 0.99). With 10% of the waits given up at random, the places of those
// that gave up go to the others: still no slot unused, no violation.
func TestFairWaitingMultiProcess(t *testing.T) {
	t.Parallel() // waiting, mostly: these real-time runs overlap each other
	const workers = 50
	limits := sluice.MustParse("10/s burst=1")
	interval := limitconv.Interval(limits[0])
	for _, giveUp := range []float64{0, 0.1} {
		t.Run(fmt.Sprintf("give_up=%v", giveUp), func(t *testing.T) {
			t.Parallel()
			cfg := workerConfig{Addrs: []string{shared.Addr()}, Prefix: prefix(t), Keys: []string{"api"},
				Limits: limits.String(), PerProc: []int{17, 17, 16}, Duration: 12 * time.Second, Fair: true, GiveUp: giveUp}
			_, lines := runWorkersOut(t, 3, cfg, nil)
			uses := fairUses(t, lines)
			gaveUp := 0
			for _, ls := range lines {
				for _, line := range ls {
					var n int
					if _, err := fmt.Sscanf(line, "gave up %d", &n); err == nil {
						gaveUp += n
					}
				}
			}
			t.Logf("%d waits given up", gaveUp)
			if giveUp > 0 && gaveUp < 5 {
				t.Fatalf("%d waits given up, want about a tenth of them", gaveUp)
			}
			recs := make([]grantRecord, len(uses))
			for i, u := range uses {
				recs[i] = grantRecord{key: "api", at: u.slot, n: 1, orig: 1, cancel: "-"}
			}
			util := judge(t, recs, limits) // fails on any violation
			t.Logf("%d permits used, utilization %.3f over their span", len(uses), util["api"])
			if util["api"] < 0.98 {
				t.Errorf("utilization %.3f over the span of the permits used: slots were left unused", util["api"])
			}
			// Waits: a worker's place is at most the workers ahead of it away, plus the
			// one being served; 300 ms for the race detector and the machine.
			bound := time.Duration(workers+1)*interval + 300*time.Millisecond
			var worst time.Duration
			for _, u := range uses {
				worst = max(worst, time.Duration(u.wait))
			}
			t.Logf("longest wait %v (bound %v)", worst, bound)
			if worst > bound {
				t.Errorf("a worker waited %v, more than (workers + 1) intervals", worst)
			}
			if giveUp > 0 {
				return
			}
			// Rounds: from the first permit after every worker has had one, whole rounds.
			first := map[string]int{}
			for i, u := range uses {
				if _, ok := first[u.worker]; !ok {
					first[u.worker] = i
				}
			}
			if len(first) != workers {
				t.Fatalf("%d workers got a permit, want %d", len(first), workers)
			}
			from := 0
			for _, i := range first {
				from = max(from, i+1)
			}
			rounds := (len(uses) - from) / workers
			if rounds < 1 {
				t.Fatalf("no whole round after every worker's first permit (%d permits from %d)", len(uses), from)
			}
			count := map[string]float64{}
			for _, u := range uses[from : from+rounds*workers] {
				count[u.worker]++
			}
			x := make([]float64, 0, workers)
			for w := range first {
				x = append(x, count[w])
			}
			j := measure.Jain(x)
			t.Logf("Jain's index over %d whole rounds: %.4f", rounds, j)
			if j < 0.99 {
				t.Errorf("Jain's index %.4f over whole rounds, want at least 0.99", j)
			}
		})
	}
}

// TestFairProcessesMultiProcess: three processes of 1, 5 and 20 goroutines wait on one
// key through one real Redis. With sluice.FairProcesses each process holds one place in
// the key's line at a time, and they get equal parts (Jain's index between the processes
// at least 0.95); without it each goroutine holds its own, and the processes get about
// 1:5:20 (Jain near 0.53).
func TestFairProcessesMultiProcess(t *testing.T) {
	t.Parallel()
	limits := sluice.MustParse("50/s burst=1")
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("fair_processes=%v", on), func(t *testing.T) {
			t.Parallel()
			cfg := workerConfig{Addrs: []string{shared.Addr()}, Prefix: prefix(t), Keys: []string{"api"},
				Limits: limits.String(), PerProc: []int{1, 5, 20}, Duration: 4 * time.Second, Fair: true, FairProcesses: on}
			_, lines := runWorkersOut(t, 3, cfg, nil)
			uses := fairUses(t, lines)
			recs := make([]grantRecord, len(uses))
			for i, u := range uses {
				recs[i] = grantRecord{key: "api", at: u.slot, n: 1, orig: 1, cancel: "-"}
			}
			judge(t, recs, limits) // fails on any violation
			// The window in which all three processes were in line.
			first, last := map[string]int64{}, map[string]int64{}
			proc := func(u fairUse) string { return u.worker[:strings.IndexByte(u.worker, '.')] }
			for _, u := range uses {
				p := proc(u)
				if _, ok := first[p]; !ok {
					first[p] = u.slot
				}
				last[p] = u.slot
			}
			if len(first) != 3 {
				t.Fatalf("%d processes got a permit, want 3", len(first))
			}
			from, to := int64(0), int64(1<<62)
			for p := range first {
				from, to = max(from, first[p]), min(to, last[p])
			}
			count := map[string]float64{}
			for _, u := range uses {
				if u.slot >= from && u.slot <= to {
					count[proc(u)]++
				}
			}
			x := []float64{count["p0"], count["p1"], count["p2"]}
			j := measure.Jain(x)
			t.Logf("permits of the processes of 1, 5 and 20 goroutines while all waited: %v, Jain %.3f", x, j)
			if on && j < 0.95 {
				t.Errorf("FairProcesses: Jain's index between the processes %.3f, want at least 0.95", j)
			}
			if !on && j > 0.8 {
				t.Errorf("without FairProcesses: Jain's index %.3f: the goroutines did not each hold a place", j)
			}
		})
	}
}

// TestPermitExpiryStoppedProcess: two processes of 4 goroutines wait on one key through
// real Redis with a 20 ms margin; the first is SIGSTOPped for 500 ms mid-run, holding
// places (half of its goroutines by Reserve and Reservation.Wait, half by WaitN). When it
// resumes, those permits are long past their time: none is used (each expires, is counted
// and asked again), so no permit is used more than the margin late, beyond the time it
// takes the race detector to record it; the grants used conform exactly.
func TestPermitExpiryStoppedProcess(t *testing.T) {
	limits := sluice.MustParse("20/s burst=1")
	margin := 20 * time.Millisecond
	cfg := workerConfig{Addrs: []string{shared.Addr()}, Prefix: prefix(t), Keys: []string{"api"},
		Limits: limits.String(), Goroutines: 4, Duration: 3 * time.Second, Fair: true,
		Margin: margin, StopAt: time.Second, StopFor: 500 * time.Millisecond}
	_, lines := runWorkersOut(t, 2, cfg, nil)
	uses := fairUses(t, lines)
	recs := make([]grantRecord, len(uses))
	var worst time.Duration
	for i, u := range uses {
		recs[i] = grantRecord{key: "api", at: u.slot, n: 1, orig: 1, cancel: "-"}
		worst = max(worst, time.Duration(u.late))
	}
	judge(t, recs, limits)
	expired := make([]int, 2)
	for p, ls := range lines {
		for _, line := range ls {
			fmt.Sscanf(line, "expired %d", &expired[p])
		}
	}
	t.Logf("%d permits used; expired per process %v; the latest used %v after its time", len(uses), expired, worst)
	if expired[0] == 0 {
		t.Errorf("the stopped process expired no permit")
	}
	// The places held across the stop were due up to 500 ms before it ended; any of them
	// used would be hundreds of ms late.
	if worst > margin+50*time.Millisecond {
		t.Errorf("a permit was used %v after its time (margin %v)", worst, margin)
	}
}
