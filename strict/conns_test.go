package strict

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// freeConns is how many of the backend's own connections wait for a batch.
func (b *Backend) freeConns() int {
	if b.p.conns == nil {
		return -1
	}
	b.p.conns.mu.Lock()
	defer b.p.conns.mu.Unlock()
	return len(b.p.conns.free)
}

// TestOwnConnectionsSurviveRestart: a backend made by Dial sends on connections of its
// own, kept from one call to the next, not taken from go-redis' pool each time. After a
// NOSCRIPT it sends the script again. When Redis is killed they break, and once it is
// back the backend decides again on new ones (a broken connection kept would fail every
// call from then on). Close gives them all back.
func TestOwnConnectionsSurviveRestart(t *testing.T) {
	srv := redistest.New(t)
	ctx := context.Background()
	b, err := dialRedis(ctx, srv.URL(), WithProbeEvery(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	l := gcra.Limit{T: 1000, Tau: 1_000_000}
	for i := 0; i < 20; i++ {
		if ok, err := b.AllowOne(ctx, "k", l); err != nil || !ok {
			t.Fatalf("call %d before the restart: %v %v", i, ok, err)
		}
	}
	if n := b.freeConns(); n < 1 {
		t.Fatalf("after 20 calls one at a time, %d connections of the backend's own are free, want at least 1", n)
	}
	// A NOSCRIPT reply (an error) gives its connection back; the EVAL goes on another.
	if _, err := srv.Do("SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.AllowOne(ctx, "k", l); err != nil || !ok {
		t.Fatalf("after SCRIPT FLUSH: %v %v", ok, err)
	}
	srv.Kill()
	if _, err := b.AllowOne(ctx, "k", l); !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("with Redis killed: %v, want backend.ErrUnavailable", err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ok, err := b.AllowOne(ctx, "k", l)
		if err == nil && ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after Redis came back, calls still fail: %v %v", ok, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := 0; i < 20; i++ {
		if ok, err := b.AllowOne(ctx, "k", l); err != nil || !ok {
			t.Fatalf("call %d after the restart: %v %v", i, ok, err)
		}
	}
	b.Close()
	if n := b.freeConns(); n != 0 {
		t.Errorf("after Close, %d connections are still held", n)
	}
}

// TestOwnConnectionsIdleClosed: a connection of the backend's own that Redis closed while
// it sat idle (Redis' timeout setting; a proxy or NAT does the same) is not used: the call
// after the idle time gets its answer, as through go-redis' pool, whose health check finds
// such a connection closed.
func TestOwnConnectionsIdleClosed(t *testing.T) {
	srv := redistest.New(t)
	ctx := context.Background()
	if _, err := srv.Do("CONFIG", "SET", "timeout", "1"); err != nil {
		t.Fatal(err)
	}
	b, err := dialRedis(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	l := gcra.Limit{T: 1000, Tau: 1_000_000}
	if ok, err := b.AllowOne(ctx, "k", l); err != nil || !ok {
		t.Fatalf("first call: %v %v", ok, err)
	}
	time.Sleep(2500 * time.Millisecond) // Redis closes connections idle for over 1 s (whole seconds)
	if ok, err := b.AllowOne(ctx, "k", l); err != nil || !ok {
		t.Fatalf("after the connection sat idle past Redis' timeout: %v %v", ok, err)
	}
	if st := b.Stats(); st.Failures != 0 {
		t.Errorf("%d failures", st.Failures)
	}
}

// TestDialWaitsForASlowFirstAnswer: Dial checks that Redis answers within the longer of
// the time-out and a second, trying again meanwhile: a Redis that takes 400 ms to answer
// its first PING (a loaded machine: the sluice demo through Sentinel failed to start
// with "i/o timeout" when two test runs shared the machine) is found; the old Dial gave up
// after one time-out (100 ms).
func TestDialWaitsForASlowFirstAnswer(t *testing.T) {
	srv := redistest.New(t)
	srv.Pause()
	go func() {
		time.Sleep(400 * time.Millisecond)
		srv.Resume()
	}()
	b, err := dialRedis(context.Background(), srv.URL())
	if err != nil {
		t.Fatalf("Dial of a Redis paused for 400 ms: %v", err)
	}
	b.Close()
	// One that does not answer within the second is refused, within about that.
	srv.Pause()
	defer srv.Resume()
	start := time.Now()
	if _, err := dialRedis(context.Background(), srv.URL()); !errors.Is(err, backend.ErrUnavailable) {
		t.Errorf("Dial of a paused Redis: %v, want backend.ErrUnavailable", err)
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("Dial gave up on a paused Redis after %v, before its second", took)
	}
}

// TestAllowAllocations: a lone allowance through a backend made by Dial allocates once,
// for the script call's command (go-redis has no way to reuse one): the key's Redis name
// is written into the batch builder's buffer, not made as a string per call, which in
// the benchmark at 64 goroutines on 10,000 keys was the one allocation per decision
// (BENCHMARKS.md).
func TestAllowAllocations(t *testing.T) {
	b, err := dialRedis(ctx, shared.URL(), WithPrefix(prefix(t)), WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	l := gcra.Limit{T: 1, Tau: 1_000_000_000}
	keys := []string{"a", "b}", ""} // a plain key, one escaped, and the empty key
	for _, k := range keys {
		if ok, err := b.AllowOne(ctx, k, l); err != nil || !ok {
			t.Fatalf("AllowOne(%q) = %v, %v", k, ok, err)
		}
	}
	i := 0
	a := testing.AllocsPerRun(300, func() {
		b.AllowOne(ctx, keys[i%len(keys)], l)
		i++
	})
	if a > 1 {
		t.Errorf("AllowOne allocates %v times a call, want at most 1 (the command)", a)
	}
}
