package allot

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/gcra"
)

// The allocation core, driven by hand: a newcomer gets only what is free, and the holder's
// share shrinks at its next renewal; the freed half is B's once A says it switched.
func ExampleState_Apply() {
	cfg := DefaultConfig()
	cfg.JoinWindow = 0
	ms := int64(time.Millisecond)
	s, _ := NewState(gcra.Limit{T: 100 * ms, Tau: 400 * ms}, 1, 0, 0, cfg) // 10/s burst 4
	ask := func(at int64, op Op, member string, e Epoch, inUse uint64) Reply {
		r, err := s.Apply(at, cfg, Request{Op: op, Member: member, Epoch: e, InUse: inUse, Demand: RateScale})
		if err != nil {
			panic(err)
		}
		fmt.Printf("%4dms %-5s %s: share %+v\n", at/ms, op, member, r.Lease.Share)
		return r
	}
	a := ask(0, OpJoin, "a", Epoch{}, 0)
	b := ask(10*ms, OpJoin, "b", Epoch{}, 0)
	a = ask(250*ms, OpRenew, "a", a.Epoch, a.Lease.Seq)
	b = ask(260*ms, OpRenew, "b", b.Epoch, b.Lease.Seq) // A may still use the whole limit
	a = ask(500*ms, OpRenew, "a", a.Epoch, a.Lease.Seq) // A says it uses the half
	ask(510*ms, OpRenew, "b", b.Epoch, b.Lease.Seq)
	// Output:
	//    0ms join  a: share {Rate:1000000 Burst:4}
	//   10ms join  b: share {Rate:0 Burst:0}
	//  250ms renew a: share {Rate:500000 Burst:2}
	//  260ms renew b: share {Rate:0 Burst:0}
	//  500ms renew a: share {Rate:500000 Burst:2}
	//  510ms renew b: share {Rate:500000 Burst:2}
}
