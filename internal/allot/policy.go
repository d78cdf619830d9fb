package allot

import (
	"cmp"
	"slices"
	"time"
)

// turn is how long a holder keeps its share before giving way, when the burst is smaller
// than the number of members that want capacity.
func (s *State) turn(cfg Config) int64 {
	if cfg.Turn > 0 {
		return int64(cfg.Turn)
	}
	t := 8 * s.Limit.Tau
	return max(t, 2*int64(cfg.TTL), int64(time.Millisecond))
}

// targets returns the share the policy wants each member to hold at now (zero for dead
// members), the number of live members, and the pool size the shares are based on.
//
// Every member that holds a share needs at least one permit of burst, so at most Burst
// members hold at a time. When more want capacity, holders are chosen by rotation: a
// holder keeps its place for one turn; then places go to the members that have waited
// longest (ties: the larger demand, then the name), and holders whose turn is over come
// last.
func (s *State) targets(now int64, cfg Config) (tg []Share, live, size int64) {
	tg = make([]Share, len(s.Members))
	burst := s.Limit.Burst()
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
	if live == 0 {
		return tg, 0, 0
	}
	holders := wanting
	rotating := int64(len(wanting)) > burst
	if rotating {
		holders = s.rotate(now, cfg, wanting, burst)
	}
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
			tg[i] = Share{Rate: RateScale / d, Burst: burst / d}
		}
		return tg, live, size
	}
	// Fair: water-fill the rate among holders by demand.
	order := slices.Clone(holders)
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(s.Members[a].Demand, s.Members[b].Demand) })
	left := RateScale
	for k, i := range order {
		give := min(s.Members[i].Demand, left/int64(len(order)-k))
		tg[i].Rate = give
		left -= give
	}
	// In a rotation only the holders can use rate (the others have no burst): what their
	// demands leave goes to them, equally.
	if left > 0 && rotating {
		for k, i := range holders {
			give := left / int64(len(holders)-k)
			tg[i].Rate += give
			left -= give
		}
	}
	// What nobody wanting more needs stays with whoever holds it (an idle member keeps
	// its share, and its saved burst, until someone needs the capacity): nobody gives up
	// capacity that no one else wants. Only when no rotation is going on.
	if left > 0 && !rotating {
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
	if !rotating {
		for _, i := range alive {
			if e := &s.Members[i]; rest > 0 && tg[i].Rate == 0 && e.Demand == 0 && e.Lease.Share.Parked() {
				tg[i].Burst = 1
				rest--
			}
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

// rotate chooses at most burst holders among the wanting members.
func (s *State) rotate(now int64, cfg Config, wanting []int, burst int64) []int {
	turn := s.turn(cfg)
	var keep, wait, over []int
	for _, i := range wanting {
		e := &s.Members[i]
		switch {
		case e.Lease.Share.Rate == 0:
			wait = append(wait, i)
		case now-e.Since < turn:
			keep = append(keep, i)
		default:
			over = append(over, i)
		}
	}
	bySince := func(a, b int) int {
		ea, eb := &s.Members[a], &s.Members[b]
		switch {
		case ea.Since != eb.Since:
			return cmp.Compare(ea.Since, eb.Since)
		case ea.Demand != eb.Demand:
			return cmp.Compare(eb.Demand, ea.Demand)
		}
		return 0 // members are sorted by name: the stable sort keeps that order
	}
	slices.SortStableFunc(keep, bySince)
	slices.SortStableFunc(wait, bySince)
	slices.SortStableFunc(over, bySince)
	out := append(append(keep, wait...), over...)
	return out[:burst]
}
