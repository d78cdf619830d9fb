package allot

import (
	"bytes"
	"errors"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gcra"
)

const (
	ms  = int64(time.Millisecond)
	sec = int64(time.Second)
	all = RateScale
)

func lim(rate int64, period time.Duration, burst int64) gcra.Limit {
	t := (int64(period) + rate - 1) / rate
	return gcra.Limit{T: t, Tau: burst * t}
}

// pool drives one State with requests at fixed times, remembering each member's epoch and
// newest lease as a member would.
type pool struct {
	t     *testing.T
	s     *State
	cfg   Config
	epoch map[string]Epoch
	seq   map[string]uint64
}

func newPool(t *testing.T, l gcra.Limit, cfg Config, fence int64) *pool {
	s, err := NewState(l, 7, 0, fence, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &pool{t: t, s: s, cfg: cfg, epoch: map[string]Epoch{}, seq: map[string]uint64{}}
}

// step is one request at a virtual time and what must come of it.
type step struct {
	at     int64
	op     Op
	member string
	demand int64
	stale  bool  // InUse: the member has not switched to its newest lease
	want   Share // the share granted
	fill   int64 // the burst handed over full, in permits
	err    error
}

func (p *pool) run(steps []step) {
	p.t.Helper()
	for i, st := range steps {
		req := Request{Op: st.op, Member: st.member, Epoch: p.epoch[st.member], Demand: st.demand}
		if !st.stale {
			req.InUse = p.seq[st.member]
		}
		rep, err := p.s.Apply(st.at, p.cfg, req)
		if !errors.Is(err, st.err) {
			p.t.Fatalf("step %d (t=%v %v %s): got error %v, want %v", i, time.Duration(st.at), st.op, st.member, err, st.err)
		}
		if cerr := p.s.Check(st.at); cerr != nil {
			p.t.Fatalf("step %d: %v", i, cerr)
		}
		if err != nil || st.op == OpRelease || st.op == OpPenalize {
			continue
		}
		p.epoch[st.member] = rep.Epoch
		p.seq[st.member] = rep.Lease.Seq
		if rep.Lease.Share != st.want {
			p.t.Errorf("step %d (t=%v %v %s): got share %+v, want %+v", i, time.Duration(st.at), st.op, st.member, rep.Lease.Share, st.want)
		}
		if got := rep.Fill / p.s.Limit.T; got != st.fill {
			p.t.Errorf("step %d (t=%v %v %s): got fill %d permits, want %d", i, time.Duration(st.at), st.op, st.member, got, st.fill)
		}
	}
}

func cfg(policy Policy) Config {
	return Config{TTL: time.Second, Grace: 500 * time.Millisecond, Policy: policy}
}

// TestNewcomerGetsOnlyWhatIsFree: 10/s burst 6. A holds everything; B joins and gets
// nothing until A has switched to its smaller share (its next renewal shrinks it, the one
// after says it uses the smaller lease). B's share then starts with what the freed
// capacity saved up since A let it go.
func TestNewcomerGetsOnlyWhatIsFree(t *testing.T) {
	p := newPool(t, lim(10, time.Second, 6), cfg(Fair), 0)
	half := Share{all / 2, 3}
	p.run([]step{
		{at: 0, op: OpJoin, member: "a", demand: all, want: Share{all, 6}, fill: 6},
		{at: 100 * ms, op: OpJoin, member: "b", demand: all, want: Share{}},
		{at: 200 * ms, op: OpRenew, member: "b", demand: all, want: Share{}},
		// A shrinks to half; its old lease (the whole limit) is still counted.
		{at: 250 * ms, op: OpRenew, member: "a", demand: all, want: half},
		{at: 300 * ms, op: OpRenew, member: "b", demand: all, want: Share{}},
		// A says it uses the half lease: the other half is free from 500 ms.
		{at: 500 * ms, op: OpRenew, member: "a", demand: all, want: half},
		// 200 ms at half of 10/s saved one permit for B.
		{at: 700 * ms, op: OpRenew, member: "b", demand: all, want: half, fill: 1},
		{at: 950 * ms, op: OpRenew, member: "b", demand: all, want: half},
	})
}

// TestShrinkWaitsForTheOldLease: the freed half stays counted while A has not said it
// switched (its reply was lost); it frees when A's old lease passes quarantine.
func TestShrinkWaitsForTheOldLease(t *testing.T) {
	p := newPool(t, lim(10, time.Second, 6), cfg(Fair), 0)
	half := Share{all / 2, 3}
	p.run([]step{
		{at: 0, op: OpJoin, member: "a", demand: all, want: Share{all, 6}, fill: 6},
		{at: 100 * ms, op: OpJoin, member: "b", demand: all, want: Share{}},
		{at: 250 * ms, op: OpRenew, member: "a", demand: all, want: half},
		// A never got the half lease: it still reports the whole one.
		{at: 500 * ms, op: OpRenew, member: "a", demand: all, stale: true, want: half},
		{at: 750 * ms, op: OpRenew, member: "a", demand: all, stale: true, want: half},
		{at: 1000 * ms, op: OpRenew, member: "b", demand: all, want: Share{}},
		// The whole-limit lease granted at 0 expires at 1 s and is quarantined to 1.5 s.
		{at: 1499 * ms, op: OpRenew, member: "b", demand: all, want: Share{}},
		{at: 1500 * ms, op: OpRenew, member: "b", demand: all, want: half},
	})
}

// TestCrashedMemberIsQuarantined: A crashes at 0 (it never renews). B sees A's share only
// after A's lease expired (TTL) and passed quarantine (Grace), and gets it whole: the
// capacity saved nothing while it counted as A's.
func TestCrashedMemberIsQuarantined(t *testing.T) {
	p := newPool(t, lim(10, time.Second, 6), cfg(Fair), 0)
	half := Share{all / 2, 3}
	p.run([]step{
		{at: 0, op: OpJoin, member: "a", demand: all, want: Share{all, 6}, fill: 6},
		{at: 0, op: OpJoin, member: "b", demand: all, want: Share{}},
		{at: 1 * ms, op: OpRenew, member: "a", demand: all, want: half},
		{at: 2 * ms, op: OpRenew, member: "a", demand: all, want: half},
		{at: 3 * ms, op: OpRenew, member: "b", demand: all, want: half},
		// A crashed after 2 ms: its lease expires at 1.002 s, quarantined until 1.502 s.
		{at: 1200 * ms, op: OpRenew, member: "b", demand: all, want: half},
		{at: 1501 * ms, op: OpRenew, member: "b", demand: all, want: half},
		{at: 1502 * ms, op: OpRenew, member: "b", demand: all, want: Share{all, 6}},
		// A comes back too late: its registration is gone.
		{at: 1600 * ms, op: OpRenew, member: "a", demand: all, err: ErrStaleEpoch},
		{at: 1600 * ms, op: OpJoin, member: "a", demand: all, want: Share{}},
	})
}

// TestIdleMemberHandsItsShareBack: with the fair policy a member that reports no demand
// gives its share up at that renewal, to the free capacity (where others grow into it,
// or borrow its saved burst); a newcomer gets it once the idle member has said it uses
// its new, empty lease.
func TestIdleMemberHandsItsShareBack(t *testing.T) {
	p := newPool(t, lim(10, time.Second, 6), cfg(Fair), 0)
	p.run([]step{
		{at: 0, op: OpJoin, member: "a", demand: all, want: Share{all, 6}, fill: 6},
		{at: 250 * ms, op: OpRenew, member: "a", demand: 0, want: Share{}},
		{at: 300 * ms, op: OpJoin, member: "b", demand: all, want: Share{}},
		{at: 500 * ms, op: OpRenew, member: "a", demand: 0, want: Share{}},
		{at: 501 * ms, op: OpRenew, member: "a", demand: 0, want: Share{}},
		{at: 550 * ms, op: OpRenew, member: "b", demand: all, want: Share{all, 6}},
	})
}

// TestUnequalDemand: a member that asks for a twentieth of the limit gets it, with
// headroom while the limit has room (half as much again) and two fifths of the burst
// beyond its first permit (the rest stays free), and the other, which wants all it can
// get, the rest; once the first member renews, its share is its demand.
func TestUnequalDemand(t *testing.T) {
	p := newPool(t, lim(100, time.Second, 10), cfg(Fair), 0)
	p.run([]step{
		{at: 0, op: OpJoin, member: "a", demand: all / 20, want: Share{all / 20 * 3 / 2, 4}, fill: 4},
		{at: 0, op: OpJoin, member: "b", demand: all, want: Share{all - all/20*3/2, 6}, fill: 6},
		{at: 1 * ms, op: OpRenew, member: "a", demand: all / 20, want: Share{all / 20, 1}},
		{at: 2 * ms, op: OpRenew, member: "a", demand: all / 20, want: Share{all / 20, 1}},
		{at: 3 * ms, op: OpRenew, member: "b", demand: all, want: Share{all - all/20, 9}},
	})
}

// TestDemandBelowTheLimitKeepsAReserve: two members whose demands (30% and 20% of
// 100/s burst 20) leave room get them with headroom, while 40% of the rate and a part of
// the burst stay free: the reserve members borrow from. When the second member's demand
// grows to 50%, the demands (80%) leave less than the reserve free: both shares are scaled
// to 60% of the limit, below the demands (the rest is borrowed), and the second member's
// grows at its own renewal, from the free capacity, while the first still holds its older,
// larger lease (it has not renewed yet).
func TestDemandBelowTheLimitKeepsAReserve(t *testing.T) {
	p := newPool(t, lim(100, time.Second, 20), cfg(Fair), 0)
	p.run([]step{
		{at: 0, op: OpJoin, member: "a", demand: 300000, want: Share{450000, 8}, fill: 8},
		{at: 0, op: OpJoin, member: "b", demand: 200000, want: Share{240000, 4}, fill: 4},
		{at: 250 * ms, op: OpRenew, member: "a", demand: 300000, want: Share{360000, 5}},
		{at: 260 * ms, op: OpRenew, member: "b", demand: 500000, want: Share{375000, 5}, fill: 1},
		{at: 500 * ms, op: OpRenew, member: "a", demand: 300000, want: Share{225000, 4}},
		{at: 510 * ms, op: OpRenew, member: "a", demand: 300000, want: Share{225000, 4}}, // it uses it
	})
	if c := p.s.Committed(510 * ms); c != (Share{600000, 9}) {
		t.Errorf("the shares hold %+v of the limit at 510 ms, want 60%% of its rate and 9 permits of its burst", c)
	}
}

// TestFenceAfterRestart: a record made by a store that restarted empty grants nothing
// until TTL + Grace after the restart; the burst then starts empty and refills.
func TestFenceAfterRestart(t *testing.T) {
	p := newPool(t, lim(10, time.Second, 6), cfg(Fair), 1500*ms)
	p.run([]step{
		{at: 0, op: OpJoin, member: "a", demand: all, want: Share{}},
		{at: 1499 * ms, op: OpRenew, member: "a", demand: all, want: Share{}},
		{at: 1500 * ms, op: OpRenew, member: "a", demand: all, want: Share{all, 6}},
	})
	// A second record made after the fence: its burst refilled from the fence on.
	s, _ := NewState(lim(10, time.Second, 6), 8, 1800*ms, 1500*ms, cfg(Fair))
	rep, err := s.Apply(1800*ms, cfg(Fair), Request{Op: OpJoin, Member: "a", Demand: all})
	if err != nil || rep.Lease.Share != (Share{all, 6}) || rep.Fill/s.Limit.T != 3 {
		t.Errorf("after the fence: %+v fill %d permits, %v; want the whole limit and 3 permits", rep.Lease, rep.Fill/s.Limit.T, err)
	}
}

// TestSmallLimitIsDecidedAtTheStore: a limit too small to share out (1/6s: a burst of one
// permit, and a share would grant less than a permit per lease) is decided at the store as
// soon as two members want it: nobody holds a share, the first member's share is counted
// until it says it gave it up, and takes draw on the free capacity one permit every 6 s,
// booked ahead within TTL + Grace. When one member is left, shares come back.
func TestSmallLimitIsDecidedAtTheStore(t *testing.T) {
	c := cfg(Fair)
	c.JoinWindow = 0
	c.TTL, c.Grace = 10*time.Second, time.Second // members that need not renew between the steps
	l := lim(1, 6*time.Second, 1)
	s, _ := NewState(l, 1, 0, 0, c)
	apply := checkedApply(t, s, c)
	a := apply(0, Request{Op: OpJoin, Member: "a", Demand: all})
	if a.Lease.Share != (Share{Rate: all, Burst: 1}) || a.Central {
		t.Fatalf("a alone: %+v", a)
	}
	b := apply(1*ms, Request{Op: OpJoin, Member: "b", Demand: all})
	if !b.Central || !b.Lease.Share.IsZero() {
		t.Fatalf("b joins: %+v, want the limit decided at the store", b)
	}
	// a still holds its share (counted until it says it switched): no take yet.
	if r := apply(2*ms, Request{Op: OpTake, Member: "b", Epoch: b.Epoch, N: 1, MaxDelay: int64(time.Hour)}); r.Taken {
		t.Fatalf("a take while a holds the whole limit: %+v", r)
	}
	a = apply(250*ms, Request{Op: OpRenew, Member: "a", Epoch: a.Epoch, InUse: a.Lease.Seq, Demand: all})
	if !a.Central || !a.Lease.Share.IsZero() {
		t.Fatalf("a renews: %+v, want no share", a)
	}
	a = apply(260*ms, Request{Op: OpRenew, Member: "a", Epoch: a.Epoch, InUse: a.Lease.Seq, Demand: all})
	// The freed capacity starts empty: the first take is booked 6 s on, within TTL+Grace
	// only if asked for it; then one every 6 s.
	r := apply(300*ms, Request{Op: OpTake, Member: "b", Epoch: b.Epoch, N: 1})
	if r.Taken || r.Wait <= 0 {
		t.Fatalf("a take now: %+v, want a wait", r)
	}
	r = apply(6300*ms, Request{Op: OpTake, Member: "b", Epoch: b.Epoch, N: 1})
	if !r.Taken || r.Wait != 0 {
		t.Fatalf("a take at 6.3 s: %+v", r)
	}
	r = apply(6400*ms, Request{Op: OpTake, Member: "a", Epoch: a.Epoch, N: 1, MaxDelay: int64(time.Hour)})
	if !r.Taken || r.Wait != int64(6*time.Second)-100*ms {
		t.Fatalf("a booked take: %+v, want 5.9 s ahead", r)
	}
	// b leaves: one member wants the limit, but a take is booked ahead: shares come back
	// only after it.
	apply(7*sec, Request{Op: OpRelease, Member: "b", Epoch: b.Epoch})
	a = apply(7*sec+1, Request{Op: OpRenew, Member: "a", Epoch: a.Epoch, InUse: a.Lease.Seq, Demand: all})
	if !a.Central {
		t.Fatalf("shares came back with a take booked ahead: %+v", a)
	}
	a = apply(13*sec, Request{Op: OpRenew, Member: "a", Epoch: a.Epoch, InUse: a.Lease.Seq, Demand: all})
	if a.Central || a.Lease.Share.Rate != all {
		t.Fatalf("a alone again after the booking: %+v", a)
	}
}

// TestEqualPolicyAgreement: Numaflow's throttler's rule. Three members report the pool size they were
// told; while they disagree, the largest size reported wins (everyone gets less).
func TestEqualPolicyAgreement(t *testing.T) {
	s, _ := NewState(lim(30, time.Second, 30), 1, 0, 0, cfg(Equal))
	c := cfg(Equal)
	epochs := map[string]Epoch{}
	seqs := map[string]uint64{}
	ask := func(at int64, op Op, m string, size int64) Reply {
		t.Helper()
		rep, err := s.Apply(at, c, Request{Op: op, Member: m, Epoch: epochs[m], InUse: seqs[m], Size: size})
		if err != nil {
			t.Fatal(err)
		}
		epochs[m], seqs[m] = rep.Epoch, rep.Lease.Seq
		return rep
	}
	for i, st := range []struct {
		at        int64
		op        Op
		m         string
		size      int64
		wantSize  int64
		wantShare Share
	}{
		{0, OpJoin, "a", 0, 1, Share{all, 30}},
		{0, OpJoin, "b", 0, 2, Share{}}, // disagreement (a said 0): max(2, 0)
		{0, OpJoin, "c", 0, 3, Share{}},
		{10 * ms, OpRenew, "a", 1, 3, Share{all / 3, 10}},
		{20 * ms, OpRenew, "a", 3, 3, Share{all / 3, 10}},
		{30 * ms, OpRenew, "b", 3, 3, Share{all / 3, 10}},
		{40 * ms, OpRenew, "c", 3, 3, Share{all / 3, 10}},
		// c leaves; a and b still say 3: they keep a third each until they agree on 2.
		{50 * ms, OpRelease, "c", 3, 0, Share{}},
		{60 * ms, OpRenew, "a", 3, 3, Share{all / 3, 10}},
		{70 * ms, OpRenew, "b", 2, 3, Share{all / 3, 10}},
		{80 * ms, OpRenew, "a", 2, 2, Share{all / 2, 15}},
	} {
		rep := ask(st.at, st.op, st.m, st.size)
		if st.op == OpRelease {
			continue
		}
		if rep.Size != st.wantSize || rep.Lease.Share != st.wantShare {
			t.Errorf("step %d: got size %d share %+v, want %d %+v", i, rep.Size, rep.Lease.Share, st.wantSize, st.wantShare)
		}
	}
}

// TestReleaseFreesAtOnceOrAfterReservations: a release frees the share at once, or when
// the member's last reserved permit is due.
func TestReleaseFreesAtOnceOrAfterReservations(t *testing.T) {
	p := newPool(t, lim(10, time.Second, 6), cfg(Fair), 0)
	p.run([]step{
		{at: 0, op: OpJoin, member: "a", demand: all, want: Share{all, 6}, fill: 6},
		{at: 0, op: OpJoin, member: "b", demand: all, want: Share{}},
	})
	if _, err := p.s.Apply(10*ms, p.cfg, Request{Op: OpRelease, Member: "a", Epoch: p.epoch["a"], InUse: p.seq["a"], BusyFor: 200 * ms}); err != nil {
		t.Fatal(err)
	}
	p.run([]step{
		{at: 209 * ms, op: OpRenew, member: "b", demand: all, want: Share{}},
		{at: 210 * ms, op: OpRenew, member: "b", demand: all, want: Share{all, 6}},
	})
	if len(p.s.Members) != 1 {
		t.Errorf("members %+v: the released one should be gone", p.s.Members)
	}
}

// TestRejoinUnderTheSameName: a second registration under a name counts the first one's
// share beside its own until the first one's quarantine ends (it may be another process).
func TestRejoinUnderTheSameName(t *testing.T) {
	p := newPool(t, lim(10, time.Second, 6), cfg(Fair), 0)
	p.run([]step{
		{at: 0, op: OpJoin, member: "a", demand: all, want: Share{all, 6}, fill: 6},
		{at: 100 * ms, op: OpJoin, member: "a", demand: all, want: Share{}},
		{at: 200 * ms, op: OpRenew, member: "a", demand: all, want: Share{}},
		{at: 1500 * ms, op: OpRenew, member: "a", demand: all, want: Share{all, 6}},
	})
}

func TestPenaltyReachesEveryMember(t *testing.T) {
	p := newPool(t, lim(10, time.Second, 6), cfg(Fair), 0)
	p.run([]step{{at: 0, op: OpJoin, member: "a", demand: all, want: Share{all, 6}, fill: 6}})
	if rep, err := p.s.Apply(10*ms, p.cfg, Request{Op: OpPenalize, Member: "b", Hold: 2 * sec}); err != nil || rep.Penalty != 2*sec {
		t.Fatalf("penalize: %+v %v", rep, err)
	}
	rep, err := p.s.Apply(510*ms, p.cfg, Request{Op: OpRenew, Member: "a", Epoch: p.epoch["a"], InUse: p.seq["a"], Demand: all})
	if err != nil || rep.Penalty != 1500*ms {
		t.Fatalf("renew during the penalty: penalty %v %v, want 1.5s", time.Duration(rep.Penalty), err)
	}
}

func TestBadRequests(t *testing.T) {
	s, _ := NewState(lim(10, time.Second, 6), 1, 0, 0, cfg(Fair))
	if _, err := s.Apply(0, cfg(Fair), Request{Op: 99, Member: "a"}); !errors.Is(err, ErrBadRequest) {
		t.Errorf("unknown op: %v", err)
	}
	if _, err := s.Apply(0, cfg(Fair), Request{Op: OpJoin}); !errors.Is(err, ErrBadRequest) {
		t.Errorf("no member: %v", err)
	}
	if _, err := s.Apply(0, cfg(Fair), Request{Op: OpRenew, Member: "x", Epoch: Epoch{1, 1}}); !errors.Is(err, ErrStaleEpoch) {
		t.Errorf("unknown member: %v", err)
	}
	if err := (Config{}).Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("zero config: %v", err)
	}
	if _, err := ParsePolicy("greedy"); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("policy: %v", err)
	}
}

