package sluice

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/internal/testkit/poll"
	"github.com/sluicehq/sluice/local"
)

// waitFor yields until cond holds (a condition, never a sleep).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, what, 10*time.Second, 0, cond)
}

// TestWaitGiveUpHandsPlaceOn: five waiters in arrival order; the second gives up before
// its turn, and the next takes its place: every slot is used, in arrival order.
func TestWaitGiveUpHandsPlaceOn(t *testing.T) {
	l, clk := newVirtual(t, "10/s burst=1")
	l.Allow(bg, "k") // the slot at 0 is taken: waiters get 100ms, 200ms, ...
	type got struct {
		who string
		at  int64
		err error
	}
	out := make(chan got, 5)
	ctxB, cancelB := context.WithCancel(bg)
	defer cancelB()
	for i, who := range []string{"a", "b", "c", "d", "e"} {
		ctx := bg
		if who == "b" {
			ctx = ctxB
		}
		go func() {
			r, err := l.WaitN(ctx, "k", 1)
			g := got{who: who, err: err}
			if err == nil {
				g.at = r.Slot()
			}
			out <- g
		}()
		waitFor(t, "the waiter in the room", func() bool { return l.waiting("k") == i+1 })
	}
	cancelB()
	if g := <-out; g.who != "b" || !errors.Is(g.err, context.Canceled) {
		t.Fatalf("first out: %+v, want b cancelled", g)
	}
	want := []got{{"a", 100e6, nil}, {"c", 200e6, nil}, {"d", 300e6, nil}, {"e", 400e6, nil}}
	for step, w := range want {
		waitFor(t, "the waiters asleep", func() bool { return clk.Pending() >= len(want)-step })
		clk.Advance(100 * time.Millisecond)
		if g := <-out; g != w {
			t.Fatalf("step %d: got %+v, want %+v", step, g, w)
		}
	}
	if d, _ := l.AllowN(bg, "k", 1); d.Allowed {
		t.Fatalf("a permit free at 400ms after four grants since 100ms: b's place was kept twice")
	}
}

// TestWaitMembersShare: a member with ten goroutines and one with one, each asking again
// as soon as served, share the key equally: the permits alternate.
func TestWaitMembersShare(t *testing.T) {
	l, clk := newVirtual(t, "10/s burst=1")
	ctx, cancel := context.WithCancel(bg)
	var mu sync.Mutex
	count := map[string]int{}
	var wg sync.WaitGroup
	run := func(member string) {
		defer wg.Done()
		for {
			if _, err := l.WaitN(WithMember(ctx, member), "k", 1); err != nil {
				return
			}
			mu.Lock()
			count[member]++
			mu.Unlock()
		}
	}
	wg.Add(11)
	for range 10 {
		go run("big")
	}
	go run("small")
	served := func() int { mu.Lock(); defer mu.Unlock(); return count["big"] + count["small"] }
	for step := 0; step < 40; step++ {
		// Everyone back in the room with its place taken, asleep on the clock.
		waitFor(t, "all eleven asleep in the room", func() bool {
			return served() == step+1 && l.waiting("k") == 11 && clk.Pending() == 11
		})
		clk.Advance(100 * time.Millisecond)
	}
	waitFor(t, "the last served", func() bool { return served() == 41 })
	cancel()
	wg.Wait()
	if count["small"] < 20 || count["big"] < 20 {
		t.Fatalf("served %v in 41 permits, want 20 or 21 each", count)
	}
}

