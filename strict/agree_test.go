package strict

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/agreetest"
)

// agreeMain is a worker process of the agreement tests: one limiter on strict.Dial's
// backend (the library's defaults: fair by process), waiting at the gate, then serving the
// demand cfg.Agree until cfg.Duration has passed. It prints, at the end, each arrival ("a
// AT") and each permit: "p USE SLOT ARRIVAL", the real time it was used, its slot (Redis
// time, as the script decided it) and its request's arrival (real time).
func agreeMain(cfg workerConfig) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	be, err := Dial(context.Background(), "redis://"+cfg.Addrs[0], WithPrefix(cfg.Prefix))
	if err != nil {
		return fail(err)
	}
	lim, err := sluice.New(sluice.MustParse(cfg.Limits), sluice.WithBackend(be), sluice.WithMaxWait(time.Minute))
	if err != nil {
		be.Close()
		return fail(err)
	}
	defer be.Close()
	defer lim.Close()
	if err := agreetest.Gate(cfg.Gate, cfg.Agree.Name); err != nil {
		return fail(err)
	}
	start := time.Now().UnixNano()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration)
	defer cancel()
	var mu sync.Mutex
	var out bytes.Buffer
	agreetest.Run(ctx, *cfg.Agree, cfg.Seed, start, func(ctx context.Context, arrival int64) bool {
		r, err := lim.WaitN(ctx, cfg.Keys[0], 1)
		if err != nil {
			return false
		}
		at := time.Now().UnixNano()
		mu.Lock()
		fmt.Fprintln(&out, "p", at, r.Slot(), arrival)
		mu.Unlock()
		return true
	}, func(at int64) {
		mu.Lock()
		fmt.Fprintln(&out, "a", at)
		mu.Unlock()
	})
	os.Stdout.Write(out.Bytes())
	return 0
}

// TestAgreesWithSimulator: the strict mode's real processes agree with the simulator on
// two shapes of the guarantee matrix (docs/simulator.md, "The real processes agree"). Four
// OS processes (strict.Dial on one real Redis, the library's defaults: fair by process, no
// margin) of 1, 2, 4 and 8 goroutines start together and serve the demand the simulator
// generates for the shape's scenario (agreetest), which the simulator runs too, with 8
// seeds:
//
//   - unequal-poisson-85: Poisson demand at 85% of 100/s burst=20 in the proportions
//     1:2:4:8, for 10 s. The served fraction (granted / arrivals) within 0.05 of the
//     simulator's range, the p50 wait within 50 ms of it.
//   - many-waiters: every goroutine always busy on 5/s burst=2, for 12 s. The permits
//     granted within 10% of the simulator's range; Jain's index by member at least the
//     simulator's lowest less 0.05 (by process, the default: about a quarter each; the
//     real member of one goroutine gets a little more than the simulated one:
//     agreetest.JainTol).
//
// Safety is exact: every permit's slot (its Redis time, as the script decided it) is
// judged by the referee, a strict GCRA that judges each at its instant, as the
// simulator's API does: no violation. The tolerances are loose (a shared 2-core machine,
// race-built processes, seconds of real time, samples of 60 permits or 850 requests) but
// parts split by waiter rather than by process, or a throttle that lets requests queue,
// break them.
func TestAgreesWithSimulator(t *testing.T) { agreetest.RunShapes(t, testAgree) }

func testAgree(t *testing.T, s agreetest.Shape) {
	ds, err := s.Members()
	if err != nil {
		t.Fatal(err)
	}
	sims, err := s.Simulate("strict", 0)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	gate := t.TempDir()
	prefix := prefix(t)
	cmds := make([]*exec.Cmd, len(ds))
	outs := make([]*bytes.Buffer, len(ds))
	errs := make([]*bytes.Buffer, len(ds))
	ins := make([]io.Writer, len(ds))
	t.Cleanup(func() {
		for _, c := range cmds {
			if c != nil && c.ProcessState == nil {
				c.Process.Kill()
				c.Wait()
			}
		}
	})
	for i, d := range ds {
		cfg := workerConfig{Addrs: []string{shared.Addr()}, Prefix: prefix, Keys: []string{"api"}, Limits: s.Limit,
			Duration: s.Duration, Seed: uint64(i + 1), Agree: &d, Gate: gate}
		js, _ := json.Marshal(cfg)
		c := exec.Command(exe, "-test.run", "^$")
		c.Env = append(os.Environ(), workerEnv+"="+string(js))
		outs[i], errs[i] = &bytes.Buffer{}, &bytes.Buffer{}
		c.Stdout, c.Stderr = outs[i], errs[i]
		if ins[i], err = c.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[i] = c
	}
	start := agreetest.Release(t, gate, ins)
	arrivals := make([][]int64, len(ds))
	permits := make([][]agreetest.Permit, len(ds))
	var slots []int64
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("worker %d: %v: %s", i, err, errs[i])
		}
		sc := bufio.NewScanner(outs[i])
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			n := make([]int64, len(f))
			for k := 1; k < len(f); k++ {
				if n[k], err = strconv.ParseInt(f[k], 10, 64); err != nil {
					t.Fatalf("worker %d: line %q: %v", i, sc.Text(), err)
				}
			}
			switch {
			case f[0] == "a" && len(f) == 2:
				arrivals[i] = append(arrivals[i], n[1])
			case f[0] == "p" && len(f) == 4:
				slots = append(slots, n[2])
				permits[i] = append(permits[i], agreetest.Permit{Use: n[1], Arrival: n[3]})
			default:
				t.Fatalf("worker %d: line %q", i, sc.Text())
			}
		}
	}
	nv, first, err := agreetest.Violations(s.Limit, slots)
	if err != nil {
		t.Fatal(err)
	}
	if nv > 0 {
		t.Errorf("the referee rejected %d of the %d slots (the first, in order, is %d)", nv, len(slots), first)
	}
	t.Logf("%s: %s; %d permits, their slots judged by the referee: %d violations", s.Name, agreetest.Describe(ds), len(slots), nv)
	agreetest.Compare(t, s, "strict", agreetest.Measure(ds, arrivals, permits, start, start+int64(s.Duration)), sims)
}
