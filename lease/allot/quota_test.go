package allot

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
)

// window returns a windowed quota of count tokens per window of w.
func window(count int64, w time.Duration) gcra.Limit {
	t := int64(w) / count
	return gcra.Limit{T: t, Tau: count * t, Window: int64(w)}
}

// TestQuotaChunks is the store's side of a windowed quota, step by step: members draw
// chunks (at most 1/200 of the count, at most half of what is left split among the live
// members), give back what they do not use, and the count is whole again at the window's
// end; a window is never handed out past its count.
func TestQuotaChunks(t *testing.T) {
	c := Config{TTL: 20 * time.Second, Grace: time.Second}
	s, err := NewState(window(1000, 10*time.Second), 7, 0, 0, c)
	if err != nil {
		t.Fatal(err)
	}
	epochs := map[string]Epoch{}
	steps := []struct {
		at                int64
		op                Op
		member            string
		want, unused, got int64
		unusedOf          int64
		quota, granted    int64
	}{
		{at: 0, op: OpJoin, member: "a", want: 3, quota: 3, granted: 3},
		{at: 1 * ms, op: OpJoin, member: "b", want: 50, quota: 5, granted: 8}, // 1/200 of the count
		{at: 2 * ms, op: OpRenew, member: "a", want: 5, unused: 2, got: 1, unusedOf: 10 * sec, quota: 5, granted: 11},
		{at: 3 * ms, op: OpRenew, member: "a", unused: 99, unusedOf: 10 * sec, granted: 5},                // gives back at most what it holds
		{at: 4 * ms, op: OpRenew, member: "b", unused: 5, got: 5, unusedOf: 20 * sec, granted: 5},         // another window's tokens: void
		{at: 5 * ms, op: OpRenew, member: "b", want: 1, got: 2, unusedOf: 10 * sec, quota: 1, granted: 3}, // 3 never read: back to the window
		{at: 10 * sec, op: OpRenew, member: "b", want: 5, quota: 5, granted: 5},                           // a new window: the count is whole
		{at: 10*sec + ms, op: OpRenew, member: "a", unused: 5, unusedOf: 10 * sec, granted: 5},            // the old window's: void
		{at: 10*sec + 2*ms, op: OpRelease, member: "b", unused: 5, unusedOf: 20 * sec, granted: 0},
	}
	for i, st := range steps {
		req := Request{Op: st.op, Member: st.member, Epoch: epochs[st.member], Want: st.want, Unused: st.unused, UnusedOf: st.unusedOf, Got: st.got, Nonce: uint64(i + 1)}
		rep, err := s.Apply(st.at, c, req)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if st.op == OpJoin {
			epochs[st.member] = rep.Epoch
		}
		if rep.Quota != st.quota || s.Granted != st.granted {
			t.Errorf("step %d: got %d tokens, %d handed out; want %d, %d", i, rep.Quota, s.Granted, st.quota, st.granted)
		}
		if err := s.Check(st.at); err != nil {
			t.Errorf("step %d: %v", i, err)
		}
		if st.op == OpRenew {
			req.Want = 5
			if rep, _ := s.Apply(st.at, c, req); rep.Quota != 0 {
				t.Errorf("step %d: the same request again (stale) got %d tokens, want none", i, rep.Quota)
			}
		}
	}
	// The last of a window goes out in ever smaller chunks, to the last token.
	s2, _ := NewState(window(10, 10*time.Second), 7, 0, 0, c)
	var got []int64
	for i := range 6 {
		rep, _ := s2.Apply(int64(i)*ms, c, Request{Op: OpJoin, Member: fmt.Sprint("m", i), Want: 10, Nonce: 1})
		got = append(got, rep.Quota)
	}
	if want := []int64{1, 1, 1, 1, 1, 1}; !slices.Equal(got, want) {
		t.Errorf("draws of a count of 10: got %v, want %v", got, want)
	}
	for i := range 10 {
		s2.Apply(10*ms+int64(i)*ms, c, Request{Op: OpJoin, Member: "z", Want: 10, Nonce: uint64(i + 1)})
	}
	if s2.Granted != 10 {
		t.Errorf("a count of 10: %d handed out after everyone asked for more, want 10", s2.Granted)
	}
}

