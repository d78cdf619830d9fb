package robustness

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/limitconv"
)

// The checkers are tested on histories made by hand: each must catch the breach it
// exists for, name it, and pass the same history without it.

const ms = int64(time.Millisecond)

// redis is a time on Redis' clock (Unix nanoseconds, November 2026): the slots of grants
// Redis decided count from it.
const redis = int64(1_795_000_000) * int64(time.Second)

// use is a grant of n permits on key a0 (200/s burst=10, tightened by the 20 ms margin to
// a burst of 6) at slot (ms after redis), called 1 ms before and used at the slot (ms
// after 0, the run's start).
func use(proc int, n, slot int64) Use {
	return Use{Proc: proc, Key: "a0", N: n, Slot: redis + slot*ms, Call: (slot - 1) * ms, At: slot * ms}
}

func TestCheckStrictLinearizable(t *testing.T) {
	// 6 permits at once (the tightened burst), then one every 5 ms: exactly the limit.
	h := &History{}
	for i := range int64(6) {
		h.Uses = append(h.Uses, use(int(i%3), 1, 1000))
	}
	for i := range int64(20) {
		h.Uses = append(h.Uses, use(int(i%3), 1, 1005+5*i))
	}
	if vs, notes := CheckStrict(h, 0); len(vs) != 0 || len(notes) != 0 {
		t.Fatalf("a conforming history: violations %v, notes %v", vs, notes)
	}
}

func TestCheckStrictOverAdmission(t *testing.T) {
	// A seventh permit in the same instant is one past the burst.
	h := &History{}
	for i := range int64(40) {
		h.Uses = append(h.Uses, use(0, 1, 1000+50*i)) // harmless traffic before
	}
	for i := range 7 {
		h.Uses = append(h.Uses, use(i%3, 1, 5000))
	}
	vs, _ := CheckStrict(h, 0)
	if len(vs) != 1 || vs[0].Check != "strict" || !strings.Contains(vs[0].Detail, "key a0") {
		t.Fatalf("got %v, want one strict violation on key a0", vs)
	}
	// The window is the shortest that shows it: the seven grants at 5 s, not the 40 before.
	if w := vs[0].Window; len(w) != 7 {
		t.Fatalf("window of %d operations, want the 7 at 5 s:\n%s", len(w), strings.Join(w, "\n"))
	}
}

func TestCheckStrictLossForgetsOneBurst(t *testing.T) {
	// Redis loses its state between two bursts 10 ms apart: the second burst is within
	// the documented bound (one burst per key per loss), and the same history without the
	// loss is a violation.
	h := &History{}
	for range 6 {
		h.Uses = append(h.Uses, use(0, 1, 1000))
	}
	for range 6 {
		h.Uses = append(h.Uses, use(1, 1, 1010))
	}
	if vs, _ := CheckStrict(h, 0); len(vs) != 1 {
		t.Fatalf("two bursts 10 ms apart, no loss: got %v, want a violation", vs)
	}
	h.Losses = [][2]int64{{1002 * ms, 1005 * ms}}
	if vs, _ := CheckStrict(h, 0); len(vs) != 0 {
		t.Fatalf("two bursts 10 ms apart across a loss: got %v, want none", vs)
	}
	// A third burst after the loss is past the bound again.
	for range 6 {
		h.Uses = append(h.Uses, use(2, 1, 1012))
	}
	if vs, _ := CheckStrict(h, 0); len(vs) != 1 {
		t.Fatalf("three bursts across one loss: got %v, want a violation", vs)
	}
}

