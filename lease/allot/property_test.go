package allot

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
)

// world is a small simulation of a pool for property tests: members (real Member cores)
// and a store (a real State) exchange messages with random delays and losses, members
// crash, pause, rejoin and leave, and the store restarts empty.
type world struct {
	t       *testing.T
	rng     *rand.Rand
	classes bool // every third member's callers are critical (odd seeds)
	now     int64
	limit   gcra.Limit
	cfg     Config
	mcfg    MemberConfig
	state   *State
	inc     uint64
	members []*simMember
	msgs    []msg
	permits map[ticketKey]int64 // every grant: its time and cost, to judge conformance at the end
	maxRate int64               // the most rate in use at once, seen from the members
	takes   int                 // permits taken at the store (a limit decided there)
	taken   map[ticketKey]bool  // which grants were takes (for failure reports)
	trace   func(string)
}

type simMember struct {
	name    string
	m       *Member
	paused  int64 // paused until
	gen     int   // bumped on a crash: messages for an older generation are lost
	tickets []gcra.Ticket
	seq     int
}

type ticketKey struct {
	member string
	gen    int
	seq    int
	at     int64
}

type msg struct {
	at    int64
	to    int // -1: the store; else a member index
	gen   int
	call  Request
	reply Reply
	err   error
	nonce uint64
}

func newWorld(t *testing.T, seed uint64, l gcra.Limit, policy Policy, n int) *world {
	w := &world{t: t, rng: rand.New(rand.NewPCG(seed, 1)), limit: l, classes: seed%2 == 1,
		cfg:  Config{TTL: 800 * time.Millisecond, Grace: 300 * time.Millisecond, Policy: policy, JoinWindow: 50 * time.Millisecond},
		mcfg: MemberConfig{RenewEvery: 200 * time.Millisecond, Margin: 5 * time.Millisecond}, inc: 1}
	w.state, _ = NewState(l, w.inc, 0, 0, w.cfg)
	w.permits = map[ticketKey]int64{}
	for i := range n {
		w.members = append(w.members, &simMember{name: fmt.Sprint("m", i)})
	}
	return w
}

// inUse is what a status says its member may be using (Member.InUse, from outside).
func (st Status) inUse() Share {
	var c Share
	if st.Expires > 0 {
		c = st.Share
	}
	if st.PrevLeft > 0 {
		c = maxShare(c, st.Prev)
	}
	return c
}

// check verifies the invariant at the current instant, from both sides.
func (w *world) check(what string) {
	w.t.Helper()
	if err := w.state.Check(w.now); err != nil {
		w.t.Fatalf("t=%v after %s: store: %v", time.Duration(w.now), what, err)
	}
	var sum Share
	for _, sm := range w.members {
		if sm.m != nil {
			in := sm.m.InUse(w.now)
			if st := sm.m.Status(w.now); st.inUse() != in {
				w.t.Fatalf("t=%v after %s: %s's status says it uses %+v (share %+v for %v, older %+v for %v), InUse %+v",
					time.Duration(w.now), what, sm.name, st.inUse(), st.Share, st.Expires, st.Prev, st.PrevLeft, in)
			}
			if in2, until := sm.m.InUseUntil(w.now); in2 != in || until < w.now {
				w.t.Fatalf("t=%v after %s: %s's InUseUntil %+v until %v, InUse %+v", time.Duration(w.now), what, sm.name, in2, time.Duration(until), in)
			} else if until > w.now && until < math.MaxInt64 {
				// Until then InUse says the same (and reads no pending permits: asking
				// ahead changes nothing).
				for _, at := range []int64{w.now + (until-w.now)/2, until - 1} {
					if got := sm.m.InUse(at); got != in {
						w.t.Fatalf("t=%v after %s: %s's InUse at %v is %+v, not %+v until %v", time.Duration(w.now), what, sm.name, time.Duration(at), got, in, time.Duration(until))
					}
				}
			}
			sum = sum.add(in)
		}
	}
	if !sum.Fits(Share{RateScale, w.limit.Burst()}) {
		w.t.Fatalf("t=%v after %s: members use rate %d burst %d of %d, %d", time.Duration(w.now), what, sum.Rate, sum.Burst, RateScale, w.limit.Burst())
	}
	w.maxRate = max(w.maxRate, sum.Rate)
}

func (w *world) send(m msg, lossy bool) {
	if lossy && w.rng.IntN(10) == 0 {
		return // lost
	}
	m.at = w.now + int64(w.rng.IntN(30))*int64(time.Millisecond)
	w.msgs = append(w.msgs, m)
}

