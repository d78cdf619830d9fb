// Package classtest is the priorities' test across processes, which every mode that
// orders its store's line by class runs: a critical caller in one process beside a
// sheddable flood in another.
package classtest

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/priority"
)

// CriticalBesideFlood runs 8 goroutines of flood waiting for permits of key "api" as
// sheddable callers while critical asks a critical Allow every 200 ms, and returns, once
// the flood has had 20 permits (it holds the line), how many of 8 such Allows were granted
// and how many permits the flood got. The two limiters stand for two processes: each its
// own backend on one store, limited to 10/s burst=10.
func CriticalBesideFlood(critical, flood *sluice.Limiter) (asked, granted int, flooded int64) {
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	var got atomic.Int64 // permits the flood got
	shed := priority.With(ctx, priority.Sheddable)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for flood.Wait(shed, "api") == nil {
				got.Add(1)
			}
		}()
	}
	// The critical caller, from the start; its answers count once the flood has held the
	// line for two seconds (past the key's first window, in which a sheddable caller keeps
	// its headroom on a key its limiter has watched for less: docs/priorities.md).
	crit := priority.With(ctx, priority.Critical)
	for asked < 8 {
		ok := critical.Allow(crit, "api")
		if got.Load() >= 20 {
			asked++
			if ok {
				granted++
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return asked, granted, got.Load()
}
