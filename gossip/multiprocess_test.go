package gossip

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/gossip/hits"
	"github.com/sluicehq/sluice/internal/testkit/proctest"
)

// memberEnv, when set, makes the test binary a member process (see TestMain): its value
// is the member's JSON config.
const memberEnv = "SLUICE_GOSSIP_MEMBER"

type procConfig struct {
	Bind  string        `json:"bind"`
	Peers []string      `json:"peers"`
	Start time.Time     `json:"start"` // when to start the load (all processes alike)
	For   time.Duration `json:"for"`
	// Optional: the limit (default 100/s burst 10), the policy (default auto) and the
	// largest pool that reports all-to-all (default 32).
	Rate, Burst int64
	Policy      string
	MeshMax     int
}

// memberMain runs one member process: it joins, waits for Start, asks for permits of
// "api" (100/s burst 10) as fast as a caller pacing itself at 1 ms would for For, and
// prints the wall-clock time of each grant, one per line, then "done".
func memberMain() int {
	var pc procConfig
	if err := json.Unmarshal([]byte(os.Getenv(memberEnv)), &pc); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg := DefaultConfig()
	cfg.Bind, cfg.Peers = pc.Bind, pc.Peers
	cfg.Policy, _ = ParsePolicy(pc.Policy)
	cfg.MeshMax = pc.MeshMax
	if pc.Rate == 0 {
		pc.Rate, pc.Burst = 100, 10
	}
	b, err := New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer b.Close()
	time.Sleep(time.Until(pc.Start))
	lim := []gcra.Limit{{T: sec / pc.Rate, Tau: pc.Burst * sec / pc.Rate}}
	w := bufio.NewWriter(os.Stdout)
	for end := pc.Start.Add(pc.For); time.Now().Before(end); time.Sleep(time.Millisecond) {
		g, err := b.Decide(context.Background(), "api", backend.Request{Limits: lim, N: 1})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		if g.Allowed {
			fmt.Fprintln(w, time.Now().UnixNano())
		}
	}
	fmt.Fprintln(w, "done")
	w.Flush()
	return 0
}

// TestThreeProcesses: three member processes, memberlist over real UDP and TCP on
// loopback, share 100/s burst 10 for 4 s; their grants, merged by wall-clock time (one
// machine, one clock), stay within the bound, and use most of the limit.
func TestThreeProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("processes in real time")
	}
	grants := runProcs(t, 3, procConfig{For: 4 * time.Second}, 2*time.Second)
	var all []int64
	for _, g := range grants {
		all = append(all, g...)
	}
	slices.Sort(all)
	e := excess(all, 10, 100)
	util := float64(len(all)) / (10 + 100*4)
	bound := hits.Bound(hits.BoundParams{Nodes: 3, Burst: 10, Rate: 100})
	t.Logf("three processes: %d granted in 4 s, excess %.1f (bound %.0f), utilization %.3f", len(all), e, bound, util)
	if e > bound+100*DefaultConfig().Interval.Seconds() {
		t.Errorf("excess %.1f permits, want within %.0f (and an interval's rate for a late report)", e, bound)
	}
	// Liveness only, loosely: 0.95 on an idle machine (docs/gossip.md), 0.52 once with two
	// make test runs at once, where late reports make each process hold back more.
	if util < 0.3 {
		t.Errorf("utilization %.3f, want at least 0.3 (loose: real time, a shared machine)", util)
	}
}

