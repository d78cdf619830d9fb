package measure

import (
	"math"
	"testing"

	"github.com/sluicehq/sluice"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestJain(t *testing.T) {
	cases := []struct {
		x    []float64
		want float64
	}{
		{[]float64{1, 1, 1, 1}, 1},
		{[]float64{1, 0, 0, 0}, 0.25},
		{[]float64{2, 1}, 9.0 / 10.0},         // (3)² / (2·5)
		{[]float64{3, 1, 1, 1}, 0.75},         // 36 / (4·12)
		{[]float64{10, 10, 5}, 625.0 / 675.0}, // (25)² / (3·225)
		{nil, 1},
	}
	for i, c := range cases {
		if got := Jain(c.x); !near(got, c.want) {
			t.Errorf("case %d %v: got %v, want %v", i, c.x, got, c.want)
		}
	}
}

func TestMaxMin(t *testing.T) {
	inf := math.Inf(1)
	cases := []struct {
		cap     float64
		demands []float64
		want    []float64
	}{
		{20, []float64{inf, inf, inf, inf}, []float64{5, 5, 5, 5}},
		{20, []float64{2, inf, inf}, []float64{2, 9, 9}},
		{20, []float64{2, 4, 100}, []float64{2, 4, 14}},
		{20, []float64{1, 2, 3}, []float64{1, 2, 3}}, // demand below capacity: everyone satisfied
		{20, []float64{0, inf}, []float64{0, 20}},
	}
	for i, c := range cases {
		got := MaxMin(c.cap, c.demands)
		for j := range got {
			if !near(got[j], c.want[j]) {
				t.Errorf("case %d: got %v, want %v", i, got, c.want)
				break
			}
		}
	}
}

// TestFairSharesLateJoiner: 20/s for 10 s; member 0 wants everything throughout, member 1
// joins at 5 s. Fair shares: member 0 gets 20·5 + 10·5 = 150, member 1 gets 50. If they
// were granted exactly that, Jain over granted/fair is 1, though raw counts differ 3:1.
func TestFairSharesLateJoiner(t *testing.T) {
	inf := math.Inf(1)
	fair := FairShares(20, 2, []Span{{0, 0, 10, inf}, {1, 5, 10, inf}})
	if !near(fair[0], 150) || !near(fair[1], 50) {
		t.Fatalf("fair shares %v, want [150 50]", fair)
	}
	if j := JainOfShares([]float64{150, 50}, fair); !near(j, 1) {
		t.Errorf("Jain of exact fair shares: %v", j)
	}
	if j := Jain([]float64{150, 50}); !near(j, 0.8) {
		t.Errorf("raw Jain would say %v", j)
	}
	// Had they split the whole run 100/100, the late joiner got twice its share.
	if j := JainOfShares([]float64{100, 100}, fair); !near(j, (100.0/150+2)*(100.0/150+2)/(2*((100.0/150)*(100.0/150)+4))) {
		t.Errorf("Jain of an unfair split: %v", j)
	}
}

func TestFairSharesOnOff(t *testing.T) {
	inf := math.Inf(1)
	// Member 0 on for 0-4 s; member 1 on for 2-6 s; member 2 asks 2/s throughout 0-6 s.
	fair := FairShares(10, 3, []Span{{0, 0, 4, inf}, {1, 2, 6, inf}, {2, 0, 6, 2}})
	// 0-2: m0 8/s, m2 2/s. 2-4: m0 4, m1 4, m2 2. 4-6: m1 8, m2 2.
	want := []float64{16 + 8, 8 + 16, 12}
	for i := range want {
		if !near(fair[i], want[i]) {
			t.Fatalf("fair shares %v, want %v", fair, want)
		}
	}
}

func TestCapacityAndUtilization(t *testing.T) {
	c, r := Capacity(sluice.MustParse("20/s burst=10"), 5)
	if !near(c, 110) || !near(r, 20) {
		t.Errorf("capacity %v rate %v, want 110 20", c, r)
	}
	// Several limits: the tightest over the window binds.
	c, r = Capacity(sluice.MustParse("20/s burst=10; 60/m"), 5)
	if !near(c, 65) || !near(r, 1) {
		t.Errorf("two limits: capacity %v rate %v, want 65 (60 + 1×5) and 1", c, r)
	}
	if u := Utilization(109, 110); !near(u, 109.0/110) {
		t.Errorf("got %v", u)
	}
	if u := Utilization(5, 0); u != 0 {
		t.Errorf("zero capacity: %v", u)
	}
}

// TestMaxMinWeighted: 12 among weights 1, 2 and 3, the first asking 1: it gets 1, the
// other two share 11 as 2:3; equal weights are MaxMin.
func TestMaxMinWeighted(t *testing.T) {
	inf := math.Inf(1)
	got := MaxMinWeighted(12, []float64{1, inf, inf}, []float64{1, 2, 3})
	if !near(got[0], 1) || !near(got[1], 4.4) || !near(got[2], 6.6) {
		t.Fatalf("weighted shares %v, want [1 4.4 6.6]", got)
	}
	// A heavy member asking less than its weighted part gives the rest to the others.
	got = MaxMinWeighted(12, []float64{inf, 2, inf}, []float64{1, 8, 3})
	if !near(got[1], 2) || !near(got[0], 2.5) || !near(got[2], 7.5) {
		t.Fatalf("weighted shares %v, want [2.5 2 7.5]", got)
	}
	eq, mm := MaxMinWeighted(10, []float64{1, 5, inf}, nil), MaxMin(10, []float64{1, 5, inf})
	for i := range eq {
		if !near(eq[i], mm[i]) || !near(mm[i], []float64{1, 4.5, 4.5}[i]) {
			t.Fatalf("unweighted %v, MaxMin %v, want [1 4.5 4.5]", eq, mm)
		}
	}
}

// TestFairSharesOverALimitChange: 10/s for 10 s, then 5/s for 10 s; two members always
// busy: each gets 50 + 25, not 100 as a constant 10/s would give.
func TestFairSharesOverALimitChange(t *testing.T) {
	inf := math.Inf(1)
	fair := FairSharesOver([]Step{{0, 10}, {10, 5}}, 2, []Span{{0, 0, 20, inf}, {1, 0, 20, inf}}, nil)
	if !near(fair[0], 75) || !near(fair[1], 75) {
		t.Fatalf("fair shares %v, want [75 75]", fair)
	}
	// One member asking 4/s throughout: all of it before (6 left for the other), an equal
	// split of 5 after (4 is more than 2.5).
	fair = FairSharesOver([]Step{{0, 10}, {10, 5}}, 2, []Span{{0, 0, 20, inf}, {1, 0, 20, 4}}, nil)
	if !near(fair[0], 60+25) || !near(fair[1], 40+25) {
		t.Fatalf("fair shares %v, want [85 65]", fair)
	}
}
