package bench

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/proctest"
	"github.com/sluicehq/sluice/strict"
)

// startRedis starts a redis-server on a free loopback port for one benchmark or test and
// kills it at the end: one plain server is all a benchmark needs (internal/testkit/redistest's
// servers are made for the main module's tests: clusters, Sentinel, kills and restarts).
func startRedis(tb testing.TB) string {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		tb.Fatal("the redis benchmarks need redis-server on the PATH (Debian: apt-get install redis-server; .ci/run installs it)")
	}
	p, err := proctest.FreePort(false) // below the ephemeral range: no connection takes it before redis-server binds it
	if err != nil {
		tb.Fatal(err)
	}
	port := strconv.Itoa(p)
	dir := tb.TempDir()
	cmd := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := "127.0.0.1:" + port
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			tb.Fatal("redis-server did not answer")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return addr
}

// redisCPU reads the server's CPU time (user + system) from INFO cpu.
func redisCPU(c *goredis.Client) time.Duration {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		return 0
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// redisCommandTime is the time Redis spent executing script calls (EVALSHA, EVAL: INFO
// commandstats, usec), the scripts' cost without the network's, and how many script
// calls it ran. Both libraries send nothing but script calls. A command a script calls is
// counted in commandstats under its own name too, within its script's time: summing
// every command, as this did until 2026-11-26, counted each script's SET, GET, MGET and
// TIME twice (BENCHMARKS.md).
func redisCommandTime(c *goredis.Client) (time.Duration, int64) {
	return commandTime(c, "cmdstat_evalsha", "cmdstat_eval")
}

// commandTime is the time Redis spent executing the commands of INFO commandstats named
// (cmdstat_NAME), in usec, and how many of them it ran.
func commandTime(c *goredis.Client, names ...string) (time.Duration, int64) {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return 0, 0
	}
	var total, calls int64
	for _, line := range strings.Split(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !slices.Contains(names, name) {
			continue
		}
		for _, kv := range strings.Split(stats, ",") {
			if v, ok := strings.CutPrefix(kv, "usec="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				total += n
			}
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				calls += n
			}
		}
	}
	return time.Duration(total) * time.Microsecond, calls
}

// processCPU is this process' CPU time (user + system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// shareN calls f(i) for each i in [0, n) from g goroutines, each taking the next i, and
// returns when every call has.
func shareN(n, g int, f func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				f(i)
			}
		}()
	}
	wg.Wait()
}

// runDecisions makes b.N decisions from g goroutines over keys and reports decisions/s,
// p50 and p99 latency, CPU per decision of this process (the client) and of Redis, Redis'
// execution time per decision and per script call, and script calls per decision (below 1
// when calls are batched).
func runDecisions(b *testing.B, g int, keys []string, info *goredis.Client, decide func(key string) bool) {
	lat := make([]int64, b.N)
	var denied atomic.Int64
	cmd0, calls0 := redisCommandTime(info)
	cpu0, rcpu0 := processCPU(), redisCPU(info)
	b.ResetTimer()
	start := time.Now()
	shareN(b.N, g, func(i int) {
		t0 := time.Now()
		if !decide(keys[i%len(keys)]) {
			denied.Add(1)
		}
		lat[i] = int64(time.Since(t0))
	})
	elapsed := time.Since(start)
	b.StopTimer()
	cpu, rcpu := processCPU()-cpu0, redisCPU(info)-rcpu0
	cmd, calls := redisCommandTime(info)
	cmd, calls = cmd-cmd0, calls-calls0
	slices.Sort(lat)
	n := float64(b.N)
	b.ReportMetric(n/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(lat[len(lat)/2])/1e3, "p50-us")
	b.ReportMetric(float64(lat[len(lat)*99/100])/1e3, "p99-us")
	b.ReportMetric(float64(cpu.Microseconds())/n, "client-cpu-us/op")
	b.ReportMetric(float64(rcpu.Microseconds())/n, "redis-cpu-us/op")
	b.ReportMetric(float64(cmd.Nanoseconds())/1e3/n, "redis-exec-us/op")
	if calls > 0 {
		b.ReportMetric(float64(cmd.Nanoseconds())/1e3/float64(calls), "redis-exec-us/call")
		b.ReportMetric(float64(calls)/n, "script-calls/op")
	}
	b.ReportMetric(float64(denied.Load())/n, "denied/op")
}

// The limit both libraries get: so high that every decision grants, so that the
// benchmark measures deciding, not waiting (as the local benchmarks do), and low enough
// that both write every grant: at 1e9/s redis_rate's float seconds lose the 1 ns
// increment (new TAT = now), so it never wrote its key and was measured running a
// read-only script (TestRedisLibrariesAgree checks that both write).
var redisLimit = redis_rate.Limit{Rate: 1_000_000, Burst: 1000, Period: time.Second}