// TestQuotaLostRecordSpendsTheWindow: a windowed quota's record made fenced (its store
// lost the one before) hands nothing out until the fence ends; a member that drew tokens
// from the lost record in this window says so at its next renewal (its epoch is of the
// lost record's incarnation, and it has seen a version of it), and the window is then
// spent, since the lost record may have handed it all out. The next window is whole.
func TestQuotaLostRecordSpendsTheWindow(t *testing.T) {
	c := Config{TTL: 2 * time.Second, Grace: time.Second}
	s, _ := NewState(window(1000, 10*time.Second), 7, 3*sec, c.FenceAfterRestart(3*sec), c)
	steps := []struct {
		at        int64
		req       Request
		quota     int64
		remaining int64
		err       error
	}{
		{at: 3 * sec, req: Request{Op: OpJoin, Member: "a", Want: 5, Nonce: 1}, remaining: 1000},          // fenced
		{at: 6 * sec, req: Request{Op: OpJoin, Member: "b", Want: 5, Nonce: 1}, quota: 5, remaining: 995}, // the fence ended
		{at: 6*sec + 100*ms, req: Request{Op: OpRenew, Member: "x", Epoch: Epoch{Incarnation: 3, N: 1}, Seen: 9, Nonce: 4}, err: ErrStaleEpoch},
		{at: 6*sec + 200*ms, req: Request{Op: OpJoin, Member: "c", Want: 5, Nonce: 1}},                     // spent
		{at: 10 * sec, req: Request{Op: OpJoin, Member: "d", Want: 5, Nonce: 1}, quota: 5, remaining: 995}, // the next window
	}
	for i, st := range steps {
		rep, err := s.Apply(st.at, c, st.req)
		if !errors.Is(err, st.err) {
			t.Fatalf("step %d: %v, want %v", i, err, st.err)
		}
		if err == nil && (rep.Quota != st.quota || rep.Remaining != st.remaining) {
			t.Errorf("step %d: got %d tokens, %d remaining; want %d, %d", i, rep.Quota, rep.Remaining, st.quota, st.remaining)
		}
		if err := s.Check(st.at); err != nil {
			t.Errorf("step %d: %v", i, err)
		}
	}
}

// qworld simulates a windowed quota's pool in virtual time: members (real Member cores)
// and the store (a real State) exchange messages with random delays and losses; members
// join, crash holding their tokens, leave, and ask with random weights at random rates.
type qworld struct {
	t       *testing.T
	rng     *rand.Rand
	now     int64
	limit   gcra.Limit
	cfg     Config
	mcfg    MemberConfig
	state   *State
	members []*qmember
	msgs    []msg
	used    map[int64]int64 // tokens granted to callers, by the end of the window they were used in
	asked   map[int64]int64 // tokens asked, likewise
	crashed map[int64]int   // crashes, likewise
	granted map[int64]int64 // handed out by the store, likewise
}

type qmember struct {
	name   string
	m      *Member
	gen    int
	rate   float64 // calls a second
	weight int     // a call takes 1..weight tokens
	next   int64   // the next call
}

func (w *qworld) send(m msg) {
	if m.to >= 0 && w.rng.IntN(20) == 0 {
		return // an answer lost: its tokens are lost with it
	}
	m.at = w.now + int64(w.rng.IntN(20))*ms
	w.msgs = append(w.msgs, m)
}

