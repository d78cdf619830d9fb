package allot

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/gcra"
)

// BenchmarkDecide: one permit now or not at all on a member's share of one limit, by
// Decide (the long way, which the backend takes when AllowOne does not apply), at the
// share's rate, within the lease.
func BenchmarkDecide(b *testing.B) {
	l := lim(1_000_000, time.Second, 1000) // T = 1µs
	m := sharedMember(b, l)
	one := []*Member{m}
	now := 2 * ms
	b.ReportAllocs()
	for b.Loop() {
		if now += 1000; now > 900*ms { // start again before the lease ends
			now, m.bucket.tat = 2*ms, 0
		}
		if res, _, _, err := Decide(one, now, 1, 0); err != nil || !res.Allowed {
			b.Fatalf("at %v: %+v, %v", time.Duration(now), res, err)
		}
	}
}

// BenchmarkDecideKeeping is BenchmarkDecide for a decision that keeps 40% of the share's
// burst for a higher class (DecideKeeping).
func BenchmarkDecideKeeping(b *testing.B) {
	l := lim(1_000_000, time.Second, 1000)
	m := sharedMember(b, l)
	one := []*Member{m}
	keep := [gcra.MaxLimits]float64{0.4}
	now := 2 * ms
	b.ReportAllocs()
	for b.Loop() {
		if now += 1000; now > 900*ms {
			now, m.bucket.tat = 2*ms, 0
		}
		if res, _, _, err := DecideKeeping(one, now, 1, 0, &keep); err != nil || !res.Allowed {
			b.Fatalf("at %v: %+v, %v", time.Duration(now), res, err)
		}
	}
}
