package allot

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gcra"
)

// TestUnequalDemandSpareWithinTwoRenewals: four members share 100/s; one asks for 2.5/s
// (a tenth of its fair share), three want all they can get. From the renewal at which the
// store learns the light member's demand, the three others hold all the rest (but what the
// light one keeps for itself) within two renewal intervals. Deterministic: no network
// delay, a step of one millisecond.
func TestUnequalDemandSpareWithinTwoRenewals(t *testing.T) {
	l := lim(100, time.Second, 20)
	cfg := Config{TTL: time.Second, Grace: 500 * time.Millisecond}
	renew := 250 * time.Millisecond
	mcfg := MemberConfig{RenewEvery: renew, Margin: 5 * time.Millisecond}
	st, _ := NewState(l, 1, 0, 0, cfg)
	var ms []*Member
	for _, id := range []string{"light", "b", "c", "d"} {
		ms = append(ms, NewMember(id, l, mcfg, 0))
	}
	learned := int64(-1) // when the store first heard the light member's real demand
	step := int64(time.Millisecond)
	for now := int64(0); now < int64(10*time.Second); now += step {
		for i, m := range ms {
			if req, ok := m.Request(now, 0); ok {
				rep, err := st.Apply(now, cfg, req)
				m.Receive(now, req.Nonce, rep, err)
				if i == 0 && req.Op == OpRenew && req.Demand < RateScale && learned < 0 {
					learned = now
				}
			}
			switch {
			case i == 0 && now%int64(400*time.Millisecond) == 0:
				Decide([]*Member{m}, now, 1, int64(time.Second)) // 2.5/s, waiting if need be
			case i > 0:
				for { // saturated: take permits until refused
					if _, _, out, _ := Decide([]*Member{m}, now, 1, 0); out != Granted {
						break
					}
				}
			}
		}
		if err := st.Check(now); err != nil {
			t.Fatal(err)
		}
		if learned < 0 {
			continue
		}
		light := ms[0].InUse(now).Rate
		var others int64
		for _, m := range ms[1:] {
			others += m.InUse(now).Rate
		}
		if others >= RateScale-light-RateScale/1000 {
			took := time.Duration(now - learned)
			t.Logf("the light member holds %d ppm; the others hold %d ppm %v after the store learned its demand", light, others, took)
			if took > 2*renew {
				t.Errorf("the spare capacity reached the others after %v, want within two renewal intervals (%v)", took, 2*renew)
			}
			if light > RateScale/10 {
				t.Errorf("the light member holds %d ppm for a demand of 25000", light)
			}
			return
		}
	}
	t.Fatalf("the others never held the spare capacity (store learned at %v)", time.Duration(learned))
}

// TestUnequalPoissonDemandBelowTheLimitIsServed: six members share 100/s burst 20, their
// callers asking one permit at a time with Poisson demand of 30, 20, 15, 10, 5 and 5 a
// second (85/s, under the limit) and taking a refusal as final (maxDelay 0: the daemon's
// line protocol). One limiter at 100/s burst 20 serves all but a handful of the same
// requests; the members must serve at least 0.97 of what it does. Shares that each follow
// their member's demand cannot: each holds a burst of a few permits, which Poisson
// arrivals find empty while the limit has room. Where a decision goes to the store (a
// borrow, AtStore) it is applied at once. Deterministic: a step of one millisecond, no
// network delay, one seeded source of arrivals. The shares never sum past the limit, on
// the store's side and the members'.
func TestUnequalPoissonDemandBelowTheLimitIsServed(t *testing.T) {
	l := lim(100, time.Second, 20)
	cfg := DefaultConfig()
	mcfg := DefaultMemberConfig()
	st, _ := NewState(l, 1, 0, 0, cfg)
	rates := []float64{30, 20, 15, 10, 5, 5}
	rng := rand.New(rand.NewPCG(1, 2))
	var ms []*Member
	next := make([]int64, len(rates))
	for i := range rates {
		ms = append(ms, NewMember(fmt.Sprintf("m%d", i), l, mcfg, 0))
		next[i] = int64(rng.ExpFloat64() / rates[i] * 1e9)
	}
	ideal := gcra.Limit{T: l.T, Tau: l.Tau}
	idealTat := int64(0)
	asked, served, idealServed := 0, 0, 0
	const step, end = int64(time.Millisecond), int64(60 * time.Second)
	for now := int64(0); now < end; now += step {
		for i, m := range ms {
			if req, ok := m.Request(now, 0); ok {
				rep, err := st.Apply(now, cfg, req)
				m.Receive(now, req.Nonce, rep, err)
			}
			for next[i] <= now {
				next[i] += int64(rng.ExpFloat64() / rates[i] * 1e9)
				if now < 3*sec {
					continue // the members learn their demand; the count starts after
				}
				asked++
				if tat, ok := gcra.AllowOne(idealTat, ideal, now); ok {
					idealTat = tat
					idealServed++
				}
				_, _, out, err := Decide([]*Member{m}, now, 1, 0)
				if err != nil {
					t.Fatal(err)
				}
				if out == AtStore {
					req, ok := m.TakeRequest(now, 1, 0)
					if !ok {
						t.Fatal("a member asked to decide at the store is not registered")
					}
					rep, err := st.Apply(now, cfg, req)
					m.Took(now, now, 1, rep, err)
					if err == nil && rep.Taken {
						out = Granted
					} else {
						_, _, out, _ = DecideAgain([]*Member{m}, now, 1, 0)
					}
				}
				if out == Granted {
					served++
				}
			}
		}
		if err := st.Check(now); err != nil {
			t.Fatal(err)
		}
		var inUse Share
		for _, m := range ms {
			inUse = inUse.add(m.InUse(now))
		}
		if !inUse.Fits(Share{RateScale, l.Burst()}) {
			t.Fatalf("at %v the members use %+v of the limit", time.Duration(now), inUse)
		}
	}
	got := float64(served) / float64(idealServed)
	t.Logf("asked %d, one limiter served %d, the members %d (%.4f of it)", asked, idealServed, served, got)
	if got < 0.97 {
		t.Errorf("the members served %.4f of what one limiter did, want at least 0.97", got)
	}
}

