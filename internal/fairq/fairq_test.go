package fairq

import (
	"math"
	"testing"
)

// TestArrivalOrder: waiters without a member are served in the order they came, whoever
// left in between.
func TestArrivalOrder(t *testing.T) {
	r := New(0)
	for id := uint64(1); id <= 5; id++ {
		if err := r.Join(id, ""); err != nil {
			t.Fatal(err)
		}
	}
	if !r.Leave(2) || r.Leave(2) {
		t.Fatal("Leave(2): want true once, then false")
	}
	if err := r.Join(6, ""); err != nil {
		t.Fatal(err)
	}
	for step, want := range []uint64{1, 3, 4, 5, 6} {
		if got, ok := r.Serve(); !ok || got != want {
			t.Fatalf("step %d: served %d (%v), want %d", step, got, ok, want)
		}
	}
	if _, ok := r.Serve(); ok || !r.Empty() {
		t.Fatalf("an empty room served someone or is not empty")
	}
	if err := r.Join(7, ""); err != nil {
		t.Fatal(err)
	}
	if err := r.Join(7, ""); err == nil {
		t.Fatal("a second Join of one id: no error")
	}
}

// TestMembersRoundRobin: a member with many waiters gets no more than a member with one:
// the permits alternate between them.
func TestMembersRoundRobin(t *testing.T) {
	r := New(0)
	id := uint64(0)
	join := func(m string) uint64 {
		id++
		if err := r.Join(id, m); err != nil {
			t.Fatal(err)
		}
		return id
	}
	big := map[uint64]bool{}
	for range 20 {
		big[join("big")] = true
	}
	small := join("small")
	var got []string
	for range 6 {
		w, ok := r.Serve()
		if !ok {
			t.Fatal("nobody served")
		}
		if w == small {
			got = append(got, "small")
			small = join("small") // it asks again at once
		} else if big[w] {
			got = append(got, "big")
		}
	}
	want := []string{"big", "small", "big", "small", "big", "small"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("served %v, want %v", got, want)
		}
	}
}

