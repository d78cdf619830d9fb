// Package storetest is the conformance suite of store.Store: every store (Memory, the
// Redis, etcd and ZooKeeper stores, and any a user writes) must pass it. It checks the
// contract the allocation relies on: records read with the store's time, compare-and-set
// per record, deletion, versions that never decrease, and an incarnation that begins when
// the store loses everything.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store"
)

// Factory makes an empty store for one test. wipe, if not nil, makes the store lose
// every record as a restart without persistence does (the suite then checks Since).
type Factory func(t *testing.T) (s store.Store, wipe func())

// Run runs the suite.
func Run(t *testing.T, f Factory) {
	ctx := context.Background()
	n := 0
	id := func(name string) string {
		n++
		return fmt.Sprintf("{suite-%s-%d-%d}:1:1", name, time.Now().UnixNano(), n)
	}
	// wipeable makes a store the factory can wipe, or skips the test.
	wipeable := func(t *testing.T) (store.Store, func()) {
		t.Helper()
		s, wipe := f(t)
		if wipe == nil {
			t.Skip("the factory cannot wipe this store")
		}
		return s, wipe
	}
	load := func(t *testing.T, s store.Store, ids ...string) store.Snapshot {
		t.Helper()
		snap, err := s.Load(ctx, ids)
		if err != nil {
			t.Fatal(err)
		}
		if len(snap.Records) != len(ids) {
			t.Fatalf("Load of %d records read %d", len(ids), len(snap.Records))
		}
		return snap
	}
	swap := func(t *testing.T, s store.Store, ws ...store.Write) []uint64 {
		t.Helper()
		vs, err := s.Swap(ctx, ws)
		if err != nil {
			t.Fatal(err)
		}
		if len(vs) != len(ws) {
			t.Fatalf("Swap of %d writes answered %d versions", len(ws), len(vs))
		}
		return vs
	}

	t.Run("MissingRecordsAndTime", func(t *testing.T) {
		s, _ := f(t)
		a, b := id("a"), id("b")
		snap := load(t, s, a, b)
		for i, r := range snap.Records {
			if r.Version != 0 || len(r.Data) != 0 {
				t.Errorf("record %d of a new store: %+v", i, r)
			}
		}
		if snap.Now <= 0 || snap.Since > snap.Now {
			t.Errorf("now %d since %d", snap.Now, snap.Since)
		}
	})

	t.Run("CompareAndSet", func(t *testing.T) {
		s, _ := f(t)
		a := id("cas")
		v1 := swap(t, s, store.Write{ID: a, Data: []byte("one"), Keep: time.Minute})[0]
		if v1 == 0 {
			t.Fatal("creating a missing record with version 0 failed")
		}
		if v := swap(t, s, store.Write{ID: a, Data: []byte("again"), Keep: time.Minute})[0]; v != 0 {
			t.Fatal("creating an existing record succeeded")
		}
		r := load(t, s, a).Records[0]
		if r.Version != v1 || string(r.Data) != "one" {
			t.Fatalf("read %+v, want version %d data one", r, v1)
		}
		v2 := swap(t, s, store.Write{ID: a, Data: []byte("two \x00 bytes"), Version: v1, Keep: time.Minute})[0]
		if v2 <= v1 {
			t.Fatalf("an update gave version %d after %d", v2, v1)
		}
		if v := swap(t, s, store.Write{ID: a, Data: []byte("stale"), Version: v1, Keep: time.Minute})[0]; v != 0 {
			t.Fatal("a write with a stale version succeeded")
		}
		if r := load(t, s, a).Records[0]; r.Version != v2 || !bytes.Equal(r.Data, []byte("two \x00 bytes")) {
			t.Fatalf("read %+v after the update", r)
		}
	})

	t.Run("DeleteAndVersionsNeverDecrease", func(t *testing.T) {
		s, _ := f(t)
		a := id("del")
		v1 := swap(t, s, store.Write{ID: a, Data: []byte("x"), Keep: time.Minute})[0]
		vd := swap(t, s, store.Write{ID: a, Version: v1})[0]
		if vd == 0 {
			t.Fatal("deleting with the right version failed")
		}
		if r := load(t, s, a).Records[0]; r.Version != 0 {
			t.Fatalf("a deleted record read %+v", r)
		}
		v3 := swap(t, s, store.Write{ID: a, Data: []byte("y"), Keep: time.Minute})[0]
		if v3 <= v1 {
			t.Fatalf("a record made again got version %d, not above %d", v3, v1)
		}
	})

	t.Run("PerRecordInABatch", func(t *testing.T) {
		s, _ := f(t)
		a, b, c := id("ba"), id("bb"), id("bc")
		v := swap(t, s, store.Write{ID: a, Data: []byte("a"), Keep: time.Minute}, store.Write{ID: b, Data: []byte("b"), Keep: time.Minute})
		vs := swap(t, s,
			store.Write{ID: a, Data: []byte("a2"), Version: v[0], Keep: time.Minute},
			store.Write{ID: b, Data: []byte("b2"), Version: v[1] + 1000, Keep: time.Minute}, // stale
			store.Write{ID: c, Data: []byte("c"), Keep: time.Minute})
		if vs[0] == 0 || vs[1] != 0 || vs[2] == 0 {
			t.Fatalf("versions %v: want the first and last written, the middle refused", vs)
		}
		snap := load(t, s, a, b, c)
		if string(snap.Records[0].Data) != "a2" || string(snap.Records[1].Data) != "b" || string(snap.Records[2].Data) != "c" {
			t.Fatalf("read %q %q %q", snap.Records[0].Data, snap.Records[1].Data, snap.Records[2].Data)
		}
	})

	t.Run("OneWinnerPerVersion", func(t *testing.T) {
		s, _ := f(t)
		a := id("race")
		v0 := swap(t, s, store.Write{ID: a, Data: []byte("0"), Keep: time.Minute})[0]
		n := concurrently(16, func(i int) bool {
			vs, err := s.Swap(ctx, []store.Write{{ID: a, Data: []byte(fmt.Sprint(i)), Version: v0, Keep: time.Minute}})
			return err == nil && vs[0] != 0
		})
		if n != 1 {
			t.Fatalf("%d writers won the same version", n)
		}
	})

	t.Run("IncarnationAfterAWipe", func(t *testing.T) {
		s, wipe := wipeable(t)
		a := id("wipe")
		swap(t, s, store.Write{ID: a, Data: []byte("x"), Keep: time.Minute})
		before := load(t, s, a)
		wipe()
		after := load(t, s, a)
		if after.Records[0].Version != 0 {
			t.Fatalf("a record survived the wipe: %+v", after.Records[0])
		}
		if after.Since < before.Now || after.Since > after.Now {
			t.Fatalf("since %d after a wipe between %d and %d: the store did not begin a new incarnation", after.Since, before.Now, after.Now)
		}
	})

	t.Run("Buckets", func(t *testing.T) {
		// Every operation on a bucket gives what store.ApplyBucket gives at the clock the
		// store applied it at (a store with its own Bucket method, a script, mirrors it;
		// any other goes through DoBucket's compare-and-set), and concurrent takes never
		// grant more than the bucket holds.
		s, _ := f(t)
		b := id("bucket")
		var model []byte
		do := func(op store.BucketOp) store.BucketResult {
			t.Helper()
			res, err := store.DoBucket(ctx, s, b, op, 8)
			if err != nil {
				t.Fatal(err)
			}
			out, _, want, err := store.ApplyBucket(model, res.Now, store.Fresh, op)
			if err != nil {
				t.Fatal(err)
			}
			if out != nil {
				model = out
			}
			if res.Taken != want.Taken || res.Wait != want.Wait {
				t.Fatalf("%+v at %d: taken %v wait %d, want %v %d (store.ApplyBucket)", op, res.Now, res.Taken, res.Wait, want.Taken, want.Wait)
			}
			return res
		}
		// A full bucket, as the store keeps one: its TAT long past.
		fill := func(id string) []byte {
			t.Helper()
			data := []byte("b1 0")
			swap(t, s, store.Write{ID: id, Data: data, Version: load(t, s, id).Records[0].Version, Keep: time.Minute})
			return data
		}
		// A day a permit, a burst of 3: nothing refills while the test runs.
		const day = int64(24 * 3600 * 1e6)
		lim := store.BucketOp{T: day, Tau: 3 * day}
		do(lim)
		lim.N = 1
		if r := do(lim); r.Taken {
			t.Fatalf("a new bucket granted a permit at once: %+v (it starts empty)", r)
		}
		// Full, it grants its burst, no more; and permits given back change nothing.
		model = fill(b)
		for i := range 3 {
			if r := do(lim); !r.Taken || r.Wait != 0 {
				t.Fatalf("take %d of a full bucket of 3: %+v", i+1, r)
			}
		}
		if r := do(lim); r.Taken {
			t.Fatalf("a fourth take of a bucket of 3 was granted: %+v", r)
		}
		give := lim
		give.N = -3
		do(give)
		if r := do(lim); r.Taken {
			t.Fatalf("a take after 3 permits given back to an empty bucket was granted: %+v (a bucket cannot tell they are still counted in it)", r)
		}
		book := lim
		book.MaxDelay = 2 * day
		if r := do(book); !r.Taken || r.Wait <= 0 {
			t.Fatalf("a take booked ahead: %+v", r)
		}
		if _, err := store.DoBucket(ctx, s, b, store.BucketOp{T: day, Tau: 3 * day, N: 4}, 8); !errors.Is(err, store.ErrBadBucketOp) {
			t.Fatalf("a take of 4 permits of a burst of 3: %v, want ErrBadBucketOp", err)
		}
		charge := lim
		charge.Charge = true
		do(charge)
		hold := store.BucketOp{T: day, Tau: 3 * day, Hold: 10 * day}
		do(hold)
		if r := do(book); r.Taken {
			t.Fatalf("a take within two days of a bucket held back ten: %+v", r)
		}
		// Concurrent takes of a refilled bucket: exactly its burst granted.
		c := id("bucket-race")
		fill(c)
		n := concurrently(12, func(int) bool {
			res, err := store.DoBucket(ctx, s, c, lim, 64)
			return err == nil && res.Taken
		})
		if n != 3 {
			t.Fatalf("12 concurrent takes of a full bucket of 3 granted %d", n)
		}
	})

	t.Run("BucketAfterAWipe", func(t *testing.T) {
		// A bucket the store lost with everything else is made empty only a Fence after
		// the store's new incarnation began (as the lease records are fenced).
		s, wipe := wipeable(t)
		b := id("bucket-wipe")
		const sec = int64(1e6)
		op := store.BucketOp{T: sec, Tau: 10 * sec, Fence: 3600 * sec}
		if _, err := store.DoBucket(ctx, s, b, op, 8); err != nil {
			t.Fatal(err)
		}
		wipe()
		op.N = 1
		res, err := store.DoBucket(ctx, s, b, op, 8)
		if err != nil {
			t.Fatal(err)
		}
		if res.Taken || res.Wait < 3599*sec {
			t.Fatalf("a take of a bucket lost in a wipe: %+v, want refused for the fence (an hour)", res)
		}
	})
}

// concurrently runs f(0) to f(n-1) at once and returns how many returned true.
func concurrently(n int, f func(i int) bool) int {
	var wg sync.WaitGroup
	var won atomic.Int64
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if f(i) {
				won.Add(1)
			}
		}()
	}
	wg.Wait()
	return int(won.Load())
}
