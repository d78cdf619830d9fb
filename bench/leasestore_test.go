package bench

import (
	"context"
	"fmt"
	"io"
	"log"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/etcdtest"
	"github.com/sluicehq/sluice/internal/testkit/zktest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/store"
	etcdstore "github.com/sluicehq/sluice/store/etcd"
	redisstore "github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/storetest"
	zkstore "github.com/sluicehq/sluice/store/zk"
)

// leaseRun is what a lease run through a real Redis cost.
type leaseRun struct {
	seconds             float64
	loads, swaps        int64
	bytesIn, bytesOut   int64
	writes, conflicts   int64
	buckets             int64 // bucket operations (each among writes too)
	decisions, admitted int64
	recordBytes         int
	// The start, before the measured time: how long until every member had decided once
	// (each waiting up to 10 s), the records written and lost meanwhile, and the members
	// whose first decision did not come.
	warmSeconds          float64
	warmWrites, warmLost int64
	cold                 int64
}

// countedStore is a member's store with what it cost.
type countedStore interface {
	store.Store
	Ops() (loads, swaps int64)
}

// runLeaseOnRedis runs members lease members through one Redis (see runLease), each
// member with its own Redis store (store/redis) on one shared client and connection pool.
func runLeaseOnRedis(b *testing.B, addr string, members int, renew time.Duration, cfg lease.Config, limits sluice.Limits, keys []string, pace float64, d time.Duration, poisson ...bool) leaseRun {
	client := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: 64})
	defer client.Close()
	client.FlushAll(ctx)
	run := runLease(b, func() countedStore { return redisstore.New(client) }, members, renew, cfg, limits, keys, pace, d, poisson...)
	// The size of one record as it is stored.
	if ks, err := client.Keys(ctx, "*").Result(); err == nil {
		for _, k := range ks {
			if n, err := client.StrLen(ctx, k).Result(); err == nil && int(n) > run.recordBytes {
				run.recordBytes = int(n)
			}
		}
	}
	return run
}

