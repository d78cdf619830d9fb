package hits

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gcra"
)

// BenchmarkReportBytes: the bytes of reports (and, deciding at the owner, of nothing else:
// forwarded requests are not counted here) each daemon sends per second of virtual time,
// as the pool grows, for a fixed set of 100 active tags on 100/s burst 20 with arrivals of
// 400/s spread over the pool and the tags: what docs/gossip.md and BENCHMARKS.md quote.
// Run with -benchtime 1x: each op is 5 s of virtual time.
func BenchmarkReportBytes(b *testing.B) {
	lim := []gcra.Limit{{T: sec / 100, Tau: 20 * sec / 100}}
	tags := make([]string, 100)
	for i := range tags {
		tags[i] = fmt.Sprintf("tenant-%03d", i)
	}
	for _, n := range []int{3, 20, 100, 200} {
		for _, p := range []Policy{Auto, Shares} {
			b.Run(fmt.Sprintf("daemons=%d/policy=%s", n, p), func(b *testing.B) {
				var perDaemon float64
				for range b.N {
					cfg := DefaultConfig()
					cfg.Policy = p
					c := newCluster(b, n, lim, cfg, 1)
					c.tags = tags
					c.run(int64(time.Second), 400) // the pool forms, shares settle
					start := c.bytes
					c.run(6*int64(time.Second), 400)
					perDaemon = float64(c.bytes-start) / 5 / float64(n)
				}
				b.ReportMetric(perDaemon, "bytes/daemon/s")
			})
		}
	}
}

// BenchmarkTreeFanout: the same load over 200 daemons, all-to-all (mesh) and over trees
// of fanout 4, 8 (the default), 16 and 199 (a star around each tag's root): the bytes a
// daemon sends per second on average and at the busiest daemon, and the permits used of
// the limit (by shares, the tree's lag shows). Run with -benchtime 1x.
func BenchmarkTreeFanout(b *testing.B) {
	lim := []gcra.Limit{{T: sec / 100, Tau: 20 * sec / 100}}
	tags := make([]string, 100)
	for i := range tags {
		tags[i] = fmt.Sprintf("tenant-%03d", i)
	}
	const n = 200
	for _, fan := range []int{0, 4, 8, 16, n - 1} {
		for _, p := range []Policy{Auto, Shares} {
			name := fmt.Sprintf("fanout=%d/policy=%s", fan, p)
			if fan == 0 {
				name = "mesh/policy=" + p.String()
			}
			b.Run(name, func(b *testing.B) {
				var avg, busiest float64
				for range b.N {
					cfg := DefaultConfig()
					cfg.Policy = p
					if fan == 0 {
						cfg.MeshMax = n
					} else {
						cfg.Fanout = fan
					}
					c := newCluster(b, n, lim, cfg, 1)
					c.tags = tags
					c.run(int64(time.Second), 400)
					start := slices.Clone(c.sentBy)
					c.run(6*int64(time.Second), 400)
					var total, most int64
					for i := range c.sentBy {
						d := c.sentBy[i] - start[i]
						total += d
						most = max(most, d)
					}
					avg, busiest = float64(total)/5/n, float64(most)/5
				}
				b.ReportMetric(avg, "bytes/daemon/s")
				b.ReportMetric(busiest, "bytes/busiest/s")
			})
		}
	}
}