// TestTwentyProcessesOverTrees: twenty member processes start together (a join storm on
// one machine) and, their pool larger than MeshMax (4 here), report over the tag's tree
// (depth 2: fanout 8); they share 10000/s burst 2000 by shares, each asking as fast as a
// caller pacing itself at 1 ms would (about 900/s: 18,000/s in all). Over the last 3 s of
// 6, the pool stays within the bound, uses most of the limit and shares it evenly
// (Jain's index over the processes).
func TestTwentyProcessesOverTrees(t *testing.T) {
	if testing.Short() {
		t.Skip("processes in real time")
	}
	const n, rate, burst = 20, 10000, 2000
	grants := runProcs(t, n, procConfig{For: 6 * time.Second, Rate: rate, Burst: burst, Policy: "shares", MeshMax: 4}, 4*time.Second)
	var all []int64
	for _, g := range grants {
		all = append(all, g...)
	}
	slices.Sort(all)
	if len(all) == 0 {
		t.Fatal("nothing granted")
	}
	// The load started at the same wall-clock time everywhere: the first grant is it.
	from := all[0] + int64(3*time.Second)
	e := excess(all, burst, rate)
	var xs []float64
	var last int
	for _, g := range grants {
		k := len(g) - sort.Search(len(g), func(i int) bool { return g[i] >= from })
		xs = append(xs, float64(k))
		last += k
	}
	util := float64(last) / (rate * 3)
	j := jain(xs)
	bound := hits.Bound(hits.BoundParams{Nodes: n, Burst: burst, Rate: rate})
	t.Logf("twenty processes over trees: %d granted in 6 s, excess %.1f (bound %.0f), over the last 3 s utilization %.3f, Jain %.3f",
		len(all), e, bound, util, j)
	if e > bound+rate*DefaultConfig().Interval.Seconds() {
		t.Errorf("excess %.1f permits, want within %.0f (and an interval's rate for a late report)", e, bound)
	}
	// Loose, as above: real time on a shared machine of two cores, 20 processes, which
	// under make test's other packages cannot even ask the limit's rate (0.995 and Jain
	// 1.000 on a quiet machine; 0.506 and 0.969 once under make test). The convergence
	// itself is judged exactly in the simulator (TestGossipJoinStorm).
	if util < 0.3 || j < 0.8 {
		t.Errorf("over the last 3 s: utilization %.3f, Jain %.3f; want at least 0.3 and 0.8 (loose: real time, a shared machine)", util, j)
	}
}

// jain is Jain's index of xs: (Σx)² / (n·Σx²).
func jain(xs []float64) float64 {
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	if s2 == 0 {
		return 0
	}
	return s * s / (float64(len(xs)) * s2)
}

// runProcs runs n member processes, each with pc (its address and peers filled in), the
// load starting after wait; it returns each one's grant times, sorted.
func runProcs(t *testing.T, n int, pc procConfig, wait time.Duration) [][]int64 {
	t.Helper()
	ports := freePorts(t, n)
	pc.Start = time.Now().Add(wait)
	type proc struct {
		cmd *exec.Cmd
		out strings.Builder
	}
	var ps []*proc
	for i := range n {
		c := pc
		c.Bind, c.Peers = ports[i], nil
		for j := range n {
			if j != i {
				c.Peers = append(c.Peers, ports[j])
			}
		}
		cfg, _ := json.Marshal(c)
		p := &proc{cmd: exec.Command(os.Args[0], "-test.run=^$")}
		p.cmd.Env = append(os.Environ(), memberEnv+"="+string(cfg))
		p.cmd.Stdout = &p.out
		p.cmd.Stderr = os.Stderr
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	var out [][]int64
	for i, p := range ps {
		if err := p.cmd.Wait(); err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
		lines := strings.Fields(p.out.String())
		if len(lines) == 0 || lines[len(lines)-1] != "done" {
			t.Fatalf("member %d did not finish", i)
		}
		var grants []int64
		for _, l := range lines[:len(lines)-1] {
			var ns int64
			fmt.Sscan(l, &ns)
			grants = append(grants, ns)
		}
		slices.Sort(grants)
		out = append(out, grants)
	}
	return out
}

// freePorts returns n loopback addresses whose TCP and UDP ports were free a moment ago,
// below the ephemeral range (proctest.FreePort): a port the system handed out for port 0
// was taken by another connection's source port before its member bound it (TestTwenty
// ProcessesOverTrees: "address already in use", once in CI).
func freePorts(t *testing.T, n int) []string {
	var out []string
	for len(out) < n {
		p, err := proctest.FreePort(true)
		if err != nil {
			t.Fatal(err)
		}
		if a := "127.0.0.1:" + strconv.Itoa(p); !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}
