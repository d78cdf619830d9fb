package allot

import (
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
)

// sharedMember returns a member holding a share of l (all of it) from 1ms, answered at
// 1ms.
func sharedMember(t testing.TB, l gcra.Limit) *Member {
	t.Helper()
	return partMember(t, l, Share{Rate: RateScale, Burst: l.Tau / l.T}, Reply{})
}

// partMember returns a member holding share of l from 1ms, answered at 1ms by a reply
// that says what pool says of the free capacity (its Pool and Free).
func partMember(t testing.TB, l gcra.Limit, share Share, pool Reply) *Member {
	t.Helper()
	m := NewMember("m", l, MemberConfig{RenewEvery: 250 * time.Millisecond, FailMode: backend.FailLocal}, 0)
	req, ok := m.Request(0, 0)
	if !ok {
		t.Fatal("no join")
	}
	rep := Reply{Epoch: Epoch{Incarnation: 1, N: 1}, Sent: req.Sent, Nonce: req.Nonce, TTL: int64(time.Second),
		Grace: int64(500 * time.Millisecond), Target: share, Live: 1, Version: 1, Fill: share.Burst * l.T,
		Pool: pool.Pool, Free: pool.Free}
	rep.Lease.Seq, rep.Lease.Share = 1, share
	m.Receive(ms, req.Nonce, rep, nil)
	return m
}

// TestGrantedIsAllowOne: permits granted on a member's FastShare and handed to Granted leave
// the member as AllowOne granting them would have, for evenly spaced calls: a burst that
// spends the bucket, calls at the share's rate after a refusal, calls after a pause, and
// more calls than Granted replays one by one. A refusal on the share is no fast grant
// (AllowOne counts it); a member without a share, or released, has no FastShare.
func TestGrantedIsAllowOne(t *testing.T) {
	l := lim(1000, time.Second, 20) // T = 1ms, burst 20
	if _, ok := NewMember("m", l, DefaultMemberConfig(), 0).Fast(); ok {
		t.Fatal("a member without a share has a FastShare")
	}
	slow, fast := sharedMember(t, l), sharedMember(t, l)
	for i, run := range []struct {
		start, gap int64 // the first call's time and the gap between calls
		n          int64
		refuseAt   bool // a call at the run's end is refused (AllowOne, on both)
	}{
		{start: 2 * ms, gap: 10 * time.Microsecond.Nanoseconds(), n: 20, refuseAt: true}, // the burst, then a refusal
		{start: 30 * ms, gap: ms, n: 50},                                                 // at the rate, after the refusal
		{start: 400 * ms, gap: 2 * ms, n: 7},                                             // after a pause
		{start: 420 * ms, gap: ms, n: 1},
		{start: 500 * ms, gap: 3 * ms, n: 300}, // longer than Granted replays
	} {
		fs, ok := fast.Fast()
		if !ok {
			t.Fatalf("step %d: no FastShare", i)
		}
		g := FastGrants{Tat: fs.Tat}
		now := run.start
		for k := range run.n {
			now = run.start + k*run.gap
			if got, _ := slow.AllowOne(now); !got {
				t.Fatalf("step %d: call %d at %v refused by AllowOne", i, k, time.Duration(now))
			}
			tat, got := gcra.AllowOne(g.Tat, fs.Limit, now)
			if !got || now >= fs.End {
				t.Fatalf("step %d: call %d at %v refused on the FastShare", i, k, time.Duration(now))
			}
			if g.N == 0 {
				g.First = now
			}
			g.Tat, g.N, g.Last = tat, g.N+1, now
		}
		fast.Granted(g)
		if !reflect.DeepEqual(slow, fast) {
			t.Fatalf("step %d: after %d grants\nAllowOne: %+v\nGranted:  %+v", i, run.n, *slow, *fast)
		}
		if run.refuseAt {
			now += run.gap
			fs, _ := fast.Fast()
			if _, got := gcra.AllowOne(fs.Tat, fs.Limit, now); got {
				t.Fatalf("step %d: the FastShare grants past the burst", i)
			}
			a, _ := slow.AllowOne(now)
			b, _ := fast.AllowOne(now)
			if a || b || !reflect.DeepEqual(slow, fast) {
				t.Fatalf("step %d: refusals differ: %v %v\n%+v\n%+v", i, a, b, *slow, *fast)
			}
		}
	}
	fast.Release(sec)
	if _, ok := fast.Fast(); ok {
		t.Fatal("a released member has a FastShare")
	}
}
