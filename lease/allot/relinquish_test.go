package allot

import (
	"testing"
	"time"
)

// TestRelinquishKeepsThePermitOfTheLeaseInUse: a member gives its share up (Relinquish)
// keeping one permit parked, from the lease it uses, while the store has already moved it
// to a newer lease without burst whose answer it has not had. The store counts the permit
// it keeps, so a newcomer gets the rest of the burst only. Before, the store kept the
// newer lease's burst (none) and forgot the older lease, and the permit kept was counted
// nowhere (the property test, with critical callers, on 100/s burst 20: 21 permits of
// burst in use).
func TestRelinquishKeepsThePermitOfTheLeaseInUse(t *testing.T) {
	c := cfg(Fair)
	c.JoinWindow = 0
	s, _ := NewState(lim(100, time.Second, 20), 1, 0, 0, c)
	apply := checkedApply(t, s, c)
	a := apply(0, Request{Op: OpJoin, Member: "a", Demand: all})
	if got := a.Lease.Share; got != (Share{all, 20}) {
		t.Fatalf("step 0: a's share %+v, want the whole limit", got)
	}
	// a reports no demand: the store moves it to a lease without burst (its answer is
	// lost), keeping the one it uses counted.
	apply(100*ms, Request{Op: OpRenew, Member: "a", Epoch: a.Epoch, InUse: a.Lease.Seq})
	// a, still on its first lease, relinquishes it and keeps one permit parked.
	apply(200*ms, Request{Op: OpRenew, Member: "a", Epoch: a.Epoch, InUse: a.Lease.Seq, Relinquish: true, Keep: 1})
	b := apply(300*ms, Request{Op: OpJoin, Member: "b", Demand: all})
	if got := b.Lease.Share.Burst; got+1 > 20 {
		t.Errorf("step 3: b's share has a burst of %d beside the permit a keeps, want at most 19", got)
	}
}
