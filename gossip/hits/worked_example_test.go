package hits

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/gcra"
)

const sec = int64(time.Second)

// TestDThrottleWorkedExample replays the DThrottle design's worked example: two daemons, burst
// 10, 1 permit per second, an exchange every 5 s, a client whose 17 requests at t=0.1 a
// load balancer splits 9 and 8. The design as written (policy whole) grants all 17 where
// one bucket allows 10, refuses at A at t=0.2 after one more, and after the exchange holds
// both daemons at -3 until t=9.1, as the example's table says. Sluice's policy grants 10:
// each daemon spends its share of the bucket, within the documented bound.
func TestDThrottleWorkedExample(t *testing.T) {
	lim := []gcra.Limit{{T: sec, Tau: 10 * sec}}
	cfg := DefaultConfig()
	cfg.Interval, cfg.LostAfter, cfg.Hold = 5*time.Second, 20*time.Second, 20*time.Second
	run := func(p Policy) (granted [6]int, remaining [2]int64) {
		cfg.Policy = p
		a, _ := New("A", 1, cfg, 0)
		b, _ := New("B", 1, cfg, 0)
		a.Join("B", 0)
		b.Join("A", 0)
		ask := func(n *Node, at int64, k int) (ok int) {
			for range k {
				if res, _, err := n.Decide("C", lim, at, 1, 0); err != nil {
					t.Fatal(err)
				} else if res.Allowed {
					ok++
				}
			}
			return ok
		}
		granted[0] = ask(a, sec/10, 9) + ask(b, sec/10, 8)
		granted[1] = ask(a, 2*sec/10, 2)
		ra, rb := a.Report(5*sec), b.Report(5*sec)
		a.Receive(5*sec+sec/20, &rb)
		b.Receive(5*sec+sec/20, &ra)
		granted[2] = ask(a, 52*sec/10, 1) + ask(b, 52*sec/10, 1)
		granted[3] = ask(a, 9*sec, 1) + ask(b, 9*sec, 1)
		granted[4] = ask(a, 92*sec/10, 1) + ask(b, 92*sec/10, 1)
		res, _, _ := a.Decide("C", lim, 52*sec/10, 0, 0)
		remaining[0] = res.Remaining
		return granted, remaining
	}
	whole, _ := run(Whole)
	for i, want := range []int{17, 1, 0, 0, 2} {
		if whole[i] != want {
			t.Errorf("whole, step %d: granted %d, want %d (the example's table)", i, whole[i], want)
		}
	}
	shares, _ := run(Shares)
	if shares[0] != 10 || shares[1] != 0 {
		t.Errorf("shares: granted %d at t=0.1 and %d at t=0.2; want 10 and 0 (each daemon spends half the burst)", shares[0], shares[1])
	}
	// Over the first 0.2 s one bucket allows 10 + 0.2 = 10.2 permits: the bound allows
	// one more per daemon whose share holds less than a permit of burst (none here).
	if got := shares[0] + shares[1]; float64(got) > 10.2+Bound(BoundParams{Nodes: 2, Burst: 10}) {
		t.Errorf("shares: %d granted in 0.2 s, over the bound", got)
	}
}

// TestEqualPolicy: with the equal policy each node takes 1/N of the limit whatever the
// demand, N the pool it counts: a lost peer still counts for the hold, then not.
func TestEqualPolicy(t *testing.T) {
	lim := []gcra.Limit{{T: sec / 100, Tau: 30 * sec / 100}} // 100/s burst 30
	cfg := DefaultConfig()
	cfg.Policy = Equal
	n, _ := New("a", 1, cfg, 0)
	n.Join("b", 0)
	n.Join("c", 0)
	granted := func(at int64, k int) (ok int) {
		for range k {
			if res, _, _ := n.Decide("api", lim, at, 1, 0); res.Allowed {
				ok++
			}
		}
		return ok
	}
	for i, s := range []struct {
		at        int64
		ask, want int
		dead      bool
	}{
		{at: 0, ask: 20, want: 10},             // a third of the burst
		{at: sec, ask: 100, want: 10},          // refilled to its third of the burst, no more
		{at: sec + sec/10, ask: 0, dead: true}, // b and c fall silent (dead to the membership)
		{at: 2 * sec, ask: 100, want: 10},      // held: still a third
		{at: 5 * sec, ask: 100, want: 30},      // the hold is over: the whole burst
	} {
		if s.dead {
			n.Leave("b", s.at, false)
			n.Leave("c", s.at, false)
		}
		n.Report(s.at)
		if got := granted(s.at, s.ask); s.ask > 0 && got != s.want {
			t.Errorf("step %d: granted %d, want %d (members %d)", i, got, s.want, n.Members())
		}
	}
}
