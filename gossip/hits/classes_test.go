package hits

import (
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/priority"
)

// TestClassesInShares: two daemons share 100/s burst 20 by shares. One is asked 70/s by
// critical callers, the other 200/s by sheddable ones. Their reports carry demand by
// class, and the shares serve the critical demand first, where max-min fairness by demand
// alone gave the critical daemon half the limit (0.71 of its asks at most).
//
// Callers that do not wait: the critical daemon's share is its demand, and it is granted
// 0.85 of its Poisson asks (a bucket at exactly their mean rate refuses their bursts);
// the pool keeps hits.Bound. Callers that wait up to a second: it is granted all it asks;
// the sheddable daemon gets what the critical one's demand leaves, counted at the most of
// its last reports (docs/gossip.md, "Classes"), and the pool's excess is that of
// reservations whose share shrinks before they fall due (a known limit), logged.
func TestClassesInShares(t *testing.T) {
	for step, s := range []struct {
		maxDelay time.Duration
		minCrit  float64
		bound    bool // the pool must keep hits.Bound
	}{
		{0, 0.8, true},
		{time.Second, 0.99, false},
	} {
		cfg := DefaultConfig()
		cfg.Policy = Shares
		lim := []gcra.Limit{{T: int64(10 * time.Millisecond), Tau: int64(200 * time.Millisecond)}}
		c := newCluster(t, 2, lim, cfg, 7)
		const from, to = int64(5 * time.Second), int64(25 * time.Second)
		var asked, granted [2]int
		classes := [2]priority.Class{priority.Critical, priority.Sheddable}
		rates := [2]float64{70, 200}
		c.arrive = func() {
			for i, n := range c.nodes {
				for k := poisson(c.rng, rates[i]/1000); k > 0; k-- {
					var res gcra.Result
					var tk gcra.Ticket
					if err := n.DecideClassTo(&res, &tk, "api", lim, c.now, 1, int64(s.maxDelay), classes[i]); err != nil {
						t.Fatal(err)
					}
					if res.Allowed {
						c.grants = append(c.grants, c.now+res.Delay)
					}
					if c.now >= from && c.now < to {
						asked[i]++
						if res.Allowed {
							granted[i]++
						}
					}
				}
			}
		}
		c.run(to, 0)
		slices.Sort(c.grants)
		crit, shed := float64(granted[0])/float64(asked[0]), float64(granted[1])/float64(asked[1])
		ex := excess(c.grants, 0, to, 20, 100)
		t.Logf("step %d: critical %d of %d (%.3f), sheddable %d of %d (%.3f), excess %.1f", step, granted[0], asked[0], crit, granted[1], asked[1], shed, ex)
		if crit < s.minCrit {
			t.Errorf("step %d: the critical daemon was granted %.3f of what it asked, want at least %.2f", step, crit, s.minCrit)
		}
		if b := Bound(BoundParams{Nodes: 2, Burst: 20, Rate: 100}); s.bound && ex > b {
			t.Errorf("step %d: over-admission %.1f, beyond the bound %.0f", step, ex, b)
		}
	}
}