// runLease runs members lease members, each with its own store from newStore (as members
// in separate processes: the members of one process that share a store combine their
// rounds), on the limits, each key in keys asked for by every member at pace decisions a
// second each, for d after every member holds its shares, and reports the stores' costs
// over that time.
//
// poisson (optional, false by default): each member asks at Poisson times of its own at
// pace, rather than at evenly spaced instants, which members started together keep in
// step: at a slow limit (under a permit a second a member) they all ask at once, and a
// pool's burst, not its rate, bounds what any throttle could grant them.
func runLease(b *testing.B, newStore func() countedStore, members int, renew time.Duration, cfg lease.Config, limits sluice.Limits, keys []string, pace float64, d time.Duration, poisson ...bool) leaseRun {
	atRandom := len(poisson) > 0 && poisson[0]
	var stores []countedStore
	var conflicts []*storetest.Conflicts
	for range members {
		st := newStore()
		stores = append(stores, st)
		conflicts = append(conflicts, &storetest.Conflicts{Store: st})
	}
	if err := lease.WaitUnfenced(ctx, stores[0], lease.DefaultConfig()); err != nil {
		b.Fatal(err)
	}
	var ls []*sluice.Limiter
	var bes []*lease.Backend
	for i := range members {
		be, err := lease.New(conflicts[i], lease.WithID("m"+strconv.Itoa(i)), lease.WithRenewEvery(renew), lease.WithConfig(cfg))
		if err != nil {
			b.Fatal(err)
		}
		l, err := sluice.New(limits, sluice.WithBackend(be))
		if err != nil {
			b.Fatal(err)
		}
		ls = append(ls, l)
		bes = append(bes, be)
	}
	defer func() {
		for i := range ls {
			ls[i].Close()
			bes[i].Close()
		}
	}()
	sum := func() (loads, swaps, in, out, writes, lost, buckets int64) {
		for i, st := range stores {
			l, s := st.Ops()
			loads, swaps = loads+l, swaps+s
			if bs, ok := st.(interface{ Bytes() (int64, int64) }); ok {
				a, b := bs.Bytes()
				in, out = in+a, out+b
			}
			w, c := conflicts[i].Counts()
			writes, lost, buckets = writes+w, lost+c, buckets+conflicts[i].Buckets()
		}
		return
	}
	// Every member joins every key's limit, concurrently (a first decision on a fresh limit
	// waits for its join window, and joins due together go in one round trip).
	var warm sync.WaitGroup
	var cold atomic.Int64 // members whose first decision did not come within 10 s
	_, _, _, _, ww0, wc0, _ := sum()
	warmStart := time.Now()
	sem := make(chan struct{}, 512)
	for _, l := range ls {
		for _, k := range keys {
			warm.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; warm.Done() }()
				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				if l.Wait(wctx, k) != nil {
					cold.Add(1)
				}
			}()
		}
	}
	warm.Wait()
	warmSeconds := time.Since(warmStart).Seconds()
	_, _, _, _, ww1, wc1, _ := sum()
	var decisions, admitted atomic.Int64
	var measuring atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for m, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Every 10 ms, the decisions due by then: a ticker drops the ticks a loaded
			// machine misses, and demand would fall under the pace asked for.
			t := time.NewTicker(10 * time.Millisecond)
			defer t.Stop()
			start, done := time.Now(), 0
			rng := rand.New(rand.NewPCG(uint64(m), 1))
			next := rng.ExpFloat64() / pace // seconds from start of the next ask (poisson)
			// Evenly spaced, each member at a phase of its own (spread over the interval by
			// the golden ratio): members started together would otherwise ask in step for
			// ever, a thousand at once, where no throttle grants more than the burst.
			phase := math.Mod(float64(m)*0.6180339887498949, 1)
			for {
				select {
				case <-stop:
					return
				case <-t.C:
				}
				due := int(time.Since(start).Seconds()*pace + phase)
				if atRandom {
					for due = done; next <= time.Since(start).Seconds(); next += rng.ExpFloat64() / pace {
						due++
					}
				}
				for ; done < due; done++ {
					for _, k := range keys {
						ok := l.Allow(ctx, k)
						if measuring.Load() {
							decisions.Add(1)
							if ok {
								admitted.Add(1)
							}
						}
					}
				}
			}
		}()
	}
	// Every member joins, the shares settle: two TTLs.
	time.Sleep(2 * time.Second)
	loads0, swaps0, in0, out0, w0, c0, k0 := sum()
	measuring.Store(true)
	start := time.Now()
	time.Sleep(d)
	measuring.Store(false)
	el := time.Since(start).Seconds()
	loads1, swaps1, in1, out1, w1, c1, k1 := sum()
	close(stop)
	wg.Wait()
	run := leaseRun{
		seconds: el, loads: loads1 - loads0, swaps: swaps1 - swaps0,
		bytesIn: in1 - in0, bytesOut: out1 - out0,
		writes: w1 - w0, conflicts: c1 - c0, buckets: k1 - k0,
		decisions: decisions.Load(), admitted: admitted.Load(),
		warmSeconds: warmSeconds, warmWrites: ww1 - ww0, warmLost: wc1 - wc0, cold: cold.Load(),
	}
	return run
}