func TestStateRoundTrip(t *testing.T) {
	p := newPool(t, lim(10, time.Second, 6), cfg(Fair), 0)
	p.run([]step{
		{at: 0, op: OpJoin, member: "a", demand: all, want: Share{all, 6}, fill: 6},
		{at: 0, op: OpJoin, member: "b", demand: all, want: Share{}},
		{at: 1 * ms, op: OpRenew, member: "a", demand: all, want: Share{all / 2, 3}},
	})
	b := MarshalState(p.s)
	got, err := UnmarshalState(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, p.s) {
		t.Errorf("round trip changed the record:\n%+v\n%+v", got, p.s)
	}
	t.Logf("a record of two members is %d bytes", len(b))
}

// TestStateDecodesFormat1: a record written before windows and ramps (format 1, made by
// the code of that time: testdata/state-v1.bin) still decodes, as a limit without either,
// and a plain limit's record is still written in format 1.
func TestStateDecodesFormat1(t *testing.T) {
	b, err := os.ReadFile("testdata/state-v1.bin")
	if err != nil {
		t.Fatal(err)
	}
	if b[0] != stateFormatV1 {
		t.Fatalf("testdata/state-v1.bin is format %d", b[0])
	}
	s, err := UnmarshalState(b)
	if err != nil {
		t.Fatal(err)
	}
	p := newPool(t, lim(10, time.Second, 6), cfg(Fair), 0)
	p.run([]step{
		{at: 0, op: OpJoin, member: "a", demand: all, want: Share{all, 6}, fill: 6},
		{at: 0, op: OpJoin, member: "b", demand: all, want: Share{}},
		{at: 1 * ms, op: OpRenew, member: "a", demand: all, want: Share{all / 2, 3}},
	})
	if !reflect.DeepEqual(s, p.s) {
		t.Errorf("format 1 decoded as\n%+v\nwant\n%+v", s, p.s)
	}
	// A plain limit's record is written as before, byte for byte: members of the version
	// before read it.
	if out := MarshalState(s); !bytes.Equal(out, b) {
		t.Errorf("written back as %x, want %x (format 1, as read)", out, b)
	}
}

