package allot

import (
	"testing"
	"time"
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
