package fairq

import (
	"fmt"
	"math"
	"testing"
)

// A step of a ledger's table: an operation and what it answers, written as text.
type step struct {
	do   func(l *Ledger[string]) any
	want string
}

func join(id uint64, m string) step {
	return step{func(l *Ledger[string]) any { return l.Join(id, m) }, "<nil>"}
}

func turn(id uint64, first bool, start, bound int64, want string) step {
	return step{func(l *Ledger[string]) any {
		a, w := l.Turn(id, first, start, start, bound)
		return fmt.Sprintf("%v %d", a, w)
	}, want}
}

func took(id uint64, p string, due int64, ok bool, wantGone bool) step {
	return step{func(l *Ledger[string]) any { return l.Took(id, p, due, ok) }, fmt.Sprint(wantGone)}
}

func pop(now, maxLate int64, want string) step {
	return step{func(l *Ledger[string]) any { o, id, p := l.Pop(now, maxLate); return fmt.Sprintf("%v %d %s", o, id, p) }, want}
}

func next(want string) step {
	return step{func(l *Ledger[string]) any { due, ok := l.Next(); return fmt.Sprintf("%d %v", due, ok) }, want}
}

func waiting(want int) step {
	return step{func(l *Ledger[string]) any { return l.Waiting() }, fmt.Sprint(want)}
}

func (a Action) String() string { return [...]string{"wait", "take", "refuse"}[a] }

func (o Outcome) String() string { return [...]string{"not-due", "served", "expired", "spare"}[o] }

func runSteps(t *testing.T, l *Ledger[string], steps []step) {
	t.Helper()
	for i, s := range steps {
		if got := fmt.Sprint(s.do(l)); got != s.want {
			t.Fatalf("step %d: got %q, want %q", i, got, s.want)
		}
	}
}

const never = math.MaxInt64 // a lateness that expires nothing

// TestLedgerPlacePerWaiter: each waiter takes a place of its own; the first due goes to
// the first free waiter; a waiter that fails to take a place leaves; a waiter comes back
// to take the place the room lacks.
func TestLedgerPlacePerWaiter(t *testing.T) {
	runSteps(t, NewLedger[string](0, false), []step{
		join(1, ""),
		turn(1, true, 0, 100, "take 0"), // the room lacks a place: 1 takes it, busy
		join(2, ""),
		turn(2, true, 0, 100, "take 0"), // one place being taken for two waiters
		turn(1, false, 0, 100, "wait 0"),
		next("0 false"),               // none held yet
		took(1, "a", 10, true, false), // 1's place, due at 10
		next("10 true"),               // 2 is still busy
		pop(5, never, "not-due 0 "),   // not due yet
		pop(10, never, "served 1 a"),  // 2 is busy: 1 gets it
		pop(10, never, "not-due 0 "),  // nothing left
		took(2, "", 0, false, true),   // 2 failed to take its place: it leaves
		waiting(0),
		join(3, ""),
		turn(3, true, 20, 100, "take 0"),
		took(3, "c", 30, true, false),
		pop(40, never, "served 3 c"),
	})
}

// TestLedgerOnePlace: with one place at a time, the other waiters wait while it is taken
// and held; once it is served the next waiter to look takes the next.
func TestLedgerOnePlace(t *testing.T) {
	runSteps(t, NewLedger[string](0, true), []step{
		join(1, ""), join(2, ""), join(3, ""),
		turn(1, true, 0, 100, "take 0"),
		turn(2, true, 0, 100, "wait 0"), // one place being taken: enough
		took(1, "a", 10, true, false),
		turn(3, true, 0, 100, "wait 0"),  // one place held
		pop(10, never, "served 1 a"),     // the first to come, free again
		turn(2, false, 0, 100, "take 0"), // no place held: 2 takes the next
		turn(3, false, 0, 100, "wait 0"),
		took(2, "b", 20, true, false),
		pop(20, never, "served 2 b"),
		turn(3, false, 0, 100, "take 0"),
	})
}

// TestLedgerRefuse: a newcomer whose next place lies beyond its bound is refused on its
// first turn, and has left; later turns wait whatever the bound.
func TestLedgerRefuse(t *testing.T) {
	runSteps(t, NewLedger[string](0, false), []step{
		join(1, ""),
		turn(1, true, 0, 1000, "take 0"),
		took(1, "a", 500, true, false),
		join(2, ""),
		turn(2, true, 100, 300, "take 0"), // two waiters, one place: 2 takes the second
		took(2, "b", 600, true, false),
		join(3, ""),
		turn(3, true, 0, 100, "take 0"), // the room lacks a place for 3: taken whatever the bound
		took(3, "", 0, false, true),
		join(4, ""),
		step{func(l *Ledger[string]) any { l.Put("x", 700); return l.Waiting() }, "3"}, // a place for 4
		turn(4, true, 150, 300, "refuse 350"),                                          // 500 is 350 after it came
		waiting(2),
		join(5, ""),
		turn(5, false, 150, 300, "wait 0"), // not its first turn: it waits
	})
}

// TestLedgerExpiredBusySpare: a place past its lateness expires and serves nobody; with
// every waiter busy a due place stays until one is free; with nobody waiting it is spare.
func TestLedgerExpiredBusySpare(t *testing.T) {
	runSteps(t, NewLedger[string](0, false), []step{
		join(1, ""),
		turn(1, true, 0, 100, "take 0"),
		took(1, "a", 30, true, false),
		join(2, ""),
		turn(2, true, 0, 100, "take 0"),
		took(2, "b", 45, true, false),
		pop(50, 10, "expired 0 a"), // 20 late, 10 allowed
		pop(50, 10, "served 1 b"),  // 5 late
		turn(2, false, 0, 100, "take 0"),
		step{func(l *Ledger[string]) any { l.Put("c", 60); return nil }, "<nil>"},
		pop(60, never, "not-due 0 "), // 2, the only waiter, is busy: the place stays
		next("60 true"),
		took(2, "d", 70, true, false),
		pop(70, never, "served 2 c"),
		pop(70, never, "spare 0 d"), // nobody waits
		next("0 false"),
	})
}

