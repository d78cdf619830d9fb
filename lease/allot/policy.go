package allot

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/gcra"
)

// reserve is the part of the limit's rate (in parts of RateScale) the fair policy keeps
// free, for members to borrow from, while the members' demands leave room for it.
// Measured (TestUnequalPoissonDemandBelowTheLimitIsServed: six members of unequal
// Poisson demand at 85% of 100/s burst 20, answered at once or refused): a reserve of
// 35% served 0.974 of what one limiter would, 40% 0.978, 45% 0.982, each with a few more
// borrows (store operations).
const reserve = RateScale * 40 / 100

// reserveSpan: the reserve shrinks as the demands asked exceed the limit, and is gone
// once they exceed it by this part of it: members held back by their shares ask half as
// much again as they are given, and when they all do (a limit too small for everyone)
// the shares hold the whole limit, as before there was a reserve.
const reserveSpan = RateScale * 15 / 100

// shareHeadroomNum / shareHeadroomDen is how much more than its demand the fair policy
// gives a member while the demands leave room (as far as the reserve allows): room to
// grow before it is held back.
const (
	shareHeadroomNum int64 = 3
	shareHeadroomDen int64 = 2
)

// burstPartNum / burstPartDen is the part of the burst (beyond each holder's first permit)
// the shares hold, in proportion to their rates, while the fair policy keeps a reserve;
// the free capacity keeps the rest, for every member to borrow.
const (
	burstPartNum int64 = 2
	burstPartDen int64 = 5
)

// While members report critical demand and the fair policy keeps no larger reserve for
// everyone (the demands exceed the limit), the store keeps one for the critical callers
// and hands it out itself. Each such member's share holds its critical demand less a part
// it borrows (criticalBorrowedNum / criticalBorrowedDen of it, at most
// criticalBorrowedMost permits a second), criticalKeptNum / criticalKeptDen of the
// borrowed parts stay free (at most the reserve's part of the limit), and the pool that
// rate fills is the critical members' to borrow from; a lower-class member may borrow
// only what the pool holds beyond criticalFloorNum / criticalFloorDen of the free burst.
// For Poisson callers of a few permits a renewal, the share holds three fifths of their
// demand and nine tenths more stay free: half as much again in all, as a member's share
// holds while the demands leave room. Measured on scenarios/priorities.yaml
// (docs/priorities.md): shares holding all of the critical demand and a reserve of half
// of it, critical p99 wait 105 to 168 ms but utilization 0.888 to 0.890 (the critical
// members' shares left idle between their callers' bursts what the reserve then served).
const (
	criticalBorrowedNum  int64 = 2
	criticalBorrowedDen  int64 = 5
	criticalBorrowedMost int64 = 16
	criticalKeptNum      int64 = 9
	criticalKeptDen      int64 = 4
	criticalFloorNum     int64 = 2
	criticalFloorDen     int64 = 5
)

