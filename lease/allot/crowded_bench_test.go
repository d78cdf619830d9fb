package allot

import (
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"
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
		return Request{Op: OpTake, N: 1, Member: "m" + strconv.Itoa(i%n), Epoch: e, Sent: now, Nonce: uint64(i + 2)}
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
// an instant whose takes have already dropped the others.
func TestLongLineOfWaiters(t *testing.T) {
	c := cfg(Fair)
	s, err := NewState(lim(10, time.Second, 1), 1, 0, 0, c)
	if err != nil {
		t.Fatal(err)
	}
	const n = 2 * pruneFrom
	eps := make([]Epoch, n)
	for i := range n {
		rep, err := s.Apply(0, c, Request{Op: OpJoin, Member: fmt.Sprintf("m%02d", i), Nonce: 1, Demand: RateScale})
		if err != nil {
			t.Fatal(err)
		}
		eps[i] = rep.Epoch
	}
	take := func(at int64, i int) Reply {
		rep, err := s.Apply(at, c, Request{Op: OpTake, N: 1, Member: fmt.Sprintf("m%02d", i), Epoch: eps[i], Sent: at, Nonce: uint64(at) + 2, MaxDelay: 0})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	t0 := 5 * sec                                 // long after the first joiner's share has ended and passed its quarantine
	for at := 500 * ms; at < t0; at += 500 * ms { // renewals keep them live
		for i := range n {
			if _, err := s.Apply(at, c, Request{Op: OpRenew, Member: fmt.Sprintf("m%02d", i), Epoch: eps[i], Sent: at, Nonce: uint64(at), Demand: RateScale}); err != nil {
				t.Fatal(err)
			}
		}
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
