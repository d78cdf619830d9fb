package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/strict"
)

// The scripts of BenchmarkRedisFloor: what one script call costs Redis before it does
// anything, and what the commands an exact lone decision needs cost in one.
const (
	// floorEmpty is the least a script call can be.
	floorEmpty = `return 1`
	// floorTime reads Redis' clock, which an exact decision needs (the store's clock).
	floorTime = `local t = redis.call('TIME') return 1`
	// floorCommands makes the three commands a lone decision needs (TIME, GET, SET
	// keeping the key's expiry), with constant arguments and no arithmetic.
	floorCommands = `local t = redis.call('TIME')
local v = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], '1 0 00 1 2', 'KEEPTTL')
return 1`
	// floorAllow is the least an exact lone allowance does in a script: sluice.lua's lone
	// allowance (argv: Tau, T as pairs of seconds and nanoseconds) without the checks that
	// pick it among the script's paths, without a virtual now, and refusing a key in any
	// state but the common one. It is not a decision of sluice's (it writes sluice's
	// format); it measures how far sluice's script is from the least its decision needs.
	floorAllow = `local B = 1000000000
local t = redis.call('TIME')
local nh, nl = t[1] + 0, t[2] * 1000
local v = redis.pcall('GET', KEYS[1])
local th, tl, mh = 0, 0, false
if v then
  if type(v) ~= 'string' then return -1 end
  local z, c, d = string.match(v, '^1 0 (00?) (%-?%d+) (%d+)$')
  if not c then return -1 end
  th, tl = c + 0, d + 0
  if z == '00' then mh = th end
end
local a = ARGV
if th < nh or (th == nh and tl < nl) then th, tl = nh, nl end
th, tl = th + a[3], tl + a[4]
if tl >= B then th, tl = th + 1, tl - B end
local zh, zl = th - a[1], tl - a[2]
if zl < 0 then zh, zl = zh - 1, zl + B end
if nh < zh or (nh == zh and nl < zl) then return 0 end
if mh == th then
  redis.call('SET', KEYS[1], string.format('1 0 00 %d %d', th, tl), 'KEEPTTL')
else
  redis.call('SET', KEYS[1], string.format('1 0 00 %d %d', th, tl), 'PXAT', string.format('%d', (th + 2) * 1000))
end
return 1`
	// floorLibrary holds floorEmpty and floorAllow as Redis 7 functions (FCALL), which
	// get their keys and arguments as parameters rather than as the globals KEYS and ARGV.
	floorLibrary = "#!lua name=sluicefloor\nredis.register_function('empty', function(KEYS, ARGV) return 1 end)\n" +
		"redis.register_function('allow', function(KEYS, ARGV)\n" + floorAllow + "\nend)"
)