func TestCheckStrictPlaceDecidedBeforeARewind(t *testing.T) {
	// Seed 7002's case: a place reserved at +1001 ms (slot 1030) before old state was
	// restored (+1010 to +1012 ms), served by the waiting room to a waiter that called at
	// +1025 ms, beside a burst decided on the restored state at the same slot. It is a
	// lost write (the failover bound), linearizable before the loss: recorded from its
	// decision (decidedFrom: its answer's arrival less the backend's time-out) the history
	// passes; recorded from the waiter's call, it must follow the loss, and the key looks
	// decided on two states at once.
	h := &History{Losses: [][2]int64{{1010 * ms, 1012 * ms}}}
	for range 6 {
		h.Uses = append(h.Uses, use(0, 1, 1000))
	}
	for range 6 {
		h.Uses = append(h.Uses, Use{Proc: 1, Key: "a0", N: 1, Slot: redis + 1030*ms, Call: 1020 * ms, At: 1030 * ms})
	}
	served := Use{Proc: 2, Key: "a0", N: 1, Slot: redis + 1030*ms, Call: 1001*ms - int64(100*time.Millisecond), At: 1030 * ms}
	h.Uses = append(h.Uses, served)
	if vs, _ := CheckStrict(h, 0); len(vs) != 0 {
		t.Fatalf("the place recorded from its decision: got %v, want no violation", vs)
	}
	h.Uses[len(h.Uses)-1].Call = 1025 * ms
	if vs, _ := CheckStrict(h, 0); len(vs) != 1 {
		t.Fatalf("the place recorded from its waiter's call: got %v, want a violation", vs)
	}
}

func TestCheckStrictRealTimeOrder(t *testing.T) {
	// Slots on Redis' clock must agree with real time: a grant whose slot is 100 ms
	// before another's, though it was called after that one was used, is not
	// linearizable when both fill the burst.
	h := &History{}
	for range 6 {
		h.Uses = append(h.Uses, Use{Proc: 0, Key: "a0", N: 1, Slot: redis + 2000*ms, Call: 1999 * ms, At: 2000 * ms})
	}
	for range 6 {
		h.Uses = append(h.Uses, Use{Proc: 1, Key: "a0", N: 1, Slot: redis + 1990*ms, Call: 2001 * ms, At: 2002 * ms})
	}
	if vs, _ := CheckStrict(h, 0); len(vs) != 1 {
		t.Fatalf("got %v, want one violation", vs)
	}
}

func TestCheckReferee(t *testing.T) {
	// The referee judges use times with the real limit (burst 10): 10 at once pass, the
	// eleventh is refused.
	h := &History{}
	for range 10 {
		h.Uses = append(h.Uses, use(0, 1, 1000))
	}
	if vs := CheckReferee(h, 0, nil); len(vs) != 0 {
		t.Fatalf("10 permits at once under burst=10: %v", vs)
	}
	h.Uses = append(h.Uses, use(1, 1, 1001))
	vs := CheckReferee(h, 0, nil)
	if len(vs) != 1 || vs[0].Check != "referee" {
		t.Fatalf("11 permits in 1 ms under burst=10: got %v, want one referee violation", vs)
	}
	// A loss of Redis' state starts the referee anew.
	h.Losses = [][2]int64{{1000*ms + 500_000, 1000*ms + 700_000}}
	if vs := CheckReferee(h, 0, nil); len(vs) != 0 {
		t.Fatalf("across a loss: %v", vs)
	}
}

func TestCheckLeases(t *testing.T) {
	T := limitconv.Core(sluice.MustParse("200/s"), 0)[0].T
	h := &History{Leases: []Lease{
		{Proc: 0, Key: "a0", T: T, Rate: 100, From: 0, Until: 1000 * ms},
		{Proc: 1, Key: "a0", T: T, Rate: 100, From: 10 * ms, Until: 1000 * ms},
		{Proc: 0, Key: "a0", T: T, Rate: 0, From: 520 * ms, Until: 520 * ms, Asked: 500 * ms}, // member 0 shrinks to nothing, asked at 500 ms
		{Proc: 2, Key: "a0", T: T, Rate: 100, From: 510 * ms, Until: 1000 * ms},               // given what member 0 freed
	}}
	if vs := CheckLeases(h, 0); len(vs) != 0 {
		t.Fatalf("shares summing to the limit: %v", vs)
	}
	h.Leases = append(h.Leases, Lease{Proc: 3, Key: "a0", T: T, Rate: 1, From: 700 * ms, Until: 800 * ms})
	vs := CheckLeases(h, 0)
	if len(vs) != 1 || !strings.Contains(vs[0].Detail, "201.00/s") || len(vs[0].Window) != 3 {
		t.Fatalf("got %v, want one violation at 201/s naming the 3 shares in use", vs)
	}
	// Old state restored just before: the documented failover bound allows up to twice
	// the limit for a renewal interval and a lease after it, and no longer.
	h.Rewinds = [][2]int64{{600 * ms, 650 * ms}}
	if vs := CheckLeases(h, 0); len(vs) != 0 {
		t.Fatalf("201/s within the failover bound after a rewind: %v", vs)
	}
	h.Rewinds = [][2]int64{{600*ms - int64(RewindWindow) - 200*ms, 650*ms - int64(RewindWindow) - 200*ms}}
	if vs := CheckLeases(h, 0); len(vs) != 1 {
		t.Fatalf("201/s past the failover bound's window: got %v, want one violation", vs)
	}
}

