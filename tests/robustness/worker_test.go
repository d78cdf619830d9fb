package robustness

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/lease"
)

// TestServedPlaceRecordedFromItsDecision: a place the waiting room reserved for one waiter
// and served to another, who called after it was decided, is recorded from its decision,
// not from the second waiter's call (seed 7002: a place reserved before restore_old and
// served after it looked like a decision on the restored state).
func TestServedPlaceRecordedFromItsDecision(t *testing.T) {
	clk := clock.NewReal()
	waiting := make(chan struct{}, 2)
	l, err := sluice.New(sluice.MustParse("5/s burst=1"), sluice.WithClock(clk), sluice.WithMaxWait(2*time.Second),
		sluice.WithObserver(func(e sluice.Event) {
			if e.Kind == sluice.EventWait && e.Wait > 0 {
				waiting <- struct{}{}
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !l.Allow(context.Background(), "k") {
		t.Fatal("the burst: denied")
	}
	// A waits for the next place (200 ms away), B for the one after; A gives up, and its
	// place goes to B, who called after it was reserved.
	ctxA, cancelA := context.WithCancel(context.Background())
	before := time.Now().UnixNano()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = l.WaitN(ctxA, "k", 1)
	}()
	<-waiting
	reservedBy := time.Now().UnixNano() // A's place is reserved: it waits for it
	callB := time.Now().UnixNano()
	done := make(chan *sluice.Reservation, 1)
	go func() {
		r, err := l.WaitN(context.Background(), "k", 1)
		if err != nil {
			t.Errorf("B: %v", err)
		}
		done <- r
	}()
	<-waiting
	cancelA()
	wg.Wait()
	r := <-done
	if r == nil {
		t.Fatal("B got no permit")
	}
	if r.Delay >= 300*time.Millisecond {
		t.Fatalf("B was served the place 400 ms away (delay %v), not A's: the room did not hand it on", r.Delay)
	}
	got := decidedFrom(callB, r, clk, 100*time.Millisecond)
	if got > reservedBy-int64(100*time.Millisecond) || got < before-int64(100*time.Millisecond) {
		t.Errorf("B's grant recorded from %v after A's call, want A's place's arrival less 100 ms (%v to %v after it)",
			time.Duration(got-before), -100*time.Millisecond, time.Duration(reservedBy-before)-100*time.Millisecond)
	}
	// A grant of the caller's own is recorded from its call.
	call := time.Now().UnixNano()
	own, err := l.Reserve(context.Background(), "k", 1)
	if err != nil || !own.Allowed {
		t.Fatalf("own reservation: %v", err)
	}
	if got := decidedFrom(call, own, clk, 100*time.Millisecond); got != call {
		t.Errorf("own grant recorded from %v after its call, want its call", time.Duration(got-call))
	}
	_ = own.Cancel(context.Background())
}

// TestLeaseRecordCountsFromTheStatus: a status taken before its member was paused and
// observed after (seed 5018, lease-etcd: a renewal answered, then SIGSTOP for 1.17 s
// before the observer printed it) is recorded from when it was taken: its share ends
// Expires after that, not Expires after the print (which made it look valid 2.45 s
// after its request, a second past its lease).
func TestLeaseRecordCountsFromTheStatus(t *testing.T) {
	const s = int64(time.Second)
	st := lease.Status{Key: "a0", Rate: 173.67, At: 10 * s, Expires: 977 * time.Millisecond, Asked: 10*s - 470*int64(time.Millisecond)}
	st.Limit.T = int64(5 * time.Millisecond)
	real0 := int64(1_795_000_000) * s // real time at clock 0
	// Observed 1 s after it was taken.
	got := leaseRecord(1, st, real0+11*s, 11*s)
	want := Lease{Proc: 1, Key: "a0", T: st.Limit.T, Rate: 173.67, From: real0 + 10*s, Until: real0 + 10*s + int64(977*time.Millisecond), Asked: real0 + st.Asked}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
}
