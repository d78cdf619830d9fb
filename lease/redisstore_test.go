package lease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/backendtest"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/store"
	redisstore "github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/storetest"
)

var prefixes atomic.Int64

// redisClient returns a client of srv for the test, closed after it.
func redisClient(t testing.TB, srv *redistest.Server) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), MaxRetries: -1, DialTimeout: time.Second,
		ReadTimeout: time.Second, WriteTimeout: time.Second, ContextTimeoutEnabled: true, DisableIdentity: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// testPrefix gives each store of a test run its own keys in a shared Redis.
func testPrefix() store.Option {
	return store.WithPrefix(fmt.Sprintf("test%d:", prefixes.Add(1)))
}

func TestRedisStoreConformance(t *testing.T) {
	srv := redistest.New(t)
	client := redisClient(t, srv)
	storetest.Run(t, func(t *testing.T) (store.Store, func()) {
		return redisstore.New(client, testPrefix()), func() { client.FlushAll(context.Background()) }
	})
}

func TestRedisClusterStoreConformance(t *testing.T) {
	cl := redistest.NewCluster(t)
	client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs(), DisableIdentity: true})
	t.Cleanup(func() { client.Close() })
	storetest.Run(t, func(t *testing.T) (store.Store, func()) {
		return redisstore.New(client, testPrefix()), func() {
			client.ForEachMaster(context.Background(), func(ctx context.Context, c *goredis.Client) error { return c.FlushAll(ctx).Err() })
		}
	})
}

func TestMemStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) (store.Store, func()) {
		clk := clock.NewVirtual()
		s := store.NewMemory(clk)
		return s, s.Restart
	})
}

