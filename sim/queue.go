package sim

// The event queue: what happens when, in virtual time.

import (
	"cmp"
	"math/bits"
	"slices"
)

// kind is what an event does.
type kind uint8

const (
	evArrival      kind = iota // a request of member m arrives (open-loop demand)
	evStart                    // goroutine g of member m takes the next request
	evPermit                   // g's permit is due: send the request to the API
	evAPIArrive                // the API receives g's request
	evAPIReply                 // g receives the API's answer (val: 1 accepted, 0 rejected; val2: retry-after)
	evRetry                    // g asks again after a back-off
	evStoreReq                 // the store receives g's request
	evStoreReply               // g receives the store's answer
	evStoreTimeout             // g gives up on the store's answer
	evStoreCharge              // the store receives a charge-back of val permits
	evStorePenalty             // the store receives a penalty until val
	evOnOff                    // an on/off member toggles
	evScenario                 // scenario event number val
	evResume                   // a paused member resumes
	evHeal                     // member m's partition heals (val: the partition's generation)
	evLeaseTick                // lease mode: member m's renewal timer (op: incarnation)
	evLeaseReq                 // lease mode: the store receives a request (val: message slot)
	evLeaseReply               // lease mode: member m receives the store's answer (val: message slot)
	evLeaseTimeout             // lease mode: member m gives up on a request (g: limit, val2: nonce)
	evGossipTick               // gossip mode: member m reports (op: incarnation)
	evGossipMsg                // gossip mode: member m receives a report (val: message slot, op: incarnation)
)

// event is one thing that happens at a time. Events are small values held in the queue's
// buckets: the hot loop allocates nothing per event, and moves 56 bytes per copy.
type event struct {
	at   int64
	seq  uint64
	val  int64
	val2 int64
	m    int32
	g    int32
	op   uint32 // the goroutine's operation (or member's incarnation) the event belongs to
	tk   int32  // the store's messages: the ticket they carry, in engine.tickets (see ok)
	kind kind
	ok   bool // the store's answer: granted (its ticket is tk)
}

// eventQueue holds pending events in a radix heap (R. Ahuja, K. Mehlhorn, J. Orlin and R.
// Tarjan, 1990). A radix heap fits a simulation: nothing is scheduled before the event being
// handled, so every held time is at or after the latest popped one, last. Event x waits in
// bucket bits.Len64(x.at ^ last): bucket 0 holds the times equal to last, bucket i those
// whose highest bit differing from last is bit i-1. Popping takes from bucket 0; when it is
// empty, the lowest bucket that is not is emptied: its earliest time becomes last and its
// events move to lower buckets. An event only ever moves down, a few times in its life,
// copied in a linear scan with branches a CPU predicts, where a heap's sifting compares at
// every level with branches it cannot predict, and popping reads bucket 0 in order, where
// a heap's entries point at payloads scattered in memory (BENCHMARKS.md: the 4-ary heap it
// replaced spent half of a large pool's run in pop; heap_test.go keeps it).
//
// Ties in time come out in the order they were scheduled (seq), as from a heap: events
// that reach bucket 0 together are sorted by seq, and any scheduled later at that time come
// after them. An event scheduled before last (a time-out counted from a send that a slow
// message outlived) waits in a small binary heap, past, which is emptied first: all of it
// is before last. Nothing is allocated per event once the buckets have grown.
type eventQueue struct {
	last    int64
	buckets [64][]event // times are not negative: at ^ last < 1<<63
	head    int         // bucket 0 is buckets[0][head:]
	full    uint64      // bit i set: bucket i (1 to 63) holds events
	past    []event
	n       int
}

func (q *eventQueue) len() int { return q.n }

// before orders events by (at, seq).
func before(a, b *event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

func (q *eventQueue) push(e *event) {
	q.n++
	if e.at < q.last {
		q.pushPast(e)
		return
	}
	i := bits.Len64(uint64(e.at ^ q.last))
	q.buckets[i] = append(q.buckets[i], *e)
	if i > 0 {
		q.full |= 1 << i
	}
}

// pop removes the earliest event and copies it into *out. The queue must not be empty.
func (q *eventQueue) pop(out *event) {
	q.n--
	if len(q.past) > 0 {
		q.popPast(out)
		return
	}
	if q.head == len(q.buckets[0]) {
		q.refill()
	}
	*out = q.buckets[0][q.head]
	q.head++
	if q.head == len(q.buckets[0]) {
		q.buckets[0], q.head = q.buckets[0][:0], 0
	}
}

// refill empties the lowest bucket that holds events into the ones below it, its
// earliest time becoming last; bucket 0 (empty before) then holds that time's events in
// the order they were scheduled.
func (q *eventQueue) refill() {
	i := bits.TrailingZeros64(q.full)
	b := q.buckets[i]
	last := b[0].at
	for k := 1; k < len(b); k++ {
		last = min(last, b[k].at)
	}
	q.last = last
	for k := range b {
		j := bits.Len64(uint64(b[k].at ^ last))
		q.buckets[j] = append(q.buckets[j], b[k])
		if j > 0 {
			q.full |= 1 << j
		}
	}
	q.buckets[i] = b[:0]
	q.full &^= 1 << i
	if z := q.buckets[0]; len(z) > 1 {
		slices.SortFunc(z, func(a, b event) int { return cmp.Compare(a.seq, b.seq) })
	}
}

// pushPast and popPast keep past, a binary min-heap by (at, seq).
func (q *eventQueue) pushPast(e *event) {
	q.past = append(q.past, *e)
	h := q.past
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !before(e, &h[p]) {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = *e
}

func (q *eventQueue) popPast(out *event) {
	h := q.past
	*out = h[0]
	n := len(h) - 1
	x := h[n]
	h = h[:n]
	q.past = h
	if n == 0 {
		return
	}
	i := 0
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if c+1 < n && before(&h[c+1], &h[c]) {
			c++
		}
		if !before(&h[c], &x) {
			break
		}
		h[i] = h[c]
		i = c
	}
	h[i] = x
}
