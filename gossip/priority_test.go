package gossip_test

import (
	"bufio"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/gossip"
	"github.com/sluicehq/sluice/gossip/hits"
	"github.com/sluicehq/sluice/internal/testkit/classtest"
	"github.com/sluicehq/sluice/internal/testkit/daemontest"
	"github.com/sluicehq/sluice/server"
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

// TestLinePrioritiesAcrossDaemons: the check of issue [24] across two daemons (`sluice
// serve --backend gossip`, real UDP on loopback, the line protocol over TCP), each with the
// rule api=50/s burst=10: a client of one asks `~c=critical api` ten times a second beside
// three connections to the other flooding `~c=sheddable api`, for 5 s. The flood's
// decisions (which do not wait) keep 40% of the burst while the critical class asks at the
// other daemon (the key's board of classes at its owner), so every critical request is
// granted; before, the flood took nearly all. With the critical client at the key's owner
// and at the other daemon.
func TestLinePrioritiesAcrossDaemons(t *testing.T) {
	if testing.Short() {
		t.Skip("real time: not in -short")
	}
	for _, atOwner := range []bool{true, false} {
		t.Run(fmt.Sprintf("critical at the owner %v", atOwner), func(t *testing.T) {
			a, b := pair(t, gossip.Auto)
			if owner := hits.OwnerOf("api", []string{a.Name(), b.Name()}); (owner == a.Name()) != atOwner {
				a, b = b, a
			}
			crit, flood := daemon(t, a, "api=50/s burst=10"), daemon(t, b, "api=50/s burst=10")
			var stop atomic.Bool
			var wg sync.WaitGroup
			defer func() { stop.Store(true); wg.Wait() }()
			var flooded atomic.Int64
			for range 3 {
				c := lineConn(t, flood)
				wg.Go(func() {
					for !stop.Load() {
						if c.ask(t, "~c=sheddable api") {
							flooded.Add(1)
						}
					}
				})
			}
			// The critical client from the start; its answers count once the flood has held
			// the key for a second (a class is heeded from its first ask on: the flood's
			// decisions before it keep nothing for it).
			c := lineConn(t, crit)
			asked, granted := 0, 0
			for i := range 50 {
				ok := c.ask(t, "~c=critical api")
				if i >= 10 {
					asked++
					if ok {
						granted++
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Logf("critical: %d of %d granted; the flood: %d permits", granted, asked, flooded.Load())
			if granted < asked {
				t.Errorf("a critical client beside another daemon's sheddable flood: %d of %d granted, want all", granted, asked)
			}
			if flooded.Load() < 100 {
				t.Errorf("the flood had %d permits in about 5 s of 50/s, want at least 100 (it keeps 40%% of the burst, not of the rate)", flooded.Load())
			}
		})
	}
}

// daemon starts a daemon on the gossip member be, with one rule and line and HTTP
// listeners on loopback, shut down when the test ends.
func daemon(t *testing.T, be *gossip.Backend, rule string) *server.Server {
	t.Helper()
	sc := server.DefaultConfig()
	sc.Backend, sc.ListenLine, sc.ListenHTTP = "gossip", "127.0.0.1:0", "127.0.0.1:0"
	sc.Rules = daemontest.Rules(t, rule)
	return daemontest.Start(t, sc, server.WithBackend(be))
}

// line is a line protocol client's connection.
type line struct {
	c net.Conn
	r *bufio.Reader
}

func lineConn(t *testing.T, s *server.Server) *line {
	t.Helper()
	c, err := net.Dial("tcp", s.LineAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &line{c: c, r: bufio.NewReader(c)}
}

// ask sends one query and reports whether the answer is OK (false on NO or an error).
func (l *line) ask(t *testing.T, q string) bool {
	if _, err := fmt.Fprintf(l.c, "%s\n", q); err != nil {
		return false
	}
	a, err := l.r.ReadString('\n')
	return err == nil && a == "OK\n"
}