// TestDemandIsWhatCallersAsk: a member reports the rate its callers ask, refused requests
// included and without headroom of its own (the store adds headroom from what the
// demands leave free): one whose callers ask 20/s, every 50 ms, of 100/s reports about
// 20/s, and holds about half as much again. Before, it reported half as much again itself,
// and members' headroom added up past the limit while their demands fitted in it.
func TestDemandIsWhatCallersAsk(t *testing.T) {
	l := lim(100, time.Second, 20)
	cfg := DefaultConfig()
	st, _ := NewState(l, 1, 0, 0, cfg)
	m := NewMember("a", l, DefaultMemberConfig(), 0)
	step := int64(time.Millisecond)
	for now := int64(0); now < 5*sec; now += step {
		if req, ok := m.Request(now, 0); ok {
			rep, err := st.Apply(now, cfg, req)
			m.Receive(now, req.Nonce, rep, err)
		}
		if now%(50*ms) == 0 {
			Decide([]*Member{m}, now, 1, 0)
		}
	}
	s := m.Status(5 * sec)
	if s.Demand < 190000 || s.Demand > 210000 {
		t.Errorf("reported demand %d ppm, want about 200000 (20/s)", s.Demand)
	}
	if s.Share.Rate < 280000 || s.Share.Rate > 320000 {
		t.Errorf("share %+v, want about 300000 ppm (the demand and half as much again)", s.Share)
	}
}