// targets returns the share the policy wants each member to hold at now (zero for dead
// members), the number of live members, the pool size the shares are based on, and the
// number of live members given less rate than they ask for (short: the fair policy's
// contention).
//
// Every member that holds a share needs at least one permit of burst, and a share
// should grant a permit per lease, and a few while the demand is under the limit: when more members want the limit than that
// allows, it is decided at the store instead (centralWanted) and nobody holds a share.
//
// It runs at every grant over every member: it reads each entry once, into lists of
// the members' places and demands (scratch, reused from one grant to the next), and
// works on those.
func (s *State) targets(now int64, cfg Config) (tg []Share, live, size, short int64) {
	tg = getTargets(len(s.Members))
	capa := s.capacity(now) // all of the limit, or the rate a ramp has reached
	burst := capa.Burst
	sc := getScratch(len(s.Members))
	defer scratchPool.Put(sc)
	alive, wanting, idle, dm := sc.alive, sc.wanting, sc.idle, sc.dm[:len(s.Members)]
	// asked is what the members that want capacity ask for in all (fair policy): one
	// asking for as much as it can get counts as more than any reserve allows.
	var asked, lent int64 // lent: what critical callers would borrow (criticalBorrowed)
	critical := false     // some member that wants capacity reports critical demand
	for i := range s.Members {
		e := &s.Members[i]
		if !e.live(now) {
			dm[i] = 0 // wants nothing (byDemand reads the holders from dm)
			continue
		}
		alive = append(alive, i)
		d := e.Demand
		dm[i] = d
		switch {
		case cfg.Policy == Equal || d > 0:
			wanting = append(wanting, i)
			asked += asking(d)
			critical = critical || e.Critical > 0
			lent += s.criticalBorrowed(min(e.Critical, e.Demand))
		case d == 0 && e.Lease.Share.Parked():
			idle = append(idle, i) // it keeps the permit it parked while the burst allows
		}
	}
	sc.alive, sc.wanting, sc.idle = alive, wanting, idle
	// shortOf counts the live members given less rate than they ask for.
	shortOf := func() int64 {
		var n int64
		for _, i := range alive {
			if tg[i].Rate < dm[i] {
				n++
			}
		}
		return n
	}
	live = int64(len(alive))
	size = live
	s.Central = s.centralWanted(now, cfg, int64(len(wanting)), int64(len(alive)), func() (est int64) {
		for _, i := range wanting {
			est += s.Members[i].estimate()
		}
		return est
	})
	s.toBucket(now, live, cfg)
	if live == 0 || s.Central {
		return tg, live, size, shortOf() // decided at the store: nobody holds a share
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
		return tg, live, size, shortOf()
	}
	// Fair: water-fill the rate among holders by the demand they report (what their
	// callers ask, refused requests included; as much as it can get for a member held
	// back), less the reserve kept for critical callers, if any: a member's critical
	// demand then counts for the part of it its share holds, the rest is borrowed.
	kept := reserveFor(capa.Rate, asked)
	ckept := criticalReserve(capa.Rate, burst, int64(len(holders)), live, asked, lent)
	if ckept > 0 {
		kept = 0
		for _, i := range holders {
			if c := min(s.Members[i].Critical, dm[i]); c > 0 && dm[i] < RateScale {
				dm[i] -= s.criticalBorrowed(c)
			}
		}
	}
	left := s.fill(holders, dm, capa.Rate-ckept, tg, sc, critical, ckept > 0)
	// A part of the limit stays free while the demands leave room for it: a reserve, whose
	// saved burst any member whose share refuses a permit borrows from (OpTake with
	// Request.Borrow). Each share holds its own demand's rate and burst; the reserve pools
	// the rest of the burst for everyone, as one limiter would, and a member whose demand
	// grows gets capacity from it at its next renewal without waiting for others to
	// shrink. Shares that held the whole limit would leave the pool nothing, and Poisson
	// demand would be refused by each member's small burst while the limit had room. The
	// reserve shrinks as the demands asked exceed the limit (members held back ask half
	// as much again as they measured, so demands somewhat above it are often members held
	// back by a burst), and is gone once they ask reserveSpan more than the limit, or one
	// asks for as much as it can get (it joins, or its callers wait for more): then the
	// shares hold it all, as max-min fair shares of a limit too small for everyone.
	if !poolable(burst, int64(len(holders))) {
		kept = 0
	}
	// Scale every share by num / den: min(headroom, room / sum), headroom above its
	// demand while the demands leave room, and below it (the rest borrowed) while they
	// leave less than the reserve free. Bursts then: one permit to each holder with a
	// rate, the rest in proportion to rate.
	num, den := int64(1), int64(1)
	scale := false
	if sum, room := capa.Rate-left, capa.Rate-kept; kept > 0 && sum > 0 { // sum: every give
		scale = true
		num, den = shareHeadroomNum, shareHeadroomDen
		if room*den < sum*num {
			num, den = room, sum
		}
	}
	with := sc.with
	var rates int64
	var scaled divMemo
	for _, i := range holders {
		if scale {
			x := tg[i].Rate
			r, _, ok := scaled.get(x)
			if !ok {
				r, _ = mulDiv(x, num, den)
				scaled.put(x, r, 0)
			}
			tg[i].Rate = max(min(r, capa.Rate), min(x, 1))
		}
		if tg[i].Rate > 0 {
			with = append(with, i)
			tg[i].Burst = 1
			rates += tg[i].Rate
		}
		if tg[i].Rate < dm[i] {
			short++ // (the live members that want nothing are not short)
		}
	}
	sc.with = with
	// While a reserve is kept, the shares hold two fifths of the burst beyond the first
	// permits, and the free capacity keeps what is left: a burst that one member's Poisson
	// arrivals need only now and then serves them all from the pool, as one limiter's
	// would. Members that want capacity come first if the burst cannot cover everyone.
	if int64(len(with)) > burst {
		for _, i := range with[burst:] {
			tg[i] = Share{}
		}
		with = with[:burst]
		rates = 0
		for _, i := range with {
			rates += tg[i].Rate
		}
		short = shortOf()
	}
	rest := burst - int64(len(with))
	// An idle member keeps the one permit it parked (a share without rate), while the
	// burst left after every holder's first permit covers it: its next request is then
	// served at once while it asks for a rate again.
	for _, i := range idle {
		if rest <= 0 {
			break
		}
		tg[i].Burst = 1
		rest--
	}
	if rest > 0 && rates > 0 {
		// Largest remainders: floors first, then one more permit each to the largest
		// fractional parts (ties to the earlier name), so the shares' part is handed out.
		part := rest // every share together holds the limit: the whole burst
		if kept > 0 || ckept > 0 {
			part, _ = mulDiv(rest, burstPartNum, burstPartDen)
		}
		// The remainders go straight into largestRemainders' keys (remKey), unless one
		// does not fit (never from Apply).
		rem, keys := sc.rem[:len(with)], sc.keys[:0]
		given, fits := int64(0), len(with) <= math.MaxUint32
		var split divMemo
		for k, i := range with {
			rate := tg[i].Rate
			x, r, ok := split.get(rate)
			if !ok {
				hi, lo := mul128(part, rate)
				x, r = div128(hi, lo, rates)
				split.put(rate, x, r)
			}
			tg[i].Burst += x
			rem[k] = r
			given += x
			fits = fits && r >= 0 && r <= math.MaxUint32
			keys = append(keys, remKey(r, k))
		}
		sc.keys = keys
		n := int(max(0, min(part-given, int64(len(rem)))))
		if !fits {
			for _, k := range largestRemainders(rem, n, sc) {
				tg[with[k]].Burst++
			}
		} else {
			for _, key := range smallestKeys(keys, n) {
				tg[with[key&math.MaxUint32]].Burst++
			}
		}
	}
	return tg, live, size, short
}

