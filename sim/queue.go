package sim

// The event queue: what happens when, in virtual time.

import (
	"cmp"
	"math/bits"
	"slices"

	"github.com/sluicehq/sluice/gcra"
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

// event is one thing that happens at a time. Events are values in a slice heap: the hot
// loop allocates nothing per event.
type event struct {
	at   int64
	seq  uint64
	kind kind
	m    int32
	g    int32
	op   uint32 // the goroutine's operation (or member's incarnation) the event belongs to
	val  int64
	val2 int64
	res  gcra.Result
	tk   gcra.Ticket
}

// eventQueue holds pending events: their payloads in reusable slots, and small entries
// (time, order of scheduling, slot) in a radix heap (R. Ahuja, K. Mehlhorn, J. Orlin and R.
// Tarjan, 1990). A radix heap fits a simulation: nothing is scheduled before the event being
// handled, so every held time is at or after the latest popped one, last. Entry x waits in
// bucket bits.Len64(x.at ^ last): bucket 0 holds the times equal to last, bucket i those
// whose highest bit differing from last is bit i-1. Popping takes from bucket 0; when it is
// empty, the lowest bucket that is not is emptied: its earliest time becomes last and its
// entries move to lower buckets. An entry only ever moves down, a few times in its life,
// copied in a linear scan with branches a CPU predicts, where a heap's sifting compares at
// every level with branches it cannot predict (BENCHMARKS.md: the 4-ary heap it replaced
// spent half of a large pool's run in pop, and heap_test.go keeps it).
//
// Ties in time come out in the order they were scheduled (seq), as from a heap: entries
// that reach bucket 0 together are sorted by seq, and any scheduled later at that time come
// after them. An event scheduled before last (a time-out counted from a send that a slow
// message outlived) waits in a small binary heap, past, which is emptied first: all of it
// is before last. Nothing is allocated per event once the slots and buckets have grown.
type eventQueue struct {
	last    int64
	buckets [64][]heapEntry // times are not negative: at ^ last < 1<<63
	head    int             // bucket 0 is buckets[0][head:]
	full    uint64          // bit i set: bucket i (1 to 63) holds entries
	past    []heapEntry
	n       int
	slots   []event
	free    []int32
}

type heapEntry struct {
	at   int64
	seq  uint64
	slot int32
}

func (q *eventQueue) len() int { return q.n }

func less(a, b *heapEntry) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

func (q *eventQueue) push(e *event) {
	var slot int32
	if n := len(q.free); n > 0 {
		slot = q.free[n-1]
		q.free = q.free[:n-1]
		q.slots[slot] = *e
	} else {
		slot = int32(len(q.slots))
		q.slots = append(q.slots, *e)
	}
	q.n++
	x := heapEntry{at: e.at, seq: e.seq, slot: slot}
	if x.at < q.last {
		q.pushPast(x)
		return
	}
	i := bits.Len64(uint64(x.at ^ q.last))
	q.buckets[i] = append(q.buckets[i], x)
	if i > 0 {
		q.full |= 1 << i
	}
}

// pop removes the earliest event and copies it into *out. The queue must not be empty.
func (q *eventQueue) pop(out *event) {
	var x heapEntry
	switch {
	case len(q.past) > 0:
		x = q.popPast()
	case q.head < len(q.buckets[0]):
		x = q.buckets[0][q.head]
		q.head++
	default:
		q.refill()
		x = q.buckets[0][0]
		q.head = 1
	}
	if q.head == len(q.buckets[0]) {
		q.buckets[0], q.head = q.buckets[0][:0], 0
	}
	q.n--
	*out = q.slots[x.slot]
	q.free = append(q.free, x.slot)
}

// refill empties the lowest bucket that holds entries into the ones below it, its
// earliest time becoming last; bucket 0 (empty before) then holds that time's entries in
// the order they were scheduled.
func (q *eventQueue) refill() {
	i := bits.TrailingZeros64(q.full)
	b := q.buckets[i]
	last := b[0].at
	for k := 1; k < len(b); k++ {
		last = min(last, b[k].at)
	}
	q.last = last
	for _, x := range b {
		j := bits.Len64(uint64(x.at ^ last))
		q.buckets[j] = append(q.buckets[j], x)
		if j > 0 {
			q.full |= 1 << j
		}
	}
	q.buckets[i] = b[:0]
	q.full &^= 1 << i
	if z := q.buckets[0]; len(z) > 1 {
		slices.SortFunc(z, func(a, b heapEntry) int { return cmp.Compare(a.seq, b.seq) })
	}
}

// pushPast and popPast keep past, a binary min-heap by (at, seq).
func (q *eventQueue) pushPast(x heapEntry) {
	q.past = append(q.past, x)
	h := q.past
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !less(&x, &h[p]) {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = x
}

func (q *eventQueue) popPast() heapEntry {
	h := q.past
	top := h[0]
	n := len(h) - 1
	x := h[n]
	h = h[:n]
	q.past = h
	if n > 0 {
		i := 0
		for {
			c := 2*i + 1
			if c >= n {
				break
			}
			if c+1 < n && less(&h[c+1], &h[c]) {
				c++
			}
			if !less(&h[c], &x) {
				break
			}
			h[i] = h[c]
			i = c
		}
		h[i] = x
	}
	return top
}
