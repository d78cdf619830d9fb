package lease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/store"
	etcdstore "github.com/sluicehq/sluice/store/etcd"
	zkstore "github.com/sluicehq/sluice/store/zk"
)

// restartable is a store server a test kills and restarts with its data.
type restartable interface {
	Kill()
	Restart() error
}

// restartPlan is the timeline of a four-process run through a store: a member is killed
// at kill and the store at down (each from the moment every member has its first permit);
// the store is restarted with its data 200 ms later (a loaded machine restarts a server
// in 0.5 to 6 s), and the run ends `after` the last restart (or twice as long after it as
// the slowest store was down, if longer). The members' limiters keep margin
// as their jitter tolerance (sluice.WithMargin); the pool must use at least minUse of the
// limit from 0.5 s into the run to the kill, from the kill's recovery to the store's
// outage, and, after the restart, from when it is back (minUse over 500 ms, at least
// 500 ms before the end) to the end.
type restartPlan struct {
	kill, down, after time.Duration
	margin            time.Duration
	minUse            float64
}

// zkBack is how long the run goes on at least after a ZooKeeper restart: the longest a
// member may take to hold a lease again by its client's rules (a connect request left
// unanswered given up after the 4 s session time-out, a second before go-zookeeper tries
// again, and a renewal), the 500 ms over which the pool's use is then measured, and 2 s
// of scheduling on a loaded machine (a make test run beside other work once found the
// pool not back within 6.4 s of a restart after 3.2 s down; 30 s alone, twice, it was).
const zkBack = 4*time.Second + time.Second + time.Second + 500*time.Millisecond + 2*time.Second

// shortRestart is make test's run: seconds, judged as exactly as the long one, with a
// loose bound on the pool's use (a shared, loaded machine gives back many permits late:
// see docs/lease.md, "Measured").
var shortRestart = restartPlan{kill: time.Second, down: 3300 * time.Millisecond, after: 3 * time.Second, margin: mpMargin, minUse: 0.25}

// TestMultiProcessOnEtcdAndZK: four OS processes share 200/s burst=20 through a real
// etcd, and four others through a real ZooKeeper, side by side on one timeline
// (shortRestart): one of each is killed with SIGKILL, and each store is killed and
// restarted with its data. Judged by testStoreRestarts. etcd has no clock, so its members'
// must agree: none is skewed; on ZooKeeper one process's clock is 3 s ahead (its leader
// times every lease: the members' clocks do not matter).
func TestMultiProcessOnEtcdAndZK(t *testing.T) {
	if testing.Short() {
		t.Skip("eight processes and two store restarts")
	}
	t.Parallel() // mostly waiting: it overlaps the Redis runs
	testStoreRestarts(t, shortRestart, etcdRun(t), zkRun(t))
}

// etcdRun is a run through the package's etcd.
func etcdRun(t *testing.T) *storeRun {
	srv := lease.SharedEtcd(t)
	cfg := memberConfig{Store: "etcd", Addrs: []string{srv.Addr()}, Prefix: fmt.Sprintf("mp%d/", time.Now().UnixNano())}
	st := etcdstore.New(lease.EtcdClient(t, srv.Addr()), store.WithPrefix(cfg.Prefix))
	return &storeRun{name: "etcd", cfg: cfg, st: st, srv: srv}
}

// zkRun is a run through the package's ZooKeeper, member 2's clock 3 s ahead.
func zkRun(t *testing.T) *storeRun {
	srv := lease.SharedZK(t)
	cfg := memberConfig{Store: "zk", Addrs: []string{srv.Addr()}, Prefix: fmt.Sprintf("/mp/%d", time.Now().UnixNano())}
	st := zkstore.New(lease.ZKClient(t, srv.Addr()), store.WithPrefix(cfg.Prefix))
	return &storeRun{name: "zk", cfg: cfg, st: st, srv: srv, skews: map[int]time.Duration{2: 3 * time.Second}}
}

// storeRun is four member processes through one store, and the times of its events.
type storeRun struct {
	name           string
	cfg            memberConfig
	st             store.Store
	srv            restartable
	skews          map[int]time.Duration
	ms             []*member
	kill, down, up int64
}

