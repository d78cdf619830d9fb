package sim

// The event queue: what happens when, in virtual time.

import "math/bits"

// kind is what an event does.
type kind uint8

const (
	evArrival          kind = iota // a request of member m arrives (open-loop demand)
	evStart                        // goroutine g of member m takes the next request
	evPermit                       // g's permit is due: send the request to the API
	evAPIArrive                    // the API receives g's request
	evAPIReply                     // g receives the API's answer (val: 1 accepted, 0 rejected; val2: retry-after)
	evRetry                        // g asks again after a back-off
	evStoreReq                     // the store receives g's request
	evStoreReply                   // g receives the store's answer
	evStoreTimeout                 // g gives up on the store's answer
	evStoreCharge                  // the store receives a charge-back of val permits
	evStorePenalty                 // the store receives a penalty until val
	evOnOff                        // an on/off member toggles
	evScenario                     // scenario event number val
	evResume                       // a paused member resumes
	evHeal                         // member m's partition heals (val: the partition's generation)
	evLeaseTick                    // lease mode: member m's renewal timer (op: incarnation)
	evLeaseReq                     // lease mode: the store receives a request (val: message slot)
	evLeaseReply                   // lease mode: member m receives the store's answer (val: message slot)
	evLeaseTimeout                 // lease mode: member m gives up on a request (g: limit, val2: nonce)
	evGossipTick                   // gossip mode: member m reports (op: incarnation)
	evGossipMsg                    // gossip mode: member m receives a report (val: message slot, op: incarnation)
	evGossipAsk                    // gossip mode: owner m receives goroutine g's forwarded request (val: its member, and from bit 32 the headroom it keeps; val2: sent at, op: g's operation)
	evGossipAnswer                 // gossip mode: g receives the owner's answer (ok: granted; val2: delay or retry-after)
	evIdealTick                    // ideal mode: the next waiter's permit may be due (op: the tick's generation)
	evGossipMembership             // gossip mode: the membership tells each node who is alive (over trees)
	evLocalTick                    // local mode, one process: the waiting room's next place may be due
	evGossipClasses                // gossip mode: member m receives a classes message (val: the sender, val2: its entry's slot, op: incarnation)
)

