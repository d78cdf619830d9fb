package gossip_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/gossip"
)

// TestLimitersShareAnOwnersLineByProcess: two processes' limiters on two gossip members
// (real UDP on loopback) wait on a small limit, decided at its key's owner: one limiter
// with five waiters, one with one. The backend's line is shared (SharedLine), so each
// limiter holds one place in it by default (sluice.FairProcesses) and the one with a
// single waiter gets about half, not the sixth a place per waiter would give it. Loosely
// judged (real time, a shared machine): at least 0.3.
func TestLimitersShareAnOwnersLineByProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("real time")
	}
	mk := func(peers []string) *gossip.Backend {
		cfg := gossip.DefaultConfig()
		cfg.Bind, cfg.Peers = "127.0.0.1:0", peers
		b, err := gossip.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	a := mk(nil)
	b := mk([]string{a.Addr()})
	for deadline := time.Now().Add(10 * time.Second); a.Members() != 2 || b.Members() != 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the two members did not find each other")
		}
	}
	time.Sleep(300 * time.Millisecond) // each hears the other's reports
	lim := func(be *gossip.Backend) *sluice.Limiter {
		l, err := sluice.New(sluice.MustParse("20/s burst=1"), sluice.WithBackend(be))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	many, one := lim(a), lim(b)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var mu sync.Mutex
	count := map[*sluice.Limiter]int{}
	var wg sync.WaitGroup
	errs := 0
	run := func(l *sluice.Limiter) {
		for ctx.Err() == nil {
			err := l.Wait(ctx, "api")
			mu.Lock()
			if err == nil {
				count[l]++
			} else if ctx.Err() == nil {
				errs++ // the owner unreachable for a moment (a loaded machine): ask again
				if errs == 1 {
					t.Logf("first error: %v", err)
				}
			}
			mu.Unlock()
			if err != nil {
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	for range 5 {
		wg.Go(func() { run(many) })
	}
	wg.Go(func() { run(one) })
	wg.Wait()
	total := count[many] + count[one]
	t.Logf("five waiters: %d permits; one waiter: %d; errors %d", count[many], count[one], errs)
	if total < 20 {
		t.Fatalf("%d permits in 3 s of 20/s, want at least 20 (loose: real time)", total)
	}
	if share := float64(count[one]) / float64(total); share < 0.3 {
		t.Errorf("the limiter with one waiter got %.2f of the permits, want about half (at least 0.3)", share)
	}
}
