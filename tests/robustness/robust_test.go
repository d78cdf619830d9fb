package robustness

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// summary is the last line of a `make robustness` run, printed by TestMain after the
// tests' own output.
var summary string

// TestMain makes the test binary a member process when MemberEnv is set; otherwise it runs
// the tests, fails the package if one leaves a goroutine behind, and prints the summary.
func TestMain(m *testing.M) {
	if os.Getenv(MemberEnv) != "" {
		os.Exit(MemberMain())
	}
	code := m.Run()
	if code == 0 {
		// toxiproxy v2.5.0's toxics (bandwidth, latency, even its no-op) can be left blocked
		// on a channel send when a link is torn down mid-transfer, and so can the reader
		// that feeds a link's first toxic (ToxicLink.read, blocked writing to the toxic
		// gone: seen after 18- and 3-run make robustness): its goroutines, not Sluice's
		// (the members check their own), seen after long runs of make robustness.
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
			goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).read")); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL: goroutine leak:", err)
			code = 1
		}
	}
	if summary != "" {
		fmt.Println(summary)
	}
	os.Exit(code)
}

func envInt(t *testing.T, name string, def uint64) uint64 {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: want a non-negative integer", name, s)
	}
	return v
}

// TestRobustness runs ROBUST_RUNS schedules (2 by default: make test's short run, seeds 0
// and 1, the strict and lease modes; make robustness asks for more) with seeds
// ROBUST_BASE, ROBUST_BASE+1, ... (0 by default), or
// the one seed ROBUST_SEED, each ROBUST_DURATION long (6s by default), in the mode the
// seed picks (Modes[seed % len]) or ROBUST_MODE's, and prints one
// line per run and the summary. A failing run prints its seed and the shortest window
// of its history that shows each violation.
func TestRobustness(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes, real time: make robustness, or go test without -short")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	runs := envInt(t, "ROBUST_RUNS", 2)
	base := envInt(t, "ROBUST_BASE", 0)
	if s := os.Getenv("ROBUST_SEED"); s != "" {
		base, runs = envInt(t, "ROBUST_SEED", 0), 1
	}
	d := 6 * time.Second
	if s := os.Getenv("ROBUST_DURATION"); s != "" {
		if d, err = time.ParseDuration(s); err != nil || d < 3*time.Second {
			t.Fatalf("ROBUST_DURATION=%q: want a duration of at least 3s", s)
		}
	}
	DumpDir, SluiceBin = os.Getenv("ROBUST_DUMP"), os.Getenv("ROBUST_SLUICE")
	var only Mode
	if s := os.Getenv("ROBUST_MODE"); s != "" {
		if only, err = ParseMode(s); err != nil {
			t.Fatal(err)
		}
	}
	var faults, owners, ops, violations int
	for i := range runs {
		seed := base + i
		mode := Modes[seed%uint64(len(Modes))]
		if only != "" {
			mode = only
		}
		s := NewSchedule(seed, mode, 3, d)
		res, err := Run(context.Background(), s, exe)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		fmt.Println(res.Line(int(i + 1)))
		for _, n := range res.Notes {
			fmt.Println("  note:", n)
		}
		if len(res.Violations) > 0 {
			fmt.Printf("  seed %d FAILED (reproduce: make robustness ROBUST_SEED=%d ROBUST_MODE=%s ROBUST_DURATION=%v); its faults:\n", seed, seed, mode, d)
			for _, f := range s.Faults {
				fmt.Println("    ", f)
			}
			fmt.Println("    member clock offsets:", s.Skews)
			for _, v := range res.Violations {
				fmt.Println("  violation:", v)
			}
			t.Errorf("seed %d: %d violations", seed, len(res.Violations))
		}
		faults += s.FaultCount()
		owners += len(res.Owners)
		ops += res.Ops
		violations += len(res.Violations)
	}
	summary = summaryLine(int(runs), faults, owners, ops, violations)
}

// summaryLine is the summary: "robustness: R runs, F faults, O operations, V violations
// beyond the documented bounds", the form scripts read, then the faults on a key's owner,
// if any, in brackets.
func summaryLine(runs, faults, owners, ops, violations int) string {
	line := fmt.Sprintf("robustness: %d runs, %d faults, %d operations, %d violations beyond the documented bounds", runs, faults, ops, violations)
	if owners > 0 {
		line += fmt.Sprintf(" (%d faults on a key's owner)", owners)
	}
	return line
}

// TestSummaryLine: the summary keeps the form scripts read whatever faults fell on a
// key's owner (it put them between the faults and the operations, and a script reading
// the form found no summary in a run with an owner fault).
func TestSummaryLine(t *testing.T) {
	form := regexp.MustCompile(`^robustness: (\d+) runs, (\d+) faults, (\d+) operations, (\d+) violations beyond the documented bounds`)
	for _, owners := range []int{0, 2} {
		line := summaryLine(3, 41, owners, 13919, 0)
		m := form.FindStringSubmatch(line)
		if m == nil || m[2] != "41" || m[3] != "13919" || m[4] != "0" {
			t.Errorf("%q: not the form scripts read", line)
		}
	}
}