// TestStateRoundTripWindowAndRamp: format 2's fields survive a round trip.
func TestStateRoundTripWindowAndRamp(t *testing.T) {
	w := gcra.Limit{T: 100 * ms, Tau: 100 * 100 * ms, Window: 10 * sec}
	s, err := NewState(w, 7, 3*sec, 0, cfg(Fair))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(3*sec, cfg(Fair), Request{Op: OpJoin, Member: "a", Want: 5}); err != nil {
		t.Fatal(err)
	}
	r := lim(10, time.Second, 6)
	r.Ramp = gcra.Ramp{T0: sec, Over: 60 * sec}
	s2, err := NewState(r, 7, 4*sec, 0, cfg(Fair))
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range []*State{s, s2} {
		got, err := UnmarshalState(MarshalState(st))
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Members) == 0 {
			got.Members = st.Members // nil and empty are one record
		}
		if !reflect.DeepEqual(got, st) {
			t.Errorf("record %d: round trip changed it:\n%+v\n%+v", i, got, st)
		}
	}
	if s.Granted != 1 || s.Members[0].Chunk != 1 || s.WindowEnd != 10*sec || s2.RampStart != 4*sec {
		t.Errorf("granted %d, chunk %d, window end %v, ramp start %v", s.Granted, s.Members[0].Chunk, s.WindowEnd, s2.RampStart)
	}
}