// TestLedgerServedAsItGaveUp: a waiter served as it gave up reports so; its place goes back
// and to the next waiter.
func TestLedgerServedAsItGaveUp(t *testing.T) {
	runSteps(t, NewLedger[string](0, false), []step{
		join(1, ""), join(2, ""),
		turn(1, true, 0, 100, "take 0"),
		took(1, "a", 10, true, false),
		turn(2, true, 0, 100, "take 0"),
		took(2, "b", 20, true, false),
		pop(10, never, "served 1 a"),
		step{func(l *Ledger[string]) any { return l.Leave(1) }, "false"}, // served meanwhile
		step{func(l *Ledger[string]) any { l.Put("a", 10); return l.Leave(2) }, "true"},
		join(3, ""),
		pop(20, never, "served 3 a"), // 3 gets a, and b stays for nobody
		pop(20, never, "spare 0 b"),
	})
}

// TestLedgerCallers: the last caller out gets the places still held, the latest first.
func TestLedgerCallers(t *testing.T) {
	l := NewLedger[string](0, false)
	l.Enter()
	l.Enter()
	l.Put("b", 20)
	l.Put("a", 10)
	l.Put("c", 20) // after b: due no earlier
	if spare, last := l.Exit(); spare != nil || last {
		t.Fatalf("first exit: %v %v, want nothing", spare, last)
	}
	if spare, last := l.Exit(); fmt.Sprint(spare) != "[c b a]" || !last {
		t.Fatalf("last exit: %v %v, want [c b a] true", spare, last)
	}
	if _, ok := l.Next(); ok {
		t.Fatal("places left after the last exit")
	}
}

// TestLedgerSomePlaces: a bounded room with two places takes a second while the first is
// held, never a third, and never more than its waiters.
func TestLedgerSomePlaces(t *testing.T) {
	l := NewLedger[string](0, true)
	l.SetPlaces(2)
	runSteps(t, l, []step{
		join(1, ""), join(2, ""), join(3, ""),
		turn(1, true, 0, 100, "take 0"),
		turn(2, true, 0, 100, "take 0"), // a second place, while the first is taken
		turn(3, true, 0, 100, "wait 0"), // two: enough
		took(1, "a", 10, true, false),
		took(2, "b", 20, true, false),
		turn(3, false, 0, 100, "wait 0"),
		pop(10, never, "served 1 a"),
		turn(3, false, 0, 100, "take 0"), // one held, three... two waiters: a second
	})
	one := NewLedger[string](0, true)
	one.SetPlaces(5)
	runSteps(t, one, []step{
		join(1, ""),
		turn(1, true, 0, 100, "take 0"),
		took(1, "a", 10, true, false),
		turn(1, false, 0, 100, "wait 0"), // one waiter: one place
	})
}

func refused(id uint64, retryAt int64, wantGone bool) step {
	return step{func(l *Ledger[string]) any { return l.Refused(id, retryAt) }, fmt.Sprint(wantGone)}
}

// TestLedgerRefusedNamedStays: a named member's waiter refused a place (the line full
// within its bound until 60) stays while the room holds a place, is served by member from
// the places the others took, and no named waiter takes a place before 60; an anonymous
// waiter refused one leaves, as does a named one when the room holds none.
func TestLedgerRefusedNamedStays(t *testing.T) {
	runSteps(t, NewLedger[string](0, false), []step{
		join(1, "big"), join(2, "big"),
		turn(1, true, 0, 100, "take 0"), took(1, "a", 10, true, false),
		turn(2, true, 0, 100, "take 0"), took(2, "b", 20, true, false),
		join(3, "small"),
		turn(3, true, 5, 100, "take 0"),
		refused(3, 60, false), // two places held: 3 stays
		waiting(3),
		join(4, "big"),
		turn(4, true, 6, 100, "wait 0"), // the line is full until 60: 4 takes none
		pop(10, never, "served 1 a"),    // big's first waiter came first
		pop(20, never, "served 3 b"),    // then small, owed half a permit more than big
		turn(4, false, 30, 100, "wait 0"),
		turn(4, false, 60, 100, "take 0"), // from 60 a place fits
		took(4, "c", 70, true, false),
		join(5, ""),
		turn(5, true, 61, 100, "take 0"), // an anonymous newcomer takes one, full or not
		refused(5, 90, true),             // and leaves when refused
		pop(70, never, "served 2 c"),
		join(6, "small"),
		turn(6, true, 71, 100, "take 0"),
		refused(6, 95, true), // the room holds no place: it leaves
		waiting(1),
	})
}

// TestLedgerFullWakes: while the line is full and the room lacks places, Next says when
// its named waiters may take one again, so that a room whose places are all served does
// not sleep until its waiters' ends.
func TestLedgerFullWakes(t *testing.T) {
	runSteps(t, NewLedger[string](0, false), []step{
		join(1, "big"), join(2, "small"),
		turn(1, true, 0, 100, "take 0"), took(1, "a", 10, true, false),
		turn(2, true, 0, 100, "take 0"),
		refused(2, 50, false),
		next("10 true"),
		pop(10, never, "served 1 a"),
		next("50 true"), // no place left: wake at 50 to take one
		turn(2, false, 20, 100, "wait 0"),
		turn(2, false, 50, 100, "take 0"),
		took(2, "b", 60, true, false),
		next("60 true"),
	})
}
