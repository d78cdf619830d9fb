package storetest

import (
	"context"
	"sync/atomic"

	"github.com/sluicehq/sluice/store"
)

// Trips wraps a store and counts its round trips: every Load and every Swap. Tests and
// benchmarks use it to count what a member asks of its store.
type Trips struct {
	store.Store
	n atomic.Int64
}

// Load is the store's Load, counted.
func (c *Trips) Load(ctx context.Context, ids []string) (store.Snapshot, error) {
	c.n.Add(1)
	return c.Store.Load(ctx, ids)
}

// Swap is the store's Swap, counted.
func (c *Trips) Swap(ctx context.Context, ws []store.Write) ([]uint64, error) {
	c.n.Add(1)
	return c.Store.Swap(ctx, ws)
}

// Trips returns how many round trips were made.
func (c *Trips) Trips() int64 { return c.n.Load() }

// Bucket applies a bucket's operation (store.Buckets): the store's own Bucket, one round
// trip, if it has one; otherwise by compare-and-set through the counted Load and Swap.
func (c *Trips) Bucket(ctx context.Context, id string, op store.BucketOp) (store.BucketResult, error) {
	if b, ok := c.Store.(store.Buckets); ok {
		c.n.Add(1)
		return b.Bucket(ctx, id, op)
	}
	return store.DoBucket(ctx, store.CASOnly(c), id, op, 8)
}
