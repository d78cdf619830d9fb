package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/clock"
)

// TestEpochsNeverRepeatAfterAForgottenRecord: a member from an earlier registration (a
// partitioned old pod) must never have its renewal accepted as a later registration's,
// even when the store forgot the record in between (no member, a full pool) and made it
// again.
func TestEpochsNeverRepeatAfterAForgottenRecord(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewVirtual()
	cfg := DefaultConfig()
	s, err := NewMemStore(cfg, clk)
	if err != nil {
		t.Fatal(err)
	}
	l := lim(10, time.Second, 10)
	apply := func(req Request) (Reply, error) {
		t.Helper()
		res, err := s.Apply(ctx, []Call{{Key: "k", Limit: l, Req: req}})
		if err != nil {
			t.Fatal(err)
		}
		return res[0].Reply, res[0].Err
	}
	old, err := apply(Request{Op: OpJoin, Member: "pod", Demand: all})
	if err != nil {
		t.Fatal(err)
	}
	// The replacement joins under the same name, then leaves.
	clk.Advance(2 * time.Second)
	repl, err := apply(Request{Op: OpJoin, Member: "pod", Demand: all})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := apply(Request{Op: OpRelease, Member: "pod", Epoch: repl.Epoch}); err != nil {
		t.Fatal(err)
	}
	// Long enough for every quarantine to end and the pool to refill: the record is forgotten.
	clk.Advance(10 * time.Second)
	if _, err := apply(Request{Op: OpPenalize, Hold: 0}); err != nil {
		t.Fatal(err)
	}
	if st := s.Snapshot("k", l); st != nil {
		t.Fatalf("the idle record was kept: %+v", st)
	}
	// It joins again: a new record.
	again, err := apply(Request{Op: OpJoin, Member: "pod", Demand: all})
	if err != nil {
		t.Fatal(err)
	}
	if again.Epoch == old.Epoch || again.Epoch == repl.Epoch {
		t.Fatalf("epoch %+v issued again (earlier: %+v, %+v)", again.Epoch, old.Epoch, repl.Epoch)
	}
	// The old pod comes back from its partition with its first epoch.
	if rep, err := apply(Request{Op: OpRenew, Member: "pod", Epoch: old.Epoch, Demand: all}); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("the old registration's renewal was accepted: %+v, %v", rep, err)
	}
}
