package gossip

import (
	"testing"
	"time"
)

// TestGracefulLeaveFreesTheShareAtOnce: a member that closes leaves the pool gracefully,
// and its peer counts it out at once, not after the hold it keeps for a peer that was lost
// (a crash or a partition). With a 10 s hold, the peer counts itself alone within 2 s of
// the close. (memberlist hands NotifyLeave a Node whose State field it never sets: a test
// of that field took every leave for a crash, and the share stayed held for the hold.)
func TestGracefulLeaveFreesTheShareAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("real time")
	}
	hold := func(c *Config) { c.Hold = 10 * time.Second }
	a := member(t, hold)
	b := member(t, func(c *Config) { hold(c); c.Peers = []string{a.Addr()} })
	waitFor(t, "a pair", func() bool { return a.Members() == 2 && b.Members() == 2 })
	closed := time.Now()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for a.Members() != 1 {
		if d := time.Since(closed); d > 2*time.Second {
			t.Fatalf("%v after its peer closed, a counts %d members: the leave was taken for a loss (held 10 s)", d.Round(10*time.Millisecond), a.Members())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("a alone %v after its peer closed", time.Since(closed).Round(time.Millisecond))
}
