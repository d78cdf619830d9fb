package storetest

import (
	"context"
	"sync/atomic"

	"github.com/sluicehq/sluice/store"
)

// Conflicts wraps a store and counts the records written and the writes that lost their
// compare-and-set (version 0 in Swap's answer: another member wrote the record first, and
// the member reads and applies again). Tests and benchmarks use it to measure contention.
type Conflicts struct {
	store.Store
	writes, lost, buckets atomic.Int64
}

// Swap is the store's Swap, counted.
func (c *Conflicts) Swap(ctx context.Context, ws []store.Write) ([]uint64, error) {
	vs, err := c.Store.Swap(ctx, ws)
	if err == nil {
		c.writes.Add(int64(len(ws)))
		for _, v := range vs {
			if v == 0 {
				c.lost.Add(1)
			}
		}
	}
	return vs, err
}

// Counts returns how many records were written (or tried) and how many writes lost.
func (c *Conflicts) Counts() (writes, lost int64) { return c.writes.Load(), c.lost.Load() }

// Bucket applies a bucket's operation (store.Buckets): the store's own Bucket, counted as a
// write, if it has one; otherwise by compare-and-set through the counted Swap.
func (c *Conflicts) Bucket(ctx context.Context, id string, op store.BucketOp) (store.BucketResult, error) {
	if b, ok := c.Store.(store.Buckets); ok {
		res, err := b.Bucket(ctx, id, op)
		if err == nil {
			c.writes.Add(1)
			c.buckets.Add(1)
		}
		return res, err
	}
	c.buckets.Add(1)
	return store.DoBucket(ctx, store.CASOnly(c), id, op, 8)
}

// Buckets returns how many bucket operations were applied (or tried): each also counts
// among Counts' writes, as one script call or as the compare-and-sets it took.
func (c *Conflicts) Buckets() int64 { return c.buckets.Load() }
