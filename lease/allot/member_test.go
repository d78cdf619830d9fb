package allot

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
)

// memberStep is one thing that happens to a member at a virtual time, and what must come
// of it. Exactly one of the actions is set.
type memberStep struct {
	at int64

	send    bool   // ask for the due request: want wantOp (or none if wantOp is 0 and noSend)
	noSend  bool   // no request is due
	wantOp  Op     // the request's operation
	reply   *Share // answer the request in flight with this share (seq+1)
	failErr error  // answer the request in flight with this error
	allow   bool   // take one permit now
	granted bool   // ... and whether it must be granted

	phase phase // the member's phase after the step
}

// TestMemberPhases walks a member through its phases with the store: unregistered (it
// joins), registered (it renews, decides on its share, runs on its lease through an outage
// in fail mode local until the lease and the grace end), unregistered again when the store
// forgot it, and released.
func TestMemberPhases(t *testing.T) {
	l := lim(10, time.Second, 10)
	cfg := MemberConfig{RenewEvery: 250 * time.Millisecond, Margin: 0, FailMode: backend.FailLocal}
	m := NewMember("m", l, cfg, 0)
	full := &Share{Rate: RateScale, Burst: 10}
	var seq uint64
	var inflight Request
	steps := []memberStep{
		{at: 0, allow: true, granted: false, phase: unregistered}, // no share yet
		{at: 0, send: true, wantOp: OpJoin, phase: unregistered},
		{at: 1 * ms, reply: full, phase: registered},
		{at: 2 * ms, allow: true, granted: true, phase: registered},
		{at: 3 * ms, noSend: true, phase: registered}, // renewals come a renewal interval later
		{at: 250 * ms, send: true, wantOp: OpRenew, phase: registered},
		{at: 251 * ms, failErr: backend.ErrUnavailable, phase: registered}, // the store is down
		{at: 900 * ms, allow: true, granted: true, phase: registered},      // on the lease (TTL 1 s from the join, sent at 0)
		{at: 1400 * ms, allow: true, granted: true, phase: registered},     // on the grace (500 ms)
		{at: 1500 * ms, allow: true, granted: false, phase: registered},    // past both: fail mode local ends
		{at: 1800 * ms, send: true, wantOp: OpRenew, phase: registered},
		{at: 1801 * ms, failErr: ErrStaleEpoch, phase: unregistered}, // the store forgot it
		{at: 1802 * ms, send: true, wantOp: OpJoin, phase: unregistered},
		{at: 1803 * ms, reply: full, phase: registered},
		{at: 1804 * ms, allow: true, granted: true, phase: registered},
	}
	for i, st := range steps {
		now := st.at
		switch {
		case st.send, st.noSend:
			req, ok := m.Request(now, 0)
			if st.noSend {
				if ok {
					t.Fatalf("step %d at %v: request %v sent, want none", i, time.Duration(now), req.Op)
				}
				break
			}
			if !ok || req.Op != st.wantOp {
				t.Fatalf("step %d at %v: request %v (sent %v), want %v", i, time.Duration(now), req.Op, ok, st.wantOp)
			}
			inflight = req
		case st.reply != nil:
			seq++
			rep := Reply{Epoch: Epoch{Incarnation: 1, N: 1}, Sent: inflight.Sent, Nonce: inflight.Nonce,
				TTL: int64(time.Second), Grace: int64(500 * time.Millisecond), Target: *st.reply, Live: 1, Version: seq}
			rep.Lease.Seq, rep.Lease.Share = seq, *st.reply
			rep.Fill = st.reply.Burst * l.T
			m.Receive(now, inflight.Nonce, rep, nil)
		case st.failErr != nil:
			m.Receive(now, inflight.Nonce, Reply{}, st.failErr)
		case st.allow:
			got, _ := m.AllowOne(now)
			if got != st.granted {
				t.Fatalf("step %d at %v: allowed %v, want %v", i, time.Duration(now), got, st.granted)
			}
		}
		if m.phase != st.phase {
			t.Fatalf("step %d at %v: phase %v, want %v", i, time.Duration(now), m.phase, st.phase)
		}
	}
	// Released: it hands its share back once, then sends nothing more and decides nothing.
	if req, ok := m.Release(2 * sec); !ok || req.Op != OpRelease {
		t.Fatalf("release: %+v %v", req, ok)
	}
	if m.phase != released {
		t.Fatalf("phase %v after release", m.phase)
	}
	if _, ok := m.Request(3*sec, 0); ok {
		t.Fatal("a released member sent a request")
	}
	if _, ok := m.Release(3 * sec); ok {
		t.Fatal("released twice")
	}
	if got, _ := m.AllowOne(3 * sec); got {
		t.Fatal("a released member granted a permit")
	}
}

