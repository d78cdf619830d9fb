//go:build soak

package lease_test

// The four-process runs through a real etcd and a real ZooKeeper, killed and restarted
// mid-run, run by make soak: judged with the 5 ms jitter allowance of the other
// multi-process tests, they failed under a loaded machine's scheduling right after the
// store's restart (22-26 permits in 100 ms; an allowance of 10-50 ms passed), and
// whether that is wake-up bunching or a real excess when every member rejoins at once is
// open (docs/lease.md, "Known limits"). make test covers these stores with the
// conformance, backend and differential suites.

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

// TestSoakMultiProcessOnEtcd: four OS processes share 200/s burst=20 through a real etcd for
// 12 s; one is killed with SIGKILL after 3 s, and etcd is killed and restarted with its
// data after 6. The pool's permits conform to the limit throughout; it
// uses at least 90% of the limit outside the windows the kill and the restart cost.
// (etcd has no clock: the members' must agree, so none is skewed here.)
func TestSoakMultiProcessOnEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("four processes for 12 s")
	}
	srv := lease.SharedEtcd(t)
	cfg := memberConfig{Store: "etcd", Addrs: []string{srv.Addr()}, Prefix: fmt.Sprintf("mp%d/", time.Now().UnixNano())}
	st := lease.NewEtcdStore(lease.EtcdClient(t, srv.Addr()), lease.WithEtcdPrefix(cfg.Prefix))
	testStoreRestart(t, cfg, st, srv, nil)
}

// TestSoakMultiProcessOnZK: the same through a real ZooKeeper, one process's clock 3 s ahead
// (ZooKeeper's leader times every lease: the members' clocks do not matter).
func TestSoakMultiProcessOnZK(t *testing.T) {
	if testing.Short() {
		t.Skip("four processes for 12 s")
	}
	srv := lease.SharedZK(t)
	cfg := memberConfig{Store: "zk", Addrs: []string{srv.Addr()}, Prefix: fmt.Sprintf("/mp/%d", time.Now().UnixNano())}
	st := lease.NewZKStore(lease.ZKClient(t, srv.Addr()), lease.WithZKPath(cfg.Prefix))
	testStoreRestart(t, cfg, st, srv, map[int]time.Duration{2: 3 * time.Second})
}

func testStoreRestart(t *testing.T, cfg memberConfig, st lease.Store, srv restartable, skews map[int]time.Duration) {
	const limits = "200/s burst=20"
	const d = 12 * time.Second
	// The members run until the test kills them; the timeline starts when every one has
	// its first permit (a loaded machine starts four race-built processes slowly).
	cfg.Limits, cfg.Goroutines, cfg.Duration, cfg.ReadyDir = limits, 8, d+time.Minute, t.TempDir()
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
	time.Sleep(d / 4)
	kill := time.Now().UnixNano()
	ms[1].cmd.Process.Signal(syscall.SIGKILL)
	time.Sleep(d / 4)
	down := time.Now().UnixNano()
	srv.Kill()
	time.Sleep(200 * time.Millisecond)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	up := time.Now().UnixNano()
	time.Sleep(time.Duration(start + int64(d) - time.Now().UnixNano()))
	end := time.Now().UnixNano()
	for _, m := range ms {
		m.cmd.Process.Signal(syscall.SIGKILL) // every permit is printed as it is used
	}
	ps, counts := permits(t, ms, map[int]bool{0: true, 1: true, 2: true, 3: true})
	l := sluice.MustParse(limits).Core(0)[0]
	if i := conform(ps, l, 5*time.Millisecond); i >= 0 {
		need := time.Duration(0)
		for _, j := range []time.Duration{10, 20, 50, 100, 200, 500, 1000} {
			if conform(ps, l, j*time.Millisecond) < 0 {
				need = j * time.Millisecond
				break
			}
		}
		t.Logf("a tolerance of %v would pass (0: none up to 1s)", need)
		t.Fatalf("permit %d of %d at %v breaks 200/s burst=20 (the pool's permits judged together; %d in the 100 ms before it, %d in the second before it; the kill at %v, the store down at %v, up at %v)",
			i, len(ps), time.Duration(ps[i]-start), between(ps, ps[i]-int64(100*time.Millisecond), ps[i]+1), between(ps, ps[i]-int64(time.Second), ps[i]+1),
			time.Duration(kill-start), time.Duration(down-start), time.Duration(up-start))
	}
	cfgL := lease.DefaultConfig()
	recovery := int64(cfgL.TTL + cfgL.Grace + 200*time.Millisecond) // + a renewal, + scheduling
	rate := func(from, to int64) float64 { return float64(between(ps, from, to)) / (float64(to-from) / 1e9) }
	before := rate(start, kill)
	middle := rate(kill+recovery, down)
	// The clients connect again (ZooKeeper's client waits a second between rounds of
	// attempts), and renew.
	after := rate(up+int64(2*time.Second), end)
	back := up
	for back < end && between(ps, back, back+int64(500*time.Millisecond)) < 90 {
		back += int64(10 * time.Millisecond)
	}
	t.Logf("%d permits (per process %v); %.1f/s before the kill, %.1f/s from %v after it to the store's restart, %.1f/s from 2s after it restarted (%v down; 90%% of the limit again %v after the restart)",
		len(ps), counts, before, middle, time.Duration(recovery), after, time.Duration(up-down), time.Duration(back-up))
	for _, r := range []float64{before, middle, after} {
		if r < 0.9*200 {
			t.Errorf("the pool used %.0f/s, %.0f/s and %.0f/s in its three windows, want at least 90%% of 200/s", before, middle, after)
			break
		}
	}
}