// deliver handles every message due by now, in time order.
func (w *world) deliver() {
	slices.SortStableFunc(w.msgs, func(a, b msg) int { return cmp.Compare(a.at, b.at) })
	for len(w.msgs) > 0 && w.msgs[0].at <= w.now {
		m := w.msgs[0]
		w.msgs = w.msgs[1:]
		if m.to < 0 {
			before := w.state.Clone()
			rep, err, check := w.state.ApplyChecked(m.at, w.cfg, m.call)
			if full := w.state.Check(m.at); fmt.Sprint(check) != fmt.Sprint(full) {
				w.t.Fatalf("t=%v: ApplyChecked's check %v, Check's %v", time.Duration(m.at), check, full)
			}
			if w.trace != nil && before.Pool != w.state.Pool {
				w.trace(fmt.Sprintf("%v %s %s: pool %d@%v -> %d@%v central %v return %d err %v", time.Duration(w.now), m.call.Op, m.call.Member,
					before.Pool, time.Duration(before.PoolAt), w.state.Pool, time.Duration(w.state.PoolAt), w.state.Central, m.call.Return, err))
			}
			w.check("store " + m.call.Op.String())
			if m.call.Op == OpJoin || m.call.Op == OpRenew {
				w.send(msg{to: m.gen >> 16, gen: m.gen & 0xffff, reply: rep, err: err, nonce: m.call.Nonce}, true)
			}
			continue
		}
		sm := w.members[m.to]
		if sm.m == nil || sm.gen != m.gen || sm.paused > w.now {
			continue // crashed since, or frozen: the answer is never read (a time-out follows)
		}
		sm.m.Receive(w.now, m.nonce, m.reply, m.err)
		w.check("receive")
	}
}

func (w *world) step() {
	w.now += int64(w.rng.IntN(40)) * int64(time.Millisecond)
	w.deliver()
	for i, sm := range w.members {
		switch r := w.rng.IntN(1000); {
		case sm.m == nil && r < 50:
			sm.m = NewMember(sm.name, w.limit, w.mcfg, w.now)
			sm.gen++
			sm.tickets = nil
		case sm.m == nil:
			continue
		case r < 3: // crash: nothing handed back
			sm.m = nil
			continue
		case r < 6: // graceful leave
			if req, ok := sm.m.Release(w.now); ok {
				w.send(msg{to: -1, gen: i << 16, call: req}, true)
			}
			sm.m = nil
			continue
		case r < 9: // a pause longer than a TTL
			sm.paused = w.now + int64(w.rng.IntN(3000))*int64(time.Millisecond)
		}
		if sm.paused > w.now {
			continue
		}
		m := sm.m
		if req, ok := m.Request(w.now, 0); ok {
			w.send(msg{to: -1, gen: i<<16 | sm.gen, call: req}, true)
		} else if m.link.inflight && w.now-m.link.lastSent > 100*int64(time.Millisecond) {
			m.Receive(w.now, m.link.nonce, Reply{}, backend.ErrUnavailable) // time-out
		}
		// Demand: member i asks often if i is even, rarely if odd; some callers wait for
		// a share, some cancel or settle their reservations, some get a 429. On odd
		// seeds every third member's callers are of the critical class (the store keeps
		// a reserve for them, which they borrow from); on even ones no class is named.
		if i%2 == 0 || w.rng.IntN(8) == 0 {
			for range 1 + w.rng.IntN(3) {
				if w.rng.IntN(4) == 0 {
					if ok, _ := m.AllowOne(w.now); ok {
						sm.seq++
						w.permits[ticketKey{sm.name, sm.gen, sm.seq, w.now}] = 1
					}
					continue
				}
				n := int64(1 + w.rng.IntN(2))
				if w.classes && i%3 == 0 {
					m.AskedCritical(n)
				}
				res, tk, out, err := Decide([]*Member{m}, w.now, n, int64(w.rng.IntN(1500))*int64(time.Millisecond))
				if err != nil && !errors.Is(err, gcra.ErrCostExceedsBurst) {
					w.t.Fatal(err)
				}
				switch out {
				case Granted:
					if res.Delay != tk.At-w.now {
						w.t.Fatalf("delay %d, ticket at %d", res.Delay, tk.At-w.now)
					}
					sm.seq++
					w.permits[ticketKey{sm.name, sm.gen, sm.seq, tk.At}] = tk.N
					if tk.At > w.now {
						sm.tickets = append(sm.tickets, tk)
					}
				case AtStore:
					// The limit is decided at the store: take the permits there, one round
					// trip (applied at once here; lost or late answers are the renewals').
					if req, ok := m.TakeRequest(w.now, n, int64(w.rng.IntN(1500))*int64(time.Millisecond)); ok {
						before := w.state.Clone()
						rep, err := w.state.Apply(w.now, w.cfg, req)
						if w.trace != nil {
							w.trace(fmt.Sprintf("%v take %s: pool %d@%v -> %d@%v central %v taken %v wait %v err %v members %d fence %v", time.Duration(w.now), sm.name,
								before.Pool, time.Duration(before.PoolAt), w.state.Pool, time.Duration(w.state.PoolAt), w.state.Central, rep.Taken, time.Duration(rep.Wait), err, len(w.state.Members), time.Duration(w.state.Fence)))
						}
						w.check("store take")
						m.Took(w.now, w.now, n, rep, err)
						if err == nil && rep.Taken {
							sm.seq++
							k := ticketKey{sm.name, sm.gen, sm.seq, w.now + rep.Wait}
							w.permits[k] = n
							w.takes++
							if w.taken == nil {
								w.taken = map[ticketKey]bool{}
							}
							w.taken[k] = true
						}
					}
				case NoLease, LeaseEnds, TooFar:
					if w.rng.IntN(2) == 0 {
						m.Wait(1) // a caller waits a while for the share
					}
				}
			}
		}
		if m.demand.waiting > 0 && w.rng.IntN(4) == 0 {
			m.Wait(-1)
		}
		if len(sm.tickets) > 0 && w.rng.IntN(6) == 0 {
			// Cancel or settle down a pending reservation: the API sees less (or nothing).
			k := w.rng.IntN(len(sm.tickets))
			tk := sm.tickets[k]
			sm.tickets = append(sm.tickets[:k], sm.tickets[k+1:]...)
			if tk.At > w.now {
				newN := int64(w.rng.IntN(int(tk.N)))
				if err := Adjust([]*Member{m}, w.now, tk, newN); err != nil {
					w.t.Fatal(err)
				}
				for key := range w.permits {
					if key.member == sm.name && key.gen == sm.gen && key.at == tk.At && w.permits[key] == tk.N {
						if newN == 0 {
							delete(w.permits, key)
						} else {
							w.permits[key] = newN
						}
						break
					}
				}
			}
		}
		if w.rng.IntN(400) == 0 { // a 429: the pool holds back for a while
			until := w.now + int64(w.rng.IntN(500))*int64(time.Millisecond)
			Penalize([]*Member{m}, w.now, until)
			w.send(msg{to: -1, gen: i << 16, call: m.PenalizeRequest(w.now, until)}, true)
		}
		w.check("decide")
	}
	if w.rng.IntN(2000) == 0 { // the store restarts empty
		w.inc++
		w.state, _ = NewState(w.limit, w.inc, w.now, w.now+int64(w.cfg.TTL)+int64(w.cfg.Grace), w.cfg)
		w.check("restart")
	}
}