// TestConformanceOnRedis: the lease mode through a real Redis decides as the local
// backend does for one member holding the whole limit (virtual time, passed to the
// scripts).
func TestConformanceOnRedis(t *testing.T) {
	srv := redistest.New(t)
	client := redisClient(t, srv)
	factory := func(t *testing.T, clk *clock.Virtual) backend.Backend {
		c := lease.DefaultConfig()
		c.TTL = time.Hour
		c.JoinWindow = 0
		st := redisstore.New(client, testPrefix(), store.WithNow(func() int64 { return clk.Now().UnixNano() }), store.WithAssumeFresh())
		b, err := lease.New(st, lease.WithConfig(c), lease.WithClock(clk), lease.WithRenewEvery(10*time.Minute), lease.WithIdleAfter(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	backendtest.Run(t, factory)
}

// TestMembersStartedTogetherRarelyConflict: two members of one limit started at the same
// instant, both busy, through a real Redis. They used to renew in step for ever (a
// renewal is timed from the last one, and the loser of a compare-and-set retries at once),
// and a third of their writes lost; their phases drift apart now, and a write loses only
// when two renewals happen to meet.
func TestMembersStartedTogetherRarelyConflict(t *testing.T) {
	srv := redistest.New(t)
	store := &storetest.Conflicts{Store: redisstore.New(redisClient(t, srv), testPrefix())}
	if err := lease.WaitUnfenced(context.Background(), store, lease.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	l := gcra.Limit{T: int64(5 * time.Millisecond), Tau: 20 * int64(5*time.Millisecond)} // 200/s, burst 20
	var bs []*lease.Backend
	for i := range 2 {
		b, err := lease.New(store, lease.WithID(fmt.Sprint("m", i)))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		bs = append(bs, b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, b := range bs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk := time.NewTicker(2 * time.Millisecond)
			defer tk.Stop()
			for ctx.Err() == nil {
				<-tk.C
				b.AllowOne(ctx, "api", l)
			}
		}()
	}
	wg.Wait()
	w, lost := store.Counts()
	t.Logf("%d writes, %d lost their compare-and-set", w, lost)
	if w < 10 || lost*5 > w {
		t.Errorf("%d of %d writes lost their compare-and-set: the members renew in step", lost, w)
	}
}

// TestRedisStoreKeepsRecordsLongEnough: a record lives at least its Keep after the write.
// Keep went to Redis truncated to the millisecond as a TTL (PX), which Redis adds to its
// own clock, truncated too: a record written within a millisecond of its read could
// vanish up to 2 ms before the moment its leases are all over (Write.Keep).
func TestRedisStoreKeepsRecordsLongEnough(t *testing.T) {
	srv := redistest.New(t)
	client := redisClient(t, srv)
	s := redisstore.New(client, store.WithPrefix("keep:"))
	ctx := context.Background()
	keep := 1500*time.Millisecond + 900*time.Microsecond
	for i := 0; i < 5; i++ {
		id := fmt.Sprint("r", i)
		before := time.Now()
		if _, err := s.Swap(ctx, []store.Write{{ID: id, Data: []byte("x"), Keep: keep}}); err != nil {
			t.Fatal(err)
		}
		at, err := client.PExpireTime(ctx, "keep:"+id).Result()
		if want := before.Add(keep); err != nil || time.Unix(0, int64(at)).Before(want) {
			t.Errorf("%s expires at %v (%v), before %v, %v after the write began", id, time.Unix(0, int64(at)).Format("15:04:05.000000"), err, want.Format("15:04:05.000000"), keep)
		}
	}
}

// TestMemberStartsANewStoresFence: a store seen for the first time (here, a new prefix in
// a Redis: no meta key) fences every record it makes for TTL + Grace after its first
// read. A member reads it when it starts, so a first decision made later than that is not
// fenced: the daemon's first queries after a start on a new Redis were refused for a
// second and a half (the fence ran from the first query).
func TestMemberStartsANewStoresFence(t *testing.T) {
	srv := redistest.New(t)
	st := redisstore.New(redisClient(t, srv), testPrefix())
	cfg := lease.DefaultConfig()
	b, err := lease.New(st, lease.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	time.Sleep(cfg.TTL + cfg.Grace + 300*time.Millisecond)
	l := gcra.Limit{T: int64(10 * time.Millisecond), Tau: int64(100 * time.Millisecond)} // 100/s burst 10
	g, err := b.Decide(context.Background(), "api", backend.Request{Limits: []gcra.Limit{l}, N: 1})
	if err != nil || !g.Allowed {
		t.Errorf("the first decision, TTL + Grace after the member started: %+v %v (fenced from the first decision)", g.Result, err)
	}
}

// TestRedisStoreMetaKeyExpires: the meta key that marks a Redis store's incarnation
// outlives the last read by a day, then goes: a demo's own prefix (sluice demo --mode
// lease --store redis://...) left its meta key in the user's Redis for good.
func TestRedisStoreMetaKeyExpires(t *testing.T) {
	srv := redistest.New(t)
	client := redisClient(t, srv)
	s := redisstore.New(client, store.WithPrefix("meta-ttl:"))
	ctx := context.Background()
	for range 2 { // made, then read again
		if _, err := s.Load(ctx, []string{"r"}); err != nil {
			t.Fatal(err)
		}
		ttl, err := client.PTTL(ctx, "meta-ttl:meta").Result()
		if err != nil || ttl <= 23*time.Hour || ttl > 24*time.Hour {
			t.Fatalf("meta key TTL %v (%v), want about a day", ttl, err)
		}
	}
}

// TestBucketScriptMatchesTheGoCore: Redis' bucket script (store/redis/bucket.lua) decides
// every operation as store.ApplyBucket does, and leaves the same bucket, on random
// sequences of takes (at once and booked), gives, settlements up and penalties at a
// virtual now that moves in random steps, on buckets lost now and then, with a fence
// (the store's meta key lost too now and then: a young incarnation) and without.
func TestBucketScriptMatchesTheGoCore(t *testing.T) {
	ctx := context.Background()
	client := redisClient(t, redistest.New(t))
	var now atomic.Int64
	now.Store(1_700_000_000 * int64(time.Second))
	prefix := fmt.Sprintf("test%d:", prefixes.Add(1))
	st := redisstore.New(client, store.WithPrefix(prefix), store.WithNow(now.Load))
	get := func(key string) []byte {
		v, err := client.Get(ctx, key).Result()
		if errors.Is(err, goredis.Nil) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		_, data, _ := strings.Cut(v, " ")
		return []byte(data)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	ops := 0
	for seq := range 40 {
		id := fmt.Sprintf("{bucket}:%d", seq)
		T := int64(1 + rng.IntN(5000))
		base := store.BucketOp{Start: now.Load()/1000 + int64(rng.IntN(3000)) - 1000, T: T, Tau: T * int64(1+rng.IntN(20))}
		if seq%2 == 0 {
			base.Fence = int64(rng.IntN(20_000))
		}
		for range 60 {
			now.Add(int64(rng.IntN(int(3*T))) * 1000)
			op := base
			switch rng.IntN(6) {
			case 0, 1:
				op.N = 1 + rng.Int64N(op.Tau/T)
			case 2:
				op.N, op.MaxDelay = 1+rng.Int64N(op.Tau/T), rng.Int64N(4*T)
			case 3:
				op.N = -(1 + rng.Int64N(3))
			case 4:
				op.N, op.Charge = 1+rng.Int64N(3), true
			case 5:
				op.Hold = rng.Int64N(5 * T)
			}
			switch rng.IntN(30) {
			case 0:
				client.Del(ctx, prefix+id) // the bucket lost
			case 1:
				client.Del(ctx, prefix+id, prefix+"meta") // with everything else
			}
			us := now.Load() / 1000
			data := get(prefix + id)
			since := store.Fresh
			if base.Fence > 0 {
				since = us // as the script: a missing meta key is made now
				if m, err := client.Get(ctx, prefix+"meta").Result(); err == nil {
					var s, u int64
					fmt.Sscanf(m, "%d %d", &s, &u)
					since = s*1e6 + u
				}
			}
			out, _, want, err := store.ApplyBucket(data, us, since, op)
			if err != nil {
				t.Fatal(err)
			}
			got, err := st.Bucket(ctx, id, op)
			if err != nil {
				t.Fatal(err)
			}
			if got.Taken != want.Taken || got.Wait != want.Wait || got.Now != us {
				t.Fatalf("seq %d, %+v on %q at %d (since %d): script %+v, Go %+v", seq, op, data, us, since, got, want)
			}
			if out == nil {
				out = data
			}
			if after := get(prefix + id); string(after) != string(out) {
				t.Fatalf("seq %d, %+v on %q at %d: the script left %q, Go %q", seq, op, data, us, after, out)
			}
			ops++
		}
	}
	t.Logf("%d operations compared", ops)
}
