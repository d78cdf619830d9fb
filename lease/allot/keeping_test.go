package allot

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/gcra"
)

// keepStep is one decision of one permit, now or not at all, at a virtual time, keeping
// keep of the share's burst (0: Decide), and what must come of it.
type keepStep struct {
	at      int64
	keep    float64
	allowed bool
	out     Outcome
}

// runKeeping runs steps on m, a member of one limit.
func runKeeping(t *testing.T, m *Member, steps []keepStep) {
	t.Helper()
	one := []*Member{m}
	for i, s := range steps {
		var res gcra.Result
		var out Outcome
		var err error
		if s.keep > 0 {
			keep := [gcra.MaxLimits]float64{s.keep}
			res, _, out, err = DecideKeeping(one, s.at, 1, 0, &keep)
		} else {
			res, _, out, err = Decide(one, s.at, 1, 0)
		}
		if err != nil || res.Allowed != s.allowed || out != s.out {
			t.Fatalf("step %d: got allowed %v, %v, %v (%+v), want allowed %v, %v", i, res.Allowed, out, err, res, s.allowed, s.out)
		}
		if !res.Allowed && res.RetryAfter <= 0 {
			t.Fatalf("step %d: refused with RetryAfter %v", i, time.Duration(res.RetryAfter))
		}
	}
}

// TestDecideKeepingOnAShare: a decision that keeps 40% of the burst for a higher class,
// on a member holding a share of burst 10 of 10/s, is granted while it leaves 4 permits
// of the share's burst, and refused after; a decision that keeps nothing still gets those
// 4. The refusals keeping headroom do not borrow from the free capacity, though the store
// said it has saved up a whole burst: the member's own refusals there do. Both count in
// the member's demand.
func TestDecideKeepingOnAShare(t *testing.T) {
	l := lim(20, time.Second, 20) // T = 50ms
	m := partMember(t, l, Share{Rate: RateScale / 2, Burst: 10}, Reply{Pool: l.Tau, Free: Share{Rate: RateScale / 2, Burst: 10}})
	at := 2 * ms
	steps := []keepStep{}
	for range 6 {
		steps = append(steps, keepStep{at: at, keep: 0.4, allowed: true, out: Granted})
	}
	steps = append(steps, keepStep{at: at, keep: 0.4, out: Throttled}) // it would leave 3
	for range 4 {
		steps = append(steps, keepStep{at: at, allowed: true, out: Granted})
	}
	runKeeping(t, m, steps)
	if got := m.demand.asked; got != 11 {
		t.Errorf("demand asked %d, want the 11 decisions", got)
	}
	if _, _, out, _ := Decide([]*Member{m}, at, 1, 0); out != AtStore || !m.Borrowing() {
		t.Errorf("a decision keeping nothing, the share spent: %v, want a borrow (AtStore)", out)
	}
}

// TestDecideKeepingOnTooSmallAShare: a share whose burst is too small to keep a permit
// for a higher class (1 permit, keeping 40%) is decided keeping nothing: the limit as a
// whole kept the headroom, and the other members' shares hold it. A share of 5 permits
// keeps 2 (40%, rounded up).
func TestDecideKeepingOnTooSmallAShare(t *testing.T) {
	l := lim(20, time.Second, 20)
	at := 2 * ms
	runKeeping(t, partMember(t, l, Share{Rate: RateScale / 20, Burst: 1}, Reply{}), []keepStep{
		{at: at, keep: 0.4, allowed: true, out: Granted},
		{at: at, keep: 0.4, out: Throttled},
	})
	runKeeping(t, partMember(t, l, Share{Rate: RateScale / 4, Burst: 5}, Reply{}), []keepStep{
		{at: at, keep: 0.4, allowed: true, out: Granted},
		{at: at, keep: 0.4, allowed: true, out: Granted},
		{at: at, keep: 0.4, allowed: true, out: Granted},
		{at: at, keep: 0.4, out: Throttled},
		{at: at, allowed: true, out: Granted},
	})
}
