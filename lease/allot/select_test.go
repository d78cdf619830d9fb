package allot

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestLargestRemaindersMatchesAStableSort: the places largestRemainders picks are the first
// n of the places sorted stably by remainder, the largest first, whatever the remainders
// (ties, sorted, reversed, random) and n.
func TestLargestRemaindersMatchesAStableSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 2000 {
		size := 1 + rng.IntN(300)
		rem := make([]int64, size)
		spread := []int64{1, 3, 1000, 1_000_000}[trial%4]
		for k := range rem {
			rem[k] = rng.Int64N(spread)
		}
		switch trial % 5 {
		case 1:
			slices.Sort(rem)
		case 2:
			slices.Sort(rem)
			slices.Reverse(rem)
		}
		want := make([]int, size)
		for k := range want {
			want[k] = k
		}
		slices.SortStableFunc(want, func(a, b int) int { return cmp.Compare(rem[b], rem[a]) })
		n := rng.IntN(size + 1)
		got := slices.Clone(largestRemainders(rem, n, getScratch(size)))
		slices.Sort(got)
		w := slices.Clone(want[:n])
		slices.Sort(w)
		if !slices.Equal(got, w) {
			t.Fatalf("trial %d: rem %v, n %d: got %v, want %v", trial, rem, n, got, w)
		}
	}
}

// TestByDemandMatchesAStableSort: byDemand orders the holders as a stable sort by demand
// does (ties in the members' order).
func TestByDemandMatchesAStableSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 500 {
		s := &State{Members: make([]Entry, 1+rng.IntN(300))}
		for i := range s.Members {
			s.Members[i].Demand = rng.Int64N([]int64{2, 10, RateScale + 1, 1 << 40}[trial%4])
		}
		var holders []int
		for i := range s.Members {
			if rng.IntN(4) > 0 {
				holders = append(holders, i)
			}
		}
		want := slices.Clone(holders)
		slices.SortStableFunc(want, func(a, b int) int { return cmp.Compare(s.Members[a].Demand, s.Members[b].Demand) })
		if got := s.byDemand(holders, getScratch(len(s.Members))); !slices.Equal(got, want) {
			t.Fatalf("trial %d: got %v, want %v", trial, got, want)
		}
	}
}