// TestGossipPartitionBites shows the gossip mode's network faults reach the members' real
// traffic: a member cut from its peers for 4.3 s counts itself alone during the cut (at
// once if it starts during it, as on a loaded machine where a member process takes
// seconds to start; else once the hold and the loss of contact, 2.5 s, have passed), and
// the two others count each other alone; outside the cut it counts its peers, and by its
// run's end (3 s after the heal, a loose bound) it counts both again. (The pool
// may over-admit as the partition bound says once a cut outlasts the hold, which the
// checker allows: the note gives the largest excess, 31 permits in one run on a quieter
// machine.) make robustness runs it; make test does not (8 s of real processes).
func TestGossipPartitionBites(t *testing.T) {
	if os.Getenv("ROBUST_RUNS") == "" || os.Getenv("ROBUST_SEED") != "" || os.Getenv("ROBUST_MODE") != "" {
		t.Skip("make robustness runs it (not for one seed or mode)")
	}
	joined, alone, others, res := partitionBites(t, ModeGossip, 7, "member")
	if !joined || !alone || len(others) != 2 {
		for _, p := range res.Pools {
			if p.Proc == 0 {
				t.Logf("member 0 at +%v: %d", time.Duration(p.At-res.Start), p.Members)
			}
		}
		t.Fatalf("member 0 counted its peers outside the cut: %v; itself alone during it: %v; the others counted each other alone: %v (want all)", joined, alone, others)
	}
}

// TestDaemonGossipPartitionBites shows the daemon-gossip mode's network faults (DaemonNet,
// between real `sluice serve --backend gossip` processes) reach the daemons' membership:
// with daemon 0 cut from its peers for 4.3 s, it counts itself alone during the cut, and
// the others count each other alone (each daemon's sluice_gossip_members, read every
// 100 ms). After the heal daemon 0 must count both peers again by its last record (6 s
// after the heal, a loose bound): before gossip rejoined while its count of the pool and
// memberlist's disagreed, it still counted itself alone there in 11 of 12 runs, while its
// peers counted it again within 0.5 s (docs/robustness.md). make robustness runs it; make
// test does not.
func TestDaemonGossipPartitionBites(t *testing.T) {
	if os.Getenv("ROBUST_RUNS") == "" || os.Getenv("ROBUST_SEED") != "" || os.Getenv("ROBUST_MODE") != "" {
		t.Skip("make robustness runs it (not for one seed or mode)")
	}
	if SluiceBin == "" {
		SluiceBin = os.Getenv("ROBUST_SLUICE")
	}
	_, alone, others, res := partitionBites(t, ModeDaemonGossip, 8, "daemon")
	// At least one of the others: a daemon of this loaded machine may not answer its
	// metrics for seconds (one was unread from +3.8 to +6.1 s, the whole of the cut's
	// bite).
	if !alone || len(others) == 0 {
		for _, p := range res.Pools {
			t.Logf("daemon %d at +%v: %d", p.Proc, time.Duration(p.At-res.Start), p.Members)
		}
		t.Fatalf("during the cut daemon 0 counted itself alone: %v; the others that counted each other alone: %v (want daemon 0 and one other at least)", alone, others)
	}
}

// partitionBites runs a schedule of three members (of mode) with member 0 cut from its
// peers for 4.3 s from +0.7 s, reports its violations as errors, and wants member 0 to
// count its peers again at its last record after the heal. It returns whether member 0
// counted peers outside the cut and itself alone during it, which others counted each
// other alone during it, and the run. who names a member in the messages.
func partitionBites(t *testing.T, mode Mode, seed uint64, who string) (joined, alone bool, others map[int]bool, res Result) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const at, cut = 700 * time.Millisecond, 4300 * time.Millisecond
	s := Schedule{Seed: seed, Mode: mode, Members: 3, Goroutines: 6, Duration: 8 * time.Second, Skews: make([]time.Duration, 3),
		Faults: []Fault{{At: at, For: cut, Kind: FaultPeerPartition, Target: 0}}}
	res = runJudged(t, s, exe)
	// Procs 0, 1, 2 are slots 0, 1, 2 (nobody is restarted).
	from, to := res.Start+int64(at), res.Start+int64(at+cut)
	others = map[int]bool{}
	var after []string
	for _, p := range res.Pools {
		if p.At > to && p.Proc == 0 {
			after = append(after, fmt.Sprintf("+%.1fs:%d", float64(p.At-res.Start)/1e9, p.Members))
		}
		if p.At < from || p.At > to {
			joined = joined || (p.Proc == 0 && p.Members >= 2)
			continue
		}
		alone = alone || (p.Proc == 0 && p.Members == 1)
		if p.Proc != 0 && p.Members == 2 {
			others[p.Proc] = true
		}
	}
	fmt.Printf("  %s 0 after the heal (+%v): %s\n", who, at+cut, strings.Join(after, " "))
	if back := lastPool(&res, 0, to); back != 3 {
		t.Errorf("%s 0 counted %d members at its last record after the heal, want 3 (its peers again)", who, back)
	}
	return joined, alone, others, res
}