// BenchmarkRedisFloor measures, with Redis' own INFO commandstats (the usec of EVALSHA
// or FCALL over their calls: redis-exec-us/call), what a script call costs Redis on this
// machine, from 1 and 8 goroutines each making one call at a time over 10,000 keys:
// impl=empty (return 1), impl=time (TIME), impl=commands (TIME, GET and SET, the commands
// of a lone decision), impl=allow (the least an exact lone allowance does), impl=fcall_empty
// and impl=fcall_allow (empty and allow as Redis 7 functions), and beside them impl=sluice (Limiter.Allow:
// a lone allowance of sluice.lua at 1 goroutine, batches at 8) and impl=redis_rate
// (its Allow), at BenchmarkRedis' limit. The time is wall time inside Redis: on a loaded
// machine a script preempted counts its wait.
func BenchmarkRedisFloor(b *testing.B) {
	addr := startRedis(b)
	info := goredis.NewClient(&goredis.Options{Addr: addr})
	defer info.Close()
	ctx := context.Background()
	if v, err := info.Do(ctx, "command", "info", "fcall").Slice(); err != nil || len(v) == 0 || v[0] == nil {
		b.Fatal("BenchmarkRedisFloor needs Redis 7 or later (FCALL)")
	}
	if err := info.FunctionLoadReplace(ctx, floorLibrary).Err(); err != nil {
		b.Fatal(err)
	}
	ks := keys(10_000)
	scripts := []struct{ name, src string }{
		{"empty", floorEmpty}, {"time", floorTime}, {"commands", floorCommands}, {"allow", floorAllow},
	}
	// Tau and T of BenchmarkRedis' limit (10^6/s, burst 1000) as pairs: 1 ms and 1 µs.
	allowArgs := []any{0, 1_000_000, 0, 1000}
	for _, g := range []int{1, 8} {
		for _, s := range scripts {
			b.Run(fmt.Sprintf("g=%d/impl=%s", g, s.name), func(b *testing.B) {
				c := goredis.NewClient(&goredis.Options{Addr: addr})
				defer c.Close()
				sha, err := c.ScriptLoad(ctx, s.src).Result()
				if err != nil {
					b.Fatal(err)
				}
				var args []any
				if s.name == "allow" {
					args = allowArgs
				}
				runScriptCalls(b, g, ks, info, []string{"cmdstat_evalsha"}, func(k string) bool {
					n, err := c.EvalSha(ctx, sha, []string{k}, args...).Int()
					return err == nil && n == 1
				})
			})
		}
		for _, f := range []string{"empty", "allow"} {
			b.Run(fmt.Sprintf("g=%d/impl=fcall_%s", g, f), func(b *testing.B) {
				c := goredis.NewClient(&goredis.Options{Addr: addr})
				defer c.Close()
				var args []any
				if f == "allow" {
					args = allowArgs
				}
				runScriptCalls(b, g, ks, info, []string{"cmdstat_fcall"}, func(k string) bool {
					n, err := c.FCall(ctx, f, []string{k}, args...).Int()
					return err == nil && n == 1
				})
			})
		}
		b.Run(fmt.Sprintf("g=%d/impl=sluice", g), func(b *testing.B) {
			be, err := strict.Dial(ctx, "redis://"+addr, benchTimeout)
			if err != nil {
				b.Fatal(err)
			}
			defer be.Close()
			l := sluice.MustNew(sluice.Limits{{Rate: int64(redisLimit.Rate), Period: time.Second, Burst: int64(redisLimit.Burst)}}, sluice.WithBackend(be))
			runScriptCalls(b, g, ks, info, []string{"cmdstat_evalsha", "cmdstat_eval"}, func(k string) bool { return l.Allow(ctx, k) })
		})
		b.Run(fmt.Sprintf("g=%d/impl=redis_rate", g), func(b *testing.B) {
			c := goredis.NewClient(&goredis.Options{Addr: addr})
			defer c.Close()
			rl := redis_rate.NewLimiter(c)
			runScriptCalls(b, g, ks, info, []string{"cmdstat_evalsha", "cmdstat_eval"}, func(k string) bool {
				r, err := rl.Allow(ctx, k, redisLimit)
				return err == nil && r.Allowed > 0
			})
		})
	}
}

// runScriptCalls makes b.N calls of call from g goroutines over keys and reports calls/s,
// Redis' execution time of the commands named (INFO commandstats) per script call and per
// op, and script calls per op. A call that fails or denies (a reply other than 1 from the
// scripts) fails the benchmark.
func runScriptCalls(b *testing.B, g int, keys []string, info *goredis.Client, names []string, call func(key string) bool) {
	var failed atomic.Int64
	cmd0, calls0 := commandTime(info, names...)
	b.ResetTimer()
	start := time.Now()
	shareN(b.N, g, func(i int) {
		if !call(keys[i%len(keys)]) {
			failed.Add(1)
		}
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if f := failed.Load(); f > 0 {
		b.Fatalf("%d of %d calls failed or were denied", f, b.N)
	}
	cmd, calls := commandTime(info, names...)
	cmd, calls = cmd-cmd0, calls-calls0
	n := float64(b.N)
	b.ReportMetric(n/elapsed.Seconds(), "calls/s")
	b.ReportMetric(float64(cmd.Nanoseconds())/1e3/n, "redis-exec-us/op")
	if calls > 0 {
		b.ReportMetric(float64(cmd.Nanoseconds())/1e3/float64(calls), "redis-exec-us/call")
		b.ReportMetric(float64(calls)/n, "script-calls/op")
	}
}
