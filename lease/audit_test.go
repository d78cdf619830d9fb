package lease_test

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/lease"
)

// The audit of a multi-process run from what its members printed (record): whether the
// members decided more than the limit (over-admission), judged exactly on the decisions,
// apart from when the permits were used (the machine's scheduling).

// auditShares checks that the shares the members may be using (each member's share while
// its lease may be used, and an older lease's while permits booked under it are pending:
// Member.InUse, as its statuses tell it) sum to at most the limit's rate and burst at
// every instant.
func auditShares(r record, l gcra.Limit) error {
	var xs []int64
	for _, ls := range r.leases {
		for _, s := range ls {
			xs = append(xs, s.at, s.end, s.prevEnd)
		}
	}
	slices.Sort(xs)
	xs = slices.Compact(xs)
	for _, x := range xs {
		var sum lease.Share
		var each []string
		for i, ls := range r.leases {
			if s, ok := statusAt(ls, x); ok {
				u := s.inUse(x)
				sum.Rate += u.Rate
				sum.Burst += u.Burst
				each = append(each, fmt.Sprintf("member %d: %+v (lease %d from %d to %d, older %+v to %d)", i, u, s.seq, s.at, s.end, s.prev, s.prevEnd))
			}
		}
		if sum.Rate > lease.RateScale || sum.Burst > l.Burst() {
			return fmt.Errorf("at %d the members' shares in use sum to rate %d burst %d, past the limit's %d and %d: %s",
				x, sum.Rate, sum.Burst, lease.RateScale, l.Burst(), strings.Join(each, "; "))
		}
	}
	return nil
}

// statusAt returns the member's latest status at or before x.
func statusAt(ls []leaseSeen, x int64) (leaseSeen, bool) {
	i, _ := slices.BinarySearchFunc(ls, x, func(s leaseSeen, x int64) int {
		if s.at <= x {
			return -1
		}
		return 1
	})
	if i == 0 {
		return leaseSeen{}, false
	}
	return ls[i-1], true
}

// auditMembers checks each member's permits against the leases it held: each permit's
// slot lies before the end of the lease it was decided under (the latest status at its
// decision: a status is taken when the answer is applied, under the lock every decision
// takes), and a member's slots conform to
// the share they were decided under (its GCRA interval and burst) over each run of
// decisions under one share. At a change of share the bucket is judged as starting full:
// how much of its level a member carries over, and what the store's saved burst adds,
// are not printed, so the check is that much looser there. Permits the member borrowed
// from the free capacity (decided at the store, apart from its share: r.borrowed) are
// left to the pool's audit.
func auditMembers(r record, l gcra.Limit) error {
	for i, ps := range r.permits {
		ls := r.leases[i]
		ps = slices.Clone(ps)
		slices.SortFunc(ps, func(a, b permit) int { return cmp.Compare(a.slot, b.slot) })
		borrowed := map[int64]int{}
		if i < len(r.borrowed) {
			for _, at := range r.borrowed[i] {
				borrowed[at]++
			}
		}
		var tat int64
		var cur lease.Share
		for k, p := range ps {
			if borrowed[p.slot] > 0 {
				borrowed[p.slot]--
				continue
			}
			s, ok := statusAt(ls, p.decided)
			if !ok || p.slot >= s.end {
				return fmt.Errorf("member %d: permit %d (slot %d, decided %d) lies past its lease's end %d (its status at %d)",
					i, k, p.slot, p.decided, s.end, s.at)
			}
			if s.share != cur {
				cur, tat = s.share, 0 // a new share: judged from full
			}
			sl, ok := cur.Limit(l)
			if !ok {
				return fmt.Errorf("member %d: permit %d decided on share %+v, which grants nothing", i, k, cur)
			}
			var allowed bool
			if tat, allowed = gcra.AllowOne(tat, sl, p.slot); !allowed {
				return fmt.Errorf("member %d: permit %d's slot %d breaks its share %+v (interval %v, burst %d)", i, k, p.slot, cur, time.Duration(sl.T), sl.Burst())
			}
		}
	}
	return nil
}

