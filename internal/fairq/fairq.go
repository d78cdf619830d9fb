// Package fairq is the waiting rooms of Sluice's blocking calls as pure state (no clock, no
// goroutines): which of the callers waiting on one key gets the next permit when it comes
// due (Room), and the books of a room (Ledger): the places in the key's line held for its
// waiters, the places being taken, the callers counted in. The limiter's shell tells a
// Ledger who waits, who gave up and what it got from the backend, and the Ledger says what
// to do next: take a place in line, refuse a waiter, hand a place over or give it back.
//
// The rule is fair queuing by credit. Each time a permit is served, every member waiting
// then is owed an equal part of it (1/k of a permit when k members wait), and the member
// owed most is served (its credit falls by one permit); ties go to the member whose oldest
// waiter came first. A member is a caller's identity (a worker, a tenant, a process);
// waiters without one are each their own member, forgotten once served or gone, so that
// among them the rule is arrival order. A named member that gives up before it is served
// keeps what it was owed, up to MaxOwed permits, for when it waits again: a worker whose
// waits keep ending (a deadline) before its turn does not lose its share to those that
// can wait longer.
//
// Waiters come in classes (priorities): a waiter of a higher class is always served
// before one of a lower class, and the rule above holds within each class. A member's
// waiters of different classes are counted apart, as members of their own.
//
// The cost of each of Room's operations is logarithmic in the waiters.
package fairq

import (
	"container/heap"
	"fmt"
)

// MaxOwed is the most credit, in permits, a named member keeps while it does not wait.
const MaxOwed = 2

// DefaultMaxMembers is the most named members a Room remembers while they do not wait.
const DefaultMaxMembers = 4096

// Class is a waiter's class: a lower number is served first. Standard is the class of Join.
type Class uint8

// The classes, first served first.
const (
	Critical Class = iota
	Standard
	Sheddable
)

// Room is the waiting room of one key. The zero value is not usable: make one with New.
// It is not safe for concurrent use: its owner holds a lock around every call.
type Room struct {
	acc     float64 // credit each member waiting since the start was owed: Σ 1/k per serve
	seq     uint64
	waiters map[uint64]*waiter
	active  memberHeap            // the members with waiters, most owed first
	byName  map[memberKey]*member // named members, waiting or remembered
	max     int
}

type waiter struct {
	id, seq uint64
	m       *member
	busy    bool // it cannot take a permit now (see Busy)
}

// memberKey names a member: its name, in one class.
type memberKey struct {
	name  string
	class Class
}

type member struct {
	name  string // "" for an anonymous waiter's own member
	class Class
	key   float64 // credit = acc + key while waiting
	owed  float64 // credit kept while not waiting
	queue []*waiter
	busy  int // waiters of queue that are busy
	index int // in active; -1 when not waiting
}

// New returns an empty room that remembers at most maxMembers idle named members
// (DefaultMaxMembers if maxMembers <= 0).
func New(maxMembers int) *Room {
	if maxMembers <= 0 {
		maxMembers = DefaultMaxMembers
	}
	return &Room{waiters: map[uint64]*waiter{}, byName: map[memberKey]*member{}, max: maxMembers}
}

// Join adds waiter id (unique among the room's waiters) of member name ("" for none), of
// class Standard. It returns an error if id already waits.
func (r *Room) Join(id uint64, name string) error { return r.JoinClass(id, name, Standard) }

// JoinClass is Join for a waiter of class c.
func (r *Room) JoinClass(id uint64, name string, c Class) error {
	if _, ok := r.waiters[id]; ok {
		return fmt.Errorf("fairq: waiter %d already waits", id)
	}
	var m *member
	if name != "" {
		k := memberKey{name, c}
		m = r.byName[k]
		if m == nil {
			m = &member{name: name, class: c, index: -1}
			r.byName[k] = m
		}
	} else {
		m = &member{class: c, index: -1}
	}
	r.seq++
	w := &waiter{id: id, seq: r.seq, m: m}
	r.waiters[id] = w
	m.queue = append(m.queue, w)
	if m.index < 0 {
		m.key = m.owed - r.acc
		heap.Push(&r.active, m)
	}
	return nil
}

// Leave removes waiter id (it gave up); it reports whether it was waiting.
func (r *Room) Leave(id uint64) bool {
	w, ok := r.waiters[id]
	if !ok {
		return false
	}
	delete(r.waiters, id)
	m := w.m
	if w.busy {
		m.busy--
	}
	for i, q := range m.queue {
		if q == w {
			m.queue = append(m.queue[:i], m.queue[i+1:]...)
			break
		}
	}
	if len(m.queue) == 0 {
		r.idle(m)
	} else {
		heap.Fix(&r.active, m.index)
	}
	return true
}