// TestPermitExpiresWhenPaused: a reservation whose holder was paused past its time plus
// half the margin (the other half is the trip to the API's) is not used: Wait returns
// ErrPermitExpired, the permit is counted and given back; one used sooner is not.
func TestPermitExpiresWhenPaused(t *testing.T) {
	var seen []Event
	var mu sync.Mutex
	obs := func(e Event) {
		if e.Kind == EventExpired {
			mu.Lock()
			seen = append(seen, e)
			mu.Unlock()
		}
	}
	l, clk := newVirtual(t, "10/s burst=1", WithMargin(10*time.Millisecond), WithObserver(obs))
	l.Allow(bg, "k")
	r, err := l.Reserve(bg, "k", 1) // due at 110ms (spacing 100ms + the margin)
	if err != nil || !r.Allowed || r.Delay != 110*time.Millisecond {
		t.Fatalf("reserve: %+v %v, want a permit in 110ms", r.Decision, err)
	}
	clk.Advance(125 * time.Millisecond) // the holder was paused: 15ms late
	if err := r.Wait(bg); !errors.Is(err, ErrPermitExpired) {
		t.Fatalf("15ms late with a 10ms margin: Wait = %v, want ErrPermitExpired", err)
	}
	if l.expired.Load() != 1 || len(seen) != 1 || seen[0].Wait != 15*time.Millisecond {
		t.Fatalf("Expired() = %d, events %+v: want 1, 15ms late", l.expired.Load(), seen)
	}
	// Given back (it was the key's newest grant): the next permit is due at once.
	if !l.Allow(bg, "k") {
		t.Fatal("the expired permit was not given back")
	}
	r, _ = l.Reserve(bg, "k", 1) // due 110ms later
	clk.Advance(114 * time.Millisecond)
	if err := r.Wait(bg); err != nil {
		t.Fatalf("4ms late with a 10ms margin: Wait = %v, want nil", err)
	}
	r, _ = l.Reserve(bg, "k", 1)
	clk.Advance(116 * time.Millisecond)
	if err := r.Wait(bg); !errors.Is(err, ErrPermitExpired) {
		t.Fatalf("6ms late with a 10ms margin: Wait = %v, want ErrPermitExpired", err)
	}
	// With a burst, the margin is a reserve of it: a permit may be the whole margin late.
	lb, clkb := newVirtual(t, "10/s burst=5", WithMargin(10*time.Millisecond))
	for range 4 { // the burst less its reserve of one
		lb.Allow(bg, "k")
	}
	r, _ = lb.Reserve(bg, "k", 1) // due in 100ms
	clkb.Advance(108 * time.Millisecond)
	if err := r.Wait(bg); err != nil {
		t.Fatalf("burst 5: 8ms late with a 10ms margin: Wait = %v, want nil", err)
	}
	r, _ = lb.Reserve(bg, "k", 1) // due 100ms after the last
	clkb.Advance(112 * time.Millisecond)
	if err := r.Wait(bg); !errors.Is(err, ErrPermitExpired) {
		t.Fatalf("burst 5: 12ms late with a 10ms margin: Wait = %v, want ErrPermitExpired", err)
	}
	// A reserve of one token (100ms) for a margin of 100ms tolerates 100ms of lateness in
	// all: a permit handed over 60ms late leaves 40ms for the trip to the API, less than
	// half the margin. It expires: no permit is handed over later than the tolerance less
	// half the margin (here 50ms).
	lr, clkr := newVirtual(t, "10/s burst=5", WithMargin(100*time.Millisecond))
	for range 4 {
		lr.Allow(bg, "k")
	}
	r, _ = lr.Reserve(bg, "k", 1) // due in 100ms
	clkr.Advance(140 * time.Millisecond)
	if err := r.Wait(bg); err != nil {
		t.Fatalf("burst 5: 40ms late with a 100ms margin and a reserve of 100ms: Wait = %v, want nil", err)
	}
	r, _ = lr.Reserve(bg, "k", 1) // due 100ms after the last
	clkr.Advance(160 * time.Millisecond)
	if err := r.Wait(bg); !errors.Is(err, ErrPermitExpired) {
		t.Fatalf("burst 5: 60ms late with a 100ms margin and a reserve of 100ms: Wait = %v, want ErrPermitExpired", err)
	}
	// Without a margin, nothing expires.
	l0, clk0 := newVirtual(t, "10/s burst=1")
	l0.Allow(bg, "k")
	r, _ = l0.Reserve(bg, "k", 1)
	clk0.Advance(time.Hour)
	if err := r.Wait(bg); err != nil || l0.expired.Load() != 0 {
		t.Fatalf("no margin: Wait = %v, Expired = %d, want nil and 0", err, l0.expired.Load())
	}
}

