package allot

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gcra"
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
	if s.BucketBusy < 200*ms+int64(c.TTL+c.Grace) {
		t.Fatalf("busy until %v after the switch at 200ms: the members it answered may take at the bucket until %v", time.Duration(s.BucketBusy), time.Duration(200*ms+int64(c.TTL+c.Grace)))
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
	m.Receive(ms, req.Nonce, Reply{Epoch: ep, Central: true, Bucket: 50 * ms, BucketInc: 7, Sent: 0, TTL: int64(time.Second), Grace: 500 * ms, Live: 200}, nil)
	b, ok := m.Bucket(10*ms, "rec")
	if want := (BucketRef{ID: BucketID("rec", 7), Start: 50 * ms, Fence: 1500 * ms}); !ok || b != want {
		t.Fatalf("after a reply naming the bucket: %+v %v; want %+v", b, ok, want)
	}
	if due := m.Due(ms); due > 100*ms || due < 95*ms {
		t.Fatalf("a member on its bucket renews at %v, want at its interval (95-100ms): its word on the bucket bounds how far ahead it books there", time.Duration(due))
	}
	if _, ok := m.Bucket(995*ms, "rec"); ok {
		t.Fatal("the member still takes at its bucket when its registration may have ended")
	}
	// A take at the bucket books as far ahead as its caller waits (there is no line to
	// keep its place in), but no further than the member's word on the bucket: a member
	// whose record was lost has every permit it booked before the record made again
	// grants any.
	if req, ok := m.TakeRequest(10*ms, 1, 500*ms); !ok || req.MaxDelay != 500*ms {
		t.Fatalf("a take of a member on its bucket: %+v %v; want it booked up to the caller's 500ms", req, ok)
	}
	if req, ok := m.TakeRequest(10*ms, 1, 10*sec); !ok || req.MaxDelay != 985*ms {
		t.Fatalf("a take of a member on its bucket: %+v %v; want it booked up to its word on the bucket, 985ms ahead", req, ok)
	}
	// A take at the bucket keeps nobody alive.
	m.TookAtBucket(10*ms, 11*ms, 1, true, 0, nil)
	if _, ok := m.Bucket(995*ms, "rec"); ok {
		t.Fatal("a take at the bucket extended the member's word on it")
	}
	// The record's answer to a take, on the registration, extends it.
	m.Took(900*ms, 901*ms, 1, Reply{Central: true, Bucket: 50 * ms, BucketInc: 7, Sent: 900 * ms, TTL: int64(time.Second), Version: 5}, nil)
	if _, ok := m.Bucket(1500*ms, "rec"); !ok {
		t.Fatal("the record's answer did not extend the member's word on its bucket")
	}
	// Holding what it may have booked at the bucket, it says which version of the record
	// it saw (a record found older is rewound, and moves to a new bucket).
	if req, ok := m.Request(m.Due(1000*ms), 0); !ok || req.Seen != 5 {
		t.Fatalf("a renewal of a member on its bucket: %+v, %v; want the version it saw (5)", req, ok)
	}
	// A late answer, to a request sent before the one it last learnt from, names a bucket
	// the record has left (rewound): it is not taken at.
	m.Took(1100*ms, 1101*ms, 1, Reply{Central: true, Bucket: 2 * sec, BucketInc: 99, Sent: 1100 * ms, TTL: int64(time.Second)}, nil)
	m.Took(950*ms, 1102*ms, 1, Reply{Central: true, Bucket: 50 * ms, BucketInc: 7, Sent: 950 * ms, TTL: int64(time.Second)}, nil)
	if b, ok := m.Bucket(1200*ms, "rec"); !ok || b.ID != BucketID("rec", 99) {
		t.Fatalf("after a late answer naming the old bucket: %+v %v; want the new one (99)", b, ok)
	}
	// Unregistered (its record lost): no bucket.
	m.Took(1600*ms, 1601*ms, 1, Reply{}, ErrStaleEpoch)
	if _, ok := m.Bucket(1602*ms, "rec"); ok {
		t.Fatal("an unregistered member takes at its bucket")
	}
}