// TestStateRoundTripCritical: a record with critical demand is written in format 3 and
// survives a round trip; once no member reports any, it is written as before (format 1 for
// a plain limit), so that members of an earlier version read it.
func TestStateRoundTripCritical(t *testing.T) {
	c := cfg(Fair)
	s, _ := NewState(lim(10, time.Second, 6), 7, 0, 0, c)
	if _, err := s.Apply(0, c, Request{Op: OpJoin, Member: "a", Demand: all / 2, Critical: all / 4}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(0, c, Request{Op: OpJoin, Member: "b", Demand: all}); err != nil {
		t.Fatal(err)
	}
	b := MarshalState(s)
	if b[0] != stateFormatClasses {
		t.Fatalf("format %d, want %d", b[0], stateFormatClasses)
	}
	got, err := UnmarshalState(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, s) {
		t.Errorf("round trip changed it:\n%+v\n%+v", got, s)
	}
	s.Members[0].Critical = 0
	if b := MarshalState(s); b[0] != stateFormatV1 {
		t.Errorf("without critical demand: format %d, want %d", b[0], stateFormatV1)
	}
}

// FuzzStateCodec: no input makes the decoder panic, and whatever decodes encodes back to
// the same bytes.
func FuzzStateCodec(f *testing.F) {
	p := newPool(&testing.T{}, lim(10, time.Second, 6), cfg(Fair), 0)
	f.Add(MarshalState(p.s))
	p.s.Members = append(p.s.Members, Entry{ID: "x", Epoch: Epoch{Incarnation: 9, N: 3}, Held: Share{5, 1}, HeldUntil: -7})
	f.Add(MarshalState(p.s))
	f.Add([]byte{1, 2, 3})
	w, _ := NewState(gcra.Limit{T: ms, Tau: 100 * ms, Window: sec}, 7, 3*sec, 0, cfg(Fair))
	w.Apply(3*sec, cfg(Fair), Request{Op: OpJoin, Member: "a", Want: 4, Nonce: 2})
	f.Add(MarshalState(w)) // format 2: a window
	r := lim(10, time.Second, 6)
	r.Ramp = gcra.Ramp{T0: sec, Over: 60 * sec}
	rs, _ := NewState(r, 7, 3*sec, 0, cfg(Fair))
	f.Add(MarshalState(rs)) // format 2: a ramp
	p.s.Members[0].Critical = all / 10
	f.Add(MarshalState(p.s)) // format 3: critical demand
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := UnmarshalState(b)
		if err != nil {
			return
		}
		if got := MarshalState(s); string(got) != string(b) {
			s2, err := UnmarshalState(got)
			if err != nil || !reflect.DeepEqual(s, s2) {
				t.Fatalf("%x decoded as %+v, encoded as %x, decoded as %+v (%v)", b, s, got, s2, err)
			}
		}
	})
}

