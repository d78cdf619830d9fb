package lease

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/lease/allot"
	"github.com/sluicehq/sluice/store"
)

// Buckets: a limit decided at the store (more members than permits of burst) with more
// than allot.BucketAbove live members is decided on its bucket, a GCRA bucket in a record
// of its own (allot.State.BucketAt, store.BucketOp), one script call a permit on Redis,
// rather than by takes of its record, which lists every member and which they would all
// read and write at every permit (docs/lease.md, "Past a hundred members: the bucket").

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
		if c.bucket.ID == "" {
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
			// (A borrow's settlement up too: the permits were used, and count at the
			// bucket, where a borrow's take or give-back only fails or is wasted.)
			charge := c.req.Op == allot.OpTake && c.req.MaxDelay < 0
			if r := res[j]; r.err == nil && r.rep.Bucket != 0 && !r.rep.Taken && (!c.req.Borrow || charge) && (c.req.Op == allot.OpTake || c.req.Op == allot.OpGive) {
				c.bucket = bucketOf(*c, r.rep)
				if c.req.MaxDelay > 0 {
					// Booked at once or not at all: the member's word on the bucket, which
					// bounds a booking (Member.TakeRequest), comes with this answer.
					c.req.MaxDelay = 0
				}
			}
		}
	}
	for k, c := range calls {
		if c.bucket.ID == "" {
			continue
		}
		taken, wait, err := a.bucket(ctx, c)
		r := &out[k]
		if r.rep.TTL == 0 { // the member knew: no answer of the record's
			r.rep = allot.Reply{Central: true, Bucket: c.bucket.Start, Sent: c.req.Sent, Nonce: c.req.Nonce}
		}
		r.rep.Taken, r.rep.Wait, r.err = taken, wait, err
	}
	return out, nil
}

// bucketOf is the bucket the record's answer rep to c names.
func bucketOf(c call, rep allot.Reply) allot.BucketRef {
	return allot.BucketRef{ID: allot.BucketID(RecordID(c.key, c.limit), rep.BucketInc), Start: rep.Bucket, Fence: rep.TTL + rep.Grace}
}

// bucketOp is an operation on the bucket b of limit l, without its numbers.
func bucketOp(l gcra.Limit, b allot.BucketRef) store.BucketOp {
	op := store.BucketOp{Start: (b.Start + 999) / 1000, Fence: (b.Fence + 999) / 1000}
	op.T, op.Tau = store.BucketLimit(l.T, l.Tau)
	return op
}

// bucket does c (a take, a give or a settlement up) at its bucket.
func (a *applier) bucket(ctx context.Context, c call) (taken bool, wait int64, err error) {
	op := bucketOp(c.limit, c.bucket)
	switch {
	case c.req.Op == allot.OpGive:
		op.N = -c.req.N
	case c.req.MaxDelay < 0: // a settlement up: used already
		op.N, op.Charge = c.req.N, true
	default:
		// Booked at most TTL + Grace ahead, as the record books (a bucket lost with its
		// store is fenced that long), and no further than the member's word on the bucket
		// (Member.TakeRequest).
		op.N, op.MaxDelay = c.req.N, max(min(c.req.MaxDelay, c.bucket.Fence), 0)/1000
	}
	res, err := store.DoBucket(ctx, a.store, c.bucket.ID, op, MaxAttempts)
	if err != nil {
		return false, 0, err
	}
	return res.Taken, res.Wait * int64(time.Microsecond), nil
}

// penalizeBucket holds bucket b of limit l back for d.
func (a *applier) penalizeBucket(ctx context.Context, l gcra.Limit, b allot.BucketRef, d int64) error {
	op := bucketOp(l, b)
	op.Hold = (d + 999) / 1000
	_, err := store.DoBucket(ctx, a.store, b.ID, op, MaxAttempts)
	return err
}