// event is one thing that happens at a time. Events are small values held in the queue's
// buckets: the hot loop allocates nothing per event, and moves 40 bytes per copy. Ties in
// time come out in the order they were scheduled: the queue keeps that order itself, so an
// event carries no sequence number.
type event struct {
	at   int64
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
// Tarjan, 1990) of radixBits-bit digits whose lowest buckets are sorted rather than split
// further. A radix heap fits a simulation: nothing is scheduled before the event being
// handled, or hardly ever, so every event is near or after the latest popped one.
//
// The queue keeps a time, last, and a run: the events at or before last, sorted, popped
// from head. An event after last waits in bucket (l, d), where l is the highest digit in
// which its time differs from last and d is its digit there (greater than last's). Every
// event of the lowest bucket that holds any comes before every event of the others. When
// the run is empty, popping takes that bucket: a small one (sortMax events at most, most
// of them once the buckets are a few microseconds wide) is sorted and becomes the run, its
// latest time becoming last; a larger one is split, its earliest time becoming last and
// its events moving to the lower levels (the buckets above it stay as they are: last did
// not change there). An event moves down at most once a digit, copied in a linear scan
// with branches a CPU predicts, where a heap's sifting compares at every level with
// branches it cannot predict; and popping reads the run in order, where a heap's entries
// point at payloads scattered in memory (BENCHMARKS.md: the 4-ary heap it replaced spent
// half of a large pool's run in pop; heap_test.go keeps it). An event scheduled at or
// before last (at the time being handled; rarely before it: a time-out counted from a send
// that a slow message outlived) is inserted into the run in order.
//
// Ties in time come out in the order they were scheduled, as from a heap, with no
// sequence number to sort by: every bucket holds its events in the order they were
// scheduled. A push appends the latest; a split moves a bucket's events, in order, into
// buckets that are all empty (the ones below the lowest that holds any, and the run); the
// sort is stable, and an insertion goes after the events of its time. Nothing is
// allocated per event once the buckets have grown.
type eventQueue struct {
	last    int64
	run     []event // the events at or before last, in order from head
	head    int
	buckets [radixLevels][radixWidth][]event
	levels  uint32                          // bit l: a bucket of level l holds events
	digits  [radixLevels][radixWords]uint64 // bit d of digits[l]: bucket (l, d) holds events
	n       int
}

const (
	radixBits   = 4                                // bits of a digit
	radixWidth  = 1 << radixBits                   // buckets a level
	radixWords  = (radixWidth + 63) / 64           // words of a level's bitmask
	radixLevels = (63 + radixBits - 1) / radixBits // digits of a time (not negative: 63 bits)
	sortMax     = 32                               // a bucket of at most this many events is sorted, not split (at most 256)
)

func (q *eventQueue) len() int { return q.n }

func (q *eventQueue) push(e *event) {
	q.n++
	if e.at <= q.last {
		q.insert(e)
		return
	}
	q.place(e)
}

// place puts e, after last, in its bucket.
func (q *eventQueue) place(e *event) {
	x := uint64(e.at ^ q.last)
	l := uint(bits.Len64(x)-1) / radixBits
	d := uint(e.at>>(l*radixBits)) % radixWidth
	q.buckets[l][d] = append(q.buckets[l][d], *e)
	q.levels |= 1 << l
	q.digits[l][d/64] |= 1 << (d % 64)
}

// insert puts e, at or before last, into the run after the events of its time.
func (q *eventQueue) insert(e *event) {
	r := q.run
	i := len(r)
	for i > q.head && r[i-1].at > e.at {
		i--
	}
	r = append(r, *e)
	if i < len(r)-1 {
		copy(r[i+1:], r[i:])
		r[i] = *e
	}
	q.run = r
}

// pop removes the earliest event and copies it into *out. The queue must not be empty.
func (q *eventQueue) pop(out *event) {
	q.n--
	if q.head == len(q.run) {
		q.refill()
	}
	*out = q.run[q.head]
	q.head++
}

// refill takes the lowest bucket that holds events into the run, which is empty: sorted,
// or split into the ones below it.
func (q *eventQueue) refill() {
	q.run, q.head = q.run[:0], 0
	l := bits.TrailingZeros32(q.levels)
	w := 0
	for q.digits[l][w] == 0 {
		w++
	}
	d := w*64 + bits.TrailingZeros64(q.digits[l][w])
	if q.digits[l][w] &^= 1 << (d % 64); q.digits[l] == [radixWords]uint64{} {
		q.levels &^= 1 << l
	}
	b := q.buckets[l][d]
	q.buckets[l][d] = b[:0] // nothing moves to level l: its events go below, or to the run
	if len(b) <= sortMax && (l+1)*radixBits <= 56 {
		// Sorted into the run (each bucket keeps its room: giving it the run's would
		// make a large one grow again). The bucket's times share every digit above
		// level l: each sorts by a key of its lower digits and its place in the
		// bucket (so that ties stay in the order scheduled), 8 bytes moved by the
		// insertion sort rather than 40.
		var keys [sortMax]uint64
		ks := keys[:len(b)]
		mask := uint64(1)<<((l+1)*radixBits) - 1
		for k := range b {
			x := uint64(b[k].at)&mask<<8 | uint64(k)
			i := k
			for ; i > 0 && ks[i-1] > x; i-- {
				ks[i] = ks[i-1]
			}
			ks[i] = x
		}
		r := q.run
		for _, x := range ks {
			r = append(r, b[x&255])
		}
		q.run = r
		q.last = r[len(r)-1].at
		return
	}
	last := b[0].at
	for k := 1; k < len(b); k++ {
		last = min(last, b[k].at)
	}
	q.last = last
	for k := range b {
		if b[k].at == last {
			q.run = append(q.run, b[k])
		} else {
			q.place(&b[k])
		}
	}
}