// TestMemberPresentsTheVersionItHolds: a member presents the newest version of the record
// it has seen while it may still use a share leased from it, and nothing once that has
// ended (so that a record deleted meanwhile as idle is not taken for one that was lost).
func TestMemberPresentsTheVersionItHolds(t *testing.T) {
	l := lim(10, time.Second, 10)
	m := NewMember("m", l, MemberConfig{RenewEvery: 250 * time.Millisecond, FailMode: backend.FailClosed}, 0)
	req, _ := m.Request(0, 0)
	if req.Seen != 0 {
		t.Fatalf("a new member presents version %d", req.Seen)
	}
	rep := Reply{Epoch: Epoch{Incarnation: 1, N: 1}, Sent: 0, Nonce: req.Nonce, TTL: int64(time.Second), Version: 41}
	rep.Lease.Seq, rep.Lease.Share = 1, Share{Rate: RateScale, Burst: 10}
	m.Receive(1*ms, req.Nonce, rep, nil)
	req, _ = m.Request(250*ms, 0)
	if req.Seen != 41 {
		t.Fatalf("holding a share: presents %d, want 41", req.Seen)
	}
	m.Receive(251*ms, req.Nonce, Reply{}, backend.ErrUnavailable)
	req, ok := m.Request(2*sec, 0) // the lease ended at 1 s (fail mode closed: no grace)
	if !ok || req.Seen != 0 {
		t.Fatalf("after the lease ended: presents %d (sent %v), want 0", req.Seen, ok)
	}
}

// TestMemberForgottenByTheStoreIsDueAtOnce: a member the store forgot (ErrStaleEpoch) is
// due to join again at once, and its callers' wait hint is short. (Due once answered
// math.MinInt64 for "at once", and a caller that subtracted now from it, as the renewal
// goroutine's timer did, slept for an hour: a Redis restarted empty left its members
// without a lease.)
func TestMemberForgottenByTheStoreIsDueAtOnce(t *testing.T) {
	l := lim(10, time.Second, 10)
	m := NewMember("m", l, MemberConfig{RenewEvery: 100 * time.Millisecond}, 0)
	req, _ := m.Request(0, 0)
	rep := Reply{Epoch: Epoch{Incarnation: 1, N: 1}, Nonce: req.Nonce, TTL: int64(time.Second)}
	rep.Lease.Seq, rep.Lease.Share = 1, Share{Rate: RateScale, Burst: 10}
	m.Receive(1*ms, req.Nonce, rep, nil)
	req, _ = m.Request(100*ms, 0)
	m.Receive(101*ms, req.Nonce, Reply{}, ErrStaleEpoch)
	now := 102 * ms
	if d := m.Due(now) - now; d > 0 || d < -int64(time.Second) {
		t.Fatalf("due in %v after the store forgot it, want now", time.Duration(d))
	}
	if h := m.waitHint(now); h > 100*ms {
		t.Fatalf("wait hint %v", time.Duration(h))
	}
	if req, ok := m.Request(now, 0); !ok || req.Op != OpJoin {
		t.Fatalf("no join at once: %+v %v", req, ok)
	}
}

// TestMembersStartedTogetherDrift: two members that join at the same instant and are
// answered at the same instants renewed at the same instants for ever, so that on a shared
// record every renewal's write collided with the other's. Their regular renewals are
// spread by their names: within a few renewals they are apart, never later than the
// interval.
func TestMembersStartedTogetherDrift(t *testing.T) {
	l := lim(10, time.Second, 10)
	cfg := MemberConfig{RenewEvery: 250 * time.Millisecond}
	members := []*Member{NewMember("pod-a", l, cfg, 0), NewMember("pod-b", l, cfg, 0)}
	apart := 0
	var next [2]int64 // each member's next request: at once, then when due
	for round := range 8 {
		var dues [2]int64
		for i, m := range members {
			now := next[i]
			req, ok := m.Request(now, 0)
			if !ok {
				t.Fatalf("round %d: member %d sent nothing at %v", round, i, time.Duration(now))
			}
			rep := Reply{Epoch: Epoch{Incarnation: 1, N: uint64(i + 1)}, Sent: now, Nonce: req.Nonce, TTL: int64(time.Second)}
			rep.Lease.Seq, rep.Lease.Share = 1, Share{Rate: RateScale / 2, Burst: 5}
			m.Receive(now, req.Nonce, rep, nil)
			dues[i] = m.Due(now)
			next[i] = dues[i]
			if d := dues[i] - now; d > 250*ms || d < 250*ms*19/20 {
				t.Fatalf("round %d: member %d due %v after its renewal, want within the last twentieth of 250ms", round, i, time.Duration(d))
			}
		}
		if dues[0] != dues[1] {
			apart++
		}
	}
	if apart < 6 {
		t.Fatalf("the members' renewals were apart in %d of 8 rounds", apart)
	}
}