func TestShareLimitRoundsDown(t *testing.T) {
	l := lim(3, time.Second, 3) // T = 333,333,334 ns
	for _, r := range []int64{1, 7, 333_333, 500_000, 999_999, all} {
		sl, ok := Share{r, 1}.Limit(l)
		if !ok {
			t.Fatalf("rate %d: no limit", r)
		}
		// rate(share) = 1/sl.T must not exceed r/all × 1/l.T.
		if float64(all)*float64(l.T) > float64(r)*float64(sl.T)*(1+1e-15) {
			t.Errorf("rate %d: interval %d is too short", r, sl.T)
		}
	}
	if _, ok := (Share{all, 0}).Limit(l); ok {
		t.Error("a share without burst must grant nothing")
	}
}

// TestJoinWindowSharesTheFirstBurst: members that join a fresh limit together share its
// saved burst, rather than the first to ask taking it all; they are told when to come back.
func TestJoinWindowSharesTheFirstBurst(t *testing.T) {
	c := cfg(Fair)
	c.JoinWindow = 50 * time.Millisecond
	p := newPool(t, lim(10, time.Second, 6), c, 0)
	p.run([]step{
		{at: 0, op: OpJoin, member: "a", demand: all, want: Share{}},
		{at: 10 * ms, op: OpJoin, member: "b", demand: all, want: Share{}},
		{at: 50 * ms, op: OpRenew, member: "a", demand: all, want: Share{all / 2, 3}, fill: 3},
		{at: 51 * ms, op: OpRenew, member: "b", demand: all, want: Share{all / 2, 3}, fill: 3},
	})
	rep, _ := p.s.Apply(60*ms, c, Request{Op: OpJoin, Member: "c", Demand: all})
	if rep.RetryIn != 0 {
		t.Errorf("after the window: RetryIn %v, want 0 (the capacity is held, not fenced)", time.Duration(rep.RetryIn))
	}
	s, _ := NewState(lim(10, time.Second, 6), 1, 0, 0, c)
	rep, _ = s.Apply(20*ms, c, Request{Op: OpJoin, Member: "a", Demand: all})
	if rep.RetryIn != 30*ms {
		t.Errorf("in the window: RetryIn %v, want 30ms", time.Duration(rep.RetryIn))
	}
}

