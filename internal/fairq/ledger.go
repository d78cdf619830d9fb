package fairq

import "slices"

// Ledger is the waiting room of one key with its books: the waiters (a Room decides whom
// to serve), the places in the key's line its owner holds for them, the places being
// taken, and the callers counted in. A place is a handle P of the owner's (package
// sluice: a reservation in the key's line) due at a time; the room holds one for each of
// its waiters, or a few at a time whatever their number (bounded: one by default, see
// SetPlaces), and serves each, when it
// comes due, to the waiter its rule picks.
//
// Like Room it is pure state: no clock (the owner passes times, in nanoseconds on its
// clock), no goroutines, no I/O. Its methods say what the owner must do (take a place in
// line, refuse a waiter, hand a place over, give one back); the owner does it and reports
// back. It is not safe for concurrent use: its owner holds a lock around every call.
type Ledger[P any] struct {
	room    *Room
	places  []place[P] // held, earliest due first
	taking  int        // places being taken: Turn answered Take, Took not called yet
	bounded bool       // at most `most` places held, whatever the waiters
	most    int
	callers int   // counted in by Enter, out by Exit
	full    int64 // until then the key's line is full within the bound: named waiters take no place (Refused)
}

type place[P any] struct {
	p   P
	due int64
}

// NewLedger returns an empty ledger whose Room remembers at most maxMembers idle named
// members (see New). When bounded, the room holds one place in the key's line at a time
// (or as many as SetPlaces says), whatever its number of waiters; otherwise one for each
// waiter.
func NewLedger[P any](maxMembers int, bounded bool) *Ledger[P] {
	return &Ledger[P]{room: New(maxMembers), bounded: bounded, most: 1}
}

// SetPlaces sets how many places a bounded room holds at most (at least 1): enough for
// the permits one round trip to the key's line lasts, so that one process's waiters are
// not held to one permit a round trip, and few enough that processes share the line by
// turns.
func (l *Ledger[P]) SetPlaces(n int) { l.most = max(n, 1) }

// Enter counts a caller in: the owner keeps the ledger while any caller is in it.
func (l *Ledger[P]) Enter() { l.callers++ }

// Exit counts a caller out. The last one out (last) gets the places the room still holds,
// the latest due first, for the owner to give back (so that each is the key's newest grant
// in turn when nobody else took one since), and the owner may drop the ledger.
func (l *Ledger[P]) Exit() (spare []P, last bool) {
	l.callers--
	if l.callers > 0 {
		return nil, false
	}
	for _, pl := range slices.Backward(l.places) {
		spare = append(spare, pl.p)
	}
	l.places = nil
	return spare, true
}

// Join adds waiter id (unique among the room's waiters) of member name ("" for none). It
// returns an error if id already waits.
func (l *Ledger[P]) Join(id uint64, name string) error { return l.room.Join(id, name) }

// JoinClass is Join for a waiter of class c: the room serves higher classes first.
func (l *Ledger[P]) JoinClass(id uint64, name string, c Class) error {
	return l.room.JoinClass(id, name, c)
}

// Busy marks waiter id as busy (it cannot take a place now: its goroutine does not run)
// or no longer busy, as Room.Busy does; it reports whether id waits.
func (l *Ledger[P]) Busy(id uint64, busy bool) bool { return l.room.Busy(id, busy) }

// Highest returns the highest class of the room's waiters; ok is false when nobody
// waits.
func (l *Ledger[P]) Highest() (Class, bool) { return l.room.Highest() }

// Places returns how many places the room holds (not counting those being taken).
func (l *Ledger[P]) Places() int { return len(l.places) }

// Waiting returns how many waiters the room holds.
func (l *Ledger[P]) Waiting() int { return l.room.Waiting() }

// Action is what a waiter does next (Turn).
type Action int

const (
	// Wait: sleep until the next place is due (Next), or until one is added when the room
	// holds none yet (it is being taken); then look again.
	Wait Action = iota
	// Take: take a place in the key's line for the room, and report it with Took. The
	// waiter is busy meanwhile: a place that comes due goes to a waiter that can take it
	// at once, not to this one, which could not until its place is had.
	Take
	// Refuse: the next place lies beyond the waiter's bound; the waiter has left the room.
	Refuse
)