// TestBucketRecordRewoundAndIdle: a record on its bucket found rewound moves to a new
// bucket (named anew) that starts after the record's fence; a penalty's answer names the
// bucket (the member holds it back there); and a record on its bucket whose members have
// all left is not Idle (deleted, then made again with a fresh pool) before every permit
// they may have booked at the bucket has come and the bucket has had a tolerance to
// refill.
func TestBucketRecordRewoundAndIdle(t *testing.T) {
	c := cfg(Fair)
	l := lim(100, time.Second, 20)
	s, eps := joinedState(t, l, c, BucketAbove+1)
	renewAll(t, s, c, eps, 100*ms)
	if s.BucketAt == 0 || s.BucketInc != s.Incarnation {
		t.Fatalf("bucket at %d of incarnation %d (record's %d)", s.BucketAt, s.BucketInc, s.Incarnation)
	}
	pen, err := s.Apply(200*ms, c, Request{Op: OpPenalize, Member: "m00", Hold: sec, Sent: 200 * ms})
	if err != nil || pen.Bucket != s.BucketAt || pen.BucketInc != s.BucketInc {
		t.Fatalf("a penalty's answer on a record on its bucket: %+v, %v; want it naming the bucket", pen, err)
	}
	was, at := s.BucketInc, s.BucketAt
	s.Rewound(300*ms, 99)
	if s.BucketInc != 99 || s.BucketInc == was || s.BucketAt < s.Fence || s.BucketAt < at {
		t.Fatalf("rewound: bucket %d at %v, fence %v; want a new bucket (99) from the fence on", s.BucketInc, time.Duration(s.BucketAt), time.Duration(s.Fence))
	}
	end := int64(0)
	for i := range eps {
		at := 2*sec + int64(i)
		if _, err := s.Apply(at, c, Request{Op: OpRelease, Member: fmt.Sprintf("m%02d", i), Epoch: eps[i], Sent: at, Nonce: 50}); err != nil {
			t.Fatal(err)
		}
		end = at
	}
	busy := end + int64(c.TTL+c.Grace)
	for _, at := range []int64{busy - ms, busy + l.Tau - ms} {
		if s.Idle(at) {
			t.Fatalf("idle at %v, its members having left at %v: permits booked at its bucket may still come until %v", time.Duration(at), time.Duration(end), time.Duration(busy))
		}
	}
	if q := s.QuietAt(); q < busy+l.Tau {
		t.Fatalf("quiet at %v, before %v", time.Duration(q), time.Duration(busy+l.Tau))
	}
}

// stateOnBucket returns a record of 100/s burst=20 whose BucketAbove + 1 members joined
// and renewed once, which moved it to its bucket, with their epochs, its settings and
// its limit.
func stateOnBucket(t *testing.T) (*State, []Epoch, Config, gcra.Limit) {
	t.Helper()
	c := cfg(Fair)
	l := lim(100, time.Second, 20)
	s, eps := joinedState(t, l, c, BucketAbove+1)
	renewAll(t, s, c, eps, 100*ms)
	if s.BucketAt == 0 {
		t.Fatal("not on its bucket")
	}
	return s, eps, c, l
}

