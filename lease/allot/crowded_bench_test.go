package allot

import (
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
	b.Run("take", func(b *testing.B) {
		s, eps, now := crowded(b, n)
		b.ResetTimer()
		for i := range b.N {
			if i%perTick == 0 {
				now += 25 * ms
			}
			m := i % n
			s.Apply(now, c, Request{Op: OpTake, N: 1, Member: "m" + strconv.Itoa(m), Epoch: eps[m], Sent: now, Nonce: uint64(i + 2), Late: 100 * ms})
		}
	})
	b.Run("renew", func(b *testing.B) {
		s, eps, now := crowded(b, n)
		b.ResetTimer()
		for i := range b.N {
			if i%perTick == 0 {
				now += 25 * ms
			}
			m := i % n
			s.Apply(now, c, Request{Op: OpRenew, Member: "m" + strconv.Itoa(m), Epoch: eps[m], Sent: now, Nonce: uint64(i + 2), Demand: RateScale})
		}
	})
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