func (w *qworld) deliver() {
	slices.SortStableFunc(w.msgs, func(a, b msg) int { return cmp.Compare(a.at, b.at) })
	for len(w.msgs) > 0 && w.msgs[0].at <= w.now {
		m := w.msgs[0]
		w.msgs = w.msgs[1:]
		if m.to < 0 {
			rep, err := w.state.Apply(m.at, w.cfg, m.call)
			if err := w.state.Check(m.at); err != nil {
				w.t.Fatalf("t=%v after %v of %s: %v", time.Duration(m.at), m.call.Op, m.call.Member, err)
			}
			if m.call.Op != OpRelease {
				w.send(msg{to: m.gen >> 16, gen: m.gen & 0xffff, reply: rep, err: err, nonce: m.call.Nonce})
			}
			continue
		}
		qm := w.members[m.to]
		if qm.m == nil || qm.gen != m.gen {
			continue
		}
		qm.m.Receive(w.now, m.nonce, m.reply, m.err)
	}
}

func (w *qworld) step() {
	before := w.limit.WindowEnd(w.now)
	w.now += 1 + int64(w.rng.IntN(10))*ms
	w.deliver()
	we := w.limit.WindowEnd(w.now)
	if we != before && w.state.WindowEnd == before {
		w.granted[before] = w.state.Granted
	}
	for i, qm := range w.members {
		switch r := w.rng.IntN(100_000); {
		case qm.m == nil:
			if r < 200 {
				qm.m = NewMember(qm.name, w.limit, w.mcfg, w.now)
				qm.gen++
				qm.next = w.now
			}
			continue
		case r < 5 && w.crashed[we] == 0: // at most one crash a window
			qm.m = nil
			w.crashed[we]++
			continue
		case r < 10:
			if req, ok := qm.m.Release(w.now); ok {
				w.send(msg{to: -1, gen: i<<16 | qm.gen, call: req})
			}
			qm.m = nil
			continue
		}
		for qm.next <= w.now {
			n := int64(1 + w.rng.IntN(qm.weight))
			w.asked[we] += n
			res, _, _, err := Decide([]*Member{qm.m}, w.now, n, 0)
			if err != nil {
				w.t.Fatal(err)
			}
			if res.Allowed {
				w.used[we] += n
			}
			qm.next += int64(w.rng.ExpFloat64() / qm.rate * 1e9)
		}
		if req, ok := qm.m.Request(w.now, 0); ok {
			w.send(msg{to: -1, gen: i<<16 | qm.gen, call: req})
		} else if qm.m.Inflight() && w.now-qm.m.link.lastSent > 100*ms {
			qm.m.Receive(w.now, qm.m.link.nonce, Reply{}, backend.ErrUnavailable) // a time-out
		}
	}
}

// TestPropertyQuotaNeverOverCount: over random joins, crashes, leaves, weights, losses and
// window boundaries, the tokens used in a window never exceed its count, and where the
// callers asked for more than the count, at least 99% of it was used before the window
// ended.
func TestPropertyQuotaNeverOverCount(t *testing.T) {
	seeds := propertySeeds()
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			count, win := int64(3000+500*(seed%5)), time.Minute
			w := &qworld{t: t, rng: rand.New(rand.NewPCG(seed, 2)), limit: window(count, win), now: 3 * sec,
				cfg:  Config{TTL: 800 * time.Millisecond, Grace: 300 * time.Millisecond, Policy: Fair},
				mcfg: MemberConfig{RenewEvery: 200 * time.Millisecond, Margin: 5 * time.Millisecond},
				used: map[int64]int64{}, granted: map[int64]int64{}, asked: map[int64]int64{}, crashed: map[int64]int{}}
			w.state, _ = NewState(w.limit, 1, w.now, 0, w.cfg)
			n := 2 + int(seed%4)
			quotaRate := float64(count) / win.Seconds()
			for i := range n {
				// Between a third and four times the quota's rate in all, so that some windows
				// ask for more than the count and some for less.
				rate := quotaRate * (0.3 + 3.7*w.rng.Float64()) / float64(n)
				w.members = append(w.members, &qmember{name: fmt.Sprint("m", i), rate: rate / 2, weight: 3})
			}
			end := w.now + 6*int64(win)
			for w.now < end {
				w.step()
			}
			var ends []int64
			for e := range w.used {
				ends = append(ends, e)
			}
			slices.Sort(ends)
			full := 0
			for _, e := range ends[1 : len(ends)-1] { // whole windows only
				used, asked := w.used[e], w.asked[e]
				if used > count {
					t.Errorf("window ending %v: %d tokens used of a count of %d", time.Duration(e), used, count)
				}
				if float64(asked) >= 1.2*float64(count) {
					full++
					if float64(used) < 0.99*float64(count) {
						t.Errorf("window ending %v: asked %d, used %d of %d (%.1f%%), %d crashes", time.Duration(e), asked, used, count,
							100*float64(used)/float64(count), w.crashed[e])
					}
				}
				t.Logf("window ending %v: asked %d, used %d of %d (%d handed out), %d crashes", time.Duration(e), asked, used, count, w.granted[e], w.crashed[e])
			}
			if full == 0 {
				t.Logf("no window asked for more than its count")
			}
		})
	}
}