// TestShrunkShareDoesNotSendCallersAwayForLong: a member whose callers went quiet sees its
// share follow its falling demand down to a sliver of the rate (11,369 ppm of 20/s: a
// permit every 4.4 s). When its callers come back, the first is refused at that sliver;
// it used to be told to come back in 4.3 s, and the demo's worker slept through its whole
// spell while the member's share grew again at its next renewal. A share below an equal
// split grows once the store hears the demand, so the caller is told to come back within
// a renewal interval.
func TestShrunkShareDoesNotSendCallersAwayForLong(t *testing.T) {
	l := lim(20, time.Second, 10)
	renew := 40 * ms
	m := NewMember("w6", l, MemberConfig{RenewEvery: time.Duration(renew)}, 0)
	req, _ := m.Request(0, 0)
	rep := Reply{Epoch: Epoch{Incarnation: 1, N: 1}, Sent: 0, Nonce: req.Nonce, TTL: int64(time.Second), Live: 8}
	rep.Lease.Seq, rep.Lease.Share = 1, Share{Rate: 11369, Burst: 1}
	rep.Target = rep.Lease.Share
	m.Receive(1*ms, req.Nonce, rep, nil)
	now := 100 * ms // the share started drained at 1 ms: its first permit is 4.4 s away
	res, _, out, _ := Decide([]*Member{m}, now, 1, int64(100*ms))
	if res.Allowed {
		t.Fatalf("a second permit at once on a share of 0.23/s: %+v", res)
	}
	if res.RetryAfter > renew {
		t.Fatalf("told to come back in %v (%v), want within a renewal interval (%v): the share grows at the next renewal", time.Duration(res.RetryAfter), out, time.Duration(renew))
	}
	// A member at an equal split of a pool that wants all it can get is told the truth.
	m2 := NewMember("w7", l, MemberConfig{RenewEvery: time.Duration(renew)}, 0)
	req, _ = m2.Request(0, 0)
	rep.Nonce, rep.Epoch.N = req.Nonce, 2
	rep.Lease.Share = Share{Rate: RateScale / 8, Burst: 1}
	rep.Target = rep.Lease.Share
	m2.Receive(1*ms, req.Nonce, rep, nil)
	if res, _, _, _ := Decide([]*Member{m2}, now, 1, 0); res.Allowed || res.RetryAfter < int64(250*ms) {
		t.Fatalf("at an equal split (2.5/s), the first permit is 0.4 s after the share began: %+v", res)
	}
}

