package allot

import (
	"cmp"
	"math"
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
	// Room for every member at once: these run at every grant, and growing them by
	// appends cost a large pool more than the policy's arithmetic.
	alive := make([]int, 0, len(s.Members))
	wanting := make([]int, 0, len(s.Members))
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
	order := s.byDemand(holders)
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
	with := make([]int, 0, len(alive))
	inWith := make([]bool, len(s.Members)) // with holds i (a look-up per member, not a scan)
	for _, i := range holders {
		if tg[i].Rate > 0 {
			with = append(with, i)
			inWith[i] = true
		}
	}
	for _, i := range alive {
		if tg[i].Rate > 0 && !inWith[i] {
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
		for _, k := range largestRemainders(rem, int(rest-given)) {
			tg[with[k]].Burst++
		}
	}
	return tg, live, size
}

// The sorts below run at every grant over every member that wants a share: each packs its
// key and the member's place into one uint64 and sorts those (ties in the members' order,
// as a stable sort leaves them), where a stable sort by a comparison that reads each
// member's entry cost a large pool most of its store's time. Keys that do not fit (never,
// from Apply: demands are within RateScale, remainders below it) sort the old way.

// byDemand returns holders (in the members' order) by demand, the lowest first.
func (s *State) byDemand(holders []int) []int {
	order := slices.Clone(holders)
	keys := make([]uint64, len(holders))
	for k, i := range holders {
		d := s.Members[i].Demand
		if d < 0 || d > math.MaxUint32 || i > math.MaxUint32 {
			slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(s.Members[a].Demand, s.Members[b].Demand) })
			return order
		}
		keys[k] = uint64(d)<<32 | uint64(i)
	}
	slices.Sort(keys)
	for k, key := range keys {
		order[k] = int(key & math.MaxUint32)
	}
	return order
}

// largestRemainders returns the places of the n largest remainders in rem (ties to the
// earlier place), in no particular order: which places get one more permit, not in what
// order. It selects them (quickselect, O(len(rem)) on average) rather than sorting rem.
func largestRemainders(rem []int64, n int) []int {
	if n <= 0 {
		return nil
	}
	keys := make([]uint64, len(rem))
	for k, r := range rem {
		if r < 0 || r > math.MaxUint32 || k > math.MaxUint32 {
			// Never from Apply (remainders are below RateScale): the places by a stable sort.
			idx := make([]int, len(rem))
			for k := range idx {
				idx[k] = k
			}
			slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(rem[b], rem[a]) })
			return idx[:min(n, len(idx))]
		}
		keys[k] = uint64(math.MaxUint32-r)<<32 | uint64(k) // the smallest first, all distinct
	}
	if n < len(keys) {
		selectSmallest(keys, n)
		keys = keys[:n]
	}
	idx := make([]int, len(keys))
	for k, key := range keys {
		idx[k] = int(key & math.MaxUint32)
	}
	return idx
}

// selectSmallest reorders keys (all distinct) so that its n smallest come first, in no
// particular order (0 < n < len(keys)).
func selectSmallest(keys []uint64, n int) {
	lo, hi := 0, len(keys)-1
	for lo < hi {
		// The median of three as the pivot, then a partition around it (Hoare).
		mid := lo + (hi-lo)/2
		a, b, c := keys[lo], keys[mid], keys[hi]
		pivot := max(min(a, b), min(max(a, b), c))
		i, j := lo, hi
		for i <= j {
			for keys[i] < pivot {
				i++
			}
			for keys[j] > pivot {
				j--
			}
			if i <= j {
				keys[i], keys[j] = keys[j], keys[i]
				i++
				j--
			}
		}
		// keys[lo..j] <= pivot <= keys[i..hi], and keys[j+1..i-1] == pivot.
		switch {
		case n-1 <= j:
			hi = j
		case n-1 >= i:
			lo = i
		default:
			return
		}
	}
}
