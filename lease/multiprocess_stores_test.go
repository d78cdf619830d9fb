package lease_test

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
)

// restartable is a store server a test kills and restarts with its data.
type restartable interface {
	Kill()
	Restart() error
}

// restartPlan is the timeline of a four-process run through a store: a member is killed
// at kill and the store at down (each from the moment every member has its first permit);
// the store is restarted with its data 200 ms later, and the run ends `after` its restart
// (a loaded machine restarts a server in 0.5 to 3 s). The members' limiters keep margin
// as their jitter tolerance (sluice.WithMargin); the pool must use at least minUse of the
// limit from 0.5 s into the run to the kill, from the kill's recovery to the store's
// outage, and from 1.5 s after the store is back to the end.
type restartPlan struct {
	kill, down, after time.Duration
	margin            time.Duration
	minUse            float64
}

// shortRestart is make test's run: seconds, judged as exactly as the long one, with a
// loose bound on the pool's use (a shared, loaded machine gives back many permits late:
// see docs/lease.md, "Measured").
var shortRestart = restartPlan{kill: 1200 * time.Millisecond, down: 3600 * time.Millisecond, after: 2500 * time.Millisecond, margin: 20 * time.Millisecond, minUse: 0.5}

// TestMultiProcessOnEtcd: four OS processes share 200/s burst=20 through a real etcd; one
// is killed with SIGKILL, and etcd is killed and restarted with its data (shortRestart).
// Judged by testStoreRestart. (etcd has no clock: the members' must agree, so none is
// skewed here.) It runs beside TestMultiProcessOnZK: each mostly waits.
func TestMultiProcessOnEtcd(t *testing.T) {
	t.Parallel()
	srv := lease.SharedEtcd(t)
	cfg := memberConfig{Store: "etcd", Addrs: []string{srv.Addr()}, Prefix: fmt.Sprintf("mp%d/", time.Now().UnixNano())}
	st := lease.NewEtcdStore(lease.EtcdClient(t, srv.Addr()), lease.WithEtcdPrefix(cfg.Prefix))
	testStoreRestart(t, cfg, st, srv, nil, shortRestart)
}

// TestMultiProcessOnZK: the same through a real ZooKeeper, one process's clock 3 s ahead
// (ZooKeeper's leader times every lease: the members' clocks do not matter).
func TestMultiProcessOnZK(t *testing.T) {
	t.Parallel()
	srv := lease.SharedZK(t)
	cfg := memberConfig{Store: "zk", Addrs: []string{srv.Addr()}, Prefix: fmt.Sprintf("/mp/%d", time.Now().UnixNano())}
	st := lease.NewZKStore(lease.ZKClient(t, srv.Addr()), lease.WithZKPath(cfg.Prefix))
	testStoreRestart(t, cfg, st, srv, map[int]time.Duration{2: 3 * time.Second}, shortRestart)
}

