package lease_test

import (
	"context"
	"fmt"
	"io"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/internal/testkit/agreetest"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/store"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// TestAgreesWithSimulator: the lease mode's real processes agree with the simulator on
// two shapes of the guarantee matrix (docs/simulator.md, "The real processes agree"). Four
// OS processes (lease.Dial on one real Redis, the lease package's defaults, the matrix's
// margin of 12 ms) of 1, 2, 4 and 8 goroutines start together and serve the demand the
// simulator generates for the shape's scenario (agreetest), which the simulator runs too,
// with the same margin and 8 seeds:
//
//   - unequal-poisson-85: Poisson demand at 85% of 100/s burst=20 in the proportions
//     1:2:4:8, for 10 s. The served fraction (granted / arrivals) within 0.05 of the
//     simulator's range, the p50 wait within 50 ms of it.
//   - many-waiters: every goroutine always busy on 5/s burst=2, for 12 s: too small a
//     burst to share out among four, so decided at the store and served in turn by member.
//     The permits granted within 10% of the simulator's range; Jain's index by member at
//     least the simulator's lowest less 0.05 (the real pool is a little fairer than the
//     simulator's: agreetest.JainTol).
//
// Safety is exact: every permit used is judged by the referee, a strict GCRA that judges
// each at its instant, as the simulator's API does (no violation); where the limit is
// shared out the members' decisions are audited too (judgeRun). The tolerances are loose
// (a shared 2-core machine, race-built processes, seconds of real time, samples of 60
// permits or 850 requests) but a share that lags its demand, or parts split by waiter,
// break them.
func TestAgreesWithSimulator(t *testing.T) { agreetest.RunShapes(t, testAgree) }

func testAgree(t *testing.T, s agreetest.Shape) {
	ds, err := s.Members()
	if err != nil {
		t.Fatal(err)
	}
	margin, err := agreetest.MatrixMargin()
	if err != nil {
		t.Fatal(err)
	}
	sims, err := s.Simulate("lease", margin)
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.New(t)
	gate := t.TempDir()
	cfgs := make([]memberConfig, len(ds))
	for i, d := range ds {
		cfgs[i] = memberConfig{URL: "redis://" + srv.Addr(), ID: d.Name, Limits: s.Limit, Goroutines: d.Goroutines,
			Duration: s.Duration + time.Minute, Gate: gate, Demand: &d, Seed: uint64(i + 1), MaxWait: time.Minute, Margin: margin}
	}
	ms := startMemberProcs(t, cfgs)
	// A fresh store fences the limit for TTL + Grace: wait it out while the processes start.
	client := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), DisableIdentity: true})
	defer client.Close()
	if err := lease.WaitUnfenced(context.Background(), redisstore.New(client, store.WithPrefix(lease.DefaultStorePrefix)), lease.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	ins := make([]io.Writer, len(ms))
	for i, m := range ms {
		ins[i] = m.in
	}
	start := agreetest.Release(t, gate, ins)
	end := start + int64(s.Duration)
	time.Sleep(time.Duration(end - time.Now().UnixNano()))
	for _, m := range ms {
		m.cmd.Process.Signal(syscall.SIGKILL) // every permit is printed as it is used
	}
	rec := readRecord(t, ms, map[int]bool{0: true, 1: true, 2: true, 3: true})
	// Where the limit is shared out, the members' decisions are audited exactly (judgeRun:
	// each member's permits within its lease, the leases within the limit, the slots within
	// the limit tightened by the margin). A limit with fewer permits of burst than members
	// wanting it (5/s burst=2 among four) is decided at the store, each decision a take
	// (docs/lease.md, "Limits too small to share out"): its slots are the member's reading
	// of the store's booking, up to a store round trip off it, which the margin covers; the
	// permits used are what the API sees, judged below.
	limits := sluice.MustParse(s.Limit)
	sharedOut := int64(len(ds)) <= limits[0].Burst
	var uses []int64
	if sharedOut {
		uses = judgeRun(t, rec, s.Limit, margin, start, 0, s.Name)
	} else {
		var slots []int64
		uses, slots = rec.uses()
		if err := auditShares(rec, limitconv.Core(limits, margin)[0]); err != nil {
			t.Errorf("over-admission: %v", err)
		}
		for i, ps := range rec.permits {
			for _, p := range ps {
				if p.use < p.slot {
					t.Errorf("member %d used a permit %v before its slot", i, time.Duration(p.slot-p.use))
				}
			}
		}
		need := "more than 1s"
		for _, j := range []time.Duration{0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000} {
			if conform(slots, limitconv.Core(limits, margin)[0], j*time.Millisecond) < 0 {
				need = fmt.Sprint(j * time.Millisecond)
				break
			}
		}
		t.Logf("decided at the store: the slots conform to %s tightened by the margin with a tolerance of %s", s.Limit, need)
	}
	permits := make([][]agreetest.Permit, len(ms))
	for i, ps := range rec.permits {
		for _, p := range ps {
			arrival := p.arrival
			if ds[i].Rate == 0 {
				arrival = start // a backlog: every request there from the start
			}
			permits[i] = append(permits[i], agreetest.Permit{Use: p.use, Arrival: arrival})
		}
	}
	n, first, err := agreetest.Violations(s.Limit, uses)
	if err != nil {
		t.Fatal(err)
	}
	if n > 0 {
		t.Errorf("the referee rejected %d of the %d permits used (the first, in order, is %d)", n, len(uses), first)
	}
	var expired int64
	for _, e := range rec.expired {
		expired += e
	}
	t.Logf("%s: %s; %d permits used, judged by the referee: %d violations; %d given back late (margin %v)", s.Name, agreetest.Describe(ds), len(uses), n, expired, margin)
	agreetest.Compare(t, s, "lease", agreetest.Measure(ds, rec.arrivals, permits, start, end), sims)
}
