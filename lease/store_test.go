package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/allot"
)

const all = RateScale

func lim(rate int64, period time.Duration, burst int64) gcra.Limit {
	t := (int64(period) + rate - 1) / rate
	return gcra.Limit{T: t, Tau: burst * t}
}

// TestEpochsNeverRepeatAfterAForgottenRecord: a member from an earlier registration (a
// partitioned old pod) must never have its renewal accepted as a later registration's,
// even when the store forgot the record in between (no member, a full pool) and made it
// again.
func TestEpochsNeverRepeatAfterAForgottenRecord(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewVirtual()
	s := NewMemStore(clk)
	a := &applier{store: s, cfg: DefaultConfig()}
	l := lim(10, time.Second, 10)
	apply := func(req allot.Request) (allot.Reply, error) {
		t.Helper()
		res, err := a.apply(ctx, []call{{key: "k", limit: l, req: req}})
		if err != nil {
			t.Fatal(err)
		}
		return res[0].rep, res[0].err
	}
	old, err := apply(allot.Request{Op: allot.OpJoin, Member: "pod", Demand: all})
	if err != nil {
		t.Fatal(err)
	}
	// The replacement joins under the same name, then leaves.
	clk.Advance(2 * time.Second)
	repl, err := apply(allot.Request{Op: allot.OpJoin, Member: "pod", Demand: all})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := apply(allot.Request{Op: allot.OpRelease, Member: "pod", Epoch: repl.Epoch}); err != nil {
		t.Fatal(err)
	}
	// Long enough for every quarantine to end and the pool to refill: the record is forgotten.
	clk.Advance(10 * time.Second)
	if _, err := apply(allot.Request{Op: allot.OpPenalize, Hold: 0}); err != nil {
		t.Fatal(err)
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("the idle record was kept (%d records)", n)
	}
	// It joins again: a new record.
	again, err := apply(allot.Request{Op: allot.OpJoin, Member: "pod", Demand: all})
	if err != nil {
		t.Fatal(err)
	}
	if again.Epoch == old.Epoch || again.Epoch == repl.Epoch {
		t.Fatalf("epoch %+v issued again (earlier: %+v, %+v)", again.Epoch, old.Epoch, repl.Epoch)
	}
	// The old pod comes back from its partition with its first epoch.
	if rep, err := apply(allot.Request{Op: allot.OpRenew, Member: "pod", Epoch: old.Epoch, Demand: all}); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("the old registration's renewal was accepted: %+v, %v", rep, err)
	}
}