// testStoreRestart runs four member processes through st (on srv) by plan p and judges
// what they printed:
//
//   - over-admission, exactly, on the decisions: the shares the members may be using never
//     sum past the limit (as their limiters decide it, tightened by the margin), each
//     member's slots lie within its lease and obey its share, and the pool's slots conform
//     to that limit with no tolerance at all;
//   - the permits' use, in real time: none used before its slot, and the use times of the
//     whole pool conform to the limit as a strict API would judge them (no tolerance): the
//     margin covers the lateness, since a permit handed over later than it allows is given
//     back (docs/concepts.md, "The jitter tolerance");
//   - the killed member's share back in use (the survivors' shares sum to the whole rate)
//     within TTL + Grace + two renewals + 300 ms of scheduling;
//   - the pool's use, by p.minUse.
func testStoreRestart(t *testing.T, cfg memberConfig, st lease.Store, srv restartable, skews map[int]time.Duration, p restartPlan) {
	const limits = "200/s burst=20"
	// The members run until the test kills them; the timeline starts when every one has
	// its first permit (a loaded machine starts four race-built processes slowly).
	cfg.Limits, cfg.Goroutines, cfg.Duration, cfg.ReadyDir, cfg.Margin = limits, 8, p.down+p.after+time.Minute, t.TempDir(), p.margin
	if err := lease.WaitUnfenced(context.Background(), st, lease.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	ms := startMembers(t, 4, cfg, skews)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if es, _ := os.ReadDir(cfg.ReadyDir); len(es) == len(ms) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the members had no permit 30 s after they started")
		}
	}
	start := time.Now().UnixNano()
	sleepUntil := func(at time.Duration) { time.Sleep(time.Duration(start + int64(at) - time.Now().UnixNano())) }
	sleepUntil(p.kill)
	kill := time.Now().UnixNano()
	ms[1].cmd.Process.Signal(syscall.SIGKILL)
	sleepUntil(p.down)
	down := time.Now().UnixNano()
	srv.Kill()
	time.Sleep(200 * time.Millisecond)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	up := time.Now().UnixNano()
	time.Sleep(p.after)
	end := time.Now().UnixNano()
	for _, m := range ms {
		m.cmd.Process.Signal(syscall.SIGKILL) // every permit is printed as it is used
	}
	rec := readRecord(t, ms, map[int]bool{0: true, 1: true, 2: true, 3: true})
	uses, slots := rec.uses()
	if len(uses) == 0 {
		t.Fatal("no permit")
	}
	counts := make([]int, len(ms))
	var expired int64
	for i, ps := range rec.permits {
		counts[i] = len(ps)
		expired += rec.expired[i]
	}
	at := func(x int64) time.Duration { return time.Duration(x - start) }
	marks := fmt.Sprintf("the kill at %v, the store down at %v, up at %v", at(kill), at(down), at(up))

	// Over-admission, on the decisions.
	core := sluice.MustParse(limits).Core(p.margin)[0]
	if err := auditShares(rec, core); err != nil {
		t.Errorf("over-admission: %v (%s)", err, marks)
	}
	if err := auditMembers(rec, core); err != nil {
		t.Errorf("over-admission: %v (%s)", err, marks)
	}
	if i := conform(slots, core, 0); i >= 0 {
		t.Errorf("over-admission: slot %d of %d at %v breaks %s tightened by the margin %v (%d slots in the 100 ms before it; %s)",
			i, len(slots), at(slots[i]), limits, p.margin, between(slots, slots[i]-int64(100*time.Millisecond), slots[i]+1), marks)
	}

	// The permits' use, in real time.
	early := 0
	for _, ps := range rec.permits {
		for _, q := range ps {
			if q.use < q.slot {
				early++
			}
		}
	}
	if early > 0 {
		t.Errorf("%d permits used before their slots", early)
	}
	worst, p99, n := lateness(rec, start, end)
	worstUp, p99Up, nUp := lateness(rec, up, up+int64(2*time.Second))
	t.Logf("permits used after their slots by at most %v (p99 %v) over %d, in the 2 s after the store's restart at most %v (p99 %v) over %d; %d given back late (margin %v)",
		worst, p99, n, worstUp, p99Up, nUp, expired, p.margin)
	l := sluice.MustParse(limits).Core(0)[0]
	if i := conform(uses, l, 0); i >= 0 {
		t.Errorf("permit %d of %d used at %v breaks %s (the pool's permits judged together as a strict API would; %d in the 100 ms before it; %s)",
			i, len(uses), at(uses[i]), limits, between(uses, uses[i]-int64(100*time.Millisecond), uses[i]+1), marks)
	}

	// The killed member's share, back in use.
	cfgL := lease.DefaultConfig()
	bound := int64(cfgL.TTL+cfgL.Grace) + 2*int64(100*time.Millisecond) + int64(300*time.Millisecond)
	back := reclaimed(rec, map[int]bool{1: true}, kill, down)
	if back < 0 || back-kill > bound {
		t.Errorf("the survivors' shares did not sum to the whole rate within %v of the kill (%v: -1 never before the store's outage)", time.Duration(bound), time.Duration(back-kill))
	}

	// The pool's use.
	rate := func(from, to int64) float64 { return float64(between(uses, from, to)) / (float64(to-from) / 1e9) }
	recovery := int64(cfgL.TTL + cfgL.Grace + 200*time.Millisecond) // + a renewal, + scheduling
	before := rate(start+int64(500*time.Millisecond), kill)
	middle := rate(kill+recovery, down)
	// The clients connect again (ZooKeeper's client waits a second between rounds of
	// attempts), and renew.
	after := rate(up+int64(1500*time.Millisecond), end)
	// When the pool is back to 90% of what it used before the kill, over 500 ms.
	again := up
	for again < end && float64(between(uses, again, again+int64(500*time.Millisecond))) < 0.9*before/2 {
		again += int64(10 * time.Millisecond)
	}
	t.Logf("%d permits (per process %v); %.1f/s from 0.5 s to the kill, %.1f/s from %v after it to the store's outage, %.1f/s from 1.5 s after the store's restart; the killed member's share in use again %v after the kill; %v down, back to 90%% of its use before the kill %v after the restart",
		len(uses), counts, before, middle, time.Duration(recovery), after, time.Duration(back-kill), time.Duration(up-down), time.Duration(again-up))
	for _, r := range []float64{before, middle, after} {
		if r < p.minUse*200 {
			t.Errorf("the pool used %.0f/s, %.0f/s and %.0f/s in its three windows, want at least %.0f%% of 200/s", before, middle, after, 100*p.minUse)
			break
		}
	}
}
