package sim

// The event queue: what happens when, in virtual time.

import (
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

// eventQueue holds pending events: their payloads in reusable slots, and a 4-ary
// min-heap of small entries ordered by (at, seq), so that sifting moves 24 bytes, not a
// whole event. Nothing is allocated per event once the slots have grown. A calendar
// queue was measured against it (calendar_test.go, BENCHMARKS.md) and was slower on
// every shipped scenario: the simulator's events mix latencies of milliseconds with
// back-offs and timers of seconds, which calendar days cannot fit both.
type eventQueue struct {
	heap  []heapEntry
	slots []event
	free  []int32
}

type heapEntry struct {
	at   int64
	seq  uint64
	slot int32
}

func (q *eventQueue) len() int { return len(q.heap) }

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
	q.heap = append(q.heap, heapEntry{at: e.at, seq: e.seq, slot: slot})
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
func (q *eventQueue) pop(out *event) {
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
