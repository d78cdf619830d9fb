package strict

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// TestSentinelFailover: a backend opened on a redis-sentinel:// URL decides on the master;
// after SENTINEL FAILOVER it follows the promoted replica by itself, where the key's state
// (replicated, in the same format) is found and the script, which replicas do not cache,
// is loaded again after NOSCRIPT.
func TestSentinelFailover(t *testing.T) {
	set := redistest.NewSentinels(t, redistest.SentinelConfig{})
	b, err := dialRedis(ctx, set.URL(), WithPrefix(prefix(t)), WithTimeout(2*time.Second), WithProbeEvery(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, ok := b.client.(*goredis.Client); !ok {
		t.Fatalf("client %T, want the failover *goredis.Client (one script call per batch)", b.client)
	}
	ls := []gcra.Limit{{T: int64(time.Hour), Tau: int64(99 * time.Hour)}} // 1/h burst=100
	var first int64
	for i := range 5 {
		g, err := b.Decide(ctx, "k", backend.Request{Limits: ls, N: 1})
		if i == 0 {
			first = g.Remaining
		}
		if err != nil || !g.Allowed || g.Remaining != first-int64(i) {
			t.Fatalf("step %d, before the failover: %+v %v", i, g.Result, err)
		}
	}
	replica := newClient(t, set.Replica.URL())
	sha := goredis.NewScript(scriptSource).Hash()
	if ok, err := replica.ScriptExists(ctx, sha).Result(); err != nil || ok[0] {
		t.Fatalf("SCRIPT EXISTS on the replica: %v %v, want false (replicas do not cache scripts)", ok, err)
	}
	if got, _ := set.Replica.Do("GET", b.KeyName("k")); !strings.HasPrefix(got, "1 ") {
		t.Fatalf("the replica holds %q at %s, want the key's state", got, b.KeyName("k"))
	}
	old := set.Master.Addr()
	start := time.Now()
	if err := set.Failover(); err != nil {
		t.Fatal(err)
	}
	addr, err := set.WaitPromoted(old, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if addr != set.Replica.Addr() {
		t.Fatalf("promoted %s, want the replica %s", addr, set.Replica.Addr())
	}
	t.Logf("promoted in %v", time.Since(start))
	start = time.Now()
	// Decide until a grant comes: calls may fail (READONLY from the demoted master, a
	// connection closed when the client learns of the new master), which opens the
	// breaker until a probe answers.
	var g backend.Grant
	failures := 0
	for deadline := time.Now().Add(20 * time.Second); ; {
		g, err = b.Decide(ctx, "k", backend.Request{Limits: ls, N: 1})
		if err == nil {
			break
		}
		if !errors.Is(err, backend.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("after the failover: %v", err)
		}
		failures++
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("first grant %v after the sentinels named the new master, %d calls failed meanwhile", time.Since(start), failures)
	// The grant was decided by the new master on the replicated state: 5 taken before
	// (a state lost or misread would count from the first again).
	if !g.Allowed || g.Remaining != first-5 {
		t.Fatalf("first grant after the failover: %+v, want allowed with %d remaining", g.Result, first-5)
	}
	for i := range 3 {
		g, err := b.Decide(ctx, "k", backend.Request{Limits: ls, N: 1})
		if err != nil || !g.Allowed || g.Remaining != first-6-int64(i) {
			t.Fatalf("step %d, after the failover: %+v %v", i, g.Result, err)
		}
	}
	if ok, err := replica.ScriptExists(ctx, sha).Result(); err != nil || !ok[0] {
		t.Fatalf("SCRIPT EXISTS on the new master: %v %v, want true (loaded after NOSCRIPT)", ok, err)
	}
	if got, _ := set.Replica.Do("GET", b.KeyName("k")); !strings.HasPrefix(got, "1 ") {
		t.Fatalf("the new master holds %q", got)
	}
}

// overAdmitted feeds each key's grants (those used) in time order to a strict GCRA that
// never reserves and skips those it refuses: it returns the permits refused (granted
// beyond the limit; skipping greedily refuses as few as any choice could, for one
// limit) and the slots of the refused grants.
func overAdmitted(grants []grantRecord, limits []gcra.Limit) (int64, []int64) {
	byKey := map[string][]grantRecord{}
	for _, g := range grants {
		if g.n > 0 {
			byKey[g.key] = append(byKey[g.key], g)
		}
	}
	var excess int64
	var at []int64
	for _, gs := range byKey {
		slices.SortStableFunc(gs, func(a, b grantRecord) int { return cmp.Compare(a.at, b.at) })
		tats := make([]int64, len(limits))
		for _, g := range gs {
			if r, _, err := gcra.Decide(tats, limits, g.at, g.n, 0); err != nil || !r.Allowed { // tats updated on a grant
				excess += g.n
				at = append(at, g.at)
			}
		}
	}
	return excess, at
}

// TestSentinelFailoverMultiProcess: 3 worker processes of 16 goroutines share 2 keys
// through a Sentinel set (redis-sentinel:// URL) while the master fails mid-run: killed
// with SIGKILL (the sentinels find it down and elect one to promote the replica), or
// made to fail over by SENTINEL FAILOVER (the old master decides on until the sentinels
// demote it, and what it decided after the promotion is lost). Every grant is judged
// from its Redis time: the permits granted beyond the limit must lie in the failover
// window and be at most the documented bound, per key a burst plus the permits of the
// failover's duration and of the longest reservation (docs/strict.md, "The failover
// bound"); with WithReplicaAcks(1), none at all. The workers must be granted permits on
// the new master.
func TestSentinelFailoverMultiProcess(t *testing.T) {
	for _, c := range []struct {
		how  string
		acks int
	}{{"kill", 0}, {"failover", 0}, {"failover", 1}} {
		name := fmt.Sprintf("%s/acks=%d", c.how, c.acks)
		t.Run(name, func(t *testing.T) {
			t.Parallel() // each mostly waits: for its workers, and for the sentinels
			how := c.how
			// Two replicas: after a promotion the other replica follows the new master
			// at once, so that it has a replica to acknowledge writes (the old master
			// joins it as one about 10 s later).
			set := redistest.NewSentinels(t, redistest.SentinelConfig{Replicas: 2})
			cfg := workerConfig{URL: set.URL(), Prefix: prefix(t), Keys: []string{"a", "b"}, Limits: "50/s burst=5",
				Goroutines: 16, Duration: 8 * time.Second, Acks: c.acks}
			limits := sluice.MustParse(cfg.Limits)
			done := make(chan []grantRecord, 1)
			go func() {
				// runWorkersOut may fail the test (t.Fatalf ends this goroutine): the
				// deferred send still lets the test's goroutine go on, and stop.
				var grants []grantRecord
				defer func() { done <- grants }()
				grants, _ = runWorkersOut(t, 3, cfg, nil)
			}()
			fail := func(args ...any) { // after the workers are done
				<-done
				t.Fatal(args...)
			}
			// The clients move to the new master when the sentinel each listens to
			// announces it (+switch-master: go-redis' failover client subscribes to one
			// sentinel): until then they decide on the old one, if it lives. The
			// sentinels announce it up to seconds apart (those that did not run the
			// failover learn of it from the others' hello messages, every 2 s): the
			// window ends at the last announcement. On a loaded machine the new master
			// may be judged down in turn (its first sync to the other replica stalls
			// it past down-after) and the other replica promoted: the window then ends
			// at the last announcement of the last failover.
			var mu sync.Mutex
			switches := make([][]time.Time, len(set.Sentinels)) // each sentinel's announcements
			var listening sync.WaitGroup
			defer listening.Wait()
			for i, n := range set.Sentinels {
				sc := goredis.NewSentinelClient(&goredis.Options{Addr: n.Addr()})
				defer sc.Close()
				ps := sc.Subscribe(ctx, "+switch-master")
				defer ps.Close()
				if _, err := ps.Receive(ctx); err != nil {
					fail(err)
				}
				listening.Add(1)
				go func() {
					defer listening.Done()
					for range ps.Channel() {
						mu.Lock()
						switches[i] = append(switches[i], time.Now())
						mu.Unlock()
					}
				}()
			}
			lastSwitch := func() (time.Time, bool) {
				mu.Lock()
				defer mu.Unlock()
				var last time.Time
				for _, ts := range switches {
					if len(ts) == 0 {
						return last, false
					}
					if t := ts[len(ts)-1]; t.After(last) {
						last = t
					}
				}
				return last, true
			}
			// Fail the master a second after the workers' first grants (they start
			// slowly on a loaded machine, built with -race).
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				if n, _ := set.Master.Do("DBSIZE"); n == ":2" {
					break
				}
				if time.Now().After(deadline) {
					fail("the workers wrote no key in 20 s")
				}
			}
			time.Sleep(time.Second)
			old := set.Master.Addr()
			tk := time.Now()
			if how == "kill" {
				set.Master.Kill()
			} else if err := set.Failover(); err != nil {
				fail(err)
			}
			if _, err := set.WaitPromoted(old, 20*time.Second); err != nil {
				fail(err)
			}
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if _, ok := lastSwitch(); ok {
					break
				}
				if time.Now().After(deadline) {
					fail("not every sentinel announced +switch-master within 20 s")
				}
			}
			grants := <-done
			if t.Failed() {
				return
			}
			tp, _ := lastSwitch()
			mu.Lock()
			if n := len(switches[0]); n > 1 {
				t.Logf("%d failovers in the run", n)
			}
			mu.Unlock()
			excess, at := overAdmitted(grants, limitconv.Core(limits, 0))
			core := limitconv.Core(limits, 0)[0]
			failover := tp.Sub(tk)
			const maxWait = 300 * time.Millisecond                           // the workers' sluice.WithMaxWait
			bound := 2 * (core.Burst() + int64(failover+maxWait)/core.T + 1) // 2 keys
			if c.acks > 0 {
				bound = 0
			}
			var used, after int
			for _, g := range grants {
				if g.n > 0 {
					used++
					if g.at > tp.UnixNano() {
						after++
					}
				}
			}
			var where []string
			for _, a := range at {
				where = append(where, fmt.Sprintf("%+v", time.Duration(a-tk.UnixNano()).Round(time.Millisecond)))
			}
			t.Logf("%s, %s: failover %v (from the %s to the last sentinel's +switch-master); %d grants used, %d after it; "+
				"%d permits over the limit (bound %d), at %v from the failure",
				name, cfg.Limits, failover.Round(time.Millisecond), how, used, after, excess, bound, where)
			if after == 0 {
				t.Errorf("no grant after the failover: the workers did not follow the new master")
			}
			if excess > bound {
				t.Errorf("%d permits over the limit, more than the bound %d", excess, bound)
			}
			for _, a := range at {
				if a < tk.UnixNano() || a > tp.Add(time.Second).UnixNano() {
					t.Errorf("a permit over the limit at %v from the failure, outside the failover window (%v)",
						time.Duration(a-tk.UnixNano()), failover)
				}
			}
		})
	}
}
