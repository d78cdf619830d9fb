package hits

import (
	"fmt"
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