// TestStoreDecidedLimitStaysWhileMembersComeAndGo: a limit decided at the store stays
// there while live members stop and start wanting it (Poisson callers, idle between
// requests). It went back to shares whenever fewer than two wanted it, handing the whole
// limit to one member; the next to want it then waited for that share to end (a lease and
// its quarantine, 1.25 s) before the store decided again: 305 such waits in four simulated
// hours of 24 members on 1/6s, 178 s of the limit unused with requests waiting.
func TestStoreDecidedLimitStaysWhileMembersComeAndGo(t *testing.T) {
	c := cfg(Fair)
	c.JoinWindow = 0
	c.TTL, c.Grace = 10*time.Second, time.Second
	s, _ := NewState(lim(1, 6*time.Second, 1), 1, 0, 0, c)
	apply := checkedApply(t, s, c)
	a := apply(0, Request{Op: OpJoin, Member: "a", Demand: all})
	b := apply(1*ms, Request{Op: OpJoin, Member: "b", Demand: all})
	x := apply(2*ms, Request{Op: OpJoin, Member: "c", Demand: all})
	if !x.Central {
		t.Fatalf("three members want 1/6s: %+v, want it decided at the store", x)
	}
	// b and c go quiet (no demand), still live; a alone wants it, then nobody.
	apply(100*ms, Request{Op: OpRenew, Member: "b", Epoch: b.Epoch, InUse: b.Lease.Seq})
	apply(101*ms, Request{Op: OpRenew, Member: "c", Epoch: x.Epoch, InUse: x.Lease.Seq})
	a = apply(102*ms, Request{Op: OpRenew, Member: "a", Epoch: a.Epoch, InUse: a.Lease.Seq, Demand: all})
	if !a.Central || !a.Lease.Share.IsZero() {
		t.Fatalf("one of three live members wants it: %+v, want it still decided at the store", a)
	}
	a = apply(200*ms, Request{Op: OpRenew, Member: "a", Epoch: a.Epoch, InUse: a.Lease.Seq})
	if !a.Central || !a.Lease.Share.IsZero() {
		t.Fatalf("none of three live members wants it: %+v, want it still decided at the store", a)
	}
	// b and c leave: a is alone, and shares come back.
	apply(300*ms, Request{Op: OpRelease, Member: "b", Epoch: b.Epoch})
	apply(301*ms, Request{Op: OpRelease, Member: "c", Epoch: x.Epoch})
	a = apply(400*ms, Request{Op: OpRenew, Member: "a", Epoch: a.Epoch, InUse: a.Lease.Seq, Demand: all})
	if a.Central {
		t.Fatalf("a alone: %+v, want shares back", a)
	}
}