func (r leaseRun) report(b *testing.B, members int) {
	m := float64(members)
	b.ReportMetric(float64(r.loads+r.swaps)/r.seconds/m, "storeops/s/member")
	if r.bytesIn+r.bytesOut > 0 {
		b.ReportMetric(float64(r.bytesIn+r.bytesOut)/r.seconds/m, "B/s/member")
	}
	b.ReportMetric(float64(r.swaps)/r.seconds, "swaps/s")
	if r.writes > 0 {
		b.ReportMetric(100*float64(r.conflicts)/float64(r.writes), "conflict%")
		// Records written (mailboxes and ballots included), apart from the bucket
		// operations (a crowded central limit's takes, one a decision, as the strict mode's).
		b.ReportMetric(float64(r.writes-r.buckets)/r.seconds, "recwrites/s")
	}
	if r.recordBytes > 0 {
		b.ReportMetric(float64(r.recordBytes), "B/record")
	}
	if r.warmSeconds > 0 {
		// The start: every member's first decision on a fresh limit, all at once.
		b.ReportMetric(r.warmSeconds, "warm-s")
		if r.warmWrites > 0 {
			b.ReportMetric(100*float64(r.warmLost)/float64(r.warmWrites), "warmlost%")
		}
		b.ReportMetric(float64(r.cold), "cold")
	}
	b.ReportMetric(float64(r.admitted)/r.seconds, "admitted/s")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkLeaseRedisMembers: what 2, 20, 200 and 1,000 members sharing one limit through one
// real Redis cost: store operations and bytes per member per second, the compare-and-set
// conflicts, the size of the record. Demand is 1.5 times the limit, spread evenly (every
// member busy, every renewal a real change). Run with -benchtime 1x: each iteration is
// five seconds of real time.
func BenchmarkLeaseRedisMembers(b *testing.B) {
	addr := startRedis(b)
	limits := sluice.Limits{{Rate: 2000, Period: time.Second, Burst: 400}}
	slow := lease.DefaultConfig()
	slow.TTL, slow.Grace = 4*time.Second, 2*time.Second
	for _, tc := range []struct {
		members int
		renew   time.Duration
		cfg     lease.Config
	}{
		{2, 0, lease.DefaultConfig()},
		{20, 0, lease.DefaultConfig()},
		{200, 0, lease.DefaultConfig()},
		{1000, 0, lease.DefaultConfig()},
		{200, time.Second, slow}, // renewals and leases four times as long
	} {
		members := tc.members
		name := fmt.Sprintf("members=%d", members)
		if tc.renew == 0 {
			tc.renew = lease.DefaultMemberConfig().RenewEvery
		} else {
			name += fmt.Sprintf("/renew=%v/ttl=%v", tc.renew, tc.cfg.TTL)
		}
		b.Run(name, func(b *testing.B) {
			var total leaseRun
			for range b.N {
				r := runLeaseOnRedis(b, addr, members, tc.renew, tc.cfg, limits, []string{"api"}, 1.5*2000/float64(members), 3*time.Second)
				total = total.add(r)
			}
			total.report(b, members)
		})
	}
}

// BenchmarkLeaseRedisCentral: a limit with more members than permits of burst (100/s
// burst=20, 10/s burst=5) is decided at the store, every permit a take of its one record,
// or past allot.BucketAbove members (150, 300) of its bucket (one script call); its
// members ask 150% of it (Allow) at Poisson times.
func BenchmarkLeaseRedisCentral(b *testing.B) {
	addr := startRedis(b)
	for _, tc := range []struct {
		rate, burst int64
		members     int
	}{{100, 20, 8}, {100, 20, 24}, {100, 20, 32}, {100, 20, 48}, {100, 20, 100}, {100, 20, 150}, {100, 20, 300}, {10, 5, 8}, {10, 5, 24}, {10, 5, 32}} {
		limits := sluice.Limits{{Rate: tc.rate, Period: time.Second, Burst: tc.burst}}
		members := tc.members
		b.Run(fmt.Sprintf("rate=%d/members=%d", tc.rate, members), func(b *testing.B) {
			var total leaseRun
			for range b.N {
				total = total.add(runLeaseOnRedis(b, addr, members, lease.DefaultMemberConfig().RenewEvery, lease.DefaultConfig(), limits, []string{"api"}, 1.5*float64(tc.rate)/float64(members), 3*time.Second, true))
			}
			total.report(b, members)
		})
	}
}

// BenchmarkLeaseRedisRenewals: how many renewals a second one limit's record takes before
// conflicts dominate: 20 members renew ever more often (every 250 ms down to every 5 ms).
// Every renewal of one limit is a compare-and-set on one record, so the members' writes
// serialise on it; conflict% is the share of writes that lost and were retried.
func BenchmarkLeaseRedisRenewals(b *testing.B) {
	addr := startRedis(b)
	limits := sluice.Limits{{Rate: 2000, Period: time.Second, Burst: 400}}
	const members = 20
	for _, renew := range []time.Duration{250 * time.Millisecond, 50 * time.Millisecond, 20 * time.Millisecond, 5 * time.Millisecond} {
		b.Run(fmt.Sprintf("renew=%v", renew), func(b *testing.B) {
			var total leaseRun
			for range b.N {
				total = total.add(runLeaseOnRedis(b, addr, members, renew, lease.DefaultConfig(), limits, []string{"api"}, 1.5*2000/members, 3*time.Second))
			}
			total.report(b, members)
		})
	}
}

// BenchmarkLeaseRedisKeys: one member holding many keys renews them all in one round trip
// per renewal (one read of every record, one write of those that changed), not one per key.
func BenchmarkLeaseRedisKeys(b *testing.B) {
	addr := startRedis(b)
	limits := sluice.Limits{{Rate: 100, Period: time.Second, Burst: 10}}
	for _, n := range []int{1, 100, 10000} {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = "key" + strconv.Itoa(i)
		}
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			var total leaseRun
			for range b.N {
				total = total.add(runLeaseOnRedis(b, addr, 1, lease.DefaultMemberConfig().RenewEvery, lease.DefaultConfig(), limits, keys, 2, 3*time.Second))
			}
			total.report(b, 1)
		})
	}
}

