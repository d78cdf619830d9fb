package gossip_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/gossip"
	"github.com/sluicehq/sluice/gossip/hits"
	"github.com/sluicehq/sluice/internal/testkit/classtest"
)

// TestClassesAcrossDaemons: two gossip members (real UDP and TCP on loopback), a limiter
// on each, share "api" at 10/s burst=10. A critical caller on one asks Allow five times a
// second beside a sheddable flood of eight waiters on the other: the flood's places keep
// the sheddable headroom (40% of the burst) while the critical class asks, as the other
// member's board of classes tells, so every critical Allow finds permits left while the
// flood holds the line. The key is decided at its owner (policy auto, a small limit),
// with the critical caller at the owner and with the flood there. Without classes across
// daemons the flood keeps nothing and nearly every critical Allow is refused.
func TestClassesAcrossDaemons(t *testing.T) {
	if testing.Short() {
		t.Skip("real time: not in -short")
	}
	for _, c := range []struct {
		name     string
		policy   gossip.Policy
		limit    string
		critical bool // the critical caller's member owns "api"
	}{
		{"owner/critical at the owner", gossip.Auto, "10/s burst=10", true},
		{"owner/flood at the owner", gossip.Auto, "10/s burst=10", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := pair(t, c.policy)
			crit, flood := a, b
			if owner := hits.OwnerOf("api", []string{a.Name(), b.Name()}); (owner == a.Name()) != c.critical {
				crit, flood = b, a
			}
			lim := func(be *gossip.Backend) *sluice.Limiter {
				l, err := sluice.New(sluice.MustParse(c.limit), sluice.WithBackend(be))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { l.Close() })
				return l
			}
			asked, granted, flooded := classtest.CriticalBesideFlood(lim(crit), lim(flood))
			t.Logf("critical: %d of %d Allows granted; the flood: %d permits", granted, asked, flooded)
			if granted < asked {
				t.Errorf("a critical caller beside another daemon's sheddable flood: %d of %d Allows granted, want all (the flood keeps its headroom)", granted, asked)
			}
		})
	}
}

// pair starts two members on loopback that find each other, under policy p.
func pair(t *testing.T, p gossip.Policy) (a, b *gossip.Backend) {
	t.Helper()
	mk := func(peers []string) *gossip.Backend {
		cfg := gossip.DefaultConfig()
		cfg.Bind, cfg.Peers, cfg.Policy = "127.0.0.1:0", peers, p
		be, err := gossip.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		return be
	}
	a = mk(nil)
	b = mk([]string{a.Addr()})
	for deadline := time.Now().Add(10 * time.Second); a.Members() != 2 || b.Members() != 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the two members did not find each other")
		}
	}
	time.Sleep(300 * time.Millisecond) // each hears the other's reports
	return a, b
}
