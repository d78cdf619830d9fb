package lease

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/store"
)

// WaitUnfenced waits until records that store makes are no longer fenced for the youth of
// its incarnation: TTL + Grace (cfg's) after it began, on the store's clock. A store seen
// for the first time (a Redis that was just started, or flushed) cannot tell that no lease
// was granted from it before, so it fences every record it makes for that long; a process
// that starts a workload on a new store can wait here first. It returns at once for a
// store that knows it is fresh (a new store.Memory) or whose incarnation is old enough, and
// waits at most TTL + Grace otherwise (a Redis Cluster, which fences every record it
// makes, included). A store that does not answer yet (backend.ErrUnavailable: ZooKeeper's client
// still making its first connection, a Redis restarting) is asked again every 100 ms
// until ctx ends, which returns its last error; any other error returns at once.
func WaitUnfenced(ctx context.Context, st store.Store, cfg Config) error {
	snap, err := st.Load(ctx, nil)
	for err != nil {
		if !errors.Is(err, backend.ErrUnavailable) || clock.Default.Sleep(ctx, 100*time.Millisecond) != nil {
			return err
		}
		snap, err = st.Load(ctx, nil)
	}
	if snap.Since == store.Fresh {
		return nil
	}
	wait := time.Duration(cfg.FenceAfterRestart(snap.Since) - snap.Now)
	if wait <= 0 {
		return nil
	}
	return clock.Default.Sleep(ctx, wait)
}