// TestOwedKept: a named member that gives up before its turn keeps what it was owed and is
// served first when it waits again; an anonymous one does not.
func TestOwedKept(t *testing.T) {
	r := New(0)
	for id, m := range []string{"a", "b", "c", "d"} {
		if err := r.Join(uint64(id+1), m); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := r.Serve(); got != 1 { // a; b, c and d are each owed 1/4
		t.Fatalf("step 0: served %d, want 1 (a)", got)
	}
	r.Leave(4) // d gives up, owed 1/4
	if c := r.Credit("d"); math.Abs(c-0.25) > 1e-9 {
		t.Fatalf("d is owed %v, want 0.25", c)
	}
	r.Join(5, "a")
	if got, _ := r.Serve(); got != 2 { // b (owed 1/4 + 1/3, came before c)
		t.Fatalf("step 1: served %d, want 2 (b)", got)
	}
	r.Join(6, "d") // d comes back owed 1/4
	r.Join(7, "e") // a newcomer owed nothing; a, served once already, owes 1/6
	for step, want := range []uint64{3, 6, 7, 5} {
		if got, ok := r.Serve(); !ok || got != want {
			t.Fatalf("step %d: served %d, want %d", step+2, got, want)
		}
	}
}

// TestOwedBounded: what an idle member keeps is capped, and idle members are forgotten past
// the room's bound.
func TestOwedBounded(t *testing.T) {
	r := New(3)
	for id := uint64(1); id < 100; id++ {
		r.Join(id, "")
	}
	r.Join(100, "x") // behind 99 others: owed Σ 1/k for k = 100..3, 3.69 permits when its turn comes
	for range 98 {
		r.Serve()
	}
	if c := r.Credit("x"); c < 3.6 {
		t.Fatalf("x is owed %v after 98 others were served, want 3.69", c)
	}
	r.Leave(100)
	if c := r.Credit("x"); c != MaxOwed {
		t.Fatalf("x keeps %v idle, want MaxOwed (%v)", c, MaxOwed)
	}
	for id := uint64(1000); id < 1010; id++ {
		r.Join(id, string(rune('a'+id-1000)))
		r.Leave(id) // owed nothing: forgotten at once
	}
	r.Serve() // the last anonymous waiter
	for i, m := range []string{"p", "q", "r", "s", "t"} {
		r.Join(uint64(2000+i), m)
		r.Join(uint64(3000+i), "")
		r.Serve() // the member (it came first), which then owes 1/2 and is remembered idle
		r.Leave(uint64(3000 + i))
	}
	if len(r.byName) > 4 {
		t.Fatalf("%d idle members remembered, want at most the bound (3) plus one", len(r.byName))
	}
}

// TestBusyPassedOver: a busy waiter is passed over, keeps its place, and is served first
// once free; with every waiter busy nobody is served; a busy member keeps the credit it is
// owed; a busy waiter can leave.
func TestBusyPassedOver(t *testing.T) {
	r := New(0)
	for id := uint64(1); id <= 3; id++ {
		if err := r.Join(id, ""); err != nil {
			t.Fatal(err)
		}
	}
	if !r.Busy(1, true) || r.Busy(9, true) {
		t.Fatal("Busy: want true for a waiter, false for an unknown id")
	}
	if got, ok := r.Serve(); !ok || got != 2 {
		t.Fatalf("served %d (%v), want 2: 1 is busy", got, ok)
	}
	r.Busy(3, true)
	if got, ok := r.Serve(); ok || r.Waiting() != 2 {
		t.Fatalf("every waiter busy: served %d (%v), %d waiting; want nobody, 2 waiting", got, ok, r.Waiting())
	}
	r.Busy(1, false)
	r.Busy(3, false)
	for _, want := range []uint64{1, 3} {
		if got, ok := r.Serve(); !ok || got != want {
			t.Fatalf("served %d (%v), want %d", got, ok, want)
		}
	}

	// Members: a's only waiter is busy when a is owed most; b is served, and a, owed
	// still more, is served next once free. A member's free waiter behind a busy one is
	// served.
	m := New(0)
	_ = m.Join(1, "a")
	_ = m.Join(2, "b")
	_ = m.Join(3, "b")
	m.Busy(1, true)
	if got, _ := m.Serve(); got != 2 {
		t.Fatalf("served %d, want 2 (a busy)", got)
	}
	if m.Credit("a") <= m.Credit("b") {
		t.Fatalf("credit a %v, b %v: a, passed over, must be owed more", m.Credit("a"), m.Credit("b"))
	}
	m.Busy(1, false)
	if got, _ := m.Serve(); got != 1 {
		t.Fatalf("served %d, want 1 (a owed most, free again)", got)
	}
	_ = m.Join(4, "b")
	m.Busy(3, true)
	if got, _ := m.Serve(); got != 4 {
		t.Fatalf("served %d, want 4 (b's first waiter busy)", got)
	}
	if !m.Leave(3) || m.Waiting() != 0 {
		t.Fatalf("a busy waiter left: %d waiting, want 0", m.Waiting())
	}
}

// TestHighest: the room names the highest class waiting, as waiters come and go.
func TestHighest(t *testing.T) {
	r := New(0)
	if _, ok := r.Highest(); ok {
		t.Fatal("step 0: an empty room names a class")
	}
	steps := []struct {
		do   func()
		want Class
	}{
		{func() { _ = r.JoinClass(1, "a", Sheddable) }, Sheddable},
		{func() { _ = r.JoinClass(2, "b", Critical) }, Critical},
		{func() { _ = r.JoinClass(3, "", Standard) }, Critical},
		{func() { r.Leave(2) }, Standard},
		{func() { r.Serve() }, Sheddable},
	}
	for i, s := range steps {
		s.do()
		if c, ok := r.Highest(); !ok || c != s.want {
			t.Errorf("step %d: highest %v (%v), want %v", i+1, c, ok, s.want)
		}
	}
}
