package allot

import (
	"cmp"
	"slices"
)

// targets returns the share the policy wants each member to hold at now (zero for dead
// members), the number of live members, and the pool size the shares are based on.
//
// Every member that holds a share needs at least one permit of burst, and a share
// should grant at least a permit per lease: when more members want the limit than that
// allows, it is decided at the store instead (centralWanted) and nobody holds a share.
func (s *State) targets(now int64, cfg Config) (tg []Share, live, size int64) {
	tg = make([]Share, len(s.Members))
	capa := s.capacity(now) // all of the limit, or the rate a ramp has reached
	burst := capa.Burst
	var alive, wanting []int
	for i := range s.Members {
		e := &s.Members[i]
		if !e.live(now) {
			continue
		}
		alive = append(alive, i)
		if cfg.Policy == Equal || e.Demand > 0 {
			wanting = append(wanting, i)
		}
	}
	live = int64(len(alive))
	size = live
	s.Central = s.centralWanted(now, cfg, int64(len(wanting)))
	if live == 0 || s.Central {
		return tg, live, size // decided at the store: nobody holds a share
	}
	holders := wanting
	if cfg.Policy == Equal {
		// Members agree when every live one reports the live count; until then
		// the largest size anyone reports wins, which gives everyone less (conservative).
		agree := true
		for _, i := range alive {
			if s.Members[i].Size != live {
				agree = false
			}
			size = max(size, s.Members[i].Size)
		}
		if agree {
			size = live
		}
		d := min(size, burst)
		for _, i := range holders {
			tg[i] = Share{Rate: capa.Rate / d, Burst: burst / d}
		}
		return tg, live, size
	}
	// Fair: water-fill the rate among holders by demand.
	order := slices.Clone(holders)
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(s.Members[a].Demand, s.Members[b].Demand) })
	left := capa.Rate
	for k, i := range order {
		give := min(s.Members[i].Demand, left/int64(len(order)-k))
		tg[i].Rate = give
		left -= give
	}
	// What nobody wanting more needs stays with whoever holds it (an idle member keeps
	// its share, and its saved burst, until someone needs the capacity): nobody gives up
	// capacity that no one else wants.
	if left > 0 {
		var extra []int
		var sum int64
		for _, i := range alive {
			if h := s.Members[i].Lease.Share.Rate; h > tg[i].Rate {
				extra = append(extra, i)
				sum += h - tg[i].Rate
			}
		}
		for _, i := range extra {
			x := s.Members[i].Lease.Share.Rate - tg[i].Rate
			if sum > left {
				x, _ = mulDiv(x, left, sum)
			}
			tg[i].Rate += x
		}
	}
	// Bursts: one permit to each holder with a rate, then the rest in proportion to rate.
	// Members that want capacity come first if the burst cannot cover everyone.
	var with []int
	for _, i := range holders {
		if tg[i].Rate > 0 {
			with = append(with, i)
		}
	}
	for _, i := range alive {
		if tg[i].Rate > 0 && !slices.Contains(with, i) {
			with = append(with, i)
		}
	}
	if int64(len(with)) > burst {
		for _, i := range with[burst:] {
			tg[i] = Share{}
		}
		with = with[:burst]
	}
	var rates int64
	for _, i := range with {
		tg[i].Burst = 1
		rates += tg[i].Rate
	}
	rest := burst - int64(len(with))
	// An idle member keeps the one permit it parked (a share without rate), while the
	// burst left after every holder's first permit covers it: its next request is then
	// served at once while it asks for a rate again.
	for _, i := range alive {
		if e := &s.Members[i]; rest > 0 && tg[i].Rate == 0 && e.Demand == 0 && e.Lease.Share.Parked() {
			tg[i].Burst = 1
			rest--
		}
	}
	if rest > 0 && rates > 0 {
		// Largest remainders: floors first, then one more permit each to the largest
		// fractional parts (ties to the earlier name), so the whole burst is handed out.
		rem := make([]int64, len(with))
		given := int64(0)
		for k, i := range with {
			hi, lo := mul128(rest, tg[i].Rate)
			x, r := div128(hi, lo, rates)
			tg[i].Burst += x
			rem[k] = r
			given += x
		}
		idx := make([]int, len(with))
		for k := range idx {
			idx[k] = k
		}
		slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(rem[b], rem[a]) })
		for _, k := range idx[:rest-given] {
			tg[with[k]].Burst++
		}
	}
	return tg, live, size
}