// Busy marks waiter id as busy (it cannot take a permit now: its owner is still taking its
// place in the key's line, a call that may last) or no longer busy. Serve passes over a
// busy waiter, which keeps its place and its member's credit. It reports whether id
// waits.
func (r *Room) Busy(id uint64, busy bool) bool {
	w, ok := r.waiters[id]
	if !ok || w.busy == busy {
		return ok
	}
	w.busy = busy
	if busy {
		w.m.busy++
	} else {
		w.m.busy--
	}
	return true
}

// Serve picks the waiter to serve with the permit now due, removes it from the room and
// returns its id: the first waiter not busy of the member owed most among those with
// one. ok is false when no waiter is free to take it (nobody waits, or every waiter is
// busy: then the permit serves nobody and credits nobody).
func (r *Room) Serve() (id uint64, ok bool) {
	k := len(r.active)
	if k == 0 {
		return 0, false
	}
	m := r.active[0]
	if m.busy == len(m.queue) {
		// Its waiters are all busy: the member owed most that has one free, found by
		// taking the members off the heap in order and putting them back.
		var skipped []*member
		for len(r.active) > 0 && r.active[0].busy == len(r.active[0].queue) {
			skipped = append(skipped, heap.Pop(&r.active).(*member))
		}
		var next *member
		if len(r.active) > 0 {
			next = r.active[0]
		}
		for _, s := range skipped {
			heap.Push(&r.active, s)
		}
		if next == nil {
			return 0, false
		}
		m = next
	}
	r.acc += 1 / float64(k)
	i := 0
	for m.queue[i].busy {
		i++
	}
	w := m.queue[i]
	if i == 0 {
		m.queue = m.queue[1:]
	} else {
		m.queue = append(m.queue[:i], m.queue[i+1:]...)
	}
	delete(r.waiters, w.id)
	m.key--
	if len(m.queue) == 0 {
		r.idle(m)
	} else {
		heap.Fix(&r.active, m.index)
	}
	return w.id, true
}

// Waiting returns how many waiters the room holds.
func (r *Room) Waiting() int { return len(r.waiters) }

// named reports whether waiter id waits for a named member.
func (r *Room) named(id uint64) bool {
	w, ok := r.waiters[id]
	return ok && w.m.name != ""
}

// Highest returns the highest class of the room's waiters; ok is false when nobody waits.
func (r *Room) Highest() (c Class, ok bool) {
	if len(r.active) == 0 {
		return 0, false
	}
	return r.active[0].class, true
}

// Credit returns what member name (of class Standard) is owed now, in permits (negative:
// served ahead of its share); 0 for a member the room does not know.
func (r *Room) Credit(name string) float64 {
	m := r.byName[memberKey{name, Standard}]
	switch {
	case m == nil:
		return 0
	case m.index >= 0:
		return r.acc + m.key
	default:
		return m.owed
	}
}

// Empty reports whether the room holds no waiter and remembers no member: its owner may
// drop it.
func (r *Room) Empty() bool { return len(r.waiters) == 0 && len(r.byName) == 0 }

// idle takes m, whose last waiter went, out of the active heap, and remembers or forgets
// what it is owed.
func (r *Room) idle(m *member) {
	heap.Remove(&r.active, m.index)
	m.index = -1
	if m.name == "" {
		return
	}
	m.owed = min(r.acc+m.key, MaxOwed)
	if m.owed > -1e-9 && m.owed < 1e-9 {
		m.owed = 0
		delete(r.byName, memberKey{m.name, m.class}) // owed nothing: as good as new
		return
	}
	if len(r.byName) > r.max {
		r.forgetIdle()
	}
}

// forgetIdle forgets every named member that does not wait.
func (r *Room) forgetIdle() {
	for k, m := range r.byName {
		if m.index < 0 {
			delete(r.byName, k)
		}
	}
}

// memberHeap orders the waiting members: the first class first, then most owed, then the
// oldest waiter.
type memberHeap []*member

func (h memberHeap) Len() int { return len(h) }
func (h memberHeap) Less(i, j int) bool {
	if h[i].class != h[j].class {
		return h[i].class < h[j].class
	}
	if h[i].key != h[j].key {
		return h[i].key > h[j].key
	}
	return h[i].queue[0].seq < h[j].queue[0].seq
}
func (h memberHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *memberHeap) Push(x any) {
	m := x.(*member)
	m.index = len(*h)
	*h = append(*h, m)
}
func (h *memberHeap) Pop() any {
	old := *h
	m := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	m.index = -1
	return m
}
