package lease_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/lease"
)

// A process joins a limit's pool through a store, and decides in process on its share.
// The first member of a fresh store gets the whole limit, burst included.
func ExampleNew() {
	clk := clock.NewVirtual()
	cfg := lease.DefaultConfig()
	cfg.JoinWindow = 0 // one member here: nobody to share the first burst with
	store, _ := lease.NewMemStore(cfg, clk)
	member, _ := lease.New(store, lease.WithClock(clk), lease.WithID("worker-1"))
	defer member.Close()
	l, _ := sluice.New(sluice.MustParse("10/s burst=4"), sluice.WithBackend(member), sluice.WithClock(clk))
	defer l.Close()

	ctx := context.Background()
	n := 0
	for l.Allow(ctx, "api-token") {
		n++
	}
	st := member.Leases()[0]
	fmt.Printf("took %d at once; share %d/%d of the rate, burst %d, usable for %v\n",
		n, st.Share.Rate, lease.RateScale, st.Share.Burst, st.Expires)
	// Output:
	// took 4 at once; share 1000000/1000000 of the rate, burst 4, usable for 1.45s
}

// The allocation core, driven by hand: a newcomer gets only what is free, and the holder's
// share shrinks at its next renewal; the freed half is B's once A says it switched.
func ExampleState_Apply() {
	cfg := lease.DefaultConfig()
	cfg.JoinWindow = 0
	ms := int64(time.Millisecond)
	s, _ := lease.NewState(gcra.Limit{T: 100 * ms, Tau: 400 * ms}, 1, 0, 0, cfg) // 10/s burst 4
	ask := func(at int64, op lease.Op, member string, e lease.Epoch, inUse uint64) lease.Reply {
		r, err := s.Apply(at, cfg, lease.Request{Op: op, Member: member, Epoch: e, InUse: inUse, Demand: lease.RateScale})
		if err != nil {
			panic(err)
		}
		fmt.Printf("%4dms %-5s %s: share %+v\n", at/ms, op, member, r.Lease.Share)
		return r
	}
	a := ask(0, lease.OpJoin, "a", lease.Epoch{}, 0)
	b := ask(10*ms, lease.OpJoin, "b", lease.Epoch{}, 0)
	a = ask(250*ms, lease.OpRenew, "a", a.Epoch, a.Lease.Seq)
	b = ask(260*ms, lease.OpRenew, "b", b.Epoch, b.Lease.Seq) // A may still use the whole limit
	a = ask(500*ms, lease.OpRenew, "a", a.Epoch, a.Lease.Seq) // A says it uses the half
	ask(510*ms, lease.OpRenew, "b", b.Epoch, b.Lease.Seq)
	// Output:
	//    0ms join  a: share {Rate:1000000 Burst:4}
	//   10ms join  b: share {Rate:0 Burst:0}
	//  250ms renew a: share {Rate:500000 Burst:2}
	//  260ms renew b: share {Rate:0 Burst:0}
	//  500ms renew a: share {Rate:500000 Burst:2}
	//  510ms renew b: share {Rate:500000 Burst:2}
}