// lastPool returns the pool size proc recorded last after at (0: none recorded).
func lastPool(res *Result, proc int, at int64) int {
	n, last := 0, at
	for _, p := range res.Pools {
		if p.Proc == proc && p.At > last {
			n, last = p.Members, p.At
		}
	}
	return n
}

// TestOwnerFaults is the owner faults' quick test: a fixed schedule of three members
// (seed 31, and 32 in the daemon-gossip mode) whose every call asks for one key, h5, of
// 1200/m burst=100 (Schedule.Groups), now-or-never calls and waits only (Schedule.Calm:
// no penalty or reservation given back, which would keep the bucket from draining): more
// demand than the limit, and a bucket that takes 5 s to
// refill, longer than a key's owner is out of reach, so that a burst granted twice
// shows. h5's owner is killed at +4.5 s (the burst used by then) for 1 s: in the
// daemon-gossip mode the daemon restarts under its name, in the gossip mode the member
// started in its slot outranks it for h5 (m3 over m2), and either owns h5 again at once
// with none of the state its predecessor decided on: it must be fenced as a restart. Then
// h5's owner, found again, is cut from its peers from +6.5 s for 3.2 s: the other side
// lets it go after about 2.5 s, and its new owner of h5 must be fenced while the cut one
// still decides. No violation beyond the documented bounds (CheckGossip: at the owner, a
// split adds the rate past the hold and no burst), and the cut bites: the owner counts
// itself alone during it. It found a new owner that granted the burst again with its fence
// in place (a member that decided asks before it knew any peer: fixed in gossip). The
// gossip mode runs unless -short; the daemon-gossip mode under make robustness (it needs
// ROBUST_SLUICE, the sluice binary); ROBUST_MODE picks one mode, ROBUST_SEED skips both.
func TestOwnerFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes, real time")
	}
	if os.Getenv("ROBUST_SEED") != "" {
		t.Skip("one seed asked for")
	}
	only := os.Getenv("ROBUST_MODE")
	DumpDir = os.Getenv("ROBUST_DUMP")
	for _, c := range []struct {
		seed uint64
		mode Mode
	}{{31, ModeGossip}, {32, ModeDaemonGossip}} {
		seed, mode := c.seed, c.mode
		t.Run(string(mode), func(t *testing.T) {
			if only != "" && only != string(mode) {
				t.Skipf("ROBUST_MODE=%s", only)
			}
			if mode == ModeDaemonGossip {
				if SluiceBin = os.Getenv("ROBUST_SLUICE"); SluiceBin == "" {
					t.Skip("make robustness runs it (ROBUST_SLUICE: the sluice binary)")
				}
			}
			ownerFaults(t, seed, mode)
		})
	}
}

func ownerFaults(t *testing.T, seed uint64, mode Mode) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	kill := Fault{At: 4500 * time.Millisecond, For: 1000 * time.Millisecond, Kind: FaultOwnerKill, Target: -1, Key: "h5"}
	cut := Fault{At: 6500 * time.Millisecond, For: 3200 * time.Millisecond, Kind: FaultOwnerPartition, Target: -1, Key: "h5"}
	s := Schedule{Seed: seed, Mode: mode, Members: 3, Goroutines: 6, Duration: 11 * time.Second, Skews: make([]time.Duration, 3),
		Faults: []Fault{kill, cut}, Groups: []Group{{Limits: "1200/m burst=100", Keys: []string{"h5"}}}, Calm: true}
	res := runJudged(t, s, exe)
	if len(res.Owners) != 2 {
		t.Fatalf("%d owner faults injected, want 2: %v", len(res.Owners), res.Owners)
	}
	// The pool sizes counted during the cut.
	during := func(f Fault, members int) bool {
		from, to := res.Start+int64(f.At), res.Start+int64(f.At+f.For)
		for _, p := range res.Pools {
			if p.At >= from && p.At <= to && p.Members == members {
				return true
			}
		}
		return false
	}
	if !during(cut, 1) {
		t.Errorf("the cut owner (%v) never counted itself alone during its cut: the key did not move", res.Owners[1])
	}
}

// runJudged runs schedule s with the test binary exe, prints its line and notes, and fails
// the test on each violation its checker found.
func runJudged(t *testing.T, s Schedule, exe string) Result {
	t.Helper()
	res, err := Run(context.Background(), s, exe)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println(res.Line(0))
	for _, n := range res.Notes {
		fmt.Println("  note:", n)
	}
	for _, v := range res.Violations {
		t.Error(v)
	}
	return res
}
