package allot

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/store"
)

// crowded returns the record of 2000/s burst=400 shared by n members that each want all
// they can get (more members than permits of burst: the limit is decided at the store),
// with their epochs.
func crowded(b *testing.B, n int) (*State, []Epoch, int64) {
	b.Helper()
	c := DefaultConfig()
	now := 1000 * sec
	s, err := NewState(lim(2000, time.Second, 400), 1, now, 0, c)
	if err != nil {
		b.Fatal(err)
	}
	eps := make([]Epoch, n)
	for i := range n {
		rep, err := s.Apply(now, c, Request{Op: OpJoin, Member: "m" + strconv.Itoa(i), Sent: now, Nonce: 1, Demand: RateScale})
		if err != nil {
			b.Fatal(err)
		}
		eps[i] = rep.Epoch
	}
	if !s.Central {
		b.Fatal("the limit is not decided at the store")
	}
	return s, eps, now
}

// BenchmarkApplyCrowded: what an allocator's tick costs per request on a limit of a
// thousand members (lease/relay.go applies a tick's requests at one instant): a take, a
// renewal, and the record's encoding once a tick.
func BenchmarkApplyCrowded(b *testing.B) {
	const n, perTick = 1000, 75 // 3,000 requests a second at a tick of 25 ms
	c := DefaultConfig()
	ticks := func(req func(i int, e Epoch, now int64) Request) func(b *testing.B) {
		return func(b *testing.B) {
			s, eps, now := crowded(b, n)
			b.ResetTimer()
			for i := range b.N {
				if i%perTick == 0 {
					now += 25 * ms
				}
				s.Apply(now, c, req(i, eps[i%n], now))
			}
		}
	}
	b.Run("take", ticks(func(i int, e Epoch, now int64) Request {
		// Callers that may wait a little: the refused ones wait in the store's line.
		return Request{Op: OpTake, N: 1, Member: "m" + strconv.Itoa(i%n), Epoch: e, Sent: now, Nonce: uint64(i + 2), MaxDelay: ms}
	}))
	b.Run("renew", ticks(func(i int, e Epoch, now int64) Request {
		return Request{Op: OpRenew, Member: "m" + strconv.Itoa(i%n), Epoch: e, Sent: now, Nonce: uint64(i + 2), Demand: RateScale}
	}))
	b.Run("encode", func(b *testing.B) {
		s, _, _ := crowded(b, n)
		b.ResetTimer()
		var size int
		for range b.N {
			size = len(MarshalState(s))
		}
		b.ReportMetric(float64(size), "B/record")
	})
}