// Turn says what waiter id does next at now. The room lacks a place when it holds (or is
// taking) fewer than its waiters (bounded: fewer than its places, while someone waits):
// the waiter that finds one missing takes it (Take), unless it is a named member's and the
// line was found full until after now (Refused). Otherwise, on the waiter's first turn
// (first), a next place due more than bound after start (the waiter's arrival) refuses it
// at once (Refuse, with that wait: the waiter has left); else it waits (Wait).
func (l *Ledger[P]) Turn(id uint64, first bool, now, start, bound int64) (Action, int64) {
	need := l.lacks()
	if now >= l.full {
		l.full = 0 // the line may hold more again
	} else if need && l.room.named(id) {
		need = false
	}
	switch {
	case need:
		l.taking++
		l.room.Busy(id, true)
		return Take, 0
	case first && len(l.places) > 0 && l.places[0].due-start > bound:
		l.room.Leave(id)
		return Refuse, l.places[0].due - start
	}
	return Wait, 0
}

// Took reports the place waiter id took (ok: p, due at due) or failed to take (!ok: p and
// due are ignored). The waiter is no longer busy. One that failed leaves the room, and gone
// reports whether it was still waiting: false if it was served meanwhile, from a place
// that came due while it was busy (its place is in the owner's hands then).
func (l *Ledger[P]) Took(id uint64, p P, due int64, ok bool) (gone bool) {
	l.taking--
	l.room.Busy(id, false)
	if ok {
		l.Put(p, due)
		return false
	}
	return l.room.Leave(id)
}

// Refused reports that waiter id, which Turn told to Take, could not: the key's line is
// full within its bound until retryAt (the owner's time at which a place would fit). A
// named member's waiter stays while the room holds a place: the room serves it by its rule
// from the places it holds, and no named waiter takes a place before retryAt. Any other
// leaves the room, as with Took. gone reports whether it left (false: it stays, or was
// served meanwhile).
func (l *Ledger[P]) Refused(id uint64, retryAt int64) (gone bool) {
	l.taking--
	l.room.Busy(id, false)
	if l.room.named(id) && len(l.places) > 0 {
		l.full = max(l.full, retryAt)
		return false
	}
	return l.room.Leave(id)
}

// Put adds place p, due at due, after the places due no later: a place served to a waiter
// that gave up before it could take it goes back to the room.
func (l *Ledger[P]) Put(p P, due int64) {
	i, _ := slices.BinarySearchFunc(l.places, due, func(pl place[P], due int64) int {
		if pl.due <= due {
			return -1
		}
		return 1
	})
	l.places = slices.Insert(l.places, i, place[P]{p, due})
}

// Next returns when the room next has something to do: the earliest place comes due, or,
// while the room lacks places and its named waiters may take none because the line was
// full (Refused), they may take them again, if that is sooner. ok is false when there is
// neither (a place is being taken).
func (l *Ledger[P]) Next() (at int64, ok bool) {
	if len(l.places) > 0 {
		at, ok = l.places[0].due, true
	}
	if l.full != 0 && l.lacks() && (!ok || l.full < at) {
		at, ok = l.full, true
	}
	return at, ok
}

// lacks reports whether the room holds (or is taking) fewer places than it should: one per
// waiter, or bounded, its places while someone waits.
func (l *Ledger[P]) lacks() bool {
	held := len(l.places) + l.taking
	if l.bounded {
		return held < min(l.most, l.room.Waiting())
	}
	return held < l.room.Waiting()
}

// Leave removes waiter id, which gives up; it reports false if id was served meanwhile:
// the place handed to it is the owner's to Put back.
func (l *Ledger[P]) Leave(id uint64) bool { return l.room.Leave(id) }

// Outcome is what Pop did with the earliest place.
type Outcome int

const (
	// NotDue: no place is due, or every waiter is busy (the place stays for the first
	// free one); nothing was taken.
	NotDue Outcome = iota
	// Served: the place goes to the waiter Pop returns, which has left the room.
	Served
	// Expired: the place came due longer ago than the lateness allowed; it is out of the
	// room and serves nobody: the owner gives it back.
	Expired
	// Spare: nobody waits; the place is out of the room: the owner gives it back.
	Spare
)

// Pop takes the earliest place if it is due at now and says what becomes of it: it
// expires if it came due more than maxLate before now, else it is served to the waiter
// the room's rule picks among those not busy. The owner calls it until NotDue.
func (l *Ledger[P]) Pop(now, maxLate int64) (out Outcome, id uint64, p P) {
	if len(l.places) == 0 || l.places[0].due > now {
		return NotDue, 0, p
	}
	if now-l.places[0].due > maxLate {
		return Expired, 0, l.pop()
	}
	id, ok := l.room.Serve()
	switch {
	case !ok && l.room.Waiting() > 0: // every waiter busy
		return NotDue, 0, p
	case !ok:
		return Spare, 0, l.pop()
	}
	return Served, id, l.pop()
}

// pop removes the earliest place and returns its handle.
func (l *Ledger[P]) pop() P {
	p := l.places[0].p
	l.places[0] = place[P]{} // the handle is the owner's now
	l.places = l.places[1:]
	return p
}
