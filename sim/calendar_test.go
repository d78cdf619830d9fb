package sim

import (
	"math/bits"
	"slices"
)

// calendarQueue, for the record: a calendar queue (R. Brown, CACM 31(10), 1988): the events in
// buckets of one "day" of virtual time each, a "year" of buckets round a circle, each
// bucket sorted; popping takes the earliest event of the current day's bucket, walking on
// to the next day when it has none. With days about as long as three events apart, push
// and pop are O(1) on average, where a heap's are O(log n). The buckets double or halve
// with the number of events and the day's length is re-estimated from the events then.
// Ties in time come out in the order they were scheduled (seq), as from the heap.
//
// It was measured against the engine's heap on the shipped scenarios and was slower on
// every one (BENCHMARKS.md); it stays here, with TestQueuesAgree and BenchmarkQueueHold,
// so that the comparison can be run again.
type calendarQueue struct {
	buckets []calBucket
	shift   uint  // a day is 1<<shift ns
	mask    int64 // len(buckets)-1
	cur     int64 // the current day (its bucket: cur & mask)
	n       int   // events held
	slots   []event
	free    []int32
	scratch []heapEntry
	seq     uint64 // events pushed: their order among ties
}

// calBucket is one day's events, sorted by (at, seq) from e[h] on.
type calBucket struct {
	e []heapEntry
	h int
}

const calMinBuckets = 16

func (q *calendarQueue) len() int { return q.n }

func (q *calendarQueue) push(e *event) {
	if q.buckets == nil {
		q.buckets = make([]calBucket, calMinBuckets)
		q.mask = calMinBuckets - 1
		q.shift = 20 // about a millisecond, until there are events to measure
		q.cur = e.at >> q.shift
	}
	var slot int32
	if n := len(q.free); n > 0 {
		slot = q.free[n-1]
		q.free = q.free[:n-1]
		q.slots[slot] = *e
	} else {
		slot = int32(len(q.slots))
		q.slots = append(q.slots, *e)
	}
	q.seq++
	q.insert(heapEntry{at: e.at, seq: q.seq, slot: slot})
	q.n++
	if q.n > 2*len(q.buckets) {
		q.resize(2 * len(q.buckets))
	}
}

// insert places x in its day's bucket, in order. Events come later than most of what the
// bucket holds: the search runs from the end.
func (q *calendarQueue) insert(x heapEntry) {
	if day := x.at >> q.shift; day < q.cur {
		q.cur = day // before the current day (only when the queue was empty): start there
	}
	b := &q.buckets[(x.at>>q.shift)&q.mask]
	i := len(b.e)
	for i > b.h && less(&x, &b.e[i-1]) {
		i--
	}
	if i == b.h && b.h > 0 {
		// The earliest of the bucket: into the room popped events left.
		b.h--
		b.e[b.h] = x
		return
	}
	b.e = append(b.e, heapEntry{})
	copy(b.e[i+1:], b.e[i:])
	b.e[i] = x
}

// pop removes the earliest event and copies it into *out.
func (q *calendarQueue) pop(out *event) {
	for range len(q.buckets) {
		b := &q.buckets[q.cur&q.mask]
		if b.h < len(b.e) && b.e[b.h].at>>q.shift == q.cur {
			q.take(b, out)
			return
		}
		q.cur++
	}
	// Nothing within a year: jump to the earliest day that has an event.
	var first *heapEntry
	for i := range q.buckets {
		b := &q.buckets[i]
		if b.h < len(b.e) && (first == nil || less(&b.e[b.h], first)) {
			first = &b.e[b.h]
		}
	}
	q.cur = first.at >> q.shift
	q.take(&q.buckets[q.cur&q.mask], out)
}

func (q *calendarQueue) take(b *calBucket, out *event) {
	x := b.e[b.h]
	b.h++
	if b.h == len(b.e) {
		b.e, b.h = b.e[:0], 0
	}
	*out = q.slots[x.slot]
	q.free = append(q.free, x.slot)
	q.n--
	if q.n < len(q.buckets)/4 && len(q.buckets) > calMinBuckets {
		q.resize(len(q.buckets) / 2)
	}
}

// resize moves the events into nb buckets, with the day's length re-estimated: three
// times the mean gap between the earliest events, leaving out gaps more than twice the
// mean (Brown's rule), rounded to a power of two nanoseconds.
func (q *calendarQueue) resize(nb int) {
	all := q.scratch[:0]
	for i := range q.buckets {
		b := &q.buckets[i]
		all = append(all, b.e[b.h:]...)
		b.e, b.h = b.e[:0], 0
	}
	slices.SortFunc(all, func(a, b heapEntry) int {
		if less(&a, &b) {
			return -1
		}
		return 1
	})
	sample := all[:min(len(all), 64)]
	if len(sample) > 1 {
		mean := float64(sample[len(sample)-1].at-sample[0].at) / float64(len(sample)-1)
		var sum float64
		var k int
		for i := 1; i < len(sample); i++ {
			if g := float64(sample[i].at - sample[i-1].at); g <= 2*mean {
				sum += g
				k++
			}
		}
		if k > 0 && sum > 0 {
			w := int64(3 * sum / float64(k))
			q.shift = uint(min(bits.Len64(uint64(max(w, 1)))-1, 40))
		}
	}
	if len(q.buckets) != nb {
		q.buckets = make([]calBucket, nb)
		q.mask = int64(nb - 1)
	}
	if len(all) > 0 {
		q.cur = all[0].at >> q.shift
	}
	for _, x := range all {
		b := &q.buckets[(x.at>>q.shift)&q.mask]
		b.e = append(b.e, x) // in order already
	}
	q.scratch = all[:0]
}
