package gossip

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// TestRejoinAfterPartition: a member cut from both its peers until they declare it dead
// and it drops them from its pool counts both again soon after the heal, as they count
// it, and the counts hold. At the heal the cut member's memberlist still holds its peers
// suspect, and only rejoin's exchange revives them (docs/gossip.md, "Partitions"). The
// bound is loose (real time, a shared machine): 3 s, where memberlist's failure detection
// here takes about 2 s. The counts must then hold for 8 s, past the cut member's longest
// suspicion time-out.
func TestRejoinAfterPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("real time")
	}
	var cs [3]cutter
	wrap := func(i int) func(*Config) {
		return func(c *Config) {
			c.WrapTransport = func(nt memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
				cs[i].NodeAwareTransport = nt
				return &cs[i]
			}
		}
	}
	a := member(t, wrap(0))
	b := member(t, func(c *Config) { wrap(1)(c); c.Peers = []string{a.Addr()} })
	c := member(t, func(c *Config) { wrap(2)(c); c.Peers = []string{a.Addr(), b.Addr()} })
	ms := []*Backend{a, b, c}
	const cutFor = 4300 * time.Millisecond // as the robustness suite's partition tests
	// show is what each member counts: memberlist's live members and the pool's size.
	show := func() string {
		var s []string
		for i, m := range ms {
			s = append(s, fmt.Sprintf("%c %d/%d", 'a'+i, m.ml.NumMembers(), m.Members()))
		}
		return strings.Join(s, ", ")
	}
	all3 := func() bool {
		for _, m := range ms {
			if m.ml.NumMembers() != 3 || m.Members() != 3 {
				return false
			}
		}
		return true
	}
	waitFor(t, "three members", all3)

	cut := time.Now()
	cs[2].set([]string{a.Addr(), b.Addr()}, true)
	cs[0].set([]string{c.Addr()}, true)
	cs[1].set([]string{c.Addr()}, true)
	// a and b declare c dead (about 2 s); c loses their reports and drops them after the
	// hold (2.5 s). Before rejoin pushed and pulled while the counts disagree, a cut this
	// long left c counting itself alone for more than 3 s after the heal (its memberlist
	// still held a and b suspect, theirs held c dead, only their pools counted c).
	waitFor(t, "c alone in its pool, a and b a pair", func() bool {
		return c.Members() == 1 && a.ml.NumMembers() == 2 && a.Members() == 2 && b.ml.NumMembers() == 2 && b.Members() == 2
	})
	time.Sleep(time.Until(cut.Add(cutFor)))
	t.Logf("cut for %v: %s", time.Since(cut).Round(10*time.Millisecond), show())

	healed := time.Now()
	for i := range cs {
		cs[i].set([]string{a.Addr(), b.Addr(), c.Addr()}, false)
	}
	for !all3() {
		if d := time.Since(healed); d > 3*time.Second {
			t.Fatalf("%v after the heal: %s (members/pool); want 3/3 each within 3 s", d.Round(10*time.Millisecond), show())
		}
		time.Sleep(10 * time.Millisecond)
	}
	back := time.Since(healed)
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if !all3() {
			t.Fatalf("%v after the heal: %s (members/pool); want 3/3 each from %v on", time.Since(healed).Round(10*time.Millisecond), show(), back.Round(10*time.Millisecond))
		}
	}
	t.Logf("three members again %v after the heal, and still 8 s later", back.Round(10*time.Millisecond))
}
