package allot

import (
	"math"
	"math/bits"

	"github.com/sluicehq/sluice/gcra"
)

// RateScale is the unit of a share's rate: a Share's Rate counts parts per million of the
// limit's rate. Shares are integers so that sums are exact: rates that sum to at most
// RateScale give members intervals whose rates sum to at most the limit's (each interval is
// rounded up, see Share.Limit).
const RateScale int64 = 1_000_000

// Share is a part of one limit: Rate parts of RateScale of its rate, and Burst permits of
// its burst. The zero value is no share at all.
type Share struct {
	Rate  int64 `json:"r"`
	Burst int64 `json:"b"`
}

// IsZero reports whether s grants nothing.
func (s Share) IsZero() bool { return s.Rate == 0 && s.Burst == 0 }

// Fits reports whether s is at most c in both rate and burst.
func (s Share) Fits(c Share) bool { return s.Rate <= c.Rate && s.Burst <= c.Burst }

func maxShare(a, b Share) Share { return Share{max(a.Rate, b.Rate), max(a.Burst, b.Burst)} }
func minShare(a, b Share) Share { return Share{min(a.Rate, b.Rate), min(a.Burst, b.Burst)} }
func (s Share) add(o Share) Share {
	return Share{s.Rate + o.Rate, s.Burst + o.Burst}
}

// diff is s - o, exactly (sub stops at zero).
func (s Share) diff(o Share) Share { return Share{s.Rate - o.Rate, s.Burst - o.Burst} }

func (s Share) sub(o Share) Share {
	return Share{max(0, s.Rate-o.Rate), max(0, s.Burst-o.Burst)}
}

// Limit returns the share of l as a member's own GCRA limit: the interval
// ceil(l.T × RateScale / Rate), so the member's rate is at most its part of the limit's,
// and a tolerance of Burst such intervals. A parked share (no rate, some burst: the
// permits an idle member kept) never refills: its interval is as long as can be. ok is
// false for a share that can grant nothing (no whole permit of burst, or an interval too
// long to represent).
func (s Share) Limit(l gcra.Limit) (gcra.Limit, bool) {
	if s.Burst < 1 || s.Rate < 0 {
		return gcra.Limit{}, false
	}
	if s.Rate == 0 {
		t := gcra.MaxTau / s.Burst
		return gcra.Limit{T: t, Tau: t * s.Burst}, true
	}
	t, ok := mulDivUp(l.T, RateScale, min(s.Rate, RateScale))
	if !ok || t > gcra.MaxTau/s.Burst {
		return gcra.Limit{}, false
	}
	return gcra.Limit{T: t, Tau: t * s.Burst}, true
}

// Parked reports whether s is a parked share: burst without rate.
func (s Share) Parked() bool { return s.Rate == 0 && s.Burst > 0 }

// normalize returns s if it can grant something, and the zero share otherwise: a rate
// without a whole permit of burst is no use to a member and would only hold capacity
// back from others.
func (s Share) normalize(l gcra.Limit) Share {
	if _, ok := s.Limit(l); !ok {
		return Share{}
	}
	return s
}

// mulDiv returns floor(a×b/c) for non-negative a, b and positive c, and false if it does
// not fit in an int64.
func mulDiv(a, b, c int64) (int64, bool) {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64, false
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	if q > math.MaxInt64 {
		return math.MaxInt64, false
	}
	return int64(q), true
}

// mulDivUp returns ceil(a×b/c) for non-negative a, b and positive c, and false if it does
// not fit in an int64.
func mulDivUp(a, b, c int64) (int64, bool) {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64, false
	}
	q, r := bits.Div64(hi, lo, uint64(c))
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64, false
	}
	return int64(q), true
}

// convertLevel expresses a bucket level, in nanoseconds of tolerance at interval from
// (level/from permits, negative for a debt of reserved permits), at interval to, rounding
// toward fewer permits: a level never grows by a change of units.
func convertLevel(level, from, to int64) int64 {
	if level >= 0 {
		v, _ := mulDiv(level, to, from)
		return v
	}
	v, ok := mulDivUp(-level, to, from)
	if !ok {
		return -gcra.MaxTau
	}
	return -min(v, gcra.MaxTau)
}

// mul128 returns a×b as a 128-bit value, for non-negative a and b.
func mul128(a, b int64) (hi, lo uint64) { return bits.Mul64(uint64(a), uint64(b)) }

// div128 divides hi:lo by a positive c whose quotient fits an int64, returning the
// quotient and remainder.
func div128(hi, lo uint64, c int64) (q, r int64) {
	uq, ur := bits.Div64(hi, lo, uint64(c))
	return int64(uq), int64(ur)
}
