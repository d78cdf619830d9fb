package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"
)

// A bucket is a GCRA bucket kept in a store record of its own and decided at the store:
// the lease mode's bucket of a crowded limit that is decided at the store (docs/lease.md,
// "Crowded limits"), where every permit is a round trip and the limit's record, which
// lists every member, is far too large to read and write at each one. A store with a
// Bucket method (store/redis: one script) applies an operation to it atomically, in one
// round trip; on any other store DoBucket reads it and writes it by compare-and-set.
//
// Every time and duration of a bucket is in whole microseconds of the store's clock (Unix
// time): a script's numbers are exact only below 2^53. A caller rounds a limit's emission
// interval up and its tolerance down to whole microseconds (BucketLimit): never faster,
// never a larger burst.
//
// A missing bucket is empty at Start, or at the store's now if that is later: its first
// permit comes a T after. Never a full one: a bucket that was lost (a store that restarted
// empty, an expiry) may have granted its burst just before, and a bucket that a limit
// switches to while the shares it replaces are still in use must not add its burst to
// theirs. The cost is a burst refilled, once, at a rate the limit allows anyway. And a
// bucket missing from a store whose incarnation is younger than Fence (the store lost
// every record: Snapshot.Since) is empty only when Fence has passed since it began, as
// the lease records are fenced: permits booked ahead from the bucket it lost (at most
// Fence ahead) are all past by then, and members that still name it stop within a TTL.

// BucketOp is one operation on a bucket.
type BucketOp struct {
	// Start: a missing bucket is empty then (or at the store's now, if later).
	Start int64
	// T and Tau are the bucket's emission interval and tolerance (T >= 1, Tau >= T).
	T, Tau int64
	// N > 0 takes N permits, at once or booked up to MaxDelay ahead; with Charge, N
	// permits were used already and count whatever the bucket holds (a settlement up).
	// N < 0 (permits given back, taken and not used) changes nothing: a bucket cannot tell
	// whether the permits given back are still counted in it (they may have been taken
	// before it refilled, or at another bucket), and refunding them could grant them
	// twice. They are wasted. N == 0 with Hold > 0 holds the bucket back: no
	// permit before Hold after the store's now (a 429's penalty).
	N        int64
	MaxDelay int64
	Charge   bool
	Hold     int64
	// Fence: a missing bucket of a store whose incarnation began less than Fence ago is
	// empty only Fence after it began (the lease mode: TTL + Grace).
	Fence int64
}

// BucketResult is what an operation did.
type BucketResult struct {
	// Taken: the take was granted, usable after Wait. Refused, Wait is when the same
	// take would be granted. Other operations are always Taken, with no Wait.
	Taken bool
	Wait  int64
	// Now is the store's clock the operation was applied at.
	Now int64
}

// Buckets is a store that applies a bucket's operation at itself, atomically, in one
// round trip (see DoBucket).
type Buckets interface {
	Bucket(ctx context.Context, id string, op BucketOp) (BucketResult, error)
}

// BucketKeep is how long a bucket is kept after it has refilled, if nothing changes it:
// one lost is made again empty, which only delays its first permit.
const BucketKeep = 10 * time.Minute

// bucketFormat begins a bucket's data: "b1 TAT".
const bucketFormat = "b1 "

// ApplyBucket applies op at now to a bucket's data (nil: the bucket is missing) of a store
// whose incarnation began at since (Snapshot.Since, in microseconds; Fresh: a store that
// knows no bucket was lost). It returns the data to write (nil: nothing changed), how long
// to keep it, and the result. Every store applies it (a script mirrors it; the
// conformance suite compares the two).
func ApplyBucket(data []byte, now, since int64, op BucketOp) (out []byte, keep time.Duration, res BucketResult, err error) {
	if err := op.check(); err != nil {
		return nil, 0, BucketResult{}, err
	}
	var tat int64
	if data == nil {
		tat = max(now, op.Start) + op.Tau // empty
		if since != Fresh && op.Fence > 0 {
			tat = max(tat, since+op.Fence+op.Tau)
		}
	} else {
		t, ok := bytes.CutPrefix(data, []byte(bucketFormat))
		if !ok {
			return nil, 0, BucketResult{}, fmt.Errorf("%w: bucket %q", ErrBadRecord, data[:min(len(data), 16)])
		}
		if tat, err = strconv.ParseInt(string(t), 10, 64); err != nil {
			return nil, 0, BucketResult{}, fmt.Errorf("%w: bucket %q", ErrBadRecord, data[:min(len(data), 16)])
		}
	}
	res.Now = now
	was := tat
	switch {
	case op.N > 0 && !op.Charge:
		wait := max(0, max(tat, now)+op.N*op.T-op.Tau-now)
		if wait > max(op.MaxDelay, 0) {
			res.Wait = wait
			if data == nil {
				break // refused, the bucket is made still: it starts filling from now
			}
			return nil, 0, res, nil
		}
		tat = max(tat, now+wait) + op.N*op.T
		res.Taken, res.Wait = true, wait
	case op.N > 0: // a charge: used already
		tat = max(tat, now) + op.N*op.T
		res.Taken = true
	case op.N < 0: // given back: wasted (see BucketOp.N), and a missing bucket not made
		res.Taken = true
		return nil, 0, res, nil
	default:
		if op.Hold > 0 {
			tat = max(tat, now+op.Hold+op.Tau-op.T)
		}
		res.Taken = true
	}
	if data != nil && tat == was {
		return nil, 0, res, nil
	}
	return []byte(bucketFormat + strconv.FormatInt(tat, 10)), time.Duration(max(tat-now, 0))*time.Microsecond + BucketKeep, res, nil
}