// lateness returns the largest and the 99th percentile of how long after their slots
// the permits with slots in [from, to) were used, and how many there were.
func lateness(r record, from, to int64) (worst, p99 time.Duration, n int) {
	var ls []int64
	for _, ps := range r.permits {
		for _, p := range ps {
			if p.slot >= from && p.slot < to {
				ls = append(ls, p.use-p.slot)
			}
		}
	}
	if len(ls) == 0 {
		return 0, 0, 0
	}
	slices.Sort(ls)
	return time.Duration(ls[len(ls)-1]), time.Duration(ls[len(ls)*99/100]), len(ls)
}

// reclaimed returns the first instant in [from, to) at which the shares the members not in
// gone may be using sum to at least 99% of the limit's rate (a member's share, once it has
// gone, back in use by the others), or -1.
func reclaimed(r record, gone map[int]bool, from, to int64) int64 {
	var xs []int64
	for i, ls := range r.leases {
		if gone[i] {
			continue
		}
		for _, s := range ls {
			if s.at >= from && s.at < to {
				xs = append(xs, s.at)
			}
		}
	}
	slices.Sort(xs)
	for _, x := range xs {
		var sum int64
		for i, ls := range r.leases {
			if s, ok := statusAt(ls, x); ok && !gone[i] {
				sum += s.inUse(x).Rate
			}
		}
		if sum >= lease.RateScale*99/100 {
			return x
		}
	}
	return -1
}

