package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/gossip"
	"github.com/sluicehq/sluice/local"
)

// The gossip mode's benchmarks: a daemon deciding in gossip mode (two peers joined, in
// this process on loopback) against one in local mode, in the same run; and the bytes a
// member sends per second as the number of active tags grows.

// gossipPool starts n gossip members on loopback that have all joined each other.
func gossipPool(b *testing.B, n int) []*gossip.Backend {
	var ms []*gossip.Backend
	for i := range n {
		cfg := gossip.DefaultConfig()
		cfg.Bind = "127.0.0.1:0"
		if i > 0 {
			cfg.Peers = []string{ms[0].Addr()}
		}
		m, err := gossip.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { m.Close() })
		ms = append(ms, m)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ok := true
		for _, m := range ms {
			ok = ok && m.Members() == n
		}
		if ok {
			return ms
		}
		if time.Now().After(deadline) {
			b.Fatal("the pool did not form")
		}
	}
}

// BenchmarkGossipDaemon: decisions per second of one daemon over the line protocol, 100
// pipelined queries per call, local back end against gossip (a member of a pool of three).
func BenchmarkGossipDaemon(b *testing.B) {
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("conc=%d/impl=local", conc), func(b *testing.B) {
			s := startSluice(b)
			parallel(b, conc, 100, func(w int) func() error { return lineCaller(b, s.LineAddr().String(), w, 100) })
		})
		b.Run(fmt.Sprintf("conc=%d/impl=gossip", conc), func(b *testing.B) {
			ms := gossipPool(b, 3)
			s := startSluice(b, ms[0])
			parallel(b, conc, 100, func(w int) func() error { return lineCaller(b, s.LineAddr().String(), w, 100) })
		})
	}
}

// BenchmarkGossipDecide: the back ends' own decision, without the daemon around it: a
// gossip member (of a pool of three) against the local back end, 256 tags, one limit,
// every core deciding.
func BenchmarkGossipDecide(b *testing.B) {
	lim := []gcra.Limit{{T: 1, Tau: int64(time.Second)}} // 1e9/s: always allowed, so both do the whole path
	keys := make([]string, 256)
	for i := range keys {
		keys[i] = fmt.Sprintf("t-%d-%d", i/16, i%16)
	}
	run := func(b *testing.B, be backend.Backend) {
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			// Each goroutine on its own tags, as the daemon's connections are.
			for i := int(next.Add(1)) * 16; pb.Next(); i++ {
				g, err := be.Decide(ctx, keys[i%len(keys)], backend.Request{Limits: lim, N: 1})
				if err != nil || !g.Allowed {
					b.Errorf("refused: %v", err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	}
	b.Run("impl=local", func(b *testing.B) {
		be := local.New()
		b.Cleanup(func() { be.Close() })
		run(b, be)
	})
	b.Run("impl=gossip", func(b *testing.B) { run(b, gossipPool(b, 3)[0]) })
}

// BenchmarkGossipBytes: three members decide on every one of `tags` active tags each
// round (every tag changes every sync interval); reports the bytes a member sends per
// second, and per tag.
func BenchmarkGossipBytes(b *testing.B) {
	for _, tags := range []int{100, 10000} {
		b.Run(fmt.Sprintf("tags=%d/impl=gossip", tags), func(b *testing.B) {
			ms := gossipPool(b, 3)
			lim := []gcra.Limit{{T: int64(time.Millisecond), Tau: 1000 * int64(time.Millisecond)}}
			keys := make([]string, tags)
			for i := range keys {
				keys[i] = fmt.Sprintf("tag-%05d", i)
			}
			before := make([]float64, len(ms))
			for i, m := range ms {
				before[i] = m.Sent()
			}
			start := time.Now()
			b.ResetTimer()
			// Rounds for at least 3 s (30 syncs), whatever b.N: every tag is decided on
			// every member in every interval.
			for i := 0; i < b.N || time.Since(start) < 3*time.Second; i++ {
				m := ms[i%len(ms)]
				for _, k := range keys {
					if _, err := m.Decide(context.Background(), k, backend.Request{Limits: lim, N: 1}); err != nil {
						b.Fatal(err)
					}
				}
				if tags <= 1000 {
					time.Sleep(time.Millisecond) // a small pool of tags: pace the rounds
				}
			}
			secs := time.Since(start).Seconds()
			var sent float64
			for i, m := range ms {
				sent += m.Sent() - before[i]
			}
			perMember := sent / float64(len(ms)) / secs
			b.ReportMetric(perMember, "bytes/s")
			b.ReportMetric(perMember/float64(tags), "bytes/s/tag")
		})
	}
}