// TestConfirmsOnTheBucket: a member of a limit on its bucket confirms (OpConfirm) that it
// may go on taking there by a read: a confirm changes the record only to carry its word
// on the bucket (BucketBusy) BucketKeep ahead when less than half of that is left, so
// that the store writes it about once every BucketKeep/2 whatever the number of
// members; it needs no entry of the member (those of members that only confirm expire);
// a record found rewound names its new bucket; a record on no bucket refuses it (stale:
// the member joins again); and no confirm's word outlasts the record's: the record is
// not Idle (deleted, then made again with a fresh burst) before every member's word on
// its bucket and a tolerance after it have passed.
func TestConfirmsOnTheBucket(t *testing.T) {
	s, eps, c, l := stateOnBucket(t)
	keep := bucketKeep(c)
	confirm := func(at int64, i int) (Reply, bool, error) {
		t.Helper()
		before := MarshalState(s)
		rep, err := s.Apply(at, c, Request{Op: OpConfirm, Member: fmt.Sprintf("m%02d", i), Epoch: eps[i], Sent: at, Nonce: uint64(at)})
		return rep, string(before) != string(MarshalState(s)), err
	}
	// The switch carried the record's word BucketKeep ahead: the first confirm changes
	// nothing (else every member's first confirm wrote, all at once).
	if s.BucketBusy < keep {
		t.Fatalf("busy until %v after the switch; want BucketKeep (%v) ahead", time.Duration(s.BucketBusy), time.Duration(keep))
	}
	rep, changed, err := confirm(200*ms, 0)
	if err != nil || changed {
		t.Fatalf("the first confirm: %v, changed %v; want nothing written", err, changed)
	}
	if rep.Bucket != s.BucketAt || rep.BucketInc != s.BucketInc || rep.Epoch != eps[0] || rep.Word != int64(c.TTL) {
		t.Fatalf("a confirm's answer: %+v; want the bucket, the member's epoch and a word of a TTL", rep)
	}
	writes := 0
	last := int64(0)
	for at := 300 * ms; at < 3*keep; at += 100 * ms {
		for i := range 3 {
			rep, changed, err := confirm(at, i)
			if err != nil {
				t.Fatalf("a confirm at %v: %v", time.Duration(at), err)
			}
			if changed {
				writes++
				last = at
			}
			if end := at + rep.Word; end > s.BucketBusy-int64(c.Grace) {
				t.Fatalf("a confirm at %v gave a word until %v, past the record's %v less its grace", time.Duration(at), time.Duration(end), time.Duration(s.BucketBusy))
			}
			if s.Idle(at+rep.Word+int64(c.Grace)+l.Tau-1) || s.QuietAt() < at+rep.Word+int64(c.Grace)+l.Tau {
				t.Fatalf("a confirm at %v: the record would be idle before its word and a tolerance have passed", time.Duration(at))
			}
		}
	}
	if want := int(3*keep/(keep/2)) + 1; writes > want {
		t.Fatalf("%d confirms changed the record %d times over %v; want one in BucketKeep/2 at most (%d)", 3*int(3*keep/(100*ms)), writes, time.Duration(3*keep), want)
	}
	if last < 2*keep {
		t.Fatalf("the last write at %v: the word was not carried on", time.Duration(last))
	}
	if len(s.Members) != 0 {
		t.Fatalf("%d entries left of members that only confirm: the record every member reads keeps them", len(s.Members))
	}
	// The members' entries have expired (confirms need none): one that never had one
	// confirms too.
	if _, err := s.Apply(3*keep, c, Request{Op: OpConfirm, Member: "zz", Epoch: Epoch{Incarnation: s.BucketInc, N: 9999}, Sent: 3 * keep}); err != nil {
		t.Fatalf("a confirm of a member without an entry: %v", err)
	}
	// A record found rewound moves to a new bucket after its fence: a confirm of a member
	// registered before names the new one (which starts after the fence), so that the
	// member moves there rather than joining again.
	s.Rewound(3*keep, 99)
	rep, err = s.Apply(3*keep+ms, c, Request{Op: OpConfirm, Member: "m01", Epoch: eps[1], Sent: 3*keep + ms})
	if err != nil || rep.BucketInc != 99 || rep.Bucket < s.Fence || rep.Epoch != eps[1] {
		t.Fatalf("a confirm of a rewound record: %+v, %v; want the new bucket (99), from the fence (%v) on", rep, err, time.Duration(s.Fence))
	}
	// A record not on a bucket refuses confirms.
	small, seps := joinedState(t, l, c, 3)
	if _, err := small.Apply(ms, c, Request{Op: OpConfirm, Member: "m00", Epoch: seps[0], Sent: ms}); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("a confirm of a record not on its bucket: %v; want ErrStaleEpoch", err)
	}
	if _, err := s.Apply(3*keep+ms, c, Request{Op: OpConfirm, Epoch: eps[1], Sent: 3*keep + ms}); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("a confirm without a member: %v; want ErrBadRequest", err)
	}
}

