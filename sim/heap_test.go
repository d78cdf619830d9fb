package sim

// heapQueue, for the record: the 4-ary heap the engine used before its radix heap
// (queue.go). It was measured against it (BenchmarkQueueHold, BENCHMARKS.md); it stays
// here, with TestQueuesAgree, so that the comparison can be run again.

type heapEntry struct {
	at   int64
	seq  uint64
	slot int32
}

func less(a, b *heapEntry) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

type heapQueue struct {
	seq   uint64 // events pushed: their order among ties
	heap  []heapEntry
	slots []event
	free  []int32
}

func (q *heapQueue) len() int { return len(q.heap) }

func (q *heapQueue) push(e *event) {
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
	q.heap = append(q.heap, heapEntry{at: e.at, seq: q.seq, slot: slot})
	h := q.heap
	i := len(h) - 1
	x := h[i]
	for i > 0 {
		p := (i - 1) / 4
		if !less(&x, &h[p]) {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = x
}

// pop removes the earliest event and copies it into *out.
func (q *heapQueue) pop(out *event) {
	h := q.heap
	top := h[0]
	n := len(h) - 1
	x := h[n]
	q.heap = h[:n]
	h = h[:n]
	if n > 0 {
		i := 0
		for {
			l := 4*i + 1
			if l >= n {
				break
			}
			m := l
			for c := l + 1; c < l+4 && c < n; c++ {
				if less(&h[c], &h[m]) {
					m = c
				}
			}
			if !less(&h[m], &x) {
				break
			}
			h[i] = h[m]
			i = m
		}
		h[i] = x
	}
	*out = q.slots[top.slot]
	q.free = append(q.free, top.slot)
}
