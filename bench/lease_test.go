package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/priority"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/storetest"
)

// newLeaseMember returns a limiter deciding on its lease of the limit from store, as a
// process in lease mode would, and waits until it holds its share.
func newLeaseMember(b *testing.B, store store.Store, id string, limits sluice.Limits, opts ...lease.Option) *sluice.Limiter {
	be, err := lease.New(store, append([]lease.Option{lease.WithID(id)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	l, err := sluice.New(limits, sluice.WithBackend(be))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close(); be.Close() })
	// Wait for the join (and a fresh limit's join window) and a share: a later member's
	// comes when the others shrink at their next renewal.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := l.Wait(wctx, "api"); err != nil {
		b.Fatalf("member %s got no share: %v", id, err)
	}
	return l
}

func newMemStore(b *testing.B) *store.Memory { return store.NewMemory(nil) }

// BenchmarkLeaseAllowOneKey: Allow on one key from one goroutine, in lease mode (one member
// alone on the limit) against x/time/rate. impl=sluice-lease-equal: see
// BenchmarkLeaseAllowParallel.
func BenchmarkLeaseAllowOneKey(b *testing.B) {
	limits := sluice.Limits{{Rate: ratePerSec, Period: time.Second, Burst: burst}}
	for _, tc := range leasePolicies() {
		b.Run(tc.name, func(b *testing.B) {
			l := newLeaseMember(b, newMemStore(b), "m1", limits, tc.opts...)
			b.ReportAllocs()
			b.ResetTimer()
			cpuLoop(b, func() { l.Allow(ctx, "api") })
		})
	}
	// A process whose calls name classes elsewhere (one critical call on another key): a
	// standard call on a key no critical caller asked for keeps the fast path.
	b.Run("impl=sluice-lease-classed", func(b *testing.B) {
		l := newLeaseMember(b, newMemStore(b), "m1", limits)
		l.Allow(priority.With(ctx, priority.Critical), "other")
		b.ReportAllocs()
		b.ResetTimer()
		cpuLoop(b, func() { l.Allow(ctx, "api") })
	})
	b.Run("impl=xrate", benchXrateAllow)
}

// leasePolicies are the lease benchmarks' members: under the default policy, and under
// the equal policy (see BenchmarkLeaseAllowParallel).
func leasePolicies() []struct {
	name string
	opts []lease.Option
} {
	equal := lease.DefaultConfig()
	equal.Policy = lease.Equal
	return []struct {
		name string
		opts []lease.Option
	}{{"impl=sluice-lease", nil}, {"impl=sluice-lease-equal", []lease.Option{lease.WithConfig(equal)}}}
}

// BenchmarkLeaseAllowParallel: Allow on one key from GOMAXPROCS goroutines of one member.
// Under the default (fair) policy a lone member's share follows its measured demand, half
// as much again: goroutines that speed up past it (as they do whenever the machine's other
// load eases) run at the share's rate, part of their calls the long way, until the next
// renewals grow it. impl=sluice-lease-equal is the same member under the equal policy,
// which leaves it the whole limit: the decision's own cost.
func BenchmarkLeaseAllowParallel(b *testing.B) {
	limits := sluice.Limits{{Rate: ratePerSec, Period: time.Second, Burst: burst}}
	for _, tc := range leasePolicies() {
		b.Run(tc.name, func(b *testing.B) {
			l := newLeaseMember(b, newMemStore(b), "m1", limits, tc.opts...)
			b.ReportAllocs()
			b.ResetTimer()
			cpuParallel(b, func(pb *testing.PB) {
				for pb.Next() {
					l.Allow(ctx, "api")
				}
			})
		})
	}
	b.Run("impl=xrate", benchXrateAllowParallel)
}

// BenchmarkLeaseStoreOps: how often two members that share a limit touch the store while
// they decide about 1,000, or as many as they can (over 1,000,000), decisions a second
// between them, for two seconds of real time per iteration (run it with -benchtime 1x).
// It reports decisions per second and store round trips per member per second: the same
// handful at both rates.
func BenchmarkLeaseStoreOps(b *testing.B) {
	for _, tc := range []struct {
		name   string
		paced  bool
		limits sluice.Limits
	}{
		{"decisions=1k", true, sluice.Limits{{Rate: 2000, Period: time.Second, Burst: 200}}},
		{"decisions=1M", false, sluice.Limits{{Rate: ratePerSec, Period: time.Second, Burst: burst}}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var decisions, trips, seconds float64
			for range b.N {
				store := &storetest.Trips{Store: newMemStore(b)}
				ms := []*sluice.Limiter{newLeaseMember(b, store, "m1", tc.limits), newLeaseMember(b, store, "m2", tc.limits)}
				before := store.Trips()
				var n atomic.Int64
				var wg sync.WaitGroup
				start := time.Now()
				end := start.Add(2 * time.Second)
				for _, l := range ms {
					wg.Add(1)
					go func() {
						defer wg.Done()
						next := time.Now()
						for time.Now().Before(end) {
							if tc.paced { // 500 a second per member
								next = next.Add(2 * time.Millisecond)
								time.Sleep(time.Until(next))
							}
							for range 64 {
								l.Allow(ctx, "api")
								n.Add(1)
								if tc.paced {
									break
								}
							}
						}
					}()
				}
				wg.Wait()
				el := time.Since(start).Seconds()
				decisions += float64(n.Load())
				trips += float64(store.Trips() - before)
				seconds += el
			}
			b.ReportMetric(decisions/seconds, "decisions/s")
			b.ReportMetric(trips/seconds/2, "storeops/s/member")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// TestLeaseMemberDecidesAlone checks what the lease benchmarks assume: a member alone
// holds the whole limit and decides it exactly as x/time/rate does.
func TestLeaseMemberDecidesAlone(t *testing.T) {
	be, err := lease.New(store.NewMemory(nil), lease.WithID("alone"))
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	l, err := sluice.New(sluice.Limits{{Rate: 1, Period: time.Second, Burst: 3}}, sluice.WithBackend(be))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var got int
	for i := 0; i < 10; i++ {
		if l.Allow(ctx, "k") {
			got++
		}
	}
	// The first decision of a fresh limit waits out its join window (50 ms) and gets the
	// whole burst.
	if got != 3 {
		t.Fatalf("grants of a fresh key with burst 3: %d", got)
	}
	if s := be.Leases(); len(s) != 1 || s[0].Share.Rate != lease.RateScale {
		t.Fatalf("leases %s", fmt.Sprint(s))
	}
}
