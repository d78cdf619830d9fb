package bench

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/strict"
)

// BenchmarkWindowLocal: a full decision (AllowN) on one key in process, under a windowed
// quota against the same rate as a GCRA limit, so that every decision grants.
func BenchmarkWindowLocal(b *testing.B) {
	for _, c := range []struct{ impl, limit string }{
		{"gcra", "1000000000/s"},
		{"window", "1000000000/s window"},
	} {
		b.Run("impl="+c.impl, func(b *testing.B) {
			l := sluice.MustNew(sluice.MustParse(c.limit), sluice.WithMaxKeys(0))
			defer l.Close()
			b.ReportAllocs()
			for b.Loop() {
				l.AllowN(ctx, "api", 1)
			}
		})
	}
}

// BenchmarkWindowRedis: windowed-quota decisions on one Redis on this machine, at 1 and 8
// goroutines on 10,000 keys: impl=sluice_window is the strict mode's window counter on Redis
// (window.lua, one round trip per decision, with reservations, weights and the Go core's
// answers), impl=sluice_gcra the GCRA script at the same rate (batched), impl=incr the
// fixed window users write by hand: INCRBY on the window's key and PEXPIREAT in one
// MULTI, over the count when the reply says so (no reservations, no refunds, and an
// INCR past the count stays counted).
func BenchmarkWindowRedis(b *testing.B) {
	addr := startRedis(b)
	info := goredis.NewClient(&goredis.Options{Addr: addr})
	defer info.Close()
	ks := keys(10_000)
	const count = 1_000_000_000
	for _, g := range []int{1, 8} {
		name := fmt.Sprintf("g=%d", g)
		for _, c := range []struct{ impl, limit string }{
			{"sluice_window", "1000000000/h window"},
			{"sluice_gcra", "1000000/s burst=1000"},
		} {
			b.Run(name+"/impl="+c.impl, func(b *testing.B) {
				be, err := strict.Dial(context.Background(), "redis://"+addr)
				if err != nil {
					b.Fatal(err)
				}
				defer be.Close()
				l := sluice.MustNew(sluice.MustParse(c.limit), sluice.WithBackend(be))
				runDecisions(b, g, ks, info, func(k string) bool { d, _ := l.AllowN(ctx, k, 1); return d.Allowed })
			})
		}
		b.Run(name+"/impl=incr", func(b *testing.B) {
			cl := goredis.NewClient(&goredis.Options{Addr: addr})
			defer cl.Close()
			runDecisions(b, g, ks, info, func(k string) bool {
				now := time.Now()
				w := now.Truncate(time.Hour)
				key := k + ":" + strconv.FormatInt(w.Unix(), 10)
				var incr *goredis.IntCmd
				_, err := cl.TxPipelined(ctx, func(p goredis.Pipeliner) error {
					incr = p.IncrBy(ctx, key, 1)
					p.PExpireAt(ctx, key, w.Add(time.Hour))
					return nil
				})
				return err == nil && incr.Val() <= count
			})
		})
	}
}