// paused is a virtual clock whose process can be paused: Pause moves its time on without
// firing its timers, as a SIGSTOPped process finds when it resumes.
type paused struct {
	*clock.Virtual
	off atomic.Int64
}

func (p *paused) Now() time.Time        { return p.Virtual.Now().Add(time.Duration(p.off.Load())) }
func (p *paused) Nanotime() int64       { return p.Virtual.Nanotime() + p.off.Load() }
func (p *paused) Pause(d time.Duration) { p.off.Add(int64(d)) }

// TestWaitExpiredPlaceNotHandedOn: a waiter's place that comes due while its process is
// paused longer than the margin is not handed over late; the waiter gets a fresh one.
func TestWaitExpiredPlaceNotHandedOn(t *testing.T) {
	clk := &paused{Virtual: clock.NewVirtual()}
	l, err := New(MustParse("10/s burst=1"), WithClock(clk), WithMargin(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Allow(bg, "k")
	done := make(chan *Reservation, 1)
	go func() {
		r, err := l.WaitN(bg, "k", 1)
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	waitFor(t, "the waiter asleep", func() bool { return clk.Pending() == 1 })
	clk.Pause(time.Second)              // its place is due at 110ms: the process wakes at 1.11s
	clk.Advance(110 * time.Millisecond) // the waiter's timer fires
	r := <-done
	if l.expired.Load() != 1 || r.Slot() != int64(1110*time.Millisecond) {
		t.Fatalf("Expired %d, served the place at %v: want 1 expired, then a fresh place at 1.11s", l.expired.Load(), time.Duration(r.Slot()))
	}
}

// TestFairProcessesRoundRobin: two limiters on one backend (two processes on one Redis),
// one with five waiters and one with one, FairProcesses: each holds one place in the key's
// line at a time, so the permits alternate between them.
func TestFairProcessesRoundRobin(t *testing.T) {
	clk := clock.NewVirtual()
	be := local.New(local.WithClock(clk))
	defer be.Close()
	mk := func() *Limiter {
		l, err := New(MustParse("10/s burst=1"), WithClock(clk), WithBackend(be), WithFairness(FairProcesses))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	many, one := mk(), mk()
	ctx, cancel := context.WithCancel(bg)
	var mu sync.Mutex
	count := map[*Limiter]int{}
	var wg sync.WaitGroup
	run := func(l *Limiter) {
		defer wg.Done()
		for {
			if _, err := l.WaitN(ctx, "k", 1); err != nil {
				return
			}
			mu.Lock()
			count[l]++
			mu.Unlock()
		}
	}
	wg.Add(6)
	for range 5 {
		go run(many)
	}
	go run(one)
	total := func() int { mu.Lock(); defer mu.Unlock(); return count[many] + count[one] }
	for step := 1; step <= 30; step++ {
		waitFor(t, "every waiter asleep", func() bool {
			return total() >= step && many.waiting("k") == 5 && one.waiting("k") == 1 && clk.Pending() >= 6
		})
		clk.Advance(100 * time.Millisecond)
	}
	waitFor(t, "the last served", func() bool { return total() >= 31 })
	cancel()
	wg.Wait()
	if count[one] < 15 {
		t.Fatalf("the limiter with one waiter got %d of %d permits, want half", count[one], total())
	}
}

// gated is a backend whose next Decide, once armed, blocks until the gate opens: a
// reservation that takes long to make, as the lease mode's does while a waiter's place
// lies beyond its lease (it waits for the renewal that covers it).
type gated struct {
	backend.Backend
	armed atomic.Bool
	in    chan struct{} // a gated call has started
	gate  chan struct{} // closed to let it through
}

func (g *gated) Decide(ctx context.Context, key string, req backend.Request) (backend.Grant, error) {
	if g.armed.CompareAndSwap(true, false) {
		close(g.in)
		<-g.gate
	}
	return g.Backend.Decide(ctx, key, req)
}

// TestWaitPlaceSkipsWaiterStillReserving: the first waiter is still taking its place in
// line (its reservation is slow) when the second waiter's place comes due. The place goes
// to a waiter that can take it, on time, not to the one that cannot until its own
// reservation returns: handed over then, it was past the margin and given back (in the
// lease mode, a quarter of a pool's permits expired so, a tenth to a second late).
func TestWaitPlaceSkipsWaiterStillReserving(t *testing.T) {
	clk := clock.NewVirtual()
	g := &gated{Backend: local.New(local.WithClock(clk)), in: make(chan struct{}), gate: make(chan struct{})}
	defer g.Backend.Close()
	l, err := New(MustParse("10/s burst=1"), WithClock(clk), WithBackend(g), WithMargin(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Allow(bg, "k") // the slot at 0 is taken: places at 110ms, 220ms (the margin spaces them)
	type got struct {
		who  string
		slot int64
		at   int64
		err  error
	}
	out := make(chan got, 2)
	wait := func(who string) {
		r, err := l.WaitN(bg, "k", 1)
		g := got{who: who, at: clk.Nanotime(), err: err}
		if err == nil {
			g.slot = r.Slot()
		}
		out <- g
	}
	g.armed.Store(true)
	go wait("a") // first in line; its reservation blocks at the gate
	<-g.in
	go wait("b") // takes the place at 110ms
	waitFor(t, "b asleep on its place", func() bool { return l.waiting("k") == 2 && clk.Pending() == 1 })
	clk.Advance(110 * time.Millisecond)
	var first got
	select {
	case first = <-out:
	case <-time.After(5 * time.Second):
		close(g.gate)
		t.Fatalf("the place due at 110ms was served to nobody who could take it then")
	}
	clk.Advance(50 * time.Millisecond)
	close(g.gate) // a's reservation returns at 160ms: its place is at 220ms
	waitFor(t, "a asleep on its place", func() bool { return clk.Pending() == 1 })
	clk.Advance(60 * time.Millisecond)
	second := <-out
	want := []got{{"b", 110e6, 110e6, nil}, {"a", 220e6, 220e6, nil}}
	if first != want[0] || second != want[1] || l.expired.Load() != 0 {
		t.Fatalf("served %+v then %+v, %d expired; want %+v then %+v, none expired", first, second, l.expired.Load(), want[0], want[1])
	}
}

// TestWaitMembersShareBeyondMaxWait: a member with six goroutines and one with one share a
// key whose line holds fewer places within the maximum wait (three, on 10/s burst=1 with
// WithMaxWait(300ms)) than they have waiters. A waiter refused a place of its own waits
// for the places the others hold, served by member as they come due: the one-goroutine
// member is served about half the permits, as in TestWaitMembersShare. Refused at once,
// it got a place only when it came back at the instant one was free: a fifth or less.
func TestWaitMembersShareBeyondMaxWait(t *testing.T) {
	l, clk := newVirtual(t, "10/s burst=1", WithMaxWait(300*time.Millisecond))
	ctx, cancel := context.WithCancel(bg)
	var mu sync.Mutex
	count := map[string]int{}
	var wg sync.WaitGroup
	run := func(member string, g int) {
		defer wg.Done()
		for try := 0; ctx.Err() == nil; try++ {
			_, err := l.WaitN(WithMember(ctx, member), "k", 1)
			var te *ThrottledError
			switch {
			case err == nil:
				mu.Lock()
				count[member]++
				mu.Unlock()
			case errors.As(err, &te):
				// A client backs off, then asks again: 20 to 80 ms, its goroutines apart.
				_ = clk.Sleep(ctx, time.Duration(20+(g*37+try*53)%61)*time.Millisecond)
			default:
				return
			}
		}
	}
	const goroutines = 7
	wg.Add(goroutines)
	for g := range goroutines - 1 {
		go run("big", g)
	}
	go run("small", goroutines)
	for range 4000 { // 40 s of permits, 10 ms at a time
		waitFor(t, "every goroutine asleep on the clock", func() bool { return clk.Pending() == goroutines })
		clk.Advance(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	total := count["big"] + count["small"]
	t.Logf("served %v", count)
	if share := float64(count["small"]) / float64(total); total < 390 || share < 0.45 || share > 0.6 {
		t.Errorf("served %v of 400 permits, want nearly all, about half of them to small", count)
	}
}