func (r leaseRun) add(o leaseRun) leaseRun {
	r.seconds += o.seconds
	r.loads += o.loads
	r.swaps += o.swaps
	r.bytesIn += o.bytesIn
	r.bytesOut += o.bytesOut
	r.writes += o.writes
	r.conflicts += o.conflicts
	r.buckets += o.buckets
	r.decisions += o.decisions
	r.admitted += o.admitted
	r.recordBytes = max(r.recordBytes, o.recordBytes)
	r.warmSeconds = max(r.warmSeconds, o.warmSeconds)
	r.warmWrites += o.warmWrites
	r.warmLost += o.warmLost
	r.cold += o.cold
	return r
}

// BenchmarkLeaseStores: what 2 and 8 members sharing one limit cost through one real
// Redis, etcd and ZooKeeper, in the same run: store operations per member per second, the
// writes lost to conflicts, what the pool admitted. Each member has its own store and
// client (as separate processes would). Run with -benchtime 1x.
func BenchmarkLeaseStores(b *testing.B) {
	redisAddr := startRedis(b)
	etcd, err := etcdtest.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer etcd.Close()
	zks, err := zktest.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer zks.Close()
	limits := sluice.Limits{{Rate: 2000, Period: time.Second, Burst: 400}}
	for _, members := range []int{2, 8} {
		for _, kind := range []string{"redis", "etcd", "zk"} {
			b.Run(fmt.Sprintf("store=%s/members=%d", kind, members), func(b *testing.B) {
				var closers []func()
				defer func() {
					for _, c := range closers {
						c()
					}
				}()
				prefix := fmt.Sprintf("bench%d", time.Now().UnixNano())
				newStore := func() countedStore {
					switch kind {
					case "etcd":
						c, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Addr()}, Logger: zap.NewNop()})
						if err != nil {
							b.Fatal(err)
						}
						closers = append(closers, func() { c.Close() })
						return etcdstore.New(c, store.WithPrefix(prefix+"/"))
					case "zk":
						c, _, err := zk.Connect([]string{zks.Addr()}, 4*time.Second, zk.WithLogger(log.New(io.Discard, "", 0)))
						if err != nil {
							b.Fatal(err)
						}
						closers = append(closers, c.Close)
						return zkstore.New(c, store.WithPrefix("/"+prefix))
					}
					c := goredis.NewClient(&goredis.Options{Addr: redisAddr})
					closers = append(closers, func() { c.Close() })
					return redisstore.New(c, store.WithPrefix(prefix+":"))
				}
				var total leaseRun
				for range b.N {
					total = total.add(runLease(b, newStore, members, lease.DefaultMemberConfig().RenewEvery, lease.DefaultConfig(), limits, []string{"api"}, 1.5*2000/float64(members), 3*time.Second))
				}
				total.report(b, members)
			})
		}
	}
}