// TestShareCutForTheReserveIsNotSaturation: four members whose callers wait (up to a
// minute), with Poisson demand of 1.13, 2.27, 4.53 and 9.07 a second on 20/s (85% of it),
// are given shares below their demands while the store keeps a reserve free: the rest is
// borrowed. Held back by such a share when the pool is short, a member is not saturated:
// the store knows its demand. It used to count as saturated, probe half as much again,
// then ask for as much as it could get while its callers waited, which took the reserve
// (and the pool the borrows need) away; the shares then held the whole limit, split
// equally among members that mostly wanted less, for the rest of the run.
func TestShareCutForTheReserveIsNotSaturation(t *testing.T) {
	l := lim(20, time.Second, 20)
	cfg := DefaultConfig()
	st, _ := NewState(l, 1, 0, 0, cfg)
	rates := []float64{1.1333, 2.2667, 4.5333, 9.0667}
	type caller struct {
		m       *Member
		retries []int64 // callers waiting to decide again, by when
		next    int64   // the next arrival
		all     int     // renewals reporting as much as it can get, after the first 20 s
		renews  int
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var cs []*caller
	for i := range rates {
		cs = append(cs, &caller{m: NewMember(fmt.Sprintf("m%d", i), l, DefaultMemberConfig(), 0)})
	}
	apply := func(now int64, req Request) Reply {
		t.Helper()
		rep, err := st.Apply(now, cfg, req)
		if err != nil {
			t.Fatalf("at %v: %v", time.Duration(now), err)
		}
		if err := st.Check(now); err != nil {
			t.Fatalf("at %v: %v", time.Duration(now), err)
		}
		return rep
	}
	decide := func(c *caller, now int64, again bool) {
		d := Decide
		if again {
			d = DecideAgain
		}
		res, _, out, err := d([]*Member{c.m}, now, 1, 60*sec)
		switch {
		case err != nil:
			t.Fatalf("at %v: %v", time.Duration(now), err)
		case out == AtStore && c.m.Borrowing():
			req, _ := c.m.TakeRequest(now, 1, 60*sec)
			rep := apply(now, req)
			c.m.TookBorrow(now, 1, rep, nil)
			if !rep.Taken {
				c.m.Wait(1)
				c.retries = append(c.retries, now)
			}
		case out == TooFar || out == LeaseEnds || out == NoLease:
			c.m.Wait(1)
			c.retries = append(c.retries, now+max(res.RetryAfter, ms))
		}
	}
	for now := int64(0); now < 120*sec; now += ms {
		for i, c := range cs {
			if req, ok := c.m.Request(now, 0); ok {
				rep := apply(now, req)
				c.m.Receive(now, req.Nonce, rep, nil)
				if now >= 20*sec && req.Op == OpRenew {
					c.renews++
					if req.Demand == RateScale {
						c.all++
					}
				}
			}
			var due int
			c.retries = slices.DeleteFunc(c.retries, func(at int64) bool {
				if at <= now {
					due++
					return true
				}
				return false
			})
			for range due {
				c.m.Wait(-1)
				decide(c, now, true)
			}
			for now >= c.next {
				if c.next > 0 {
					decide(c, now, false)
				}
				c.next += int64(rng.ExpFloat64() * float64(sec) / rates[i])
			}
		}
	}
	all, renews := 0, 0
	for _, c := range cs {
		all += c.all
		renews += c.renews
		t.Logf("%s: as much as it can get at %d of %d renewals", c.m.ID(), c.all, c.renews)
	}
	if all*100 > 15*renews {
		t.Errorf("the members asked for as much as they could get at %d of their %d renewals after the first 20 s (want at most 15%%: demand is 85%% of the limit)", all, renews)
	}
}

// TestCriticalCallersKeepTheirShare: four members share 100/s; one's callers are of the
// critical class and ask 50/s, three want all they can get (a sheddable flood). By member
// alone the first held a quarter of the limit and its critical callers waited for half
// their permits; reporting its critical demand (AskedCritical, Request.Critical), its
// share and the reserve the store keeps for critical callers (which it borrows from, the
// flood only beyond a floor) hold at least what they ask from the renewals that measure it
// on. Every member borrows as the backend does (AtStore, then DecideAgain if refused).
func TestCriticalCallersKeepTheirShare(t *testing.T) {
	l := lim(100, time.Second, 20)
	cfg := Config{TTL: time.Second, Grace: 500 * time.Millisecond}
	mcfg := MemberConfig{RenewEvery: 250 * time.Millisecond, Margin: 5 * time.Millisecond}
	st, _ := NewState(l, 1, 0, 0, cfg)
	var ms []*Member
	for _, id := range []string{"ui", "b1", "b2", "b3"} {
		ms = append(ms, NewMember(id, l, mcfg, 0))
	}
	step := int64(time.Millisecond)
	var asked, granted int64
	for now := int64(0); now < int64(10*time.Second); now += step {
		for i, m := range ms {
			if req, ok := m.Request(now, 0); ok {
				rep, err := st.Apply(now, cfg, req)
				m.Receive(now, req.Nonce, rep, err)
			}
			// allow decides one permit now or never, borrowing it where the member asks to.
			allow := func() bool {
				_, _, out, _ := Decide([]*Member{m}, now, 1, 0)
				if out == AtStore && m.Borrowing() {
					req, _ := m.TakeRequest(now, 1, 0)
					rep, err := st.Apply(now, cfg, req)
					m.TookBorrow(now, 1, rep, err)
					if err == nil && rep.Taken {
						return true
					}
					_, _, out, _ = DecideAgain([]*Member{m}, now, 1, 0)
				}
				return out == Granted
			}
			switch {
			case i == 0 && now%int64(20*time.Millisecond) == 0:
				m.AskedCritical(1)
				ok := allow()
				if now >= int64(3*time.Second) {
					asked++
					if ok {
						granted++
					}
				}
			case i > 0:
				for allow() {
				}
			}
		}
		if err := st.Check(now); err != nil {
			t.Fatal(err)
		}
	}
	if rate, kept := ms[0].InUse(int64(10*time.Second)).Rate, ms[0].view.free.Rate; rate+kept < RateScale/2 {
		t.Errorf("the critical member's share, rate %d of %d, and the reserve kept for critical callers, %d: want at least its callers' %d together",
			rate, RateScale, kept, RateScale/2)
	}
	if granted < asked*99/100 {
		t.Errorf("critical callers granted %d of %d from 3 s on, want at least 0.99", granted, asked)
	}
}