func TestCheckLiveness(t *testing.T) {
	h := &History{Ops: []Op{
		{Proc: 0, Kind: "wait", Key: "a0", N: 1, Call: 0, Return: int64(OpTimeout), Timeout: OpTimeout},
		{Proc: 1, Kind: "now", Key: "a0", N: 1, Call: 0, Return: int64(OpTimeout + LivenessSlack + time.Millisecond), Timeout: OpTimeout},
		{Proc: 2, Kind: "now", Key: "a0", N: 1, Call: 0, Return: int64(10 * time.Second), Timeout: OpTimeout},
	}, Stopped: map[int][][2]int64{2: {{int64(time.Second), int64(9 * time.Second)}}}}
	vs := CheckLiveness(h, 0)
	if len(vs) != 1 || !strings.Contains(vs[0].Detail, "member 1") {
		t.Fatalf("got %v, want member 1's late call alone (member 2 was stopped)", vs)
	}
	// A stall of member 1's process (the machine did not run it) while the call ran
	// excuses that much: 1 ms over with a 1 ms stall passes; a stall outside the call, or
	// of another process, does not.
	h.Stalls = []Stall{{Proc: 1, From: int64(time.Second), To: int64(time.Second + time.Millisecond)}}
	if vs := CheckLiveness(h, 0); len(vs) != 0 {
		t.Fatalf("1 ms over with a 1 ms stall: %v", vs)
	}
	h.Stalls = []Stall{{Proc: 1, From: int64(3 * time.Second), To: int64(4 * time.Second)}, {Proc: 0, From: 0, To: int64(time.Second)}}
	if vs := CheckLiveness(h, 0); len(vs) != 1 || !strings.Contains(vs[0].Detail, "member 1") {
		t.Fatalf("stalls elsewhere: got %v, want member 1's late call", vs)
	}
}

func TestScheduleReproducible(t *testing.T) {
	a, b := NewSchedule(42, ModeStrict, 3, 10*time.Second), NewSchedule(42, ModeStrict, 3, 10*time.Second)
	if a.FaultCount() == 0 || len(a.Faults) != len(b.Faults) {
		t.Fatalf("seed 42: %d and %d faults", len(a.Faults), len(b.Faults))
	}
	for i := range a.Faults {
		if a.Faults[i] != b.Faults[i] {
			t.Fatalf("fault %d: %v and %v", i, a.Faults[i], b.Faults[i])
		}
	}
	// Faults on Redis never overlap, nor do two on one member.
	busy := map[int]time.Duration{}
	for _, f := range a.Faults {
		if f.At < busy[f.Target] {
			t.Errorf("fault %v overlaps the one before on target %d", f, f.Target)
		}
		busy[f.Target] = f.At + f.For
		if f.At+f.For > a.Duration-time.Second {
			t.Errorf("fault %v runs into the run's last second", f)
		}
	}
}