// fill water-fills the rate capa among holders by their demands dm into tg and returns
// what is left. The members' critical demand (Entry.Critical: what their callers of the
// critical class ask) comes first: it is water-filled alone, and each member keeps what it
// got there as a floor while the whole limit is then water-filled by member as before
// (each gets the larger of its floor and min(its demand, the level)), so that critical
// callers' permits are not shared out evenly with a sheddable flood's, and a member is
// given no more than before where its floor is below the level. Without critical demand,
// one pass (critical is false when no member reports any). While the store keeps a
// reserve for critical callers (reserved), a member's floor is the part of its critical
// demand its share holds (less criticalBorrowed).
func (s *State) fill(holders []int, dm []int64, capa int64, tg []Share, sc *scratch, critical, reserved bool) int64 {
	var crit []int
	for _, i := range holders {
		if critical && s.Members[i].Critical > 0 {
			crit = append(crit, i)
		}
	}
	if len(crit) == 0 {
		return waterfill(s.byDemand(holders, dm, sc), dm, capa, tg)
	}
	floor := make([]int64, len(dm))
	for _, i := range crit {
		c := s.Members[i].Critical
		if reserved {
			c -= s.criticalBorrowed(c)
		}
		floor[i] = min(c, dm[i])
	}
	slices.SortStableFunc(crit, func(a, b int) int { return cmp.Compare(floor[a], floor[b]) })
	waterfill(crit, floor, capa, tg) // what each gets of its critical demand: its floor
	for _, i := range crit {
		floor[i] = tg[i].Rate
	}
	give := func(i int, level int64) int64 { return max(floor[i], min(dm[i], level)) }
	total := func(level int64) int64 {
		var sum int64
		for _, i := range holders {
			sum += give(i, level)
		}
		return sum
	}
	// The highest level at which the members' rates fit capa (the floors always do).
	lo, hi := int64(0), capa
	if total(hi) <= capa {
		lo = hi
	}
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if total(mid) <= capa {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	left := capa
	for _, i := range holders {
		tg[i].Rate = give(i, lo)
		left -= tg[i].Rate
	}
	// What the level's rounding leaves goes one each to the members held at the level.
	for _, i := range holders {
		if left <= 0 {
			break
		}
		if dm[i] > lo && floor[i] <= lo {
			tg[i].Rate++
			left--
		}
	}
	return left
}

// divMemo remembers the last quotients and remainders of one division that a pass over
// the members makes by their rates: the members held back share a rate or two (the level
// and one more), and a division costs several times a look-up.
type divMemo struct {
	key, q, r [4]int64
	set       [4]bool
}

// get returns the quotient and remainder remembered for key, if any (ok).
func (m *divMemo) get(key int64) (q, r int64, ok bool) {
	if k := key & 3; m.set[k] && m.key[k] == key {
		return m.q[k], m.r[k], true
	}
	return 0, 0, false
}

// put remembers quotient q and remainder r for key.
func (m *divMemo) put(key, q, r int64) {
	k := key & 3
	m.key[k], m.q[k], m.r[k], m.set[k] = key, q, r, true
}

// waterfill gives each member of order (by demand, the lowest first) the rate
// min(its demand dm, an even part of what is left of capa), in that order, into tg, and
// returns what is left.
//
// Once one is held back (its demand above its even part), so are all after it (their
// demands are no lower, their even parts no higher than one more): the last r of them,
// r the remainder of what is left divided evenly, get one more than the others, as the
// division one member at a time gives them. Only the members below that level cost a
// test each, and none a division.
func waterfill(order []int, dm []int64, capa int64, tg []Share) (left int64) {
	left = capa
	for k, i := range order {
		m, d := int64(len(order)-k), dm[i]
		if 0 <= d && d < 1<<31 && m < 1<<31 && d*m <= left || d <= left/m { // d at most its even part
			tg[i].Rate = d
			left -= d
			continue
		}
		tail := order[k:]
		q, r := left/m, left%m
		for j, i := range tail {
			tg[i].Rate = q
			if int64(j) >= m-r {
				tg[i].Rate = q + 1
			}
		}
		return 0 // q(m-r) + (q+1)r: all of it
	}
	return left
}

// reserveFor is the rate the fair policy keeps free of a capacity of rate capa while the
// members ask for asked in all: the reserve while that fits the capacity, shrinking to
// nothing as it grows reserveSpan past it.
func reserveFor(capa, asked int64) int64 {
	full, _ := mulDiv(capa, reserve, RateScale)
	over := asked - capa
	span, _ := mulDiv(capa, reserveSpan, RateScale)
	switch {
	case over <= 0:
		return full
	case over >= span:
		return 0
	}
	r, _ := mulDiv(full, span-over, span)
	return r
}

// asking is what a member reporting demand d (parts of RateScale) counts for in what the
// members ask in all: its demand, and one that asks for as much as it can get (RateScale)
// twice the limit, more than any reserve allows.
func asking(d int64) int64 {
	if d >= RateScale {
		return 2 * RateScale
	}
	return d
}

// poolable reports whether a burst leaves enough beyond the first permit of each of
// holders to pool: with less, a reserve's rate would refill a pool of a permit or two,
// and mostly go unused.
func poolable(burst, holders int64) bool { return 2*(burst-holders) >= holders }

// CrowdedAbove is the number of live members past which a limit is crowded: the lease
// backend relays its members' renewals through the limit's allocator, and its members do
// not borrow (docs/lease.md, "Crowded limits: the relay"); so the store keeps no reserve
// for critical callers on it, which they could not reach.
const CrowdedAbove = 16

// criticalBorrowed is the part of a member's critical demand c (parts of RateScale) that
// it borrows while the store keeps a reserve for critical callers: criticalBorrowedNum /
// criticalBorrowedDen of it, at most criticalBorrowedMost permits a second (each borrowed
// permit is a store round trip, and a member asks for at most borrowsPerWindow between
// two of its requests; Poisson callers asking many permits a renewal vary by a smaller
// part of their demand).
func (s *State) criticalBorrowed(c int64) int64 {
	b, _ := mulDiv(c, criticalBorrowedNum, criticalBorrowedDen)
	most, _ := mulDiv(gcra.MulSat(criticalBorrowedMost, s.Limit.T), RateScale, int64(time.Second))
	return min(b, most)
}

// criticalReserve is the rate the fair policy keeps free for critical callers on a
// capacity of rate capa and burst burst, shared by holders members that ask for asked in
// all, of which critical callers would borrow lent (criticalBorrowed), among live members:
// criticalKeptNum / criticalKeptDen of lent, at most the reserve's part of capa; none
// without critical demand, when the reserve for everyone (reserveFor) is as large, when
// the burst is too short to pool, or on a limit of more than CrowdedAbove live members.
func criticalReserve(capa, burst, holders, live, asked, lent int64) int64 {
	if lent <= 0 || !poolable(burst, holders) || live > CrowdedAbove {
		return 0
	}
	k, _ := mulDiv(lent, criticalKeptNum, criticalKeptDen)
	most, _ := mulDiv(capa, reserve, RateScale)
	if k = min(k, most); k <= reserveFor(capa, asked) {
		return 0
	}
	return k
}

// criticalFloor is what a borrow for member i must leave in the pool at now, in
// nanoseconds of the limit's tolerance: while the store keeps a reserve for critical
// callers and i reports no critical demand, criticalFloorNum / criticalFloorDen of the
// free burst (committed is what the shares hold), in whole permits rounded up; otherwise
// nothing. The store knows members, not requests: a member with critical callers borrows
// the whole pool for any of its callers (its waiting room serves the critical ones first).
func (s *State) criticalFloor(now int64, cfg Config, i int, committed Share) int64 {
	if cfg.Policy != Fair || s.Central || s.Members[i].Critical > 0 {
		return 0
	}
	var asked, lent, holders, live int64
	for j := range s.Members {
		e := &s.Members[j]
		if !e.live(now) {
			continue
		}
		if live++; live > CrowdedAbove {
			return 0 // no reserve on a crowded limit (criticalReserve): no need to count on
		}
		if e.Demand <= 0 {
			continue
		}
		holders++
		asked += asking(e.Demand)
		lent += s.criticalBorrowed(min(e.Critical, e.Demand))
	}
	capa := s.capacity(now)
	if criticalReserve(capa.Rate, capa.Burst, holders, live, asked, lent) == 0 {
		return 0
	}
	free := capa.sub(committed)
	f, _ := mulDivUp(free.Burst, criticalFloorNum, criticalFloorDen)
	return gcra.MulSat(f, s.Limit.T)
}

// scratch holds the index lists targets works with, reused from one grant to the next
// (scratchPool): a grant runs over every member, and lists allocated afresh at each cost a
// large pool more than the policy's arithmetic.
type scratch struct {
	alive, wanting, idle, with, order, idx []int
	rem, dm                                []int64
	keys, keys2                            []uint64
	steps                                  []freeing
	// The order byDemand last returned, of a record of hintLen entries (hintOf), as a
	// hint for the next: from one grant to the next, a few demands move.
	hint    []int
	hintOf  *State
	hintLen int
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// targetsPool holds the lists of shares targets returns, for the next grant once the last
// is done with them (putTargets): a list of every member's share allocated afresh at
// every grant kept a large pool's garbage collector busy.
var targetsPool sync.Pool

// getTargets returns a list of n zero shares.
func getTargets(n int) []Share {
	if p, ok := targetsPool.Get().(*[]Share); ok && cap(*p) >= n {
		tg := (*p)[:n]
		clear(tg)
		return tg
	}
	return make([]Share, n)
}

// putTargets gives a list targets returned back, once nothing reads it any more.
func putTargets(tg []Share) { targetsPool.Put(&tg) }

// getScratch returns scratch lists, empty, with room for n members each.
func getScratch(n int) *scratch {
	sc := scratchPool.Get().(*scratch)
	if cap(sc.alive) < n {
		c := max(n, 2*cap(sc.alive))
		*sc = scratch{
			alive: make([]int, 0, c), wanting: make([]int, 0, c), idle: make([]int, 0, c), with: make([]int, 0, c),
			order: make([]int, 0, c), idx: make([]int, 0, c), rem: make([]int64, c), dm: make([]int64, c),
			keys: make([]uint64, 0, c), steps: sc.steps,
		}
	}
	sc.alive, sc.wanting, sc.idle, sc.with = sc.alive[:0], sc.wanting[:0], sc.idle[:0], sc.with[:0]
	return sc
}

// The sorts below run at every grant over every member that wants a share: each packs its
// key and the member's place into one uint64 and sorts those (ties in the members' order,
// as a stable sort leaves them), where a stable sort by a comparison that reads each
// member's entry cost a large pool most of its store's time. Keys that do not fit (never,
// from Apply: demands are within RateScale, remainders below the sum of the rates) sort
// the old way.

// byDemand returns holders, the members with a positive demand in dm (by member; in the
// members' order), by demand, the lowest first, as a stable sort by demand orders them.
// The result is sc's.
//
// From one grant to the next the holders are mostly the same and a few demands move:
// the order of the last grant on the same record, its keys brought up to date, is
// nearly sorted, and an insertion sort finishes it in a pass and a few moves. Without
// that hint (the members came or went, another record, or too many moves), a radix sort
// of the demands (within RateScale: 20 bits), stable, in two passes of 10 bits, either
// skipped when every demand has the same digit there.
func (s *State) byDemand(holders []int, dm []int64, sc *scratch) []int {
	if order, ok := s.byHint(holders, dm, sc); ok {
		return order
	}
	order := append(sc.order[:0], holders...)
	sc.order = order
	for _, i := range holders {
		if d := dm[i]; d < 0 || d >= 1<<(2*radixBits) || i > math.MaxUint32 {
			slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(dm[a], dm[b]) })
			sc.hintOf = nil
			return order
		}
	}
	keys := sc.keys[:0]
	var or, and uint64 = 0, math.MaxUint64
	for _, i := range holders {
		k := uint64(dm[i])<<32 | uint64(i)
		keys = append(keys, k)
		or, and = or|k, and&k
	}
	sc.keys = keys
	out := keys
	other := sc.tmpKeys(len(keys))
	for pass := range 2 {
		shift := 32 + uint(pass)*radixBits
		if (or^and)>>shift&(1<<radixBits-1) == 0 {
			continue // every key has the same digit: the pass would keep the order
		}
		var count [1 << radixBits]int
		for _, k := range out {
			count[k>>shift&(1<<radixBits-1)]++
		}
		sum := 0
		for d, c := range count {
			count[d] = sum
			sum += c
		}
		for _, k := range out {
			d := k >> shift & (1<<radixBits - 1)
			other[count[d]] = k
			count[d]++
		}
		out, other = other, out
	}
	for k, key := range out {
		order[k] = int(key & math.MaxUint32)
	}
	sc.keepHint(s, order)
	return order
}