// TestJoinsOnTheBucketAreReads: a join of a limit decided on its bucket registers its
// member without changing the record (a thousand members starting at once joined by
// writing it in turn: BenchmarkLeaseRedisMembers, members=1000, most writes lost for
// seconds), with a word of a whole TTL on the bucket that ends Grace before the record's;
// the member then confirms, and its registration, which no entry holds, cannot renew.
// Takes, gives and releases the record answers are reads too (ReadOnBucket).
func TestJoinsOnTheBucketAreReads(t *testing.T) {
	s, eps, c, l := stateOnBucket(t)
	join := func(at int64, who string) (Reply, bool) {
		t.Helper()
		before := MarshalState(s)
		rep, err := s.Apply(at, c, Request{Op: OpJoin, Member: who, Sent: at, Nonce: 7, Demand: RateScale})
		if err != nil {
			t.Fatalf("a join at %v: %v", time.Duration(at), err)
		}
		return rep, string(before) != string(MarshalState(s))
	}
	keep := bucketKeep(c)
	writes := 0
	for at := 200 * ms; at < 3*keep; at += 100 * ms {
		for i := range 3 {
			rep, changed := join(at, fmt.Sprintf("new%d", i))
			if changed {
				writes++
			}
			if rep.Bucket != s.BucketAt || rep.BucketInc != s.BucketInc || !rep.Central || rep.Nonce != 7 || rep.Sent != at {
				t.Fatalf("a join's answer at %v: %+v; want the bucket, decided at the store, the request's nonce", time.Duration(at), rep)
			}
			if rep.Epoch != (Epoch{Incarnation: s.Incarnation}) || rep.Word != int64(c.TTL) {
				t.Fatalf("a join's answer: epoch %+v, word %v; want number 0 of incarnation %d, a TTL", rep.Epoch, time.Duration(rep.Word), s.Incarnation)
			}
			if end := at + int64(c.TTL); end > s.BucketBusy-int64(c.Grace) {
				t.Fatalf("a join at %v registered until %v, past the record's %v less its grace", time.Duration(at), time.Duration(end), time.Duration(s.BucketBusy))
			}
		}
	}
	if want := int(3*keep/(keep/2)) + 1; writes > want {
		t.Fatalf("joins changed the record %d times over %v; want one in BucketKeep/2 at most (%d)", writes, time.Duration(3*keep), want)
	}
	if _, ok := s.find("new0"); ok {
		t.Fatal("a join on the bucket left an entry")
	}
	// Registered so, a member confirms; a renewal of that registration is stale.
	at := 3 * keep
	rep, _ := join(at, "m00")
	if _, err := s.Apply(at, c, Request{Op: OpConfirm, Member: "m00", Epoch: rep.Epoch, Sent: at}); err != nil {
		t.Fatalf("a confirm after a join on the bucket: %v", err)
	}
	if _, err := s.Apply(at, c, Request{Op: OpRenew, Member: "m00", Epoch: rep.Epoch, Sent: at}); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("a renewal of a registration on the bucket: %v; want ErrStaleEpoch", err)
	}
	// Takes, gives and releases of a record on its bucket name it and change nothing,
	// whether the record holds the member (m01) or not.
	for _, req := range []Request{
		{Op: OpTake, Member: "m01", Epoch: eps[1], N: 1},
		{Op: OpTake, Member: "new1", Epoch: rep.Epoch, N: 1, MaxDelay: int64(c.TTL)},
		{Op: OpTake, Member: "new1", Epoch: rep.Epoch, N: 2, MaxDelay: -1},
		{Op: OpGive, Member: "new1", Epoch: rep.Epoch, N: 1},
		{Op: OpRelease, Member: "m02", Epoch: eps[2]},
		{Op: OpRelease, Member: "new2", Epoch: rep.Epoch},
	} {
		req.Sent = at
		before := MarshalState(s)
		got, err := s.Apply(at, c, req)
		if err != nil || got.Bucket != s.BucketAt || !got.Central || string(before) != string(MarshalState(s)) {
			t.Fatalf("%v of %s on the bucket: %+v, %v, record changed: %v; want the bucket named, nothing changed", req.Op, req.Member, got, err, string(before) != string(MarshalState(s)))
		}
	}
	for _, op := range []Op{OpTake, OpGive} {
		if _, err := s.Apply(at, c, Request{Op: op, Member: "new1", N: l.Burst() + 1}); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("%v of more than the burst on the bucket: %v; want ErrBadRequest", op, err)
		}
	}
	// A limit not on its bucket registers its joiners in entries, as ever.
	small, _ := joinedState(t, l, c, 3)
	if rep, err := small.Apply(ms, c, Request{Op: OpJoin, Member: "zz", Sent: ms, Demand: RateScale}); err != nil || rep.Epoch.N == 0 {
		t.Fatalf("a join of a record not on its bucket: %+v, %v; want an entry's epoch", rep.Epoch, err)
	}
}