// TestScheduleKinds: each mode draws only the faults that act on what it runs (no toxic
// in the gossip mode, which has no store; no Redis fault on etcd or ZooKeeper, but old
// state restored there too; the
// gossip network faults and owner faults only there, an owner fault with a workload key
// and no target until it starts), and over 50 seeds it draws each of them.
func TestScheduleKinds(t *testing.T) {
	toxics := []FaultKind{FaultLatency, FaultBandwidth, FaultTimeout, FaultResetPeer, FaultBlackHole, FaultProxyDown, FaultPartition}
	members := []FaultKind{FaultMemberKill, FaultMemberStop}
	redis := []FaultKind{FaultRedisStop, FaultRedisEmpty, FaultRestoreOld}
	stores := []FaultKind{FaultStoreStop, FaultStoreKill, FaultStoreWipe, FaultRestoreOld} // restore_old: a data directory put back
	peers := []FaultKind{FaultPeerPartition, FaultLinkCut, FaultPeerLoss, FaultPeerDelay}
	owners := []FaultKind{FaultOwnerKill, FaultOwnerPartition}
	cat := func(ks ...[]FaultKind) []FaultKind { return slices.Concat(ks...) }
	want := map[Mode][]FaultKind{
		ModeStrict:      cat(toxics, members, redis),
		ModeStrictLocal: cat(toxics, members, redis),
		ModeLease:       cat(toxics, members, redis, []FaultKind{FaultAllocatorKill}), // the allocator: odd seeds, the relay on
		ModeDaemon:      cat(toxics, members, redis, []FaultKind{FaultDaemonKill, FaultDaemonStop}),
		ModeLeaseEtcd:   cat(toxics, members, stores),
		ModeLeaseZK:     cat(toxics, members, stores),
		ModeGossip:      cat(members, peers, owners),
		ModeDaemonLease: cat(toxics, members, redis, []FaultKind{FaultDaemonKill, FaultDaemonStop}),
		// No store: the toxics act on the members' links to their daemons, the gossip
		// network faults between the daemons (DaemonNet).
		ModeDaemonGossip: cat(toxics, members, []FaultKind{FaultDaemonKill, FaultDaemonStop}, peers, owners),
	}
	for _, m := range Modes {
		seen := map[FaultKind]bool{}
		for seed := range uint64(50) {
			for _, f := range NewSchedule(seed, m, 3, 10*time.Second).Faults {
				if !slices.Contains(want[m], f.Kind) {
					t.Fatalf("mode %s seed %d: %v", m, seed, f)
				}
				if f.Kind == FaultLinkCut && (f.Peer == f.Target || f.Peer < 0 || f.Peer >= 3) {
					t.Fatalf("mode %s seed %d: %v cuts no link", m, seed, f)
				}
				if f.Link == "r" && m != ModeDaemon && m != ModeDaemonLease {
					t.Fatalf("mode %s seed %d: %v acts on a daemon's link to a store it does not have", m, seed, f)
				}
				if isOwnerFault(f.Kind) && (f.Target != -1 || !slices.ContainsFunc(Groups, func(g Group) bool { return slices.Contains(g.Keys, f.Key) }) ||
					f.For > OwnerFaultMax || (f.For < OwnerKillMin || f.Kind == FaultOwnerPartition && f.For < OwnerCutMin) && f.At+f.For != 9*time.Second) {
					t.Fatalf("mode %s seed %d: %v: want a workload key, its target found at run time, and %v (a cut: %v) to %v (less only at the run's end)", m, seed, f, OwnerKillMin, OwnerCutMin, OwnerFaultMax)
				}
				if f.Kind == FaultAllocatorKill && (f.Target != -1 || seed%2 == 0) {
					t.Fatalf("mode %s seed %d: %v: want it on odd seeds only (the relay on), its target found at run time", m, seed, f)
				}
				seen[f.Kind] = true
			}
		}
		for _, k := range want[m] {
			if !seen[k] {
				t.Errorf("mode %s: no %s in 50 seeds", m, k)
			}
		}
	}
}