// testStoreRestarts runs the four member processes of each run by plan p, the runs side by
// side on one timeline (the stores restarted together), and judges each in a subtest of
// its name: what its members printed (judgeRun), then
//
//   - the killed member's share back in use (the survivors' shares sum to the whole rate)
//     within TTL + Grace + two renewals + 1 s of scheduling;
//   - the pool's use, by p.minUse.
func testStoreRestarts(t *testing.T, p restartPlan, runs ...*storeRun) {
	const limits = "200/s burst=20"
	// The members run until the test kills them; the timeline starts when every one has
	// its first permit (a loaded machine starts race-built processes slowly).
	for _, r := range runs {
		// The members run until the test kills them at the run's end; their own end only
		// guards against a test that died. It was the outage plus a minute, which the run
		// (twice as long after the restart as the store was down) outlasted on a loaded
		// machine: members that ended gave their leases back, the others were raised, and
		// the audit, counting each lease given back until its printed end, reported
		// over-admission (twice under two make test runs at once; at will with 9 s).
		r.cfg.Limits, r.cfg.Goroutines, r.cfg.Duration, r.cfg.ReadyDir, r.cfg.Margin = limits, 8, 10*time.Minute, t.TempDir(), p.margin
		if err := lease.WaitUnfenced(context.Background(), r.st, lease.DefaultConfig()); err != nil {
			t.Fatal(err)
		}
		r.ms = startMembers(t, 4, r.cfg, r.skews)
	}
	for _, r := range runs {
		waitReady(t, r.cfg.ReadyDir, len(r.ms))
	}
	start := time.Now().UnixNano()
	sleepUntil := func(at time.Duration) { time.Sleep(time.Duration(start + int64(at) - time.Now().UnixNano())) }
	sleepUntil(p.kill)
	for _, r := range runs {
		r.kill = time.Now().UnixNano()
		r.ms[1].cmd.Process.Signal(syscall.SIGKILL)
	}
	sleepUntil(p.down)
	for _, r := range runs {
		r.down = time.Now().UnixNano()
		r.srv.Kill()
	}
	time.Sleep(200 * time.Millisecond)
	errs := make([]error, len(runs))
	var wg sync.WaitGroup
	for i, r := range runs {
		wg.Add(1)
		go func() { // the stores restart together: a loaded machine takes seconds for each
			defer wg.Done()
			errs[i] = r.srv.Restart()
			r.up = time.Now().UnixNano()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// The run goes on `after` the restart, or twice as long as the slowest store was down
	// if longer: a machine so loaded that a store takes 6 to 12 s to start again (seen
	// with two make test runs at once) takes longer too to serve its clients again, where
	// the idle machine's pool is back within 50 ms of a restart after 7.7 s down. And at
	// least as long as a ZooKeeper member may take to be back by its client's own rules:
	// a connect request the restarting server leaves unanswered is given up after the
	// session time-out (4 s, zkclient), go-zookeeper tries again a second after it has
	// tried every server, and the member then renews. A CI run found the ZooKeeper pool
	// not back within the 4.3 s it waited after a 2.2 s outage (zero permits after the
	// restart), on a machine running the rest of make test beside it.
	wait := max(p.after, zkBack)
	for _, r := range runs {
		wait = max(wait, 2*time.Duration(r.up-r.down))
	}
	time.Sleep(wait)
	end := time.Now().UnixNano()
	for _, r := range runs {
		for _, m := range r.ms {
			m.cmd.Process.Signal(syscall.SIGKILL) // every permit is printed as it is used
		}
	}
	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) { judgeRestart(t, r, p, start, end) })
	}
}

// judgeRestart judges one run of testStoreRestarts.
func judgeRestart(t *testing.T, r *storeRun, p restartPlan, start, end int64) {
	const limits = "200/s burst=20"
	ms, kill, down, up := r.ms, r.kill, r.down, r.up
	rec := readRecord(t, ms, map[int]bool{0: true, 1: true, 2: true, 3: true})
	at := func(x int64) time.Duration { return time.Duration(x - start) }
	marks := fmt.Sprintf("the kill at %v, the store down at %v, up at %v", at(kill), at(down), at(up))

	uses := judgeRun(t, rec, limits, p.margin, start, up, marks)
	counts := make([]int, len(ms))
	for i, ps := range rec.permits {
		counts[i] = len(ps)
	}

	// The killed member's share, back in use: the survivors' shares sum to the whole rate,
	// or, where the store keeps a reserve free because their demands leave room (they then
	// borrow what their shares do not grant), they use the whole rate (0.95 of it over
	// 500 ms) all the same.
	cfgL := lease.DefaultConfig()
	bound := int64(cfgL.TTL+cfgL.Grace) + 2*int64(100*time.Millisecond) + int64(time.Second) // + two renewals, + a loaded machine's scheduling
	back := reclaimedOrUsed(rec, map[int]bool{1: true}, uses, 200, kill, down)
	if back < 0 || back-kill > bound {
		t.Errorf("the survivors neither held nor used the whole rate within %v of the kill (%v: -1 never before the store's outage)", time.Duration(bound), time.Duration(back-kill))
	}

	// The pool's use.
	rate := func(from, to int64) float64 { return float64(between(uses, from, to)) / (float64(to-from) / 1e9) }
	recovery := int64(cfgL.TTL + cfgL.Grace + 200*time.Millisecond) // + a renewal, + scheduling
	before := rate(start+int64(500*time.Millisecond), kill)
	middle := rate(kill+recovery, down)
	// The clients connect again (ZooKeeper's client waits a second between rounds of
	// attempts; longer on a loaded machine) and renew: the pool is back when it uses
	// minUse of the limit over 500 ms, and from then to the end.
	const w = int64(500 * time.Millisecond)
	again := up
	for again+w <= end && float64(between(uses, again, again+w)) < p.minUse*200*0.5 {
		again += int64(10 * time.Millisecond)
	}
	if again+w > end {
		t.Logf("%d permits (per process %v)", len(uses), counts)
		t.Fatalf("the pool did not use %.0f%% of the limit over 500 ms in the %v after the store's restart (%v down)", 100*p.minUse, time.Duration(end-up), time.Duration(up-down))
	}
	after := rate(again, end)
	t.Logf("%d permits (per process %v); %.1f/s from 0.5 s to the kill, %.1f/s from %v after it to the store's outage; the killed member's share in use again %v after the kill; %v down, the pool back %v after the restart and %.1f/s from then",
		len(uses), counts, before, middle, time.Duration(recovery), time.Duration(back-kill), time.Duration(up-down), time.Duration(again-up), after)
	for _, r := range []float64{before, middle, after} {
		if r < p.minUse*200 {
			t.Errorf("the pool used %.0f/s, %.0f/s and %.0f/s in its three windows, want at least %.0f%% of 200/s", before, middle, after, 100*p.minUse)
			break
		}
	}
}