// ErrBadBucketOp is wrapped by the error of a bucket operation out of range: a take of
// more permits than the burst, or numbers a script cannot hold exactly.
var ErrBadBucketOp = errors.New("sluice: bad bucket operation")

// bucketMax bounds a bucket's durations (and N × T), in microseconds: about 2.2 years,
// and with the store's clock well within 2^53 (a script's numbers are doubles).
const bucketMax = 1 << 46

// check reports whether op is in range (the script checks the same).
func (op BucketOp) check() error {
	in := func(x int64) bool { return x >= 0 && x <= bucketMax }
	switch {
	case op.T < 1 || op.Tau < op.T || !in(op.Tau):
		return fmt.Errorf("%w: a bucket of T %d µs and tolerance %d µs", ErrBadBucketOp, op.T, op.Tau)
	case op.N > bucketMax/op.T || op.N < -(bucketMax/op.T):
		return fmt.Errorf("%w: %d permits of %d µs", ErrBadBucketOp, op.N, op.T)
	case op.N > 0 && !op.Charge && op.N*op.T > op.Tau:
		return fmt.Errorf("%w: a take of %d permits of a burst of %d", ErrBadBucketOp, op.N, op.Tau/op.T)
	case !in(op.MaxDelay) || !in(op.Hold) || !in(op.Fence) || op.Start < 0 || op.Start > 1<<52:
		return fmt.Errorf("%w: %+v", ErrBadBucketOp, op)
	}
	return nil
}

// BucketLimit is a limit's emission interval and tolerance (nanoseconds) as a bucket's
// (microseconds): the interval rounded up, the tolerance its burst of them, so that the
// bucket is never faster nor its burst larger.
func BucketLimit(t, tau int64) (T, Tau int64) {
	burst := max(tau/t, 1)
	T = (t + 999) / 1000
	return T, burst * T
}

// CASOnly returns st without its Bucket method, if it has one: a wrapper of a store that
// counts or cuts its calls does its own buckets with DoBucket(ctx, CASOnly(w), ...), by its
// own Load and Swap, when the store it wraps has no Bucket method.
func CASOnly(st Store) Store { return casOnly{st} }

type casOnly struct{ Store }

// DoBucket applies op to the bucket id of st: at the store, in one round trip, if st is a
// Buckets; otherwise by reading it and writing it by compare-and-set, at the clock the
// read returned, up to attempts times (after a short jittered pause each) before it fails
// with ErrConflict.
func DoBucket(ctx context.Context, st Store, id string, op BucketOp, attempts int) (BucketResult, error) {
	if b, ok := st.(Buckets); ok {
		return b.Bucket(ctx, id, op)
	}
	ids := []string{id}
	for range attempts {
		snap, err := st.Load(ctx, ids)
		if err != nil {
			return BucketResult{}, err
		}
		if len(snap.Records) != 1 {
			return BucketResult{}, fmt.Errorf("%w: %d records read for one", ErrBadRecord, len(snap.Records))
		}
		rec := snap.Records[0]
		now := snap.Now
		if rec.Now != 0 {
			now = rec.Now
		}
		var data []byte
		if rec.Version != 0 {
			data = rec.Data
		}
		since := snap.Since
		if since != Fresh {
			since /= 1000
		}
		out, keep, res, err := ApplyBucket(data, now/1000, since, op)
		if err != nil || out == nil {
			return res, err
		}
		vs, err := st.Swap(ctx, []Write{{ID: id, Data: out, Version: rec.Version, Keep: keep}})
		if err != nil {
			return BucketResult{}, err
		}
		if len(vs) == 1 && vs[0] != 0 {
			return res, nil
		}
		t := time.NewTimer(time.Duration(rand.Int64N(int64(2 * time.Millisecond))))
		select {
		case <-ctx.Done():
			t.Stop()
			return BucketResult{}, ctx.Err()
		case <-t.C:
		}
	}
	return BucketResult{}, fmt.Errorf("%w: bucket %s", ErrConflict, id)
}