// byHint is byDemand from the order it returned last for s, if that is at hand, holds
// the same members, and is close enough to sorted (ok).
func (s *State) byHint(holders []int, dm []int64, sc *scratch) (order []int, ok bool) {
	if sc.hintOf != s || sc.hintLen != len(s.Members) || len(sc.hint) != len(holders) {
		return nil, false
	}
	// The keys of the last order's members, brought up to date, each put in its place
	// among those before it (an insertion sort, given up past a few moves a key: a radix
	// sort costs about that).
	keys := sc.keys[:0]
	moves, most := 0, 4*len(holders)+64
	for _, i := range sc.hint {
		d := dm[i]
		if d <= 0 {
			continue
		}
		if d > math.MaxUint32 {
			return nil, false
		}
		x := uint64(d)<<32 | uint64(i)
		j := len(keys)
		keys = append(keys, x)
		for ; j > 0 && keys[j-1] > x; j-- {
			keys[j] = keys[j-1]
		}
		keys[j] = x
		if moves += len(keys) - 1 - j; moves > most {
			return nil, false
		}
	}
	sc.keys = keys
	if len(keys) != len(holders) {
		return nil, false // members came or went: the last order's holders are not these
	}
	order = sc.order[:0]
	for _, key := range keys {
		order = append(order, int(key&math.MaxUint32))
	}
	sc.keepHint(s, order)
	return order, true
}