// TestMemberHoldsFewPlacesInTheStoresLine: a member of a limit decided at the store holds
// at most the permits of its booking horizon in the store's line at once (one, on 2/s):
// while a take is in flight or a permit booked for it is not yet due, its other callers that
// may wait are told to wait in the process (TooFar), so that the store serves the pool by
// member. Each caller booked its own permit before: on 2/s burst=2, members of 1, 2, 4 and
// 8 goroutines with a backlog got permits in proportion to their goroutines (Jain's index
// over the members 0.943 in the matrix, 1.000 now). A caller that may not wait still asks.
func TestMemberHoldsFewPlacesInTheStoresLine(t *testing.T) {
	m := NewMember("m", lim(2, time.Second, 2), MemberConfig{RenewEvery: 250 * time.Millisecond}, 0)
	join, ok := m.Request(0, 0)
	if !ok || join.Op != OpJoin {
		t.Fatalf("join: %+v %v", join, ok)
	}
	m.Receive(1*ms, join.Nonce, Reply{Epoch: Epoch{Incarnation: 1, N: 1}, Sent: join.Sent, Nonce: join.Nonce,
		TTL: int64(time.Second), Grace: int64(500 * time.Millisecond), Live: 2, Central: true, Version: 1}, nil)
	if !m.Central() {
		t.Fatal("the member does not know its limit is decided at the store")
	}
	ms1 := []*Member{m}
	wait := int64(10 * time.Second)
	decide := func(now, maxDelay int64) (int64, Outcome) {
		t.Helper()
		res, _, out, err := DecideAgain(ms1, now, 1, maxDelay)
		if err != nil {
			t.Fatal(err)
		}
		return res.RetryAfter, out
	}
	if _, out := decide(10*ms, wait); out != AtStore {
		t.Fatalf("first caller: %v, want AtStore", out)
	}
	take, ok := m.TakeRequest(10*ms, 1, wait)
	if !ok {
		t.Fatal("no take request")
	}
	if after, out := decide(11*ms, wait); out != TooFar || after <= 0 || after > int64(time.Millisecond) {
		t.Fatalf("second caller while the take is in flight: %v after %v, want TooFar within a millisecond", out, time.Duration(after))
	}
	if _, out := decide(11*ms, 0); out != AtStore {
		t.Fatalf("a caller that may not wait: %v, want AtStore", out)
	}
	// The take is booked 400 ms ahead: the place is held until then.
	m.Took(take.Sent, take.Sent+1*ms, 1, Reply{Epoch: Epoch{Incarnation: 1, N: 1}, Central: true, Taken: true, Wait: 400 * ms, Sent: take.Sent, TTL: int64(time.Second)}, nil)
	if after, out := decide(20*ms, wait); out != TooFar || after != 390*ms {
		t.Fatalf("second caller while the permit is booked: %v after %v, want TooFar after 390ms", out, time.Duration(after))
	}
	if _, out := decide(410*ms, wait); out != AtStore {
		t.Fatalf("second caller once the permit is due: %v, want AtStore", out)
	}
}

// TestTakesAreBookedWithinTheHorizon: a member's take on a store-decided limit is booked
// no further than its booking horizon ahead; further, it waits its turn in the store's
// line. A permit booked far ahead is lost when its caller gives up before the slot (the
// store cannot give back a slot that later ones follow): sluice demo's lease workers,
// whose spells end while they wait, used 0.84 of a limit decided at the store.
func TestTakesAreBookedWithinTheHorizon(t *testing.T) {
	c := cfg(Fair)
	c.JoinWindow = 0
	s, _ := NewState(lim(2, time.Second, 1), 1, 0, 0, c)
	apply := checkedApply(t, s, c)
	mcfg := MemberConfig{RenewEvery: 200 * time.Millisecond} // horizon 50 ms
	members := map[string]*Member{}
	for _, id := range []string{"a", "b", "c"} {
		m := NewMember(id, s.Limit, mcfg, 0)
		join, _ := m.Request(0, 0)
		join.Demand = all // each wants all it can get
		m.Receive(1*ms, join.Nonce, apply(0, join), nil)
		members[id] = m
	}
	// They renew until the shares granted before the limit went to the store have ended.
	for at := 200 * ms; at <= 2000*ms; at += 200 * ms {
		for _, m := range members {
			if req, ok := m.Request(at, 0); ok {
				req.Demand = all
				m.Receive(at+1*ms, req.Nonce, apply(at, req), nil)
			}
		}
	}
	take := func(id string, at int64) Reply {
		t.Helper()
		m := members[id]
		req, ok := m.TakeRequest(at, 1, int64(10*time.Second))
		if !ok {
			t.Fatalf("%s: no take request", id)
		}
		rep := apply(at, req)
		m.Took(at, at+1*ms, 1, rep, nil)
		return rep
	}
	if rep := take("a", 2010*ms); !rep.Central || !rep.Taken || rep.Wait != 0 {
		t.Fatalf("a: %+v, want its permit at once, decided at the store (three members on a burst of one)", rep)
	}
	// b's permit is 500 ms away, c's 1 s: neither is booked; each is told when to come
	// back, in turn.
	rb, rc := take("b", 2011*ms), take("c", 2012*ms)
	if rb.Taken || rc.Taken || rb.Wait <= 0 || rc.Wait <= rb.Wait {
		t.Fatalf("b %+v, c %+v: want both told to come back, b first", rb, rc)
	}
	// b comes back as told, until its permit is within its horizon: booked then.
	at := 2011*ms + rb.Wait
	for i := 0; ; i++ {
		rep := take("b", at)
		if rep.Taken {
			if rep.Wait > 50*ms {
				t.Fatalf("b booked %v ahead, want at most its 50 ms horizon", time.Duration(rep.Wait))
			}
			break
		}
		if i == 10 || rep.Wait <= 0 {
			t.Fatalf("b at %v: %+v, want it booked within ten visits", time.Duration(at), rep)
		}
		at += rep.Wait
	}
}
