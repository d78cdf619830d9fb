package allot

import (
	"fmt"
	"testing"
	"time"
)

// TestCrowdedCentralLimitGoesToItsBucket: a limit decided at the store with more than
// BucketAbove live members is decided on its bucket from then on: BucketAt is no earlier
// than when every share still counted ends (the bucket starts empty then), the record
// answers a take with Reply.Bucket without taking, the state survives its encoding, and
// the limit stays on its bucket when the pool shrinks.
func TestCrowdedCentralLimitGoesToItsBucket(t *testing.T) {
	c := cfg(Fair)
	l := lim(100, time.Second, 20)
	s, eps := joinedState(t, l, c, BucketAbove)
	renewAll(t, s, c, eps, 100*ms)
	if !s.Central || s.BucketAt != 0 {
		t.Fatalf("%d members: central %v, bucket at %d; want central on the record", BucketAbove, s.Central, s.BucketAt)
	}
	held := s.heldUntil(100 * ms)
	// One more member: crowded past BucketAbove.
	rep, err := s.Apply(200*ms, c, Request{Op: OpJoin, Member: "zz", Nonce: 1, Demand: RateScale, Sent: 200 * ms})
	if err != nil {
		t.Fatal(err)
	}
	if s.BucketAt == 0 || rep.Bucket != s.BucketAt || !rep.Central {
		t.Fatalf("past %d members: bucket at %d, reply %+v; want the record on its bucket, and the reply saying so", BucketAbove, s.BucketAt, rep)
	}
	if s.BucketAt < held || s.BucketAt < 200*ms {
		t.Fatalf("the bucket starts at %v, before the shares counted end (%v)", time.Duration(s.BucketAt), time.Duration(held))
	}
	take, err := s.Apply(300*ms, c, Request{Op: OpTake, N: 1, Member: "m00", Epoch: eps[0], Sent: 300 * ms, Nonce: 9})
	if err != nil {
		t.Fatal(err)
	}
	if take.Taken || take.Bucket != s.BucketAt {
		t.Fatalf("a take of the record of a limit on its bucket: %+v; want not taken, told the bucket", take)
	}
	back, err := UnmarshalState(MarshalState(s))
	if err != nil {
		t.Fatal(err)
	}
	if back.BucketAt != s.BucketAt || !back.Central {
		t.Fatalf("decoded: bucket at %d, central %v; want %d, true", back.BucketAt, back.Central, s.BucketAt)
	}
	// Every member but two leaves: the limit stays on its bucket.
	for i := 2; i < BucketAbove; i++ {
		if _, err := s.Apply(400*ms, c, Request{Op: OpRelease, Member: fmt.Sprintf("m%02d", i), Epoch: eps[i], Sent: 400 * ms, Nonce: 10}); err != nil {
			t.Fatal(err)
		}
	}
	renewAll(t, s, c, eps[:2], 500*ms)
	if !s.Central || s.BucketAt == 0 {
		t.Fatalf("two members left: central %v, bucket at %d; want it still on its bucket", s.Central, s.BucketAt)
	}
}

// TestMemberTakesAtItsBucketWhileRegistered: a member learns from its record's answers that
// its limit is decided on its bucket, and takes there only while the registration it was
// told under may not have ended (a record lost and made again has a bucket decided anew).
func TestMemberTakesAtItsBucketWhileRegistered(t *testing.T) {
	m := NewMember("a", lim(100, time.Second, 20), MemberConfig{RenewEvery: 100 * time.Millisecond, Margin: 5 * time.Millisecond}, 0)
	req, ok := m.Request(0, 0)
	if !ok {
		t.Fatal("no join")
	}
	ep := Epoch{Incarnation: 7, N: 1}
	m.Receive(ms, req.Nonce, Reply{Epoch: ep, Central: true, Bucket: 50 * ms, Sent: 0, TTL: int64(time.Second), Live: 200}, nil)
	id, start, ok := m.Bucket(10*ms, "rec")
	if !ok || start != 50*ms || id != BucketID("rec", 7) {
		t.Fatalf("after a reply naming the bucket: %q %d %v; want %q, 50ms, true", id, start, ok, BucketID("rec", 7))
	}
	if due := m.Due(ms); due < 995*ms-2*100*ms {
		t.Fatalf("a member on its bucket renews at %v, want two intervals before its word on it runs out (795ms): nothing else needs a renewal", time.Duration(due))
	}
	if _, _, ok := m.Bucket(995*ms, "rec"); ok {
		t.Fatal("the member still takes at its bucket when its registration may have ended")
	}
	// A take at the bucket books as far ahead as its caller waits (the bucket caps it at
	// TTL + Grace): there is no line to keep its place in.
	if req, ok := m.TakeRequest(10*ms, 1, 10*sec); !ok || req.MaxDelay != 10*sec {
		t.Fatalf("a take of a member on its bucket: %+v %v; want it booked up to the caller's 10s", req, ok)
	}
	// A take at the bucket keeps nobody alive.
	m.TookAtBucket(10*ms, 11*ms, 1, true, 0, nil)
	if _, _, ok := m.Bucket(995*ms, "rec"); ok {
		t.Fatal("a take at the bucket extended the member's word on it")
	}
	// The record's answer to a take, on the registration, extends it.
	m.Took(900*ms, 901*ms, 1, Reply{Central: true, Bucket: 50 * ms, Sent: 900 * ms, TTL: int64(time.Second)}, nil)
	if _, _, ok := m.Bucket(1500*ms, "rec"); !ok {
		t.Fatal("the record's answer did not extend the member's word on its bucket")
	}
	// Unregistered (its record lost): no bucket.
	m.Took(1600*ms, 1601*ms, 1, Reply{}, ErrStaleEpoch)
	if _, _, ok := m.Bucket(1602*ms, "rec"); ok {
		t.Fatal("an unregistered member takes at its bucket")
	}
}