// benchTimeout is sluice's time-out in the benchmark: go-redis' default read time-out,
// which redis_rate's client has. At sluice's default of 100 ms, a call stalled that long
// on a loaded machine failed, opened the breaker, and the calls of the next 100 ms were
// denied at once without Redis (fail closed): fast "decisions" that flattered sluice
// (up to 18% of them in a run at 64 goroutines, the machine's load average near 19).
var benchTimeout = strict.WithTimeout(3 * time.Second)

// BenchmarkRedis: decisions on one Redis shared by client and server on this machine, at
// 1, 2, 4, 8 and 64 goroutines, on one key and on 10,000 keys (2 and 4: few concurrent
// callers, whose batches, if any, carry two or three calls). impl=sluice is Limiter.Allow
// (the backend's Allower: one permit, now or never), impl=sluice_decide is
// Limiter.AllowN (the full decision: remaining, reset, retry-after), impl=redis_rate is
// redis_rate's Allow (a full decision) through a go-redis client at its defaults.
// unavailable counts sluice's calls that got no answer in time (each a denial without
// Redis, and more while the breaker stays open): it must read 0 for a fair comparison.
func BenchmarkRedis(b *testing.B) {
	addr := startRedis(b)
	info := goredis.NewClient(&goredis.Options{Addr: addr})
	defer info.Close()
	ctx := context.Background()
	lim := sluice.Limits{{Rate: int64(redisLimit.Rate), Period: time.Second, Burst: int64(redisLimit.Burst)}}
	for _, nkeys := range []int{1, 10_000} {
		ks := keys(nkeys)
		for _, g := range []int{1, 2, 4, 8, 64} {
			name := fmt.Sprintf("keys=%d/g=%d", nkeys, g)
			b.Run(name+"/impl=sluice", func(b *testing.B) {
				be, err := strict.Dial(ctx, "redis://"+addr, benchTimeout)
				if err != nil {
					b.Fatal(err)
				}
				defer be.Close()
				l := sluice.MustNew(lim, sluice.WithBackend(be))
				runDecisions(b, g, ks, info, func(k string) bool { return l.Allow(ctx, k) })
				b.ReportMetric(float64(be.(*strict.Backend).Stats().Failures), "unavailable")
			})
			b.Run(name+"/impl=sluice_decide", func(b *testing.B) {
				be, err := strict.Dial(ctx, "redis://"+addr, benchTimeout)
				if err != nil {
					b.Fatal(err)
				}
				defer be.Close()
				l := sluice.MustNew(lim, sluice.WithBackend(be))
				runDecisions(b, g, ks, info, func(k string) bool { d, _ := l.AllowN(ctx, k, 1); return d.Allowed })
				b.ReportMetric(float64(be.(*strict.Backend).Stats().Failures), "unavailable")
			})
			b.Run(name+"/impl=redis_rate", func(b *testing.B) {
				c := goredis.NewClient(&goredis.Options{Addr: addr})
				defer c.Close()
				rl := redis_rate.NewLimiter(c)
				runDecisions(b, g, ks, info, func(k string) bool {
					r, err := rl.Allow(ctx, k, redisLimit)
					return err == nil && r.Allowed > 0
				})
			})
		}
	}
}

// TestRedisLibrariesAgree checks what the benchmark assumes of both libraries on a real
// Redis: a fresh key gets its burst and is then throttled, and at the benchmark's limit
// both grant and write their key, so neither is measured short-circuiting.
func TestRedisLibrariesAgree(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	be, err := strict.Dial(ctx, "redis://"+addr)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	l := sluice.MustNew(sluice.Limits{{Rate: 1, Period: time.Second, Burst: 3}}, sluice.WithBackend(be))
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	rl := redis_rate.NewLimiter(c)
	var sn, rn int
	for i := 0; i < 10; i++ {
		if l.Allow(ctx, "k") {
			sn++
		}
		if r, err := rl.Allow(ctx, "k", redis_rate.Limit{Rate: 1, Burst: 3, Period: time.Second}); err == nil && r.Allowed > 0 {
			rn++
		}
	}
	if sn != 3 || rn != 3 {
		t.Fatalf("grants of a fresh key with burst 3: sluice %d, redis_rate %d", sn, rn)
	}
	lim := sluice.MustNew(sluice.Limits{{Rate: int64(redisLimit.Rate), Period: time.Second, Burst: int64(redisLimit.Burst)}}, sluice.WithBackend(be))
	if !lim.Allow(ctx, "fast") {
		t.Fatal("sluice denied at the benchmark's limit")
	}
	if r, err := rl.Allow(ctx, "fast", redisLimit); err != nil || r.Allowed != 1 {
		t.Fatalf("redis_rate at the benchmark's limit: %+v %v", r, err)
	}
	for _, k := range []string{be.(*strict.Backend).KeyName("fast"), "rate:fast"} {
		if n, err := c.Exists(ctx, k).Result(); err != nil || n != 1 {
			t.Errorf("at the benchmark's limit, key %q was not written (%d, %v)", k, n, err)
		}
	}
}
