package strict

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// TestWaitWaitsOutAnOutage: while Redis is down, a limiter failing closed makes Wait
// sleep the prober's interval between tries (no spin) within its context, and return once
// Redis is back; a Wait whose deadline comes first returns the failure, with its hint.
func TestWaitWaitsOutAnOutage(t *testing.T) {
	srv := redistest.New(t)
	o, _ := redisstore.ClientOptions(srv.URL(), 100*time.Millisecond)
	client := goredis.NewClient(o)
	defer client.Close()
	const probe = 50 * time.Millisecond
	b := New(client, WithTimeout(100*time.Millisecond), WithProbeEvery(probe), WithPrefix(prefix(t)))
	defer b.Close()
	var tries atomic.Int64
	lim := sluice.MustNew(sluice.MustParse("1000/s"), sluice.WithBackend(b), sluice.WithObserver(func(e sluice.Event) {
		if e.Kind == sluice.EventDecision {
			tries.Add(1)
		}
	}))
	defer lim.Close()
	srv.Kill()

	short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := lim.Wait(short, "api")
	if d, ok := backend.RetryAfter(err); !errors.Is(err, backend.ErrUnavailable) || !ok || d != probe {
		t.Fatalf("a Wait whose deadline comes first: %v, want the failure with a hint of %v", err, probe)
	}

	down := time.Now()
	restarted := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond) // the outage lasts this long
		restarted <- srv.Restart()
	}()
	tries.Store(0)
	ctx, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	if err := lim.Wait(ctx, "api"); err != nil {
		t.Fatalf("Wait across the outage: %v", err)
	}
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	// One try per probe interval at most (plus the first and the last): not a spin.
	if n, most := tries.Load(), int64(time.Since(down)/probe)+2; n < 2 || n > most {
		t.Errorf("Wait asked %d times over %v, want 2 to %d", n, time.Since(down), most)
	}
}