// judgeRun judges what the members of a run printed (the run's timeline starts at start;
// restart, if not zero, is when the store came back; marks names the run's events for the
// messages) and returns every permit's use time, sorted:
//
//   - over-admission, exactly, on the decisions: the shares the members may be using never
//     sum past the limit (as their limiters decide it, tightened by the margin), each
//     member's slots lie within its lease and obey its share, and the pool's slots conform
//     to that limit with no tolerance at all;
//   - the permits' use, in real time: none used before its slot, and the use times of the
//     whole pool conform to the limit as a strict API would judge them (no tolerance): the
//     margin covers the lateness, since a permit handed over later than it allows is given
//     back (docs/concepts.md, "The jitter tolerance"). Without a margin the use times are
//     not judged (nothing bounds their lateness: docs/lease.md), only reported.
func judgeRun(t *testing.T, rec record, limits string, margin time.Duration, start, restart int64, marks string) []int64 {
	t.Helper()
	uses, slots := rec.uses()
	if len(uses) == 0 {
		t.Fatal("no permit")
	}
	at := func(x int64) time.Duration { return time.Duration(x - start) }
	core := limitconv.Core(sluice.MustParse(limits), margin)[0]
	if err := auditShares(rec, core); err != nil {
		t.Errorf("over-admission: %v (%s)", err, marks)
	}
	if err := auditMembers(rec, core); err != nil {
		t.Errorf("over-admission: %v (%s)", err, marks)
	}
	if i := conform(slots, core, 0); i >= 0 {
		t.Errorf("over-admission: slot %d of %d at %v breaks %s tightened by the margin %v (%d slots in the 100 ms before it; %s)",
			i, len(slots), at(slots[i]), limits, margin, between(slots, slots[i]-int64(100*time.Millisecond), slots[i]+1), marks)
	}
	early := 0
	var expired int64
	for i, ps := range rec.permits {
		expired += rec.expired[i]
		for _, q := range ps {
			if q.use < q.slot {
				early++
			}
		}
	}
	if early > 0 {
		t.Errorf("%d permits used before their slots", early)
	}
	worst, p99, n := lateness(rec, start, uses[len(uses)-1]+1)
	msg := fmt.Sprintf("permits used after their slots by at most %v (p99 %v) over %d", worst, p99, n)
	if restart != 0 {
		w, p, n := lateness(rec, restart, restart+int64(2*time.Second))
		msg += fmt.Sprintf(", in the 2 s after the store's restart at most %v (p99 %v) over %d", w, p, n)
	}
	t.Logf("%s; %d given back late (margin %v)", msg, expired, margin)
	l := limitconv.Core(sluice.MustParse(limits), 0)[0]
	if margin == 0 {
		need := "more than 1s"
		for _, j := range []time.Duration{0, 5, 10, 20, 50, 100, 200, 500, 1000} {
			if conform(uses, l, j*time.Millisecond) < 0 {
				need = fmt.Sprint(j * time.Millisecond)
				break
			}
		}
		t.Logf("without a margin the use times are not judged; they conform to %s with a tolerance of %s", limits, need)
		return uses
	}
	if i := conform(uses, l, 0); i >= 0 {
		t.Errorf("permit %d of %d used at %v breaks %s (the pool's permits judged together as a strict API would; %d in the 100 ms before it; %s)",
			i, len(uses), at(uses[i]), limits, between(uses, uses[i]-int64(100*time.Millisecond), uses[i]+1), marks)
	}
	return uses
}
