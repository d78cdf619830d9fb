// Package measure holds the arithmetic of docs/concepts.md that the demo, the simulator and the
// tests judge Sluice by: utilization, max-min fair shares integrated over time, and Jain's
// fairness index.
package measure

import (
	"math"
	"slices"
	"sort"

	"github.com/sluicehq/sluice"
)

// Jain returns Jain's fairness index (Σx)² / (n·Σx²) of x: 1 when all are equal, 1/n when
// one has everything. It returns 1 for an empty or all-zero x (nothing to be unfair about).
func Jain(x []float64) float64 {
	var s, s2 float64
	for _, v := range x {
		s += v
		s2 += v * v
	}
	if len(x) == 0 || s2 == 0 {
		return 1
	}
	return s * s / (float64(len(x)) * s2)
}

// MaxMin splits capacity among demands by water-filling: nobody gets more than it asks,
// and what is left is shared equally among those who want more. Demands may be +Inf.
func MaxMin(capacity float64, demands []float64) []float64 {
	return MaxMinWeighted(capacity, demands, nil)
}

// MaxMinWeighted is MaxMin with weights: what is left is shared among those who want more
// in proportion to their weights (nil: equal weights; a weight <= 0 counts as 1). It is
// the fair share of a throttle that serves callers rather than members, each member
// weighing its callers.
func MaxMinWeighted(capacity float64, demands, weights []float64) []float64 {
	w := func(i int) float64 {
		if weights == nil || weights[i] <= 0 {
			return 1
		}
		return weights[i]
	}
	out := make([]float64, len(demands))
	idx := make([]int, 0, len(demands))
	var total float64 // the weight of those not yet served
	for i, d := range demands {
		if d > 0 {
			idx = append(idx, i)
			total += w(i)
		}
	}
	sort.Slice(idx, func(a, b int) bool { return demands[idx[a]]/w(idx[a]) < demands[idx[b]]/w(idx[b]) })
	left := capacity
	for _, i := range idx {
		fair := left * w(i) / total
		give := math.Min(demands[i], fair)
		out[i] = give
		left -= give
		total -= w(i)
	}
	return out
}

// Span says that member Member wanted Demand permits per second from Start to End
// (seconds). A member with several spans has the sum of those that cover an instant.
type Span struct {
	Member     int
	Start, End float64
	Demand     float64 // permits per second; math.Inf(1) for "as many as it can get"
}

// FairShares integrates each member's max-min fair share of a capacity (permits per
// second) over time, from the spans of demand: the fair share of docs/concepts.md, under which
// a member that joined late or asked for little is not judged unfair. It sweeps the span
// boundaries in time order, so it costs O(S log S + C·M log M) for S spans, C distinct
// boundaries and M members.
func FairShares(capacity float64, members int, spans []Span) []float64 {
	return FairSharesWeighted(capacity, members, spans, nil)
}

// FairSharesWeighted is FairShares with each member's share of what is left weighed by
// weights[member] (MaxMinWeighted; nil: equal).
func FairSharesWeighted(capacity float64, members int, spans []Span, weights []float64) []float64 {
	return FairSharesOver([]Step{{0, capacity}}, members, spans, weights)
}

// Step is a capacity (permits per second) from time At (seconds) on.
type Step struct {
	At       float64
	Capacity float64
}

// FairSharesOver is FairSharesWeighted under a capacity that changes: steps, in time
// order, each from its At until the next's (the first holds before its At too): a limit
// changed during the run shares what it allows then, not what it allowed at the start.
func FairSharesOver(steps []Step, members int, spans []Span, weights []float64) []float64 {
	type edge struct {
		t      float64
		member int
		delta  float64
	}
	edges := make([]edge, 0, 2*len(spans)+len(steps))
	for _, s := range spans {
		if s.End > s.Start && s.Demand > 0 {
			edges = append(edges, edge{s.Start, s.Member, s.Demand}, edge{s.End, s.Member, -s.Demand})
		}
	}
	for _, st := range steps[1:] {
		edges = append(edges, edge{st.At, -1, 0}) // a boundary: the capacity changes
	}
	capacityAt := func(t float64) float64 {
		c := steps[0].Capacity
		for _, st := range steps[1:] {
			if st.At <= t {
				c = st.Capacity
			}
		}
		return c
	}
	slices.SortStableFunc(edges, func(a, b edge) int {
		switch {
		case a.t < b.t:
			return -1
		case a.t > b.t:
			return 1
		}
		return 0
	})
	shares := make([]float64, members)
	demand := make([]float64, members)
	inf := make([]int, members) // open spans of infinite demand: Inf - Inf is not 0
	cur := make([]float64, members)
	for k := 0; k < len(edges); {
		t := edges[k].t
		for ; k < len(edges) && edges[k].t == t; k++ {
			e := edges[k]
			switch {
			case e.member < 0:
			case math.IsInf(e.delta, 1):
				inf[e.member]++
			case math.IsInf(e.delta, -1):
				inf[e.member]--
			default:
				demand[e.member] = math.Max(0, demand[e.member]+e.delta)
			}
		}
		if k == len(edges) {
			break
		}
		next := edges[k].t
		for i := range cur {
			cur[i] = demand[i]
			if inf[i] > 0 {
				cur[i] = math.Inf(1)
			}
		}
		for i, v := range MaxMinWeighted(capacityAt(t), cur, weights) {
			shares[i] += v * (next - t)
		}
	}
	return shares
}

// ShareBurst adds a burst to fair shares: it is there at the start, so it is the equal
// share of the members whose demand began within `within` seconds of the first span.
func ShareBurst(fair []float64, spans []Span, burst, within float64) {
	if burst <= 0 || len(spans) == 0 {
		return
	}
	first := math.Inf(1)
	for _, s := range spans {
		first = math.Min(first, s.Start)
	}
	var early []int
	for _, s := range spans {
		if s.Start <= first+within && !slices.Contains(early, s.Member) {
			early = append(early, s.Member)
		}
	}
	for _, i := range early {
		fair[i] += burst / float64(len(early))
	}
}

// JainOfShares is Jain's index over granted[i] / fair[i], leaving out members whose fair
// share is zero (they wanted nothing).
func JainOfShares(granted, fair []float64) float64 {
	var x []float64
	for i := range granted {
		if fair[i] > 0 {
			x = append(x, granted[i]/fair[i])
		}
	}
	return Jain(x)
}

// Capacity is what limits allowed over a window of windowSec seconds in which demand
// exceeded them: Burst + Rate × window for the tightest limit. It also returns the
// tightest rate in permits per second.
func Capacity(limits sluice.Limits, windowSec float64) (capacity, rate float64) {
	capacity, rate = math.Inf(1), math.Inf(1)
	for _, l := range limits {
		r := float64(l.Rate) / l.Period.Seconds()
		b := float64(l.Burst)
		if l.Burst == 0 {
			b = float64(l.Rate)
		}
		capacity = math.Min(capacity, b+r*windowSec)
		rate = math.Min(rate, r)
	}
	return capacity, rate
}

// Utilization is accepted / capacity (see Capacity): the share of what the limit allowed
// that was used. It is 0 when the capacity is not positive and finite.
func Utilization(accepted, capacity float64) float64 {
	if capacity <= 0 || math.IsInf(capacity, 1) {
		return 0
	}
	return accepted / capacity
}
