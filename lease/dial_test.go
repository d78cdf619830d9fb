package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/store"
)

// TestDial: lease.Dial takes the store URLs strict.Dial takes; a member it makes decides
// through the store and closes the store's client with itself; a URL it cannot use, or
// a store that does not answer, is an error and leaves nothing open.
func TestDial(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	l := gcra.Limit{T: int64(100 * time.Millisecond), Tau: int64(time.Second)}
	for _, url := range []string{"memory://", srv.URL()} {
		b, err := lease.Dial(ctx, url, lease.WithRenewEvery(50*time.Millisecond))
		if err != nil {
			t.Fatalf("Dial(%s): %v", url, err)
		}
		g, err := b.Decide(ctx, "k", backend.Request{Limits: []gcra.Limit{l}, N: 1, MaxDelay: 10 * time.Second})
		if err != nil || !g.Allowed {
			t.Errorf("Dial(%s): decide: %+v, %v", url, g, err)
		}
		if err := b.Close(); err != nil {
			t.Errorf("Dial(%s): close: %v", url, err)
		}
	}
	if _, err := lease.Dial(ctx, "127.0.0.1:6379"); !errors.Is(err, store.ErrBadURL) {
		t.Errorf("a URL without a scheme: %v, want ErrBadURL", err)
	}
	srv.Kill()
	tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := lease.Dial(tctx, srv.URL()); !errors.Is(err, backend.ErrUnavailable) {
		t.Errorf("a Redis that is down: %v, want ErrUnavailable", err)
	}
}
