package allot

import (
	"fmt"
	"testing"
	"time"
)

// TestCriticalReserveIsTheStores: three members whose callers are all critical ask 10% of
// 100/s burst 20 each, beside four that want all they can get (a sheddable flood), so the
// demands exceed the limit and the fair policy keeps no reserve for everyone. The store
// keeps one for the critical callers instead, and hands it out itself: each critical
// member's share holds three fifths of its critical demand (6%), nine tenths of the
// critical demand (27%) stay free, and the pool that rate fills is the critical members' to
// borrow from; a lower-class member is told, and may borrow, only what the pool holds above
// a floor (two fifths of the free burst), and no rate (the reserve's rate is not its).
func TestCriticalReserveIsTheStores(t *testing.T) {
	c := cfg(Fair)
	c.JoinWindow = 0
	s, _ := NewState(lim(100, time.Second, 20), 1, 0, 0, c)
	apply := checkedApply(t, s, c)
	pool := []classedMember{
		{"b1", all, 0}, {"b2", all, 0}, {"b3", all, 0}, {"b4", all, 0},
		{"ui1", all / 10, all / 10}, {"ui2", all / 10, all / 10}, {"ui3", all / 10, all / 10},
	}
	reps, at := joinAndRenew(apply, pool, 4, 200*ms)
	at += ms
	var sum int64
	for _, x := range pool {
		sum += reps[x.id].Lease.Share.Rate
	}
	for i, x := range pool {
		got, want := reps[x.id].Lease.Share.Rate, all*55/100/4 // the rest of the limit, by member
		if x.critical > 0 {
			want = x.critical * 3 / 5
		}
		if got != want {
			t.Errorf("step %d: %s's share: rate %d, want %d", i, x.id, got, want)
		}
	}
	if want := all - all*27/100; sum != want {
		t.Errorf("the shares' rates sum to %d, want %d (the critical reserve, %d, free)", sum, want, all*27/100)
	}
	free := reps["ui3"].Free
	floor := (free.Burst*2 + 4) / 5 // two fifths of the free burst, in whole permits, rounded up
	if free.Rate != all*27/100 || floor < 1 {
		t.Fatalf("a critical member is told the free capacity %+v, want the reserve's rate %d and a burst to pool", free, all*27/100)
	}
	if got := reps["b4"].Free; got.Rate != 0 || got.Burst != free.Burst-floor {
		t.Errorf("a lower-class member is told the free capacity %+v, want no rate and the burst above the floor (%d of %d)", got, free.Burst-floor, free.Burst)
	}
	// The pool fills to the free burst; a lower-class member borrows it down to the floor,
	// a critical one the rest.
	at += 500 * ms
	borrow := func(id string) Reply {
		r := reps[id]
		return apply(at, Request{Op: OpTake, Member: id, Epoch: r.Epoch, N: 1, Borrow: true})
	}
	steps := []struct {
		id    string
		times int64
		taken bool
	}{
		{"b1", free.Burst - floor, true},
		{"b2", 1, false},
		{"ui1", floor, true},
		{"ui2", 1, false},
	}
	for i, st := range steps {
		for k := range st.times {
			if got := borrow(st.id); got.Taken != st.taken {
				t.Errorf("step %d: %s's borrow %d of %d: taken %v, want %v (pool %d permits)", i, st.id, k+1, st.times, got.Taken, st.taken, s.Pool/s.Limit.T)
			}
		}
	}
}

// TestNoCriticalReserveOnACrowdedLimit: past sixteen live members the lease backend relays
// the renewals and its members do not borrow, so the store keeps no reserve for critical
// callers there: the critical member's share holds all its critical demand, as before.
func TestNoCriticalReserveOnACrowdedLimit(t *testing.T) {
	c := cfg(Fair)
	c.JoinWindow = 0
	for _, n := range []int{16, 17} {
		s, _ := NewState(lim(1000, time.Second, 200), 1, 0, 0, c)
		apply := checkedApply(t, s, c)
		reps := map[string]Reply{}
		ids := []string{"ui"}
		for k := 1; k < n; k++ {
			ids = append(ids, fmt.Sprintf("b%02d", k))
		}
		req := func(id string) Request {
			if id == "ui" {
				return Request{Demand: all / 20, Critical: all / 20}
			}
			return Request{Demand: all}
		}
		at := int64(0)
		for _, id := range ids {
			r := req(id)
			r.Op, r.Member = OpJoin, id
			reps[id] = apply(at, r)
		}
		for range 4 {
			at += 200 * ms
			for _, id := range ids {
				r := req(id)
				r.Op, r.Member, r.Epoch, r.InUse = OpRenew, id, reps[id].Epoch, reps[id].Lease.Seq
				reps[id] = apply(at, r)
			}
		}
		got, kept := reps["ui"].Lease.Share.Rate, reps["ui"].Free.Rate
		// 50/s of 1000/s: it borrows 16/s of it (the most), and nine fourths of that are kept.
		want, wantKept := all/20-all*16/1000, all*36/1000
		if n > 16 {
			want, wantKept = all/20, 0
		}
		if got != want || kept != wantKept {
			t.Errorf("%d members: the critical member's share rate %d and the reserve %d, want %d and %d", n, got, kept, want, wantKept)
		}
	}
}
