package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testkit/daemontest"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/strict"
)

// startStrictSluice starts a daemon in the strict mode on the Redis at addr, with the rule
// of startSluice for Envoy's descriptors (bench/k=...).
func startStrictSluice(b *testing.B, addr string) *server.Server {
	cfg := server.DefaultConfig()
	cfg.ListenLine, cfg.ListenHTTP, cfg.ListenGRPC = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.Backend, cfg.Store = "strict", "redis://"+addr
	e, _ := server.ParseRuleFlag("bench/*=1000000000/s burst=1000", false)
	cfg.Rules = []server.Rule{e}
	be, err := strict.Open(cfg.Store, benchTimeout) // a stall on the loaded machine is not a denial
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	return daemontest.Start(b, cfg, server.WithBackend(be))
}

// redisScriptStats reports Redis' own time per decision (INFO commandstats) between two
// readings, and script calls per decision.
func redisScriptStats(b *testing.B, info *goredis.Client, n int, before func() (time.Duration, int64)) {
	cmd0, calls0 := before()
	cmd, calls := redisCommandTime(info)
	cmd, calls = cmd-cmd0, calls-calls0
	b.ReportMetric(float64(cmd.Nanoseconds())/1e3/float64(n), "redis-exec-us/op")
	if calls > 0 {
		b.ReportMetric(float64(cmd.Nanoseconds())/1e3/float64(calls), "redis-exec-us/call")
		b.ReportMetric(float64(calls)/float64(n), "script-calls/op")
	}
}

// BenchmarkEnvoyRedis: Envoy's ShouldRateLimit through a daemon in the strict mode on one
// Redis, one descriptor a call over 10,000 keys (bench/k=0 to 9999, in turn), at 1, 16 and
// 64 concurrent streams on one connection. It reports, beside decisions/s, Redis' own
// time per decision and per script call (INFO commandstats: the script calls' usec), and
// script calls per decision. impl=incr is what envoyproxy/ratelimit sends Redis for one
// descriptor (INCRBY and EXPIRE in one pipeline, a fixed window, not exact across the
// window's edge), from the same number of goroutines straight to Redis: the floor a
// script is measured against (its redis-exec-us/op counts those two commands).
func BenchmarkEnvoyRedis(b *testing.B) {
	const nkeys = 10_000
	addr := startRedis(b)
	info := goredis.NewClient(&goredis.Options{Addr: addr})
	defer info.Close()
	reqs := make([]*rls.RateLimitRequest, nkeys)
	for i := range reqs {
		reqs[i] = &rls.RateLimitRequest{Domain: "bench", HitsAddend: 1, Descriptors: []*rlcommon.RateLimitDescriptor{{
			Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: strconv.Itoa(i)}}}}}
	}
	for _, conc := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("conc=%d/impl=sluice-grpc", conc), func(b *testing.B) {
			s := startStrictSluice(b, addr)
			c := rlsConn(b, s.GRPCAddr().String())
			var next atomic.Int64
			t0, n0 := redisCommandTime(info)
			parallel(b, conc, 1, func(int) func() error {
				return func() error {
					i := next.Add(1) % nkeys
					resp, err := c.ShouldRateLimit(context.Background(), reqs[i])
					if err == nil && resp.OverallCode != rls.RateLimitResponse_OK {
						err = fmt.Errorf("answer %v", resp)
					}
					return err
				}
			})
			redisScriptStats(b, info, b.N, func() (time.Duration, int64) { return t0, n0 })
		})
		b.Run(fmt.Sprintf("conc=%d/impl=incr", conc), func(b *testing.B) {
			c := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: max(10, conc)})
			defer c.Close()
			var next atomic.Int64
			t0, n0 := redisIncrTime(info)
			parallel(b, conc, 1, func(int) func() error {
				ctx := context.Background()
				return func() error {
					k := "incr:" + strconv.Itoa(int(next.Add(1)%nkeys))
					p := c.Pipeline()
					p.IncrBy(ctx, k, 1)
					p.Expire(ctx, k, time.Second)
					_, err := p.Exec(ctx)
					return err
				}
			})
			t1, n1 := redisIncrTime(info)
			b.ReportMetric(float64((t1-t0).Nanoseconds())/1e3/float64(b.N), "redis-exec-us/op")
			b.ReportMetric(float64(n1-n0)/float64(b.N), "commands/op")
		})
	}
}

// redisIncrTime is Redis' time in INCRBY and EXPIRE (INFO commandstats) and how many it ran.
func redisIncrTime(c *goredis.Client) (time.Duration, int64) {
	return commandTime(c, "cmdstat_incrby", "cmdstat_expire")
}
