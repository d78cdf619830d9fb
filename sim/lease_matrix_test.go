package sim

import (
	"context"
	"testing"
)

// runMatrixCell runs one shape of the shipped matrix under mode, beside the ideal, and
// returns its cell.
func runMatrixCell(t *testing.T, shape, mode string) MatrixCell {
	t.Helper()
	m, err := ShippedMatrix()
	if err != nil {
		t.Fatal(err)
	}
	s, ok := m.Shape(shape)
	if !ok {
		t.Fatalf("no shape %q in the shipped matrix", shape)
	}
	r, err := RunMatrix(context.Background(), m, []MatrixShape{s}, []string{mode}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range r.Cells {
		if c.Mode == mode {
			return c
		}
	}
	t.Fatalf("no %s cell for %s", mode, shape)
	return MatrixCell{}
}

// TestLeaseMatrixCells: lease cells of the quick matrix that once failed pass.
//
// one-a-second/four-unequal/poisson-50/limit-change: 1/s halves to 1/2s, where demand
// equals the limit and the limit is decided at the store (a burst of one among four
// members). A member's goroutines each took their own place in the store's line, and the
// permit its turn brought went to whichever of them asked first, not to the request that
// had waited longest: p99 wait 10.2 s over the ideal's (the bound is 1.45 s), where the
// library's waiting room serves a key's waiters in arrival order.
//
// two-burst-two/four-unequal/backlog/churn: 2/s burst=2 decided at the store, members of
// 1, 2, 4 and 8 goroutines with a backlog. Each goroutine booked its own permit ahead at
// the store, so the store served the pool by goroutine, not by member: Jain's index over
// the members 0.943 (the bound 0.958), where the strict mode's processes, holding a few
// places in the line each, get 1.000.
//
// one-every-6s/three-sizes-24/poisson-85/churn: 24 members on 1/6s, idle between Poisson
// requests. The record went back to shares whenever fewer than two wanted it, and the
// next member to want it waited 1.25 s for that share to end
// (TestStoreDecidedLimitStaysWhileMembersComeAndGo); with the members' few places in the
// line, the p99 wait rose past its bound (21.5 s over the ideal's, bound 18 s).
//
// hundred-b20/classes/poisson-120/none: three members of Poisson demand at about their
// shares beside four that want more, over the limit. Each burst held the small ones back,
// so they counted as saturated and asked for all they could get whenever the limit was
// all handed out, and held 14% more than they used while the others waited: 0.944 of the
// ideal served (want 0.95). A member whose share went unused within four renewals is
// bursty, not saturated (unusedWindows).
//
// ten-a-second/four-unequal/poisson-85/none: 10/s among four members of unequal Poisson
// demand at 85% of it. Shares of 2.5 permits a lease each: the first arrivals of a member
// spent its share and the rest waited for its renewal, while the others' shares stood
// unused, p99 wait 3.9 s over the ideal's (bound 1 s). Demand under the limit on shares
// that small is decided at the store, whose one line pools them.
func TestLeaseMatrixCells(t *testing.T) {
	for _, shape := range []string{
		"one-a-second/four-unequal/poisson-50/limit-change",
		"two-burst-two/four-unequal/backlog/churn",
		"one-every-6s/three-sizes-24/poisson-85/churn",
		"hundred-b20/classes/poisson-120/none",
		"ten-a-second/four-unequal/poisson-85/none",
	} {
		t.Run(shape, func(t *testing.T) {
			c := runMatrixCell(t, shape, "lease")
			t.Logf("served %.3f, Jain %.3f, extra p99 wait %.0f ms (ideal's p99 %.0f ms), violations %d",
				c.Served, c.Jain, c.ExtraP99WaitMs, c.IdealP99WaitMs, c.Violations)
			if !c.Pass {
				t.Errorf("lease on %s: %s", shape, c.Why)
			}
		})
	}
}

// TestLeaseStoreLoadAfterAnOutage: after a store outage of 30 s under load (20 members,
// Poisson 4/s each, on 100/s burst=20), the lease members go back to a handful of store
// operations a second each. A place kept in the store's line for every member served at
// the store once made them ask again and again after the outage: 3,158,354 operations in
// the run, 30,000 a second for two minutes, against 93,745.
func TestLeaseStoreLoadAfterAnOutage(t *testing.T) {
	sc, err := Load("../scenarios/store-outage.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(sc, Options{Modes: []string{"lease"}})
	if err != nil {
		t.Fatal(err)
	}
	m := r.Modes[0]
	perMemberSec := float64(m.StoreOps) / 20 / sc.Duration.D().Seconds()
	t.Logf("%d store operations, %.1f a member a second", m.StoreOps, perMemberSec)
	if perMemberSec > 30 {
		t.Errorf("%d store operations (%.0f a member a second): the members hammer the store", m.StoreOps, perMemberSec)
	}
}
