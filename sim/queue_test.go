package sim

import (
	"math/rand/v2"
	"testing"
)

// TestQueuesAgree: the radix heap (the engine's), the 4-ary heap and the calendar queue give the same events in the same order
// (time, then the order they were scheduled) under pushes and pops interleaved as the
// engine does them: never in the past, many at once, ties, far-off timers, the queue
// growing to thousands and draining to nothing twice.
func TestQueuesAgree(t *testing.T) {
	var h heapQueue
	var r eventQueue
	var c calendarQueue
	rng := rand.New(rand.NewPCG(1, 2))
	var now int64
	var seq uint64
	push := func(at int64) {
		seq++
		e := event{at: at, val: int64(seq)} // val: the order scheduled
		h.push(&e)
		c.push(&e)
		r.push(&e)
	}
	for round := range 2 {
		for i := range 80_000 {
			grow := i < 40_000
			if (grow && rng.IntN(3) > 0) || (!grow && rng.IntN(3) == 0) || h.len() == 0 {
				var d int64
				switch rng.IntN(10) {
				case 0:
					d = 0 // at once
				case 1:
					d = rng.Int64N(int64(30e9)) // a back-off, a timer
				case 2:
					d = 1e6 // ties
				default:
					d = rng.Int64N(int64(20e6)) // a latency, an arrival
				}
				push(now + d)
				continue
			}
			var a, b, x event
			h.pop(&a)
			c.pop(&b)
			r.pop(&x)
			if a.at != b.at || a.val != b.val {
				t.Fatalf("round %d, step %d: the heap gives (%d, %d), the calendar (%d, %d)", round, i, a.at, a.val, b.at, b.val)
			}
			if a.at != x.at || a.val != x.val {
				t.Fatalf("round %d, step %d: the heap gives (%d, %d), the radix heap (%d, %d)", round, i, a.at, a.val, x.at, x.val)
			}
			now = a.at
		}
		for h.len() > 0 {
			var a, b, x event
			h.pop(&a)
			c.pop(&b)
			r.pop(&x)
			if a.val != b.val || a.val != x.val {
				t.Fatalf("round %d, draining: the heap gives %d, the calendar %d, the radix heap %d", round, a.val, b.val, x.val)
			}
			now = a.at
		}
		if c.len() != 0 || r.len() != 0 {
			t.Fatalf("the calendar holds %d, the radix heap %d after the heap drained", c.len(), r.len())
		}
		now += 1e12 // an hour of nothing, then again
	}
}

// TestRadixHeapTakesThePast: an event scheduled before the latest one popped (a time-out
// counted from a send that a slow message outlived) comes out where the heap gives it:
// before everything later, in (time, seq) order among its like, and time goes on from there.
func TestRadixHeapTakesThePast(t *testing.T) {
	var h heapQueue
	var r eventQueue
	rng := rand.New(rand.NewPCG(3, 4))
	var now int64 = 1e9
	var seq uint64
	var pasts int
	for i := range 50_000 {
		if rng.IntN(2) == 0 || h.len() == 0 {
			d := rng.Int64N(int64(20e6))
			if rng.IntN(8) == 0 {
				d = -rng.Int64N(min(now, int64(5e6))) // before now
				pasts++
			}
			seq++
			e := event{at: now + d, val: int64(seq)}
			h.push(&e)
			r.push(&e)
			continue
		}
		var a, x event
		h.pop(&a)
		r.pop(&x)
		if a.val != x.val || a.at != x.at {
			t.Fatalf("step %d: the heap gives (%d, %d), the radix heap (%d, %d)", i, a.at, a.val, x.at, x.val)
		}
		now = a.at
	}
	if pasts < 1000 {
		t.Fatalf("only %d events were scheduled in the past", pasts)
	}
	for h.len() > 0 {
		var a, x event
		h.pop(&a)
		r.pop(&x)
		if a.val != x.val {
			t.Fatalf("draining: the heap gives %d, the radix heap %d", a.val, x.val)
		}
	}
}
