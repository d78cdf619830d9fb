package allot

import (
	"fmt"
	"math/rand/v2"
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
					m.Took(now, 1, rep, err)
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