// TestMemberConfirmsOnItsBucket: a member on its limit's bucket, holding no share, renews
// by confirming (a read of the record), carries the version it saw, and extends its word
// on the bucket from the answer's Word; one that holds a share, or whose word has ended,
// renews (or joins) as before; a stale answer unregisters it (no bucket).
func TestMemberConfirmsOnItsBucket(t *testing.T) {
	m := NewMember("a", lim(100, time.Second, 20), MemberConfig{RenewEvery: 100 * time.Millisecond, Margin: 5 * time.Millisecond}, 0)
	req, _ := m.Request(0, 0)
	ep := Epoch{Incarnation: 7, N: 1}
	m.Receive(ms, req.Nonce, Reply{Epoch: ep, Central: true, Bucket: 50 * ms, BucketInc: 7, Sent: 0, TTL: int64(time.Second), Grace: 500 * ms, Live: 200, Version: 3}, nil)
	req, ok := m.Request(m.Due(ms), 0)
	if !ok || req.Op != OpConfirm || req.Epoch != ep || req.Seen != 3 {
		t.Fatalf("the renewal of a member on its bucket: %+v %v; want a confirm of epoch %v having seen version 3", req, ok, ep)
	}
	at := req.Sent
	m.Receive(at+ms, req.Nonce, Reply{Epoch: ep, Central: true, Bucket: 50 * ms, BucketInc: 7, Sent: at, TTL: int64(time.Second), Grace: 500 * ms, Word: 950 * ms, Version: 3}, nil)
	if _, ok := m.Bucket(at+944*ms, "rec"); !ok {
		t.Fatal("a confirm's answer did not extend the member's word on its bucket")
	}
	if _, ok := m.Bucket(at+945*ms, "rec"); ok {
		t.Fatal("a confirm's answer extended the word past its Word less the margin")
	}
	req, ok = m.Request(m.Due(at+ms), 0)
	if !ok || req.Op != OpConfirm {
		t.Fatalf("the next renewal: %+v %v; want a confirm", req, ok)
	}
	m.Receive(req.Sent+ms, req.Nonce, Reply{}, ErrStaleEpoch)
	if _, ok := m.Bucket(req.Sent+2*ms, "rec"); ok {
		t.Fatal("a member whose confirm was stale still takes at its bucket")
	}
	if req, ok := m.Request(req.Sent+2*ms, 0); !ok || req.Op != OpJoin {
		t.Fatalf("after a stale confirm: %+v %v; want a join", req, ok)
	}
	// A member holding a share renews.
	h := NewMember("b", lim(100, time.Second, 20), MemberConfig{RenewEvery: 100 * time.Millisecond, Margin: 5 * time.Millisecond}, 0)
	req, _ = h.Request(0, 0)
	rep := Reply{Epoch: ep, Sent: 0, TTL: int64(time.Second), Grace: 500 * ms, Live: 2}
	rep.Lease.Seq, rep.Lease.Share = 1, Share{Rate: RateScale / 2, Burst: 10}
	h.Receive(ms, req.Nonce, rep, nil)
	if req, ok := h.Request(h.Due(ms), 0); !ok || req.Op != OpRenew {
		t.Fatalf("a member holding a share: %+v %v; want a renewal", req, ok)
	}
}