// checkedApply returns a function that applies a request to s at a time, failing the test
// on an error or a broken invariant after it.
// classedMember is a member of a test's pool with its demand and the critical part of it.
type classedMember struct {
	id               string
	demand, critical int64
}

// joinAndRenew joins pool's members one millisecond apart, then renews each of them
// renewals times, every gap, reporting their demands, and returns their last replies and
// the time of the last.
func joinAndRenew(apply func(int64, Request) Reply, pool []classedMember, renewals int, gap int64) (map[string]Reply, int64) {
	reps := map[string]Reply{}
	at := int64(0)
	for _, x := range pool {
		reps[x.id] = apply(at, Request{Op: OpJoin, Member: x.id, Demand: x.demand, Critical: x.critical})
		at += ms
	}
	for range renewals {
		at += gap
		for _, x := range pool {
			r := reps[x.id]
			reps[x.id] = apply(at, Request{Op: OpRenew, Member: x.id, Epoch: r.Epoch, InUse: r.Lease.Seq, Demand: x.demand, Critical: x.critical})
			at += ms
		}
	}
	return reps, at - ms
}

func checkedApply(t *testing.T, s *State, c Config) func(at int64, req Request) Reply {
	return func(at int64, req Request) Reply {
		t.Helper()
		rep, err := s.Apply(at, c, req)
		if err != nil {
			t.Fatalf("at %v %v: %v", time.Duration(at), req.Op, err)
		}
		if err := s.Check(at); err != nil {
			t.Fatalf("at %v: %v", time.Duration(at), err)
		}
		return rep
	}
}

// switchingToTheStore returns a limit of 30/s burst 3 that four members (a, b, c, d,
// whose join replies it returns) have just switched to being decided at the store, at
// 4 ms: their shares are counted until they say they gave them up, so the free rate is
// a sliver (all but one unit of RateScale is still a's).
func switchingToTheStore(t *testing.T) (*State, Config, func(int64, Request) Reply, []Reply) {
	t.Helper()
	c := cfg(Fair)
	c.JoinWindow = 0
	s, _ := NewState(lim(30, time.Second, 3), 1, 0, 0, c)
	apply := checkedApply(t, s, c)
	var reps []Reply
	for i, id := range []string{"a", "b", "c", "d"} {
		reps = append(reps, apply(int64(i)*ms, Request{Op: OpJoin, Member: id, Demand: all}))
	}
	if !reps[3].Central {
		t.Fatalf("four members on a burst of three: %+v, want the limit decided at the store", reps[3])
	}
	for i := range s.Members {
		s.Members[i].Lease.Share = Share{}
	}
	i, _ := s.find("a")
	s.Members[i].Lease.Share = Share{Rate: all - 1, Burst: 2}
	if free := s.capacity(4 * ms).sub(s.Committed(4 * ms)); free.Rate <= 0 || free.Rate > all/100 {
		t.Fatalf("free rate while the shares are counted: %+v, want a sliver", free)
	}
	return s, c, apply, reps
}

// TestNoTurnIsSetAtARateSharesStillHold: when a limit switches to being decided at the
// store, the shares it had are counted until their members say they gave them up, so the
// free rate is for a while a sliver (here one unit of RateScale, what three shares of a
// third leave). A take then must not be told a turn at that sliver's pace (hours ahead),
// nor keep the head of the line for it: `sluice demo --mode lease` stood still for the
// rest of a run (45 permits in 8 s of 20/s) behind a first waiter told to come back in
// 13.9 hours while the pool stood full.
func TestNoTurnIsSetAtARateSharesStillHold(t *testing.T) {
	s, c, apply, members := switchingToTheStore(t)
	reps, d := members[:3], members[3]
	r := apply(4*ms, Request{Op: OpTake, Member: "d", Epoch: d.Epoch, N: 1, MaxDelay: 10 * ms})
	if r.Taken || r.Wait > int64(c.TTL+c.Grace)+s.Limit.T {
		t.Fatalf("a take while the shares are counted: %+v, want to come back when they free (within a lease and its grace) and its slot, not %v", r, time.Duration(r.Wait))
	}
	// The members give their shares up; once the pool has refilled, takes are granted at
	// once, whoever asks, but for the permit of the waiter told to come back.
	for i, id := range []string{"a", "b", "c"} {
		reps[i] = apply(100*ms, Request{Op: OpRenew, Member: id, Epoch: reps[i].Epoch, InUse: reps[i].Lease.Seq, Demand: all})
		apply(110*ms, Request{Op: OpRenew, Member: id, Epoch: reps[i].Epoch, InUse: reps[i].Lease.Seq, Demand: all})
	}
	for at := 500 * ms; at < 502*ms; at += ms {
		if r := apply(at, Request{Op: OpTake, Member: "a", Epoch: reps[0].Epoch, N: 1, MaxDelay: 10 * ms}); !r.Taken {
			t.Fatalf("a take at %v with the pool full: %+v, want it granted", time.Duration(at), r)
		}
	}
	if r := apply(502*ms, Request{Op: OpTake, Member: "b", Epoch: reps[1].Epoch, N: 1, MaxDelay: 10 * ms}); r.Taken {
		t.Fatalf("a take of the waiter's permit: %+v, want it kept for d", r)
	}
	if r := apply(503*ms, Request{Op: OpTake, Member: "d", Epoch: d.Epoch, N: 1, MaxDelay: 10 * ms}); !r.Taken {
		t.Fatalf("the waiter's take: %+v, want its permit", r)
	}
}

