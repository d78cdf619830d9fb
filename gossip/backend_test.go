package gossip

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/backendtest"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/gossip/hits"
	"github.com/sluicehq/sluice/internal/testkit/poll"
)

const sec = int64(time.Second)

// member starts a member on a free loopback port.
func member(t *testing.T, mod func(*Config)) *Backend {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Bind = "127.0.0.1:0"
	if mod != nil {
		mod(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// waitFor polls cond (real time, the membership's own) for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, what, 10*time.Second, 20*time.Millisecond, cond)
}

// TestConformance: a member alone decides exactly as one bucket (its share is the whole
// limit), on the virtual clock.
func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T, clk *clock.Virtual) backend.Backend {
		return member(t, func(c *Config) { c.Clock = clk })
	})
}

// TestThreeMembersShareALimit: three members on loopback (real UDP and TCP) find each
// other from a seed list, and share 100/s burst 10 under load on all three. Safety is
// judged from the decisions' timestamps; utilization loosely (the machine is shared).
func TestThreeMembersShareALimit(t *testing.T) {
	if testing.Short() {
		t.Skip("real time")
	}
	a := member(t, nil)
	b := member(t, func(c *Config) { c.Peers = []string{a.Addr()} })
	c := member(t, func(c *Config) { c.Peers = []string{b.Addr()} })
	ms := []*Backend{a, b, c}
	waitFor(t, "three members", func() bool {
		for _, m := range ms {
			if m.ml.NumMembers() != 3 {
				return false
			}
		}
		return true
	})
	lim := []gcra.Limit{{T: sec / 100, Tau: 10 * sec / 100}}
	const run = 3 * time.Second
	var mu sync.Mutex
	var grants []int64
	var wg sync.WaitGroup
	start := time.Now()
	for _, m := range ms {
		wg.Go(func() {
			for time.Since(start) < run {
				g, err := m.Decide(context.Background(), "api", backend.Request{Limits: lim, N: 1})
				if err != nil {
					t.Error(err)
					return
				}
				if g.Allowed {
					mu.Lock()
					grants = append(grants, time.Now().UnixNano())
					mu.Unlock()
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	wg.Wait()
	slices.Sort(grants)
	e := excess(grants, 10, 100)
	util := float64(len(grants)) / (10 + 100*run.Seconds())
	bound := hits.Bound(hits.BoundParams{Nodes: 3, Burst: 10, Rate: 100})
	t.Logf("three members: %d granted in %v, excess %.1f (bound %.0f), utilization %.3f", len(grants), run, e, bound, util)
	// A report later than an interval (a loaded machine) can let shares overlap for an
	// interval: allow one interval's rate on top of the bound.
	if e > bound+100*DefaultConfig().Interval.Seconds() {
		t.Errorf("excess %.1f permits, want within %.0f", e, bound)
	}
	// Liveness only, loosely: about 0.95 on an idle machine, 0.47 once with two make test
	// runs at once, where the members' reports come late and each holds back more.
	if util < 0.3 {
		t.Errorf("utilization %.3f, want at least 0.3 (loose: real time)", util)
	}
	// Every member counted the others' hits.
	var local, remote float64
	for _, m := range ms {
		local += value(m, "sluice_gossip_local_hits_total")
		remote += value(m, "sluice_gossip_remote_hits_total")
	}
	if remote < local {
		t.Logf("remote %v < 2 × local %v: reports in flight at the end", remote, 2*local)
	}
	if remote == 0 {
		t.Errorf("no member heard of the others' hits")
	}
}

// value returns the first series of m's metric name.
func value(m *Backend, name string) float64 {
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name {
			x := mf.GetMetric()[0]
			if g := x.GetGauge(); g != nil {
				return g.GetValue()
			}
			return x.GetCounter().GetValue()
		}
	}
	return -1
}

// excess is the most grants in any window beyond burst + rate × its length.
func excess(grants []int64, burst int64, rate float64) float64 {
	best, prefix := -1e18, -1e18
	for j, tj := range grants {
		prefix = max(prefix, rate*float64(tj)/1e9-float64(j))
		best = max(best, float64(j)-rate*float64(tj)/1e9+prefix)
	}
	return best + 1 - float64(burst)
}

// TestKeyKeepsOutsiders: with a shared key, a member with another key cannot join, and a
// forged report sent in clear to a member's port charges nothing.
func TestKeyKeepsOutsiders(t *testing.T) {
	k1 := []byte("0123456789abcdef")
	a := member(t, func(c *Config) { c.Key = k1 })
	b := member(t, func(c *Config) { c.Key = []byte("fedcba9876543210"); c.Peers = []string{a.Addr()} })
	time.Sleep(300 * time.Millisecond)
	if a.ml.NumMembers() != 1 || b.ml.NumMembers() != 1 {
		t.Fatalf("members with different keys joined: %d, %d", a.ml.NumMembers(), b.ml.NumMembers())
	}
	lim := []gcra.Limit{{T: sec, Tau: 5 * sec}}
	forged, _ := hits.Encode(&hits.Report{From: "intruder", Inc: 1, Entries: []hits.Entry{{Tag: "api", Gen: 1, Hits: 1000, Recent: 1000}}}, packetMax)
	conn, err := net.Dial("udp", a.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for range 5 {
		conn.Write(append([]byte{8}, forged[0]...)) // memberlist's user message, in clear
	}
	time.Sleep(200 * time.Millisecond)
	g, err := a.Decide(context.Background(), "api", backend.Request{Limits: lim, N: 1})
	if err != nil || !g.Allowed || g.Remaining != 4 {
		t.Fatalf("after a forged report: %+v %v, want allowed with 4 remaining", g.Result, err)
	}
}

// TestMalformedIsCounted: without a key, a user message that is not a report is dropped
// and counted.
func TestMalformedIsCounted(t *testing.T) {
	a := member(t, nil)
	conn, err := net.Dial("udp", a.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte{8, 7, 7, 7})
	waitFor(t, "a malformed message counted", func() bool {
		return value(a, "sluice_gossip_malformed_total") == 1
	})
}

func TestConfigValidate(t *testing.T) {
	for i, mod := range []func(*Config){
		func(c *Config) { c.Bind = "nope" },
		func(c *Config) { c.Peers = []string{"host-without-port"} },
		func(c *Config) { c.Key = []byte("short") },
		func(c *Config) { c.Interval = 0 },
		func(c *Config) { c.Hold = -1 },
	} {
		c := DefaultConfig()
		mod(&c)
		if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), "sluice: gossip") {
			t.Errorf("step %d: got %v, want an error naming the setting", i, err)
		}
	}
}

func TestParseKey(t *testing.T) {
	raw := []byte("0123456789abcdef0123456789abcde!")
	for i, in := range []string{string(raw), "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZSE=\n", "3031323334353637383961626364656630313233343536373839616263646521"} {
		k, err := parseKey([]byte(in))
		if err != nil || string(k) != string(raw) {
			t.Errorf("step %d: got %q %v", i, k, err)
		}
	}
	if _, err := parseKey([]byte("too short")); err == nil {
		t.Errorf("a short key was accepted")
	}
}

// TestSendWhilePeersRefresh: a peer that refreshes its state (a new incarnation, as after a
// pause refuted, or a restart on the same address) makes memberlist rewrite the peer's node
// while this member's report loop sends to it; the loop must not read memberlist's node
// without its lock (the race detector failed the robustness suite's gossip runs on it,
// seed 1067: Members returns pointers into memberlist's live state).
func TestSendWhilePeersRefresh(t *testing.T) {
	a := member(t, nil)
	b := member(t, func(c *Config) { c.Peers = []string{a.Addr()} })
	waitFor(t, "both members to see each other", func() bool { return a.ml.NumMembers() == 2 && b.ml.NumMembers() == 2 })
	for range 8 {
		_ = b.ml.UpdateNode(200 * time.Millisecond) // a time-out waiting for the broadcast to go out is no matter
		time.Sleep(20 * time.Millisecond)
	}
	if a.ml.NumMembers() != 2 {
		t.Fatalf("a sees %d members, want 2", a.ml.NumMembers())
	}
}

// TestShardIsOneCacheLine: the shards' locks sit on separate cache lines, or decisions on
// different shards slow each other down (the padding was 8 bytes short before).
func TestShardIsOneCacheLine(t *testing.T) {
	if got := unsafe.Sizeof(shard{}); got != 64 {
		t.Fatalf("a shard is %d bytes, want 64", got)
	}
}

// pair starts two members, each set by its function (nil: the defaults), the second
// joining the first, and returns them once each has heard the other.
func pair(t *testing.T, setA, setB func(*Config)) (a, b *Backend) {
	t.Helper()
	a = member(t, setA)
	b = member(t, func(c *Config) {
		if setB != nil {
			setB(c)
		}
		c.Peers = []string{a.Addr()}
	})
	waitFor(t, "two members", func() bool { return a.Members() == 2 && b.Members() == 2 })
	time.Sleep(300 * time.Millisecond) // each hears the other once
	return a, b
}

// keyOwnedBy returns the first key k0, k1, ... other than skip that via routes to owner
// under lim.
func keyOwnedBy(via, owner *Backend, lim []gcra.Limit, skip string) string {
	for i := 0; ; i++ {
		k := fmt.Sprintf("k%d", i)
		s := via.shard(k)
		s.mu.Lock()
		o, _ := s.node.Route(k, lim)
		s.mu.Unlock()
		if o == owner.Name() && k != skip {
			return k
		}
	}
}

// TestForwardsTogether: 32 callers at one member decide a small limit whose owner is the
// other member, at once and again for a second (real UDP on loopback): the asks that wait
// while one message is sent go together in the next, so fewer messages carry them than
// there are asks, and each caller gets its own answer (the grants stay within the limit).
func TestForwardsTogether(t *testing.T) {
	if testing.Short() {
		t.Skip("real time")
	}
	a, b := pair(t, nil, nil)
	lim := []gcra.Limit{{T: sec / 200, Tau: 20 * sec / 200}} // 200/s burst 20
	key := keyOwnedBy(b, a, lim, "")
	var mu sync.Mutex
	var grants []int64
	var errs int
	var wg sync.WaitGroup
	start := time.Now()
	for range 32 {
		wg.Go(func() {
			for time.Since(start) < time.Second {
				g, err := b.Decide(context.Background(), key, backend.Request{Limits: lim, N: 1})
				mu.Lock()
				if err != nil {
					errs++
				} else if g.Allowed {
					grants = append(grants, time.Now().UnixNano())
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	fwd, msgs := b.stats.forwarded.Load(), b.stats.askMessages.Load()
	t.Logf("%d asks forwarded in %d messages; %d granted, %d errors", fwd, msgs, len(grants), errs)
	if fwd < 100 || float64(msgs) > 0.9*float64(fwd) {
		t.Errorf("%d asks in %d messages: want them together (at most 0.9 a message an ask)", fwd, msgs)
	}
	// Counted whole (each grant is stamped when its answer arrives, a scheduler's delay
	// after the owner's decision, so windows shorter than that delay are not judged here).
	if most := 20 + 200*time.Since(start).Seconds(); float64(len(grants)) > most {
		t.Errorf("%d granted, more than burst + rate × time (%.0f): an answer went to two callers?", len(grants), most)
	}
	if float64(errs) > 0.01*float64(fwd) {
		t.Errorf("%d of %d forwarded asks failed", errs, fwd)
	}
}

// TestPolicyForRoutesAKey: a key whose own policy is Owner (a daemon rule's `gossip:
// owner`, through Config.PolicyFor) is forwarded to its owner by real members, though the
// members' Auto would share a limit this large; a key that says nothing is not.
func TestPolicyForRoutesAKey(t *testing.T) {
	if testing.Short() {
		t.Skip("real time")
	}
	own := func(key string) (Policy, bool) {
		if strings.HasPrefix(key, "exact\x1f") {
			return Owner, true
		}
		return 0, false
	}
	a, b := pair(t, func(c *Config) { c.PolicyFor = own }, func(c *Config) { c.PolicyFor = own })
	lim := []gcra.Limit{{T: sec / 2000, Tau: 800 * sec / 2000}} // 2000/s burst 800: Auto shares it
	for _, key := range []string{"exact\x1fa", "exact\x1fb", "loose\x1fa", "loose\x1fb"} {
		for _, m := range []*Backend{a, b} {
			if _, err := m.Decide(context.Background(), key, backend.Request{Limits: lim, N: 1}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Each exact key has one owner: the other member forwarded its request; the loose
	// keys were decided where they were asked.
	if fwd := a.stats.forwarded.Load() + b.stats.forwarded.Load(); fwd != 2 {
		t.Errorf("%d requests forwarded, want 2 (one of the two members' for each exact key)", fwd)
	}
}