// TestAuditCatches: the audit of the multi-process runs finds each kind of over-admission
// in a made-up record, and passes a record without.
func TestAuditCatches(t *testing.T) {
	l := limitconv.Core(sluice.MustParse("200/s burst=20"), 0)[0]
	const ms = int64(time.Millisecond)
	half := lease.Share{Rate: lease.RateScale / 2, Burst: 10}
	// lease returns a status at `at` with share s usable until end.
	held := func(at, end int64, s lease.Share) leaseSeen { return leaseSeen{at: at, end: end, share: s} }
	// burst returns n permits at `at`, decided then.
	burst := func(at int64, n int) []permit {
		ps := make([]permit, n)
		for i := range ps {
			ps[i] = permit{use: at, slot: at, decided: at}
		}
		return ps
	}
	for i, c := range []struct {
		name           string
		rec            record
		shares, member bool // want auditShares, auditMembers to find an excess
	}{
		{"two halves", record{
			leases:  [][]leaseSeen{{held(0, 1000*ms, half)}, {held(10*ms, 1000*ms, half)}},
			permits: [][]permit{burst(20*ms, 10), burst(20*ms, 10)},
		}, false, false},
		{"rates past the limit", record{
			leases:  [][]leaseSeen{{held(0, 1000*ms, lease.Share{Rate: 600_000, Burst: 10})}, {held(500*ms, 1000*ms, half)}},
			permits: [][]permit{nil, nil},
		}, true, false},
		{"bursts past the limit", record{
			leases:  [][]leaseSeen{{held(0, 1000*ms, lease.Share{Rate: 400_000, Burst: 15})}, {held(500*ms, 1000*ms, half)}},
			permits: [][]permit{nil, nil},
		}, true, false},
		{"an older share still in use", record{
			leases: [][]leaseSeen{{{at: 0, end: 1000 * ms, share: half, prev: lease.Share{Rate: lease.RateScale, Burst: 20}, prevEnd: 300 * ms}},
				{held(200*ms, 1000*ms, half)}},
			permits: [][]permit{nil, nil},
		}, true, false},
		{"a share's end, then another's start", record{
			leases:  [][]leaseSeen{{held(0, 400*ms, lease.Share{Rate: lease.RateScale, Burst: 20})}, {held(400*ms, 1000*ms, lease.Share{Rate: lease.RateScale, Burst: 20})}},
			permits: [][]permit{nil, nil},
		}, false, false},
		{"past a member's burst", record{
			leases:  [][]leaseSeen{{held(0, 1000*ms, half)}},
			permits: [][]permit{burst(20*ms, 11)},
		}, false, true},
		{"past a member's rate", record{
			leases:  [][]leaseSeen{{held(0, 1000*ms, half)}},
			permits: [][]permit{append(burst(20*ms, 10), permit{use: 25 * ms, slot: 25 * ms, decided: 25 * ms})},
		}, false, true},
		{"after its lease's end", record{
			leases:  [][]leaseSeen{{held(0, 100*ms, half)}},
			permits: [][]permit{{{use: 90 * ms, slot: 100 * ms, decided: 90 * ms}}},
		}, false, true},
		{"decided on the lease taken then", record{
			leases:  [][]leaseSeen{{held(0, 100*ms, half), held(100*ms, 1000*ms, half)}},
			permits: [][]permit{{{use: 100 * ms, slot: 100 * ms, decided: 100 * ms}}},
		}, false, false},
	} {
		if err := auditShares(c.rec, l); (err != nil) != c.shares {
			t.Errorf("step %d (%s): auditShares: %v, want an excess: %v", i, c.name, err, c.shares)
		}
		if err := auditMembers(c.rec, l); (err != nil) != c.member {
			t.Errorf("step %d (%s): auditMembers: %v, want an excess: %v", i, c.name, err, c.member)
		}
	}
	// Member 1 goes at 0; its share is back in use when the other two hold the whole rate.
	r := record{leases: [][]leaseSeen{
		{held(0, 2000*ms, lease.Share{Rate: 333_333, Burst: 6}), held(1500*ms, 3000*ms, lease.Share{Rate: 500_000, Burst: 10})},
		{held(0, 900*ms, lease.Share{Rate: 333_333, Burst: 6})},
		{held(0, 2000*ms, lease.Share{Rate: 333_333, Burst: 6}), held(1600*ms, 3000*ms, lease.Share{Rate: 500_000, Burst: 10})},
	}}
	if got := reclaimed(r, map[int]bool{1: true}, 0, 3000*ms); got != 1600*ms {
		t.Errorf("reclaimed at %v, want 1.6s", time.Duration(got))
	}
	if got := reclaimed(r, map[int]bool{1: true}, 0, 1550*ms); got != -1 {
		t.Errorf("reclaimed before 1.55s at %v, want never (-1)", time.Duration(got))
	}
	// Or used all the same: 200/s from 1 s on (a permit every 5 ms), the shares short of
	// the whole rate (a reserve kept free, the rest borrowed); 150/s is not enough.
	var full, short []int64
	for x := int64(0); x < 3000*ms; x += 5 * ms {
		if x >= 1000*ms {
			full = append(full, x)
		}
		if (x/(5*ms))%4 != 0 {
			short = append(short, x)
		}
	}
	if got := reclaimedOrUsed(r, map[int]bool{1: true}, full, 200, 0, 1550*ms); got < 950*ms || got > 1000*ms {
		t.Errorf("used in full at %v, want from the half second that holds 95 of them, about 1s", time.Duration(got))
	}
	if got := reclaimedOrUsed(r, map[int]bool{1: true}, short, 200, 0, 1550*ms); got != -1 {
		t.Errorf("three quarters of the rate counted as reclaimed at %v", time.Duration(got))
	}
}

// reclaimedOrUsed is when, from from on and before to, the members not gone hold the whole
// rate between them (reclaimed), or use it all the same, at least 0.95 of perSec over half
// a second of uses (sorted use times): where the store keeps a reserve free because their
// demands leave room, they borrow what their shares do not grant. -1: neither.
func reclaimedOrUsed(r record, gone map[int]bool, uses []int64, perSec float64, from, to int64) int64 {
	back := reclaimed(r, gone, from, to)
	const win = int64(500 * time.Millisecond)
	for x := from; x+win <= to && (back < 0 || x < back); x += int64(10 * time.Millisecond) {
		if float64(between(uses, x, x+win)) >= 0.95*perSec*0.5 {
			return x
		}
	}
	return back
}