// keepHint keeps order, of record s, as the hint for byDemand's next sort (order's list
// becomes the hint's, and the hint's the next order's).
func (sc *scratch) keepHint(s *State, order []int) {
	sc.order, sc.hint = sc.hint[:0], order
	sc.hintOf, sc.hintLen = s, len(s.Members)
}

// radixBits is the digit of byDemand's radix sort: two digits hold any demand up to
// RateScale.
const radixBits = 10

// tmpKeys returns a second key list of n entries, for a radix sort's passes.
func (sc *scratch) tmpKeys(n int) []uint64 {
	if cap(sc.keys2) < n {
		sc.keys2 = make([]uint64, n)
	}
	return sc.keys2[:n]
}

// largestRemainders returns the places of the n largest remainders in rem (ties to the
// earlier place), in no particular order: which places get one more permit, not in what
// order. It selects them (quickselect, O(len(rem)) on average) rather than sorting rem.
// The result is sc's.
func largestRemainders(rem []int64, n int, sc *scratch) []int {
	if n <= 0 {
		return nil
	}
	keys := sc.keys[:0]
	for k, r := range rem {
		if r < 0 || r > math.MaxUint32 || k > math.MaxUint32 {
			// Never from Apply: the places by a stable sort.
			idx := sc.idx[:0]
			for k := range rem {
				idx = append(idx, k)
			}
			sc.idx = idx
			slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(rem[b], rem[a]) })
			return idx[:min(n, len(idx))]
		}
		keys = append(keys, remKey(r, k))
	}
	sc.keys = keys
	idx := sc.idx[:0]
	for _, key := range smallestKeys(keys, n) {
		idx = append(idx, int(key&math.MaxUint32))
	}
	sc.idx = idx
	return idx
}

// remKey is the key of remainder r (at most math.MaxUint32) at place k: the largest
// remainders have the smallest keys, ties to the earlier place, all distinct.
func remKey(r int64, k int) uint64 { return uint64(math.MaxUint32-r)<<32 | uint64(k) }

// smallestKeys reorders keys (all distinct) so that its n smallest come first, and
// returns them, in no particular order.
func smallestKeys(keys []uint64, n int) []uint64 {
	if n <= 0 {
		return nil
	}
	if n < len(keys) {
		selectSmallest(keys, n)
		return keys[:n]
	}
	return keys
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