// TestMemberJoinedOnItsBucketConfirms: a member registered by a join of a record on its
// bucket (no entry: epoch number 0) confirms at every interval even while it still uses
// permits of a lease of its earlier registration, or had a share to acknowledge when it
// was found stale: a renewal of that registration is stale whatever it holds, and it
// renewed, was stale, joined again, and renewed again until its old lease's permits were
// done, unregistered meanwhile (its callers stalled).
func TestMemberJoinedOnItsBucketConfirms(t *testing.T) {
	mc := MemberConfig{RenewEvery: 100 * time.Millisecond, Margin: 5 * time.Millisecond}
	m := NewMember("a", lim(100, time.Second, 20), mc, 0)
	req, _ := m.Request(0, 0)
	rep := Reply{Epoch: Epoch{Incarnation: 7, N: 1}, Sent: 0, TTL: int64(time.Second), Grace: 500 * ms, Live: 2}
	rep.Lease.Seq, rep.Lease.Share = 1, Share{Rate: RateScale / 2, Burst: 10}
	m.Receive(ms, req.Nonce, rep, nil)
	// Its share shrank (the limit went to the store) and waits to be acknowledged, while
	// permits reserved under it are pending for a while yet; then its renewal is stale.
	m.handover.ackNow, m.handover.ackSeq, m.handover.ackUntil = true, 1, 2*sec
	m.handover.prevShare, m.handover.prevUntil = rep.Lease.Share, 2*sec
	req, _ = m.Request(m.Due(2*ms), 0)
	m.Receive(req.Sent+ms, req.Nonce, Reply{}, ErrStaleEpoch)
	req, ok := m.Request(req.Sent+2*ms, 0)
	if !ok || req.Op != OpJoin {
		t.Fatalf("after a stale answer: %+v %v; want a join", req, ok)
	}
	joined := Epoch{Incarnation: 7}
	onBucket := func(sent int64) Reply {
		return Reply{Epoch: joined, Central: true, Bucket: 50 * ms, BucketInc: 7, Sent: sent, TTL: int64(time.Second), Grace: 500 * ms, Word: int64(time.Second), Version: 4}
	}
	m.Receive(req.Sent+3*ms, req.Nonce, onBucket(req.Sent), nil)
	at := req.Sent + 3*ms
	if m.InUse(at).IsZero() {
		t.Fatal("set-up: no older lease in use")
	}
	if due := m.Due(at); due < req.Sent+int64(mc.RenewEvery-mc.RenewEvery/20) {
		t.Fatalf("registered on the bucket, next due %v after its join; want about an interval", time.Duration(due-req.Sent))
	}
	for range 3 {
		req, ok = m.Request(m.Due(at), 0)
		if !ok || req.Op != OpConfirm || req.Epoch != joined {
			t.Fatalf("registered on the bucket without an entry: %+v %v; want a confirm", req, ok)
		}
		at = req.Sent + ms
		m.Receive(at, req.Nonce, onBucket(req.Sent), nil)
	}
}

// TestMemberConfirmsAfterItsWordEnds: a member on its bucket whose word has run out (an
// answer late) still confirms rather than renewing an entry that has expired (which
// would be stale, and make it join again), and carries the version it saw while what it
// booked may still come, so that a rewind is still found.
func TestMemberConfirmsAfterItsWordEnds(t *testing.T) {
	m := NewMember("a", lim(100, time.Second, 20), MemberConfig{RenewEvery: 100 * time.Millisecond, Margin: 5 * time.Millisecond}, 0)
	req, _ := m.Request(0, 0)
	ep := Epoch{Incarnation: 7, N: 1}
	m.Receive(ms, req.Nonce, Reply{Epoch: ep, Central: true, Bucket: 50 * ms, BucketInc: 7, Sent: 0, TTL: int64(time.Second), Grace: 500 * ms, Live: 200, Version: 3}, nil)
	if _, ok := m.Bucket(2*sec, "rec"); ok {
		t.Fatal("the word did not end")
	}
	req, ok := m.Request(2*sec, 0)
	if !ok || req.Op != OpConfirm || req.Seen != 3 {
		t.Fatalf("a member on its bucket past its word: %+v %v; want a confirm having seen version 3", req, ok)
	}
	// A fence's length (TTL + Grace) past its word, nothing it booked can come: it says
	// it saw nothing, so that a record deleted meanwhile (idle) is made again unfenced.
	m.Receive(2*sec+ms, req.Nonce, Reply{}, errors.New("no answer"))
	if req, ok := m.Request(3*sec, 0); !ok || req.Op != OpConfirm || req.Seen != 0 {
		t.Fatalf("a member on its bucket a fence past its word: %+v %v; want a confirm having seen nothing", req, ok)
	}
}
