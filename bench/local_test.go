package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	uber "go.uber.org/ratelimit"
	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice"
)

// The limit every library gets: high enough that most decisions grant, as in a service
// that is throttled now and then, so the benchmarks measure the decision, not sleeping.
const (
	ratePerSec = 1_000_000_000
	burst      = 1000
)

var ctx = context.Background()

func keys(n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("tenant-%06d", i)
	}
	return ks
}

// xrateMap is how a user gives each key its own x/time/rate limiter.
type xrateMap struct{ m sync.Map }

func (x *xrateMap) allow(k string) bool {
	v, ok := x.m.Load(k)
	if !ok {
		v, _ = x.m.LoadOrStore(k, rate.NewLimiter(rate.Limit(ratePerSec), burst))
	}
	return v.(*rate.Limiter).Allow()
}

// uberMap is the same for go.uber.org/ratelimit, which has no Allow: Take blocks until
// the next slot, and at this rate it never has to sleep, so it measures the decision.
type uberMap struct{ m sync.Map }

func (u *uberMap) take(k string) {
	v, ok := u.m.Load(k)
	if !ok {
		v, _ = u.m.LoadOrStore(k, uber.New(ratePerSec))
	}
	v.(uber.Limiter).Take()
}

func newSluice(b *testing.B) *sluice.Limiter {
	l, err := sluice.New(sluice.Limits{{Rate: ratePerSec, Period: time.Second, Burst: burst}}, sluice.WithMaxKeys(0))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l
}

// BenchmarkAllowOneKey: Allow on one key from one goroutine.
func BenchmarkAllowOneKey(b *testing.B) {
	b.Run("impl=sluice", func(b *testing.B) {
		l := newSluice(b)
		b.ReportAllocs()
		cpuLoop(b, func() { l.Allow(ctx, "api") })
	})
	b.Run("impl=xrate", benchXrateAllow)
	b.Run("impl=uber", func(b *testing.B) {
		l := uber.New(ratePerSec)
		b.ReportAllocs()
		for b.Loop() {
			l.Take()
		}
	})
}

// BenchmarkAllowOneKeyParallel: Allow on one key from GOMAXPROCS goroutines.
func BenchmarkAllowOneKeyParallel(b *testing.B) {
	b.Run("impl=sluice", func(b *testing.B) {
		l := newSluice(b)
		b.ReportAllocs()
		cpuParallel(b, func(pb *testing.PB) {
			for pb.Next() {
				l.Allow(ctx, "api")
			}
		})
	})
	b.Run("impl=xrate", benchXrateAllowParallel)
	b.Run("impl=uber", func(b *testing.B) {
		l := uber.New(ratePerSec)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Take()
			}
		})
	})
}

// BenchmarkAllow10kKeysParallel: Allow on 10,000 keys from GOMAXPROCS goroutines, each
// walking the keys from its own starting point; every key exists after warm-up.
func BenchmarkAllow10kKeysParallel(b *testing.B) {
	ks := keys(10_000)
	var seed atomic.Int64
	walk := func(pb *testing.PB, f func(string)) {
		i := int(seed.Add(7919)) % len(ks)
		for pb.Next() {
			f(ks[i])
			i++
			if i == len(ks) {
				i = 0
			}
		}
	}
	b.Run("impl=sluice", func(b *testing.B) {
		l := newSluice(b)
		for _, k := range ks {
			l.Allow(ctx, k)
		}
		b.ReportAllocs()
		b.ResetTimer()
		cpuParallel(b, func(pb *testing.PB) { walk(pb, func(k string) { l.Allow(ctx, k) }) })
	})
	b.Run("impl=xrate", func(b *testing.B) {
		var m xrateMap
		for _, k := range ks {
			m.allow(k)
		}
		b.ReportAllocs()
		b.ResetTimer()
		cpuParallel(b, func(pb *testing.PB) { walk(pb, func(k string) { m.allow(k) }) })
	})
	b.Run("impl=uber", func(b *testing.B) {
		var m uberMap
		for _, k := range ks {
			m.take(k)
		}
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) { walk(pb, func(k string) { m.take(k) }) })
	})
}

// TestLibrariesAgree checks that the three set-ups above do what the benchmarks assume:
// every library grants a fresh key's burst and then throttles, so none is measured
// short-circuiting.
func TestLibrariesAgree(t *testing.T) {
	l, err := sluice.New(sluice.Limits{{Rate: 1, Period: time.Second, Burst: 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	x := rate.NewLimiter(1, 3)
	var sn, xn int
	for i := 0; i < 10; i++ {
		if l.Allow(ctx, "k") {
			sn++
		}
		if x.Allow() {
			xn++
		}
	}
	if sn != 3 || xn != 3 {
		t.Fatalf("grants of a fresh key with burst 3: sluice %d, x/time/rate %d", sn, xn)
	}
	u := uber.New(100) // 10ms apart
	start := time.Now()
	for i := 0; i < 5; i++ {
		u.Take()
	}
	if time.Since(start) < 30*time.Millisecond {
		t.Fatalf("uber ratelimit did not pace Take")
	}
}

// benchXrateAllow is the x/time/rate baseline the one-key benchmarks (local and lease
// mode) compare with: Allow on one limiter from one goroutine.
func benchXrateAllow(b *testing.B) {
	l := rate.NewLimiter(rate.Limit(ratePerSec), burst)
	b.ReportAllocs()
	cpuLoop(b, func() { l.Allow() })
}

// benchXrateAllowParallel is benchXrateAllow from GOMAXPROCS goroutines.
func benchXrateAllowParallel(b *testing.B) {
	l := rate.NewLimiter(rate.Limit(ratePerSec), burst)
	b.ReportAllocs()
	cpuParallel(b, func(pb *testing.PB) {
		for pb.Next() {
			l.Allow()
		}
	})
}
