package clock

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestVirtualTimersFireInOrder(t *testing.T) {
	v := NewVirtual()
	var got []int
	var mu sync.Mutex
	rec := func(i int) func() {
		return func() { mu.Lock(); got = append(got, i); mu.Unlock() }
	}
	v.AfterFunc(3*time.Second, rec(3))
	v.AfterFunc(1*time.Second, rec(1))
	v.AfterFunc(2*time.Second, rec(2))
	v.AfterFunc(2*time.Second, rec(22)) // same deadline: creation order
	stopped := v.AfterFunc(2*time.Second, rec(99))
	if !stopped.Stop() {
		t.Fatal("Stop of a pending timer reported false")
	}
	if v.Advance(1500*time.Millisecond) != int64(1500*time.Millisecond) {
		t.Fatal("Advance returned the wrong time")
	}
	if len(got) != 1 || got[0] != 1 {
		t.Fatalf("after 1.5s: got %v, want [1]", got)
	}
	v.Advance(10 * time.Second)
	want := []int{1, 2, 22, 3}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	if v.Pending() != 0 {
		t.Errorf("pending %d, want 0", v.Pending())
	}
}

func TestVirtualTimeSeenByCallback(t *testing.T) {
	v := NewVirtual()
	var at int64
	v.AfterFunc(time.Second, func() { at = v.Nanotime() })
	v.Advance(5 * time.Second)
	if at != int64(time.Second) {
		t.Errorf("callback saw %d, want %d (its own deadline)", at, time.Second)
	}
	if !v.Now().Equal(Epoch.Add(5 * time.Second)) {
		t.Errorf("Now = %v", v.Now())
	}
}

func TestVirtualSleepAndBlockUntil(t *testing.T) {
	v := NewVirtual()
	ctx := context.Background()
	var wg sync.WaitGroup
	done := make(chan int64, 10)
	for i := 1; i <= 10; i++ {
		wg.Add(1)
		go func(d time.Duration) {
			defer wg.Done()
			if err := v.Sleep(ctx, d); err != nil {
				t.Error(err)
			}
			done <- v.Nanotime()
		}(time.Duration(i) * time.Second)
	}
	if err := v.BlockUntil(ctx, 10); err != nil {
		t.Fatal(err)
	}
	v.Advance(10 * time.Second)
	wg.Wait()
	close(done)
	n := 0
	for at := range done {
		n++
		if at < int64(time.Second) {
			t.Errorf("a sleeper woke at %d", at)
		}
	}
	if n != 10 {
		t.Errorf("%d sleepers woke, want 10", n)
	}
}

func TestVirtualSleepCancelled(t *testing.T) {
	v := NewVirtual()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() { errc <- v.Sleep(ctx, time.Hour) }()
	if err := v.BlockUntil(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-errc; err != context.Canceled {
		t.Errorf("got %v, want context.Canceled", err)
	}
	if v.Pending() != 0 {
		t.Errorf("the cancelled sleep left %d timers", v.Pending())
	}
}

func TestVirtualTimerResetAndChannel(t *testing.T) {
	v := NewVirtual()
	tm := v.NewTimer(time.Second)
	if tm.Reset(3*time.Second) != true {
		t.Error("Reset of an active timer reported false")
	}
	v.Advance(2 * time.Second)
	select {
	case <-tm.C():
		t.Fatal("fired before its reset deadline")
	default:
	}
	v.Advance(time.Second)
	select {
	case at := <-tm.C():
		if !at.Equal(Epoch.Add(3 * time.Second)) {
			t.Errorf("fired with %v", at)
		}
	default:
		t.Fatal("did not fire at its deadline")
	}
	if tm.Stop() {
		t.Error("Stop after firing reported true")
	}
}

func TestRealClock(t *testing.T) {
	c := NewReal()
	a := c.Nanotime()
	if err := c.Sleep(context.Background(), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if b := c.Nanotime(); b-a < int64(time.Millisecond) {
		t.Errorf("Nanotime advanced %d over a 1ms sleep", b-a)
	}
	fired := make(chan struct{})
	c.AfterFunc(time.Millisecond, func() { close(fired) })
	<-fired
	tm := c.NewTimer(time.Hour)
	if !tm.Stop() {
		t.Error("Stop of a pending real timer reported false")
	}
}

func BenchmarkRealNanotime(b *testing.B) {
	c := NewReal()
	var s int64
	for b.Loop() {
		s += c.Nanotime()
	}
	_ = s
}

func BenchmarkTimeNow(b *testing.B) {
	var s int64
	for b.Loop() {
		s += time.Now().UnixNano()
	}
	_ = s
}
