package lease_test

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/store"
)

// A process joins a limit's pool through a store, and decides in process on its share.
// The first member of a fresh store gets the whole limit, burst included.
func ExampleNew() {
	clk := clock.NewVirtual()
	cfg := lease.DefaultConfig()
	cfg.JoinWindow = 0 // one member here: nobody to share the first burst with
	mem := store.NewMemory(clk)
	member, _ := lease.New(mem, lease.WithConfig(cfg), lease.WithClock(clk), lease.WithID("worker-1"))
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