// TestLongLineOfWaiters: on a line of more than pruneFrom waiters, take drops those that
// left once an instant, and a member that releases leaves the line at once, even within
// an instant whose takes have already dropped the others. (A crowded limit without a ramp
// is decided on its bucket: a ramp's stays on its record, in its line.)
func TestLongLineOfWaiters(t *testing.T) {
	c := cfg(Fair)
	const n = 2 * pruneFrom
	l := lim(10, time.Second, 1)
	l.Ramp = gcra.Ramp{T0: l.T, Over: sec}
	s, eps := joinedState(t, l, c, n)
	take := func(at int64, i int) Reply {
		rep, err := s.Apply(at, c, Request{Op: OpTake, N: 1, Member: fmt.Sprintf("m%02d", i), Epoch: eps[i], Sent: at, Nonce: uint64(at) + 2, MaxDelay: ms})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	t0 := 5 * sec                                 // long after the first joiner's share has ended and passed its quarantine
	for at := 500 * ms; at < t0; at += 500 * ms { // renewals keep them live
		renewAll(t, s, c, eps, at)
	}
	for i := range n {
		take(t0, i)
	}
	if len(s.Queue) < pruneFrom {
		t.Fatalf("a line of %d waiters; want at least %d", len(s.Queue), pruneFrom)
	}
	in := func(id string) bool { return slices.ContainsFunc(s.Queue, func(w Waiter) bool { return w.ID == id }) }
	head := s.Queue[0].ID
	var k int
	fmt.Sscanf(head, "m%d", &k)
	take(t0+ms, (k+1)%n) // the instant's first take drops the waiters that left (none)
	if _, err := s.Apply(t0+ms, c, Request{Op: OpRelease, Member: head, Epoch: eps[k], Sent: t0 + ms, Nonce: 99}); err != nil {
		t.Fatal(err)
	}
	if in(head) {
		t.Errorf("%s released and is still in the line", head)
	}
}

// TestTakesAtOnceUseTheRate: a limit decided at the store (16 members on 10/s burst=5, in
// the record's line; 108, on its bucket), callers that do not wait
// (Allow) at 150% of it, at random members, each take applied when it is asked. The pool
// grants the limit's rate. (A refused take at once joined the store's line as a waiter
// expected back at its turn, which a caller that does not wait never keeps, and a take
// behind more expected waiters than the burst holds was refused: 3.3 permits a second of
// 10 through a real Redis, BenchmarkLeaseRedisCentral.)
func TestTakesAtOnceUseTheRate(t *testing.T) {
	for _, n := range []int{CrowdedAbove, BucketAbove + 8} {
		t.Run(fmt.Sprintf("members=%d", n), func(t *testing.T) { takesAtOnce(t, n) })
	}
}

func takesAtOnce(t *testing.T, n int) {
	c := cfg(Fair)
	l := lim(10, time.Second, 5)
	s, eps := joinedState(t, l, c, n)
	var bucket []byte // the limit's bucket, once it is decided there
	bt, btau := store.BucketLimit(l.T, l.Tau)
	renew := func(at int64) { renewAll(t, s, c, eps, at) }
	t0 := 5 * sec
	for at := 250 * ms; at < t0; at += 250 * ms {
		renew(at)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const d = 60 * sec
	var asked, taken int
	nextRenew := t0
	for at := t0 + int64(rng.ExpFloat64()*float64(sec)/15); at <= t0+d; at += int64(rng.ExpFloat64() * float64(sec) / 15) {
		for ; nextRenew <= at; nextRenew += 250 * ms {
			renew(nextRenew)
		}
		i := rng.IntN(n)
		rep, err, check := s.ApplyChecked(at, c, Request{Op: OpTake, N: 1, Member: fmt.Sprintf("m%02d", i), Epoch: eps[i], Sent: at, Nonce: uint64(at) + 2})
		if err != nil || check != nil {
			t.Fatal(err, check)
		}
		if rep.Bucket != 0 {
			out, _, res, err := store.ApplyBucket(bucket, at/1000, store.Fresh, store.BucketOp{Start: rep.Bucket / 1000, T: bt, Tau: btau, N: 1})
			if err != nil {
				t.Fatal(err)
			}
			if out != nil {
				bucket = out
			}
			rep.Taken = res.Taken
		}
		if wantBucket := n > BucketAbove; (rep.Bucket != 0) != wantBucket {
			t.Fatalf("%d members: a take answered %+v, want it decided on the bucket: %v", n, rep, wantBucket)
		}
		asked++
		if rep.Taken {
			taken++
		}
	}
	if rate := float64(taken) / float64(d/sec); rate < 9.5 {
		t.Errorf("%d takes at once of %d asked in %v: %.2f a second, want at least 9.5 of the limit's 10 (line: %d waiters)", taken, asked, time.Duration(d), rate, len(s.Queue))
	}
}

// joinedState returns a record of l with n members, m00 on, joined at 0 wanting all they
// can get, and their epochs.
func joinedState(t *testing.T, l gcra.Limit, c Config, n int) (*State, []Epoch) {
	t.Helper()
	s, err := NewState(l, 1, 0, 0, c)
	if err != nil {
		t.Fatal(err)
	}
	eps := make([]Epoch, n)
	for i := range n {
		rep, err := s.Apply(0, c, Request{Op: OpJoin, Member: fmt.Sprintf("m%02d", i), Nonce: 1, Demand: RateScale})
		if err != nil {
			t.Fatal(err)
		}
		eps[i] = rep.Epoch
	}
	return s, eps
}

// renewAll renews every member of eps at at, wanting all it can get, and keeps its epoch;
// a member that joined a limit on its bucket (no entry: epoch number 0) confirms, as
// Member does.
func renewAll(t *testing.T, s *State, c Config, eps []Epoch, at int64) {
	t.Helper()
	for i := range eps {
		op := OpRenew
		if eps[i].N == 0 {
			op = OpConfirm
		}
		rep, err := s.Apply(at, c, Request{Op: op, Member: fmt.Sprintf("m%02d", i), Epoch: eps[i], Sent: at, Nonce: uint64(at), Demand: RateScale})
		if err != nil {
			t.Fatal(err)
		}
		eps[i] = rep.Epoch
	}
}