func TestParseLine(t *testing.T) {
	var h History
	for _, l := range []string{
		Op{Proc: 1, Kind: "wait", Key: "b0", N: 2, Call: 5, Return: 9, Timeout: OpTimeout, Outcome: "error:deadline"}.line(),
		Use{Proc: 1, Key: "b0", N: 2, Slot: 7, Call: 5, At: 9}.line(),
		Lease{Proc: 1, Key: "b0", T: 5, Rate: 12.5, From: 1, Until: 3, Asked: 1}.line(),
		Pool{Proc: 1, At: 4, Members: 3}.line(),
		Stall{Proc: 1, From: 5, To: 6}.line(),
	} {
		if err := h.parseLine(strings.TrimSpace(l)); err != nil {
			t.Fatal(err)
		}
	}
	if len(h.Ops) != 1 || h.Ops[0].Outcome != "error:deadline" || h.Uses[0].Slot != 7 || h.Leases[0].Rate != 12.5 ||
		len(h.Pools) != 1 || h.Pools[0].Members != 3 || len(h.Stalls) != 1 || h.Stalls[0].To != 6 {
		t.Fatalf("round trip: %+v", h)
	}
	for _, bad := range []string{"", "X 1", "O 1 wait b0 x 5 9 1 ok", "U 1 b0 2 7 5", "L 1 b0 5 fast 1 3 1", "L 1 b0 5 1 1 3"} {
		if err := h.parseLine(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestCheckFallback(t *testing.T) {
	// Member 0's fallback at a third of a0's limit (tightened: burst 6, a third: 2 permits,
	// one each 15 ms): 2 at once, then one every 15 ms conform; a third at once does not.
	// Grants on Redis' clock are not the fallback's to judge.
	h := &History{Uses: []Use{
		{Proc: 0, Key: "a0", N: 1, Slot: 100 * ms}, {Proc: 0, Key: "a0", N: 1, Slot: 100 * ms},
		{Proc: 0, Key: "a0", N: 1, Slot: 115 * ms}, {Proc: 0, Key: "a0", N: 1, Slot: 130 * ms},
		{Proc: 1, Key: "a0", N: 2, Slot: 100 * ms}, // another member's own share
		{Proc: 0, Key: "a0", N: 6, Slot: redis},    // decided by Redis
	}}
	if vs := CheckFallback(h, 0, 1.0/3); len(vs) != 0 {
		t.Fatalf("conforming fallback grants: %v", vs)
	}
	h.Uses = append(h.Uses, Use{Proc: 1, Key: "a0", N: 1, Slot: 101 * ms})
	vs := CheckFallback(h, 0, 1.0/3)
	if len(vs) != 1 || !strings.Contains(vs[0].Detail, "member 1 key a0") {
		t.Fatalf("got %v, want member 1's third permit in 1 ms refused", vs)
	}
}

func TestCheckGossip(t *testing.T) {
	// a0 is 200/s burst=10, decided at its owner (three members, policy auto): exact, and
	// a moved key fenced, so the check allows an interval's rate (20 at 200/s and 100 ms)
	// for bookings reported late beyond burst + rate × window. 10 at once and then the
	// rate are 0 beyond it; 33 more in the same instant are 33 beyond.
	if !DecidedAtOwner(limitconv.Core(sluice.MustParse(Groups[0].Limits), Margin), 3) {
		t.Fatal("a0 decided by shares, want at its owner")
	}
	h := &History{}
	for range 10 {
		h.Uses = append(h.Uses, use(0, 1, 1000))
	}
	for i := range int64(100) {
		h.Uses = append(h.Uses, use(1, 1, 1005+5*i))
	}
	vs, _, note := CheckGossip(h, 0, 3, false, Groups)
	if len(vs) != 0 || !strings.Contains(note, "largest excess over any window 0.0") || !strings.Contains(note, "5 of 5 keys decided at their owner") {
		t.Fatalf("at the limit: %v (%s)", vs, note)
	}
	for range 33 {
		h.Uses = append(h.Uses, use(2, 1, 1300))
	}
	vs, _, _ = CheckGossip(h, 0, 3, false, Groups)
	if len(vs) != 1 || !strings.Contains(vs[0].Detail, "33.0 permits beyond") || !strings.Contains(vs[0].Detail, "decided at its owner") {
		t.Fatalf("33 over: got %v, want one violation of 33 permits", vs)
	}
	// A paused member allows two intervals' rate more (40): 33 is within it.
	if vs, _, _ = CheckGossip(h, 0, 3, true, Groups); len(vs) != 0 {
		t.Fatalf("33 over with a member paused: %v", vs)
	}
	// A split shorter, with the rejoin after it (2 s), than hold + 5 intervals (2.5 s)
	// moves nothing and allows nothing more at the owner (by shares: a burst): 33 over.
	h.Splits = [][2]int64{{1000 * ms, 1400 * ms}}
	vs, _, _ = CheckGossip(h, 0, 3, false, Groups)
	if len(vs) != 1 || !strings.Contains(vs[0].Detail, "0.0 of it for the splits") {
		t.Fatalf("33 over in a 0.4 s split: got %v, want one violation, nothing allowed for the split", vs)
	}
	// A longer one lets each side's owner decide at the full rate past the hold: a 1 s
	// split and its rejoin (3 s) add 0.5 s × 200/s = 100, and no burst.
	h.Splits = [][2]int64{{1200 * ms, 2200 * ms}}
	if vs, _, _ = CheckGossip(h, 0, 3, false, Groups); len(vs) != 0 {
		t.Fatalf("33 over in a 1 s split: %v", vs)
	}
	// The split's aftermath lasts until the cut member counts its peers again, which may
	// take two rejoin rounds (gossip.RejoinEvery) after the heal: a window 0.3 s after
	// the heal still meets it (two intervals, 0.2 s, did not: the run of
	// TestGossipPartitionBites flagged 25 permits 0.2 to 0.9 s after a heal).
	h.Splits = [][2]int64{{0, 1000 * ms}}
	if vs, _, _ = CheckGossip(h, 0, 3, false, Groups); len(vs) != 0 {
		t.Fatalf("33 over 0.3 s after a split healed: %v", vs)
	}
	h.Splits = [][2]int64{{-3000 * ms, -2000 * ms}}
	vs, _, _ = CheckGossip(h, 0, 3, false, Groups)
	if len(vs) != 1 || !strings.Contains(vs[0].Detail, "33.0 permits beyond") || !strings.Contains(vs[0].Detail, "0.0 of it for the splits") {
		t.Fatalf("33 over, a split over long before: got %v, want one violation", vs)
	}
	// 113 over in a 1 s split: within 20 + 100; with a second burst of the key (10 more,
	// what a new owner not fenced would grant) it is past it.
	for range 80 {
		h.Uses = append(h.Uses, use(2, 1, 1301))
	}
	h.Splits = [][2]int64{{1000 * ms, 2000 * ms}}
	if vs, _, _ = CheckGossip(h, 0, 3, false, Groups); len(vs) != 0 {
		t.Fatalf("113 over in a 1 s split: %v", vs)
	}
	for range 10 {
		h.Uses = append(h.Uses, use(2, 1, 1301))
	}
	if vs, _, _ = CheckGossip(h, 0, 3, false, Groups); len(vs) != 1 {
		t.Fatalf("123 over in a 1 s split: got %v, want one violation (a second burst)", vs)
	}
}

// TestCheckGossipShares: a key decided by shares (a limit large enough that auto leaves it
// to shares) may exceed by hits.Bound (a permit per member) and an interval's rate, and a
// split adds a burst.
func TestCheckGossipShares(t *testing.T) {
	groups := []Group{{Limits: "20000/s burst=4000", Keys: []string{"s0"}}}
	if DecidedAtOwner(limitconv.Core(sluice.MustParse(groups[0].Limits), Margin), 3) {
		t.Fatal("20000/s burst=4000 decided at its owner, want by shares")
	}
	h := &History{}
	for range 4000 + 3 + 2000 {
		h.Uses = append(h.Uses, Use{Proc: 0, Key: "s0", N: 1, At: 1000 * ms})
	}
	if vs, _, _ := CheckGossip(h, 0, 3, false, groups); len(vs) != 0 {
		t.Fatalf("the burst, 3 permits and an interval's rate over: %v", vs)
	}
	h.Uses = append(h.Uses, Use{Proc: 0, Key: "s0", N: 1, At: 1000 * ms})
	vs, _, _ := CheckGossip(h, 0, 3, false, groups)
	if len(vs) != 1 || !strings.Contains(vs[0].Detail, "decided by shares") {
		t.Fatalf("one more: got %v, want one violation", vs)
	}
	h.Splits = [][2]int64{{1000 * ms, 1400 * ms}}
	if vs, _, _ = CheckGossip(h, 0, 3, false, groups); len(vs) != 0 {
		t.Fatalf("a burst more in a 0.4 s split: %v", vs)
	}
}