// TestDemandUnderTheLimitOnSmallSharesIsDecidedAtTheStore: 10/s among four members,
// shares of 2.5 permits a lease each. Members whose demand adds up to 85% of the limit
// (Poisson callers) are served from one line at the store, which pools what shares that
// small would leave unused; members held back by shares that hold the whole limit (each
// asks half as much again as it holds) keep shares, which serve callers that come and go
// more evenly than one line.
func TestDemandUnderTheLimitOnSmallSharesIsDecidedAtTheStore(t *testing.T) {
	c := cfg(Fair)
	c.JoinWindow = 0
	ids := []string{"a", "b", "c", "d"}
	run := func(t *testing.T, demands []int64, firstThree bool) (*State, [4]Reply) {
		s, _ := NewState(lim(10, time.Second, 10), 1, 0, 0, c)
		apply := checkedApply(t, s, c)
		var reps [4]Reply
		n := len(ids)
		if firstThree {
			n = 3 // d joins once the others hold their shares
		}
		at := int64(0)
		join := func(i int) { reps[i] = apply(at, Request{Op: OpJoin, Member: ids[i], Demand: demands[i]}); at += ms }
		renew := func(i int) {
			reps[i] = apply(at, Request{Op: OpRenew, Member: ids[i], Epoch: reps[i].Epoch, InUse: reps[i].Lease.Seq, Demand: demands[i]})
			at += ms
		}
		for i := range n {
			join(i)
		}
		for range 3 {
			at += 300 * ms
			for i := range n {
				renew(i)
			}
		}
		if firstThree {
			join(3)
			at += 300 * ms
			for i := range ids {
				renew(i)
			}
		}
		return s, reps
	}
	shares := func(reps [4]Reply) []Share {
		return []Share{reps[0].Lease.Share, reps[1].Lease.Share, reps[2].Lease.Share, reps[3].Lease.Share}
	}
	under := []int64{all * 57 / 1000, all * 113 / 1000, all * 227 / 1000, all * 453 / 1000}
	if s, reps := run(t, under, false); !s.Central {
		t.Errorf("demands %v (85%% of the limit): shares %v, want the limit decided at the store", under, shares(reps))
	}
	if s, reps := run(t, under, true); !s.Central {
		t.Errorf("demands %v, the fourth joining later: shares %v, want the limit decided at the store", under, shares(reps))
	}
	held := []int64{all, all, all, all}
	if s, reps := run(t, held, true); s.Central {
		t.Errorf("each held back by a share it spends, the fourth joining later: decided at the store, want shares (%v)", shares(reps))
	}
}

// TestChargeIsNotBookedAtARateSharesStillHold: a settlement up (permits used beyond those
// taken) made while the shares of a limit that just switched to being decided at the
// store are still counted is booked against the free capacity, whose rate is a sliver
// until the shares end: at that pace, one permit was booked hours ahead, and every take
// after waited for it. It is booked no later than the shares' end and a slot of the whole
// rate.
func TestChargeIsNotBookedAtARateSharesStillHold(t *testing.T) {
	s, _, apply, reps := switchingToTheStore(t)
	apply(4*ms, Request{Op: OpTake, Member: "d", Epoch: reps[3].Epoch, N: 1, MaxDelay: -1}) // a charge
	if bound := gcra.After(s.heldUntil(4*ms), s.Limit.T); s.Booked > bound {
		t.Fatalf("a charge while the shares are counted booked the free capacity until %v, want no later than %v", time.Duration(s.Booked), time.Duration(bound))
	}
}

// TestSharesFollowCriticalDemandFirst: a member whose callers are of the critical class
// reports that part of its demand (Request.Critical), and the fair policy gives the
// members' critical demand first, then shares the rest by member as before. One member
// asking 60% of 100/s for critical callers beside three that want all they can get (a
// sheddable flood): by member alone it got a quarter of the limit (max-min fair); now its
// share holds its critical demand less what it borrows (16 permits a second, the most it
// borrows: 44%), the store keeps a reserve for critical callers (nine fourths of that:
// 36%) to borrow from, 80% for it together, and the flood shares the rest.
func TestSharesFollowCriticalDemandFirst(t *testing.T) {
	c := cfg(Fair)
	c.JoinWindow = 0
	s, _ := NewState(lim(100, time.Second, 20), 1, 0, 0, c)
	apply := checkedApply(t, s, c)
	pool := []classedMember{{"ui", all * 60 / 100, all * 60 / 100}, {"b1", all, 0}, {"b2", all, 0}, {"b3", all, 0}}
	reps, _ := joinAndRenew(apply, pool, 4, 300*ms)
	if got, kept := reps["ui"].Lease.Share.Rate, reps["ui"].Free.Rate; got != all*44/100 || kept != all*36/100 {
		t.Errorf("the critical member's share: rate %d of %d, and the reserve kept %d: want %d and %d (the others: %+v %+v %+v)",
			got, all, kept, all*44/100, all*36/100, reps["b1"].Lease.Share, reps["b2"].Lease.Share, reps["b3"].Lease.Share)
	}
	for _, id := range []string{"b1", "b2", "b3"} {
		if got, want := reps[id].Lease.Share.Rate, all*20/100/3; got < want || got > want+1 {
			t.Errorf("%s's share: rate %d, want the rest shared by member (%d)", id, got, want)
		}
	}
}
