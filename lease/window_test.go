package lease

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/lease/allot"
)

// TestWindowedQuotaAcrossMembers: three members with more demand than a windowed quota of
// 300 tokens per 10 s share it through the store: in every window (on the store's clock,
// Unix-aligned) no more than 300 are granted, and at least 99% of them are; a member that
// closes gives back the tokens it holds: the store then counts the tokens used and those
// the others hold.
func TestWindowedQuotaAcrossMembers(t *testing.T) {
	w := int64(10 * time.Second)
	l := gcra.Limit{T: w / 300, Tau: 300 * (w / 300), Window: w}
	c := newCluster(t, l, 3, DefaultConfig())
	c.clk.Set(int64(time.Hour) + 5*int64(time.Second)) // half way into a window
	c.run(40*time.Second, []int{0, 1, 2}, 3)
	t.Logf("%d calls cut waiting for a draw on the virtual clock", c.waitedOnClock)
	origin := clock.Epoch.UnixNano() // the store's clock is Unix time: Epoch + Nanotime
	per := map[int64]int64{}
	for _, at := range c.permits {
		per[l.WindowEnd(origin+at)]++
	}
	if len(per) != 5 {
		t.Fatalf("permits in %d windows, want 5 (a half, three whole, a half)", len(per))
	}
	for end, n := range per {
		t.Logf("window ending %v: %d granted", time.Unix(0, end).UTC().Format("15:04:05"), n)
		if n > 300 {
			t.Errorf("window ending %v: %d granted of 300", time.Unix(0, end).UTC(), n)
		}
	}
	whole := 0
	for end, n := range per {
		if start := end - w; start >= origin+int64(time.Hour)+5*int64(time.Second) && end <= c.clk.Now().UnixNano() {
			whole++
			if n < 297 {
				t.Errorf("window ending %v: %d granted of 300, want at least 99%%", time.Unix(0, end).UTC(), n)
			}
		}
	}
	if whole != 3 {
		t.Errorf("%d whole windows, want 3", whole)
	}
	// A member that closes gives its tokens back: the record then counts only the tokens
	// the members used or still hold.
	if err := c.members[0].Close(); err != nil {
		t.Fatal(err)
	}
	snap, err := c.store.Load(bg, []string{RecordID("api", l)})
	if err != nil {
		t.Fatal(err)
	}
	st, err := allot.UnmarshalState(snap.Records[0].Data)
	if err != nil {
		t.Fatal(err)
	}
	var held int64
	for _, m := range c.members[1:] {
		for _, st := range m.Leases() {
			held += st.Tokens
		}
	}
	if used := per[st.WindowEnd]; st.Granted != used+held {
		t.Errorf("after a close: %d handed out, %d used, %d held by the others: want what the closed member held given back", st.Granted, used, held)
	}
}

// TestRampFollowedByThePool: three busy members share 100/s burst 10 ramping from 10/s
// over 10 s. The allocation ramps the capacity it shares, so the pool's admitted rate
// follows the ramp: never above it (permits in any second at most the ramp's over that
// second, plus its burst), and within one renewal interval of it (at least 90% of what
// the ramp allowed a renewal interval earlier). A member that joins 4 s in finds the ramp
// where it is, not at its start: the ramp is the record's, as it is for a member that
// restarts.
func TestRampFollowedByThePool(t *testing.T) {
	l := lim(100, time.Second, 10)
	l.Ramp = gcra.Ramp{T0: 10 * l.T, Over: int64(10 * time.Second)}
	renew := int64(100 * time.Millisecond) // the cluster's renewal interval
	c := newCluster(t, l, 2, DefaultConfig())
	start := c.clk.Nanotime()
	c.run(4*time.Second, []int{0, 1}, 2)
	c.add() // joins 4 s into the ramp
	c.run(10*time.Second, []int{0, 1, 2}, 3)
	// rate is the ramp's rate at d into it, permits a second; area its permits over [a, b).
	rate := func(d int64) float64 {
		if d >= l.Ramp.Over {
			return 100
		}
		return 10 + 90*float64(max(d, 0))/float64(l.Ramp.Over)
	}
	area := func(a, b int64) float64 {
		sum := 0.0
		for x := a; x < b; x += int64(time.Millisecond) {
			sum += rate(x) / 1000
		}
		return sum
	}
	for a := int64(0); a+int64(time.Second) <= 14*int64(time.Second); a += int64(500 * time.Millisecond) {
		b := a + int64(time.Second)
		n := 0
		for _, at := range c.permits {
			if d := at - start; d >= a && d < b {
				n++
			}
		}
		hi := area(a, b) + 10
		lo := 0.9 * area(a-renew, b-renew)
		t.Logf("[%v, %v): %d permits; the ramp allows %.0f, a renewal earlier %.0f", time.Duration(a), time.Duration(b), n, area(a, b), area(a-renew, b-renew))
		if float64(n) > hi {
			t.Errorf("[%v, %v): %d permits, above the ramp's %.0f and its burst", time.Duration(a), time.Duration(b), n, area(a, b))
		}
		if a >= int64(time.Second) && float64(n) < lo {
			t.Errorf("[%v, %v): %d permits, below 90%% of the ramp a renewal earlier (%.0f)", time.Duration(a), time.Duration(b), n, area(a-renew, b-renew))
		}
	}
}

// TestWindowedRecordLostWhileHeld: a store that restarts empty in the middle of a window,
// while a member holds tokens drawn from it, makes the record again fenced; a newcomer
// gets nothing in the fence, and the member's renewal (it saw the lost record) spends the
// window: the window's count is never granted twice. The next window is whole.
func TestWindowedRecordLostWhileHeld(t *testing.T) {
	w := int64(10 * time.Second)
	l := gcra.Limit{T: w / 600, Tau: 600 * (w / 600), Window: w}
	c := newCluster(t, l, 2, DefaultConfig())
	c.clk.Set(int64(time.Hour))       // a window's start
	c.run(4*time.Second, []int{0}, 2) // member 0 alone, drawing a few tokens at a time
	before := len(c.permits)
	c.store.Restart()
	c.run(5*time.Second, []int{0, 1}, 2)
	in := len(c.permits)
	c.run(2*time.Second, []int{0, 1}, 2) // into the next window
	t.Logf("%d granted before the restart, %d in the window in all, %d in the next second", before, in, len(c.permits)-in)
	if in > 600 {
		t.Errorf("%d granted in a window of 600 across a store restart", in)
	}
	if len(c.permits) == in {
		t.Error("nothing granted in the next window")
	}
}
