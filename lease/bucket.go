package lease

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/lease/allot"
	"github.com/sluicehq/sluice/store"
)

// Buckets: a crowded limit decided at the store (more live members than relayAbove, more
// of them than the limit has permits of burst) is decided on its bucket, a GCRA bucket in
// a record of its own (allot.State.BucketAt, store.BucketOp), one script call a permit on
// Redis, rather than by takes of its record, which lists every member and which they
// would all read and write at every permit (docs/lease.md, "Crowded limits").

// applyTakes applies calls as apply does, except the takes and gives (and settlements)
// of limits decided on their buckets: those its member knew of (call.bucket) go to the
// bucket at once; those the record answers with Reply.Bucket (the member did not know, or
// its registration's word on it had run out) go to the bucket after, the record's answer
// kept (the member learns the bucket from it) with the bucket's outcome. A bucket's own
// failure is its call's result.
func (a *applier) applyTakes(ctx context.Context, calls []call) ([]result, error) {
	out := make([]result, len(calls))
	var rec []call
	var recAt []int
	for k, c := range calls {
		if c.bucket == "" {
			rec, recAt = append(rec, c), append(recAt, k)
		}
	}
	if len(rec) > 0 {
		res, err := a.apply(ctx, rec)
		if err != nil {
			return nil, err
		}
		for j, k := range recAt {
			out[k] = res[j]
			c := &calls[k]
			if r := res[j]; r.err == nil && r.rep.Bucket != 0 && !r.rep.Taken && !c.req.Borrow && (c.req.Op == allot.OpTake || c.req.Op == allot.OpGive) {
				c.bucket, c.start = allot.BucketID(RecordID(c.key, c.limit), c.req.Epoch.Incarnation), r.rep.Bucket
			}
		}
	}
	for k, c := range calls {
		if c.bucket == "" {
			continue
		}
		taken, wait, err := a.bucket(ctx, c)
		r := &out[k]
		if r.rep.TTL == 0 { // the member knew: no answer of the record's
			r.rep = allot.Reply{Central: true, Bucket: c.start, Sent: c.req.Sent, Nonce: c.req.Nonce}
		}
		r.rep.Taken, r.rep.Wait, r.err = taken, wait, err
	}
	return out, nil
}

// bucket does c (a take, a give or a settlement up) at its bucket.
func (a *applier) bucket(ctx context.Context, c call) (taken bool, wait int64, err error) {
	op := store.BucketOp{Start: (c.start + 999) / 1000, Fence: (int64(a.cfg.TTL) + int64(a.cfg.Grace) + 999) / 1000}
	op.T, op.Tau = store.BucketLimit(c.limit.T, c.limit.Tau)
	switch {
	case c.req.Op == allot.OpGive:
		op.N = -c.req.N
	case c.req.MaxDelay < 0: // a settlement up: used already
		op.N, op.Charge = c.req.N, true
	default:
		// Booked at most TTL + Grace ahead, as the record books (a bucket lost with its
		// store is fenced that long).
		op.N, op.MaxDelay = c.req.N, min(c.req.MaxDelay, int64(a.cfg.TTL+a.cfg.Grace))/1000
	}
	res, err := store.DoBucket(ctx, a.store, c.bucket, op, MaxAttempts)
	if err != nil {
		return false, 0, err
	}
	return res.Taken, res.Wait * int64(time.Microsecond), nil
}

// penalizeBucket holds c's bucket back for d.
func (a *applier) penalizeBucket(ctx context.Context, c call, d int64) error {
	op := store.BucketOp{Start: (c.start + 999) / 1000, Hold: (d + 999) / 1000, Fence: (int64(a.cfg.TTL) + int64(a.cfg.Grace) + 999) / 1000}
	op.T, op.Tau = store.BucketLimit(c.limit.T, c.limit.Tau)
	_, err := store.DoBucket(ctx, a.store, c.bucket, op, MaxAttempts)
	return err
}
