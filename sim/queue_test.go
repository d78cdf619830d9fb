package sim

import (
	"math/rand/v2"
	"testing"
)

// TestQueuesAgree: the heap and the calendar queue give the same events in the same order
// (time, then the order they were scheduled) under pushes and pops interleaved as the
// engine does them: never in the past, many at once, ties, far-off timers, the queue
// growing to thousands and draining to nothing twice.
func TestQueuesAgree(t *testing.T) {
	var h eventQueue
	var c calendarQueue
	rng := rand.New(rand.NewPCG(1, 2))
	var now int64
	var seq uint64
	push := func(at int64) {
		seq++
		e := event{at: at, seq: seq, val: int64(seq)}
		h.push(&e)
		c.push(&e)
	}
	for round := range 2 {
		for i := range 200_000 {
			grow := i < 100_000
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
			var a, b event
			h.pop(&a)
			c.pop(&b)
			if a.seq != b.seq || a.at != b.at || a.val != b.val {
				t.Fatalf("round %d, step %d: the heap gives (%d, %d), the calendar (%d, %d)", round, i, a.at, a.seq, b.at, b.seq)
			}
			now = a.at
		}
		for h.len() > 0 {
			var a, b event
			h.pop(&a)
			c.pop(&b)
			if a.seq != b.seq {
				t.Fatalf("round %d, draining: the heap gives %d, the calendar %d", round, a.seq, b.seq)
			}
			now = a.at
		}
		if c.len() != 0 {
			t.Fatalf("the calendar holds %d after the heap drained", c.len())
		}
		now += 1e12 // an hour of nothing, then again
	}
}
