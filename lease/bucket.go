package lease

import (
	"context"
	"time"

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

// bucket does c (a take, a settlement up or a penalty) at its bucket (the member's
// request booked no further than its word on the bucket: Member.TakeRequest). Permits
// given back change nothing there (store.BucketOp): a give makes no call.
func (a *applier) bucket(ctx context.Context, c call) (taken bool, wait int64, err error) {
	if c.req.Op == allot.OpGive {
		return true, 0, nil
	}
	res, err := store.DoBucket(ctx, a.store, c.bucket.ID, c.bucket.BucketOp(c.limit, c.req), MaxAttempts)
	if err != nil {
		return false, 0, err
	}
	return res.Taken, res.Wait * int64(time.Microsecond), nil
}
