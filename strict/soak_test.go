//go:build soak

package strict

import (
	"context"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/gcra"
)

// TestSoakRedisWaiters: 64 goroutines Wait on one key through Redis in real time for
// SLUICE_SOAK (default 1m). Every grant's slot (Redis' time) is recorded and judged
// exactly; utilization and how late waiters wake after their slot are reported: the tight
// real-time figures the short tests leave out.
func TestSoakRedisWaiters(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("SLUICE_SOAK"))
	if err != nil || d <= 0 {
		d = time.Minute
	}
	limits := sluice.MustParse("200/s burst=10")
	be := New(newClient(t, shared.URL()))
	defer be.Close()
	l := sluice.MustNew(limits, sluice.WithBackend(be))
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var mu sync.Mutex
	var slots []int64
	var late []time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				r, err := l.WaitN(ctx, "soak", 1)
				if err != nil {
					return
				}
				woke := time.Now()
				mu.Lock()
				slots = append(slots, r.Slot())
				late = append(late, woke.Sub(r.TimeToAct()))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	w := time.Since(start).Seconds()
	slices.Sort(slots)
	tats := make([]int64, len(limits))
	for i, s := range slots {
		if r, _, _ := gcra.Decide(tats, limits.Core(0), s, 1, 0); !r.Allowed {
			t.Fatalf("grant %d of %d breaks the limit", i, len(slots))
		}
	}
	slices.Sort(late)
	util := float64(len(slots)) / (10 + 200*w)
	t.Logf("grants %d over %.1fs: utilization %.4f; wake-up after the slot p50 %v p99 %v max %v",
		len(slots), w, util, late[len(late)/2], late[len(late)*99/100], late[len(late)-1])
	if util < 0.97 {
		t.Errorf("utilization %.4f, want at least 0.97", util)
	}
}
