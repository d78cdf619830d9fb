package clock

import (
	"container/heap"
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Virtual is a clock that moves only when told to. Timers and sleeps fire, in deadline order
// (ties in creation order), when Advance or Set moves time past them. It is safe for
// concurrent use; BlockUntil lets a test wait until other goroutines are parked on it
// instead of sleeping.
type Virtual struct {
	now atomic.Int64 // nanoseconds since origin

	mu      sync.Mutex
	origin  time.Time
	timers  timerHeap
	seq     uint64
	waiters []chan struct{} // woken when a timer is added
}

var _ Clock = (*Virtual)(nil)

// Epoch is the wall time at which a virtual clock made by NewVirtual starts.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// NewVirtual returns a virtual clock at Epoch with Nanotime 0.
func NewVirtual() *Virtual { return NewVirtualAt(Epoch) }

// NewVirtualAt returns a virtual clock whose Now starts at origin.
func NewVirtualAt(origin time.Time) *Virtual { return &Virtual{origin: origin} }

// Now returns origin + Nanotime.
func (v *Virtual) Now() time.Time { return v.origin.Add(time.Duration(v.now.Load())) }

// Nanotime returns the virtual nanoseconds elapsed since the origin.
func (v *Virtual) Nanotime() int64 { return v.now.Load() }

// NewTimer returns a timer that fires when virtual time reaches now + d.
func (v *Virtual) NewTimer(d time.Duration) Timer {
	t := &vtimer{v: v, c: make(chan time.Time, 1)}
	v.schedule(t, d)
	return t
}

// AfterFunc calls f from the advancing goroutine when virtual time reaches now + d.
func (v *Virtual) AfterFunc(d time.Duration, f func()) Timer {
	t := &vtimer{v: v, f: f}
	v.schedule(t, d)
	return t
}

// Sleep blocks until virtual time has advanced by d, or ctx is done.
func (v *Virtual) Sleep(ctx context.Context, d time.Duration) error { return sleep(ctx, v, d) }

// Advance moves time forward by d, firing every timer due on the way, each at its own
// deadline. It returns the new time.
func (v *Virtual) Advance(d time.Duration) int64 { return v.Set(v.now.Load() + int64(d)) }

// Set moves time forward to nanotime at (never back), firing due timers in order.
func (v *Virtual) Set(at int64) int64 {
	for {
		v.mu.Lock()
		if len(v.timers) == 0 || v.timers[0].when > at {
			if at > v.now.Load() {
				v.now.Store(at)
			}
			now := v.now.Load()
			v.mu.Unlock()
			return now
		}
		t := heap.Pop(&v.timers).(*vtimer)
		t.index = -1
		if t.when > v.now.Load() {
			v.now.Store(t.when)
		}
		when := v.origin.Add(time.Duration(t.when))
		v.mu.Unlock()
		if t.f != nil {
			t.f()
		} else {
			select {
			case t.c <- when:
			default:
			}
		}
	}
}

// Next reports the deadline of the earliest pending timer, if any.
func (v *Virtual) Next() (int64, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.timers) == 0 {
		return 0, false
	}
	return v.timers[0].when, true
}

// Pending returns the number of timers not yet fired or stopped.
func (v *Virtual) Pending() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.timers)
}

// BlockUntil blocks until at least n timers are pending (for example, n goroutines are
// sleeping on the clock) or ctx is done.
func (v *Virtual) BlockUntil(ctx context.Context, n int) error {
	for {
		v.mu.Lock()
		if len(v.timers) >= n {
			v.mu.Unlock()
			return nil
		}
		ch := make(chan struct{})
		v.waiters = append(v.waiters, ch)
		v.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (v *Virtual) schedule(t *vtimer, d time.Duration) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.add(t, d)
}

// add must be called with v.mu held.
func (v *Virtual) add(t *vtimer, d time.Duration) {
	t.when = v.now.Load() + int64(max(d, 0))
	v.seq++
	t.seq = v.seq
	heap.Push(&v.timers, t)
	for _, w := range v.waiters {
		close(w)
	}
	v.waiters = v.waiters[:0]
}

type vtimer struct {
	v     *Virtual
	c     chan time.Time
	f     func()
	when  int64
	seq   uint64
	index int
}

func (t *vtimer) C() <-chan time.Time { return t.c }

func (t *vtimer) Stop() bool {
	t.v.mu.Lock()
	defer t.v.mu.Unlock()
	return t.stopLocked()
}

func (t *vtimer) stopLocked() bool {
	if t.c != nil {
		select { // Go 1.23 semantics: no stale value after Stop.
		case <-t.c:
		default:
		}
	}
	if t.index < 0 {
		return false
	}
	heap.Remove(&t.v.timers, t.index)
	t.index = -1
	return true
}

func (t *vtimer) Reset(d time.Duration) bool {
	t.v.mu.Lock()
	defer t.v.mu.Unlock()
	active := t.stopLocked()
	t.v.add(t, d)
	return active
}

type timerHeap []*vtimer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if h[i].when != h[j].when {
		return h[i].when < h[j].when
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *timerHeap) Push(x any) {
	t := x.(*vtimer)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	n := len(old)
	t := old[n-1]
	old[n-1] = nil
	*h = old[:n-1]
	return t
}