// TestQuotaMemberPrefetchesAndGivesBack: a member whose callers ask steadily draws its
// next chunk before it runs dry (a prefetch, with a fifth of its chunk left), so that no
// call waits once it runs; when its callers go quiet it gives back what it holds, and what
// it drew at its release; the store then counts only the tokens used.
func TestQuotaMemberPrefetchesAndGivesBack(t *testing.T) {
	c := Config{TTL: 5 * time.Second, Grace: time.Second}
	l := window(100_000, time.Hour)
	s, _ := NewState(l, 1, 0, 0, c)
	m := NewMember("a", l, MemberConfig{RenewEvery: 200 * time.Millisecond, Margin: 5 * time.Millisecond}, 0)
	exchange := func(now int64) {
		if req, ok := m.Request(now, 0); ok {
			rep, err := s.Apply(now, c, req)
			m.Receive(now+ms, req.Nonce, rep, err) // answered within a millisecond
		}
	}
	used, waited := int64(0), 0
	for now := int64(0); now < 10*sec; now += 5 * ms {
		exchange(now)
		res, _, out, err := Decide([]*Member{m}, now, 2, 0) // weighted: two tokens a call
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			used += 2
		} else if now > sec {
			waited++
			t.Logf("t=%v: %v (holds %d)", time.Duration(now), out, m.quota.left)
		}
	}
	if waited > 0 {
		t.Errorf("%d calls found the member dry after the first second, want none (prefetch)", waited)
	}
	if held := s.Granted - used; held <= 0 || held > 100_000/chunkParts {
		t.Errorf("while busy: %d handed out, %d used: the member holds %d, want 1..%d", s.Granted, used, held, 100_000/chunkParts)
	}
	for now := 10 * sec; now < 12*sec; now += 5 * ms { // the callers went quiet
		exchange(now)
	}
	if s.Granted != used || m.quota.left != 0 {
		t.Errorf("quiet: %d handed out, %d used, the member holds %d; want the store to count only the used", s.Granted, used, m.quota.left)
	}
	// Busy again, then closed: the release gives back what it holds.
	for now := 12 * sec; now < 13*sec; now += 5 * ms {
		exchange(now)
		if res, _, _, _ := Decide([]*Member{m}, now, 1, 0); res.Allowed {
			used++
		}
	}
	req, ok := m.Release(13 * sec)
	if !ok || req.Unused == 0 {
		t.Fatalf("release: %+v, %v: want the tokens it holds given back", req, ok)
	}
	if _, err := s.Apply(13*sec, c, req); err != nil {
		t.Fatal(err)
	}
	if s.Granted != used {
		t.Errorf("after the release: %d handed out, %d used", s.Granted, used)
	}
}
