//go:build soak

package sluice

import (
	"context"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/limitconv"
)

func soakTime(t *testing.T) time.Duration {
	d, err := time.ParseDuration(os.Getenv("SLUICE_SOAK"))
	if err != nil || d <= 0 {
		d = time.Minute
	}
	t.Logf("soak for %v (SLUICE_SOAK)", d)
	return d
}

// TestSoakLocalWaiters: 64 goroutines Wait on one key in real time. Every decision's slot
// (the backend's now + delay) is recorded and judged exactly by a strict GCRA;
// utilization, and how late the waiters wake after their slot (the jitter a margin must
// cover), are reported.
func TestSoakLocalWaiters(t *testing.T) {
	d := soakTime(t)
	limit := MustParse("500/s burst=20")
	l := MustNew(limit)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var mu sync.Mutex
	var permits []int64
	var late []time.Duration
	var wg sync.WaitGroup
	start := l.clock.Nanotime()
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				r, err := l.WaitN(ctx, "api", 1)
				if err != nil {
					return
				}
				due := r.ticket.At // the decision's slot, on the backend's (same) clock
				woke := l.clock.Nanotime()
				mu.Lock()
				permits = append(permits, due)
				late = append(late, time.Duration(woke-due))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	end := l.clock.Nanotime()
	slices.Sort(permits)
	core := limitconv.Core(limit, 0)
	tats := []int64{0}
	for i, p := range permits {
		if r, _, _ := gcra.Decide(tats, core, p, 1, 0); !r.Allowed {
			t.Fatalf("permit %d at %v breaks the limit", i, time.Duration(p-start))
		}
	}
	w := float64(end-start) / float64(time.Second)
	util := float64(len(permits)) / (20 + 500*w)
	slices.Sort(late)
	t.Logf("permits %d over %.1fs: utilization %.4f; wake-up lateness p50 %v p99 %v max %v",
		len(permits), w, util, late[len(late)/2], late[len(late)*99/100], late[len(late)-1])
	if util < 0.99 {
		t.Errorf("utilization %.4f, want at least 0.99", util)
	}
}
