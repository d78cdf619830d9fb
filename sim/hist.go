package sim

import "math/bits"

// hist is a log-linear histogram of non-negative nanosecond values: 16 sub-buckets per
// power of two, so quantiles are within about 6%. Adding allocates nothing.
type hist struct {
	counts [64 * 16]int64
	n      int64
}

func (h *hist) add(v int64) {
	if v < 0 {
		v = 0
	}
	h.counts[histIndex(uint64(v))]++
	h.n++
}

func histIndex(v uint64) int {
	if v < 16 {
		return int(v)
	}
	e := bits.Len64(v) - 5 // v >> e is in [16, 32)
	return (e+1)*16 + int(v>>uint(e)) - 16
}

// histLower is the smallest value of bucket i.
func histLower(i int) int64 {
	if i < 16 {
		return int64(i)
	}
	e := i/16 - 1
	return int64(uint64(16+i%16) << uint(e))
}

// quantile returns the lower bound of the bucket holding quantile q in [0, 1].
func (h *hist) quantile(q float64) int64 {
	if h.n == 0 {
		return 0
	}
	rank := int64(q*float64(h.n-1)) + 1
	var seen int64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return histLower(i)
		}
	}
	return 0
}
