package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	guber "github.com/gubernator-io/gubernator/v2"
	"github.com/sirupsen/logrus"

	"github.com/sluicehq/sluice/internal/testkit/proctest"
	"github.com/sluicehq/sluice/server"
)

// BenchmarkSharedLimitOverAdmission: what a pool of three daemons with no store admits of
// one shared limit, 150/s with a burst of 150 (gubernator's token bucket of 150 a second
// holds 150), with 8 callers at each daemon asking as fast as they are answered for 8 s:
// the gossip mode (three `sluice serve --backend gossip` servers in this process, their
// members on loopback; the default policy decides this limit at its key's owner) against
// gubernator's GLOBAL behaviour (three v2 daemons in this process, each told of the
// others: each decides at once on its own copy and the owner syncs the hits). The metric
// is the admitted over burst + rate × time, in percent (0: exact; above: over-admitted).
// Run with -benchtime 1x: each op is the whole 8 s run.
func BenchmarkSharedLimitOverAdmission(b *testing.B) {
	const rate, burst, callers = 150, 150, 8
	const run = 8 * time.Second
	b.Run("impl=sluice-gossip", func(b *testing.B) {
		var over float64
		for range b.N {
			ms := gossipPool(b, 3)
			var ss []*server.Server
			for _, m := range ms {
				cfg := server.DefaultConfig()
				cfg.Backend, cfg.ListenLine, cfg.ListenHTTP = "gossip", "", "127.0.0.1:0"
				r, err := server.ParseRuleFlag(fmt.Sprintf("api=%d/s burst=%d", rate, burst), false)
				if err != nil {
					b.Fatal(err)
				}
				cfg.Rules = []server.Rule{r}
				s, err := server.New(cfg, server.WithBackend(m), server.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Start(); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { s.Shutdown(context.Background()) })
				ss = append(ss, s)
			}
			time.Sleep(500 * time.Millisecond) // the members hear each other
			over = load(b, len(ss), callers, run, rate, burst, func(d int) (bool, error) {
				dec, err := ss[d].Decide(context.Background(), "api", 1, 0)
				return dec.Allowed, err
			})
		}
		b.ReportMetric(over, "over-%")
	})
	b.Run("impl=gubernator-global", func(b *testing.B) {
		var over float64
		for range b.N {
			log := logrus.New()
			log.SetOutput(io.Discard)
			var ds []*guber.Daemon
			var peers []guber.PeerInfo
			for range 3 {
				addr := proctest.FreeAddr(b)
				d, err := guber.SpawnDaemon(context.Background(), guber.DaemonConfig{GRPCListenAddress: addr,
					HTTPListenAddress: proctest.FreeAddr(b), AdvertiseAddress: addr, InstanceID: addr, Logger: log})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(d.Close)
				ds = append(ds, d)
				peers = append(peers, guber.PeerInfo{GRPCAddress: addr, HTTPAddress: d.HTTPListener.Addr().String()})
			}
			var cs []guber.V1Client
			for i, d := range ds {
				d.SetPeers(peers)
				c, err := guber.DialV1Server(peers[i].GRPCAddress, nil)
				if err != nil {
					b.Fatal(err)
				}
				cs = append(cs, c)
			}
			time.Sleep(500 * time.Millisecond)
			over = load(b, len(cs), callers, run, rate, burst, func(d int) (bool, error) {
				resp, err := cs[d].GetRateLimits(context.Background(), &guber.GetRateLimitsReq{Requests: []*guber.RateLimitReq{{
					Name: "api", UniqueKey: "k", Hits: 1, Limit: rate, Duration: 1000,
					Algorithm: guber.Algorithm_TOKEN_BUCKET, Behavior: guber.Behavior_GLOBAL}}})
				if err != nil {
					return false, err
				}
				r := resp.Responses[0]
				if r.Error != "" {
					return false, fmt.Errorf("gubernator: %s", r.Error)
				}
				return r.Status == guber.Status_UNDER_LIMIT, nil
			})
		}
		b.ReportMetric(over, "over-%")
	})
}

// load runs callers at each of daemons for run, each asking as fast as it is answered,
// and returns what was admitted over burst + rate × the run's length, in percent.
func load(b *testing.B, daemons, callers int, run time.Duration, rate, burst float64, ask func(daemon int) (bool, error)) float64 {
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for d := range daemons {
		for range callers {
			wg.Go(func() {
				for time.Since(start) < run {
					ok, err := ask(d)
					if err != nil {
						b.Error(err)
						return
					}
					if ok {
						admitted.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	allowed := burst + rate*time.Since(start).Seconds()
	b.Logf("admitted %d where burst + rate × time allows %.0f", admitted.Load(), allowed)
	return 100 * (float64(admitted.Load())/allowed - 1)
}