// conform judges every permit granted (and not given back) with a strict GCRA at the
// limit: none may be early.
func (w *world) conform() (bad, total int) {
	type grant struct{ at, n int64 }
	var gs []grant
	for k, n := range w.permits {
		gs = append(gs, grant{k.at, n})
		total++
	}
	slices.SortFunc(gs, func(a, b grant) int { return cmp.Compare(a.at, b.at) })
	var tat int64
	for _, g := range gs {
		t2, res, _ := gcra.DecideOne(tat, w.limit, g.at, g.n, 0)
		if !res.Allowed {
			bad++
			continue
		}
		tat = t2
	}
	return bad, total
}

// TestPropertyNeverOversubscribed: over random joins, leaves, crashes, pauses longer than a
// TTL, lost and delayed messages and store restarts, the shares in use never sum past the
// limit (store side and member side, at every event), and every permit granted conforms
// to the limit.
func TestPropertyNeverOversubscribed(t *testing.T) {
	steps := 4000
	if testing.Short() {
		steps = 1000
	}
	for _, tc := range []struct {
		name   string
		l      gcra.Limit
		policy Policy
		n      int
	}{
		{"fair-10/s-burst6-5members", lim(10, time.Second, 6), Fair, 5},
		{"equal-10/s-burst6-5members", lim(10, time.Second, 6), Equal, 5},
		{"fair-100/s-burst20-9members", lim(100, time.Second, 20), Fair, 9},
		{"fair-1/s-burst2-4members", lim(1, time.Second, 2), Fair, 4},
		{"equal-3/s-burst1-3members", lim(3, time.Second, 1), Equal, 3},
		{"fair-1/6s-12members", lim(1, 6*time.Second, 1), Fair, 12},       // decided at the store
		{"fair-20/s-burst4-10members", lim(20, time.Second, 4), Fair, 10}, // shares and store by turns
	} {
		for seed := uint64(1); seed <= propertySeeds(); seed++ {
			t.Run(fmt.Sprintf("%s/seed%d", tc.name, seed), func(t *testing.T) {
				w := newWorld(t, seed, tc.l, tc.policy, tc.n)
				for range steps {
					w.step()
				}
				if bad, total := w.conform(); bad > 0 {
					t.Errorf("%d of %d grants broke the limit", bad, total)
				}
				if len(w.permits) == 0 || (w.maxRate == 0 && w.takes == 0) {
					t.Errorf("nothing was granted: the test no longer tests")
				}
			})
		}
	}
}

// propertySeeds is how many seeds each case of the property test runs: 4, or
// SLUICE_LEASE_PROPERTY_SEEDS (make fuzz runs more).
func propertySeeds() uint64 {
	if n, err := strconv.Atoi(os.Getenv("SLUICE_LEASE_PROPERTY_SEEDS")); err == nil && n > 0 {
		return uint64(n)
	}
	return 4
}
