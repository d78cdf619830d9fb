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

// TestByDemandMatchesAStableSort: byDemand orders the holders (the members with a
// positive demand) as a stable sort by demand does (ties in the members' order), from
// scratch and from the hint of its last sort: the same record with a few demands moved
// (or many), holders come and gone, or members added.
func TestByDemandMatchesAStableSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 500 {
		s := &State{Members: make([]Entry, 1+rng.IntN(300))}
		spread := []int64{2, 10, RateScale + 1, 1 << 40}[trial%4]
		for i := range s.Members {
			s.Members[i].Demand = rng.Int64N(spread)
		}
		sc := getScratch(len(s.Members) + 1)
		holds := make([]bool, len(s.Members)+1) // which members hold, if their demand is positive
		for i := range holds {
			holds[i] = rng.IntN(4) > 0
		}
		for round := range 6 {
			switch round {
			case 1: // a few demands move
				for range 3 {
					s.Members[rng.IntN(len(s.Members))].Demand = rng.Int64N(spread)
				}
			case 2: // many do
				for i := range s.Members {
					s.Members[i].Demand = rng.Int64N(spread)
				}
			case 3: // a member joins
				s.Members = append(s.Members, Entry{Demand: rng.Int64N(spread)})
			}
			var holders []int
			dm := make([]int64, len(s.Members))
			for i := range s.Members {
				if d := s.Members[i].Demand; d > 0 && (round == 5 || holds[i] != (round == 4)) {
					holders = append(holders, i)
					dm[i] = d
				}
			}
			want := slices.Clone(holders)
			slices.SortStableFunc(want, func(a, b int) int { return cmp.Compare(dm[a], dm[b]) })
			if got := s.byDemand(holders, dm, sc); !slices.Equal(got, want) {
				t.Fatalf("trial %d round %d: got %v, want %v", trial, round, got, want)
			}
		}
	}
}

// TestWaterfillMatchesOneAtATime: waterfill gives what dividing what is left evenly, one
// member at a time in demand order, gives.
func TestWaterfillMatchesOneAtATime(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := range 2000 {
		n := 1 + rng.IntN(50)
		dm := make([]int64, n)
		for i := range dm {
			dm[i] = rng.Int64N([]int64{3, 100, RateScale + 1}[trial%3])
		}
		order := make([]int, n)
		for k := range order {
			order[k] = k
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(dm[a], dm[b]) })
		capa := rng.Int64N(RateScale + 1)
		want, got := make([]Share, n), make([]Share, n)
		left := capa
		for k, i := range order {
			give := min(dm[i], left/int64(n-k))
			want[i].Rate = give
			left -= give
		}
		if l := waterfill(order, dm, capa, got); l != left || !slices.Equal(got, want) {
			t.Fatalf("trial %d: demands %v of %d: got %v left %d, want %v left %d", trial, dm, capa, got, l, want, left)
		}
	}
}
