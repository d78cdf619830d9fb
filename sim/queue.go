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
// buckets: the hot loop allocates nothing per event, and moves 48 bytes per copy.
type event struct {
	at   int64
	seq  uint64
	val  int64
	val2 int64
	m    int32
	g    int32
	op   uint32 // the goroutine's operation (or member's incarnation) the event belongs to
	kind kind
	// The store's messages carry a ticket, in engine.tickets at index val: a request its
	// member's charge-back (charged), an answer its grant (ok).
	ok      bool
	charged bool
}

// eventQueue holds pending events in a radix heap (R. Ahuja, K. Mehlhorn, J. Orlin and R.
// Tarjan, 1990) of 16-way digits. A radix heap fits a simulation: nothing is scheduled
// before the event being handled, so every held time is at or after the latest popped
// one, last. Events at last wait in order in bucket now; an event at a later time x waits
// in bucket (l, d), where l is the highest 4-bit digit in which x differs from last and d
// is x's digit there (greater than last's). The earliest event is in the lowest such
// bucket that holds any: popping takes from now, and when it is empty, that bucket is
// emptied, its earliest time becoming last and its events moving to lower levels (the
// buckets above it stay as they are: last did not change there). An event moves down at
// most once a digit, two or three times in its life, copied in a linear scan with branches
// a CPU predicts, where a heap's sifting compares at every level with branches it cannot
// predict; and popping reads bucket now in order, where a heap's entries point at payloads
// scattered in memory (BENCHMARKS.md: the 4-ary heap it replaced spent half of a large
// pool's run in pop; heap_test.go keeps it).
//
// Ties in time come out in the order they were scheduled (seq), as from a heap: events
// that reach bucket now together are sorted by seq, and any scheduled later at that time
// come after them. An event scheduled before last (a time-out counted from a send that a
// slow message outlived) waits in a small binary heap, past, which is emptied first: all
// of it is before last. Nothing is allocated per event once the buckets have grown.
type eventQueue struct {
	last    int64
	now     []event // the events at last, in order from head
	head    int
	buckets [radixLevels][16][]event
	levels  uint16              // bit l: a bucket of level l holds events
	digits  [radixLevels]uint16 // bit d of digits[l]: bucket (l, d) holds events
	past    []event
	n       int
}

// radixLevels is the number of 4-bit digits of a time (not negative: 63 bits).
const radixLevels = 16

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
	q.place(e)
}

// place puts e, not before last, in its bucket.
func (q *eventQueue) place(e *event) {
	x := uint64(e.at ^ q.last)
	if x == 0 {
		q.now = append(q.now, *e)
		return
	}
	l := (bits.Len64(x) - 1) >> 2
	d := uint64(e.at) >> (l << 2) & 15
	q.buckets[l][d] = append(q.buckets[l][d], *e)
	q.levels |= 1 << l
	q.digits[l] |= 1 << d
}

// pop removes the earliest event and copies it into *out. The queue must not be empty.
func (q *eventQueue) pop(out *event) {
	q.n--
	if len(q.past) > 0 {
		q.popPast(out)
		return
	}
	if q.head == len(q.now) && q.refill(out) {
		return
	}
	*out = q.now[q.head]
	q.head++
	if q.head == len(q.now) {
		q.now, q.head = q.now[:0], 0
	}
}

// refill empties the lowest bucket that holds events into the ones below it, its
// earliest time becoming last; bucket now (empty before) then holds that time's events
// in the order they were scheduled. A bucket of one event (most of them, near last) is
// popped into *out instead: refill reports whether it did.
func (q *eventQueue) refill(out *event) bool {
	l := bits.TrailingZeros16(q.levels)
	d := bits.TrailingZeros16(q.digits[l])
	b := q.buckets[l][d]
	q.buckets[l][d] = b[:0] // nothing moves to level l: its events are placed below
	if q.digits[l] &^= 1 << d; q.digits[l] == 0 {
		q.levels &^= 1 << l
	}
	if len(b) == 1 {
		q.last = b[0].at
		*out = b[0]
		return true
	}
	last := b[0].at
	for k := 1; k < len(b); k++ {
		last = min(last, b[k].at)
	}
	q.last = last
	for k := range b {
		q.place(&b[k])
	}
	if len(q.now) > 1 {
		slices.SortFunc(q.now, func(a, b event) int { return cmp.Compare(a.seq, b.seq) })
	}
	return false
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
