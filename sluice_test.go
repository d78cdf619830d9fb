package sluice

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/local"
)

var bg = context.Background()

func newVirtual(t *testing.T, limits string, opts ...Option) (*Limiter, *clock.Virtual) {
	t.Helper()
	clk := clock.NewVirtual()
	l, err := New(MustParse(limits), append([]Option{WithClock(clk)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, clk
}

func TestAllowSteps(t *testing.T) {
	l, clk := newVirtual(t, "1/6s")
	steps := []struct {
		at      time.Duration
		allowed bool
	}{{2 * time.Second, true}, {8 * time.Second, true}, {13 * time.Second, false}, {14 * time.Second, true}}
	for i, s := range steps {
		clk.Set(int64(s.at))
		if got := l.Allow(bg, "api"); got != s.allowed {
			t.Errorf("step %d at %v: got %v, want %v", i, s.at, got, s.allowed)
		}
	}
}

func TestAllowNDecision(t *testing.T) {
	l, _ := newVirtual(t, "10/s burst=5")
	d, err := l.AllowN(bg, "k", 3)
	if err != nil || !d.Allowed || d.Remaining != 2 || d.ResetAfter != 300*time.Millisecond {
		t.Fatalf("got %+v %v", d, err)
	}
	d, _ = l.AllowN(bg, "k", 3)
	if d.Allowed || d.RetryAfter != 100*time.Millisecond {
		t.Fatalf("over the burst: got %+v, want denied with RetryAfter 100ms", d)
	}
	if _, err := l.AllowN(bg, "k", 6); !errors.Is(err, gcra.ErrCostExceedsBurst) {
		t.Fatalf("cost 6 over burst 5: got %v", err)
	}
}

func TestWaitUsesTheVirtualClock(t *testing.T) {
	l, clk := newVirtual(t, "1/s burst=1")
	if err := l.Wait(bg, "k"); err != nil { // immediate
		t.Fatal(err)
	}
	done := make(chan int64)
	go func() {
		if err := l.Wait(bg, "k"); err != nil {
			t.Error(err)
		}
		done <- clk.Nanotime()
	}()
	if err := clk.BlockUntil(bg, 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(999 * time.Millisecond)
	select {
	case <-done:
		t.Fatal("Wait returned before its permit")
	default:
	}
	clk.Advance(time.Millisecond)
	if at := <-done; at != int64(time.Second) {
		t.Errorf("Wait returned at %v, want 1s", time.Duration(at))
	}
}

func TestWaitCancelGivesPermitBack(t *testing.T) {
	l, clk := newVirtual(t, "1/s burst=1")
	l.Allow(bg, "k")
	ctx, cancel := context.WithCancel(bg)
	errc := make(chan error)
	go func() { errc <- l.Wait(ctx, "k") }()
	if err := clk.BlockUntil(bg, 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	clk.Advance(time.Second)
	// The cancelled waiter's slot (t=1s) is free again: one permit now, not none.
	if !l.Allow(bg, "k") {
		t.Fatal("the cancelled wait kept its permit")
	}
}

func TestWaitRefusesPastDeadlineAndMaxWait(t *testing.T) {
	l, _ := newVirtual(t, "1/m burst=1")
	l.Allow(bg, "k")
	ctx, cancel := context.WithTimeout(bg, time.Second)
	defer cancel()
	err := l.Wait(ctx, "k")
	var te *ThrottledError
	if !errors.As(err, &te) || !errors.Is(err, ErrThrottled) || te.RetryAfter != time.Minute {
		t.Fatalf("a permit a minute away with a 1s deadline: got %v, want ErrThrottled with RetryAfter 1m", err)
	}
	l2, _ := newVirtual(t, "1/m burst=1", WithMaxWait(30*time.Second))
	l2.Allow(bg, "k")
	if err := l2.Wait(bg, "k"); !errors.Is(err, ErrThrottled) {
		t.Fatalf("over the max wait: got %v", err)
	}
	r, err := l2.Reserve(bg, "k", 1)
	if err != nil || r.Allowed {
		t.Fatalf("Reserve over the max wait: %+v %v, want a denial", r, err)
	}
}

// TestWaitersShareFairly: many goroutines waiting on one key are served one per interval,
// in the order they reserved, with nothing lost.
func TestWaitersShareFairly(t *testing.T) {
	l, clk := newVirtual(t, "10/s burst=1")
	const n = 20
	var wg sync.WaitGroup
	times := make(chan int64, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := l.WaitN(bg, "k", 1)
			if err != nil {
				t.Error(err)
				return
			}
			times <- r.at + int64(r.Delay) // the permit's time (the waker may run later)
		}()
	}
	// The first is granted at once; the other 19 sleep on the clock.
	if err := clk.BlockUntil(bg, n-1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Second)
	wg.Wait()
	close(times)
	var seen [n]bool
	for at := range times {
		slot := at / int64(100*time.Millisecond)
		if at%int64(100*time.Millisecond) != 0 || slot >= n || seen[slot] {
			t.Fatalf("a waiter ran at %v: not on its own 100ms slot", time.Duration(at))
		}
		seen[slot] = true
	}
}

func TestReservationSettle(t *testing.T) {
	l, _ := newVirtual(t, "1000/m")
	r, err := l.Reserve(bg, "llm", 800)
	if err != nil || !r.Allowed || r.Delay != 0 {
		t.Fatalf("reserve 800: %+v %v", r, err)
	}
	if err := r.Settle(bg, 300); err != nil {
		t.Fatal(err)
	}
	if r.n() != 300 {
		t.Errorf("N after settle = %d", r.n())
	}
	if d, _ := l.AllowN(bg, "llm", 700); !d.Allowed {
		t.Fatalf("after settling 800 to 300, 700 more were denied")
	}
	if d, _ := l.AllowN(bg, "llm", 1); d.Allowed {
		t.Fatalf("the 1001st token was granted")
	}
	if err := r.Settle(bg, 1); err != nil || r.n() != 300 {
		t.Errorf("a second settle acted: N=%d %v", r.n(), err)
	}
}

func TestPenalizeHoldsThePoolBack(t *testing.T) {
	l, clk := newVirtual(t, "100/s")
	if err := l.Penalize(bg, "api", clk.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				if l.Allow(bg, "api") {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if allowed.Load() != 0 {
		t.Fatalf("%d permits granted during the penalty", allowed.Load())
	}
	clk.Advance(5 * time.Second)
	if !l.Allow(bg, "api") {
		t.Fatal("no permit at the penalty's end")
	}
	if l.Allow(bg, "api") {
		t.Fatal("a second permit at the penalty's end: the key should restart drained")
	}
	if l.Allow(bg, "other") != true {
		t.Fatal("the penalty spilled onto another key")
	}
}

func TestDoAndWrap(t *testing.T) {
	l, clk := newVirtual(t, "1/s burst=1")
	calls := 0
	f := Wrap(l, "api", func(ctx context.Context, x int) (int, error) {
		calls++
		if ReservationFromContext(ctx) == nil {
			t.Error("no reservation in the call's context")
		}
		return x * 2, nil
	}, Pessimistic())
	if v, err := f(bg, 21); err != nil || v != 42 {
		t.Fatalf("first call: %v %v", v, err)
	}
	v, err := f(bg, 1)
	if !errors.Is(err, ErrThrottled) || v != 0 || calls != 1 {
		t.Fatalf("pessimistic call without a permit: %v %v (calls %d), want ErrThrottled and no call", v, err, calls)
	}
	// Optimistic with a bound: a permit 1s away is refused by MaxWait(500ms) ...
	if err := l.Do(bg, "api", func(context.Context) error { calls++; return nil }, MaxWait(500*time.Millisecond)); !errors.Is(err, ErrThrottled) {
		t.Fatalf("MaxWait(500ms) for a permit 1s away: %v", err)
	}
	// ... and waited for without one.
	errc := make(chan error)
	go func() { errc <- l.Do(bg, "api", func(context.Context) error { calls++; return nil }) }()
	if err := clk.BlockUntil(bg, 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	if err := <-errc; err != nil || calls != 2 {
		t.Fatalf("optimistic Do: %v, calls %d", err, calls)
	}
	// The call's own error comes back as is.
	boom := errors.New("boom")
	clk.Advance(time.Second)
	if err := l.Do(bg, "api", func(context.Context) error { return boom }); err != boom {
		t.Fatalf("Do returned %v, want the call's error", err)
	}
}

func TestRetryBacksOffWithJitter(t *testing.T) {
	l, clk := newVirtual(t, "1/s burst=1")
	l.Allow(bg, "k")
	var sleeps []time.Duration
	last := clk.Nanotime()
	b := Backoff{Base: 100 * time.Millisecond, Jitter: 0.5, Attempts: 5, Clock: clk, Rand: func() float64 { return 0.5 }}
	done := make(chan error)
	go func() {
		done <- b.Retry(bg, func(ctx context.Context) error {
			now := clk.Nanotime()
			sleeps = append(sleeps, time.Duration(now-last))
			last = now
			return l.Do(ctx, "k", func(context.Context) error { return nil }, Pessimistic())
		})
	}()
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Retry: %v", err)
			}
			// First call at once; the permit is 1s away, so the first back-off is its
			// RetryAfter (1s) plus 25% jitter (0.5 * 0.5).
			want := []time.Duration{0, 1250 * time.Millisecond}
			if len(sleeps) != len(want) || sleeps[0] != want[0] || sleeps[1] != want[1] {
				t.Fatalf("sleeps %v, want %v", sleeps, want)
			}
			return
		default:
			if clk.Pending() > 0 {
				at, _ := clk.Next()
				clk.Set(at)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

func TestRetryGivesUp(t *testing.T) {
	clk := clock.NewVirtual()
	n := 0
	b := Backoff{Attempts: 3, Clock: clk}
	go func() {
		for i := 0; i < 2; i++ {
			clk.BlockUntil(bg, 1)
			at, _ := clk.Next()
			clk.Set(at)
		}
	}()
	err := b.Retry(bg, func(context.Context) error { n++; return &ThrottledError{Key: "k"} })
	if !errors.Is(err, ErrThrottled) || n != 3 {
		t.Fatalf("got %v after %d calls, want ErrThrottled after 3", err, n)
	}
	other := errors.New("other")
	if err := b.Retry(bg, func(context.Context) error { return other }); err != other {
		t.Fatalf("a non-throttle error was retried: %v", err)
	}
}

// TestFailModes drives a real failure of the default backend (its key cap) through both
// fail modes.
func TestFailModes(t *testing.T) {
	var errs atomic.Int64
	obs := func(e Event) {
		if e.Kind == EventError {
			errs.Add(1)
		}
	}
	closed, _ := newVirtual(t, "1/h", WithMaxKeys(1), WithObserver(obs))
	closed.Allow(bg, "a")
	d, err := closed.AllowN(bg, "b", 1)
	if d.Allowed || !errors.Is(err, backend.ErrUnavailable) || !errors.Is(err, backend.ErrTooManyKeys) {
		t.Fatalf("fail closed: %+v %v", d, err)
	}
	if err := closed.Wait(bg, "b"); !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("fail closed Wait: %v", err)
	}
	open, _ := newVirtual(t, "1/h", WithMaxKeys(1), WithFailMode(backend.FailOpen), WithObserver(obs))
	open.Allow(bg, "a")
	if d, err := open.AllowN(bg, "b", 1); !d.Allowed || err != nil {
		t.Fatalf("fail open: %+v %v", d, err)
	}
	if errs.Load() != 3 {
		t.Errorf("observer saw %d errors, want 3", errs.Load())
	}
	if _, err := backend.ParseFailMode("sideways"); err == nil {
		t.Error("backend.ParseFailMode accepted a bad mode")
	}
}

func TestObserverSeesDecisionsAndWaits(t *testing.T) {
	var mu sync.Mutex
	kinds := map[EventKind]int{}
	obs := func(e Event) { mu.Lock(); kinds[e.Kind]++; mu.Unlock() }
	l, clk := newVirtual(t, "1/s burst=1", WithObserver(obs))
	l.Allow(bg, "k")
	l.Allow(bg, "k")
	done := make(chan error, 1)
	go func() { done <- l.Wait(bg, "k") }()
	clk.BlockUntil(bg, 1)
	clk.Advance(time.Second)
	if err := <-done; err != nil { // before the penalty, which would requeue a late waker
		t.Fatal(err)
	}
	l.Penalize(bg, "k", clk.Now().Add(time.Second))
	r, _ := l.Reserve(bg, "j", 1)
	r.Cancel(bg)
	mu.Lock()
	defer mu.Unlock()
	if kinds[EventDecision] != 4 || kinds[EventWait] != 1 || kinds[EventPenalty] != 1 || kinds[EventSettle] != 1 {
		t.Errorf("observer saw %v", kinds)
	}
}

func TestClosedLimiter(t *testing.T) {
	l, _ := newVirtual(t, "1/s")
	l.Close()
	if _, err := l.AllowN(bg, "k", 1); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}

func TestNewRejectsBadLimits(t *testing.T) {
	if _, err := New(nil); !errors.Is(err, ErrBadLimit) {
		t.Errorf("no limits: %v", err)
	}
	if _, err := New(Limits{{Rate: 0, Period: time.Second}}); !errors.Is(err, ErrBadLimit) {
		t.Errorf("zero rate: %v", err)
	}
}

func TestAllowZeroAllocs(t *testing.T) {
	l := MustNew(MustParse("1000000/s"))
	defer l.Close()
	l.Allow(bg, "hot")
	if a := testing.AllocsPerRun(1000, func() { l.Allow(bg, "hot") }); a != 0 {
		t.Errorf("Allow allocates %v times per call", a)
	}
}

func TestReserveWithin(t *testing.T) {
	l, _ := newVirtual(t, "1/s burst=1")
	l.Allow(bg, "k")
	if r, err := l.ReserveWithin(bg, "k", 1, 500*time.Millisecond); err != nil || r.Allowed {
		t.Fatalf("a permit 1s away within 500ms: %+v %v, want a denial", r, err)
	}
	r, err := l.ReserveWithin(bg, "k", 1, time.Second)
	if err != nil || !r.Allowed || r.Delay != time.Second {
		t.Fatalf("within 1s: %+v %v", r, err)
	}
}

// TestPenaltiesOnManyKeysStayBounded: penalties on ever new keys (a daemon's clients
// sending 429s for random tags) are forgotten once they end, not kept for good.
func TestPenaltiesOnManyKeysStayBounded(t *testing.T) {
	l, clk := newVirtual(t, "100/s")
	for i := 0; i < 20_000; i++ {
		if err := l.Penalize(bg, fmt.Sprint("tag-", i), clk.Now().Add(time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		clk.Advance(2 * time.Millisecond)
	}
	n := 0
	for range l.penalties.All() {
		n++
	}
	if n > minPenaltySweep || l.penalties.Len() != n {
		t.Errorf("%d penalties remembered (count %d), want at most %d: ended ones are forgotten", n, l.penalties.Len(), minPenaltySweep)
	}
	// One in force is kept through the sweeps.
	if err := l.Penalize(bg, "held", clk.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5000; i++ {
		l.Penalize(bg, fmt.Sprint("more-", i), clk.Now().Add(time.Millisecond))
		clk.Advance(2 * time.Millisecond)
	}
	if !l.penalizedSince("held", 0, clk.Nanotime()) {
		t.Error("a penalty in force was forgotten")
	}
}

func TestBackoffDelay(t *testing.T) {
	b := Backoff{Base: 10 * time.Millisecond, Max: 50 * time.Millisecond, Jitter: 0.5}
	for i, want := range []time.Duration{10, 20, 40, 50, 50} {
		if got := b.delay(i+1, 0, 0); got != want*time.Millisecond {
			t.Errorf("attempt %d: %v, want %v", i+1, got, want*time.Millisecond)
		}
	}
	if got := b.delay(1, 100*time.Millisecond, 0); got != 100*time.Millisecond {
		t.Errorf("a longer Retry-After: %v, want 100ms", got)
	}
	if got := b.delay(2, 0, 0.5); got != 25*time.Millisecond {
		t.Errorf("jitter: %v, want 20ms + 0.5 × 0.5 × 20ms", got)
	}
}

// gatedBackend records the tickets its Adjust is called with, and holds the first
// Adjust until release is closed.
type gatedBackend struct {
	*local.Backend
	mu       sync.Mutex
	adjusted []gcra.Ticket
	entered  chan struct{}
	release  chan struct{}
}

func (g *gatedBackend) Adjust(ctx context.Context, key string, ls []gcra.Limit, t gcra.Ticket, n int64) error {
	g.mu.Lock()
	first := len(g.adjusted) == 0
	g.adjusted = append(g.adjusted, t)
	g.mu.Unlock()
	if first {
		close(g.entered)
		<-g.release
	}
	return g.Backend.Adjust(ctx, key, ls, t, n)
}

// TestRequeueAndCancelRefundOnce: a reservation re-queued behind a penalty while its
// owner cancels it gives its old ticket back once, never twice (a second refund of the same
// ticket can take back the permits of the grant that replaced it).
func TestRequeueAndCancelRefundOnce(t *testing.T) {
	clk := clock.NewVirtual()
	gb := &gatedBackend{Backend: local.New(local.WithClock(clk)), entered: make(chan struct{}), release: make(chan struct{})}
	l, err := New(MustParse("1/h burst=5"), WithClock(clk), WithBackend(gb))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	defer gb.Backend.Close()
	r, err := l.Reserve(bg, "api", 1)
	if err != nil || !r.Allowed {
		t.Fatalf("reserve: %+v %v", r, err)
	}
	clk.Advance(time.Millisecond)
	if err := l.Penalize(bg, "api", clk.Now().Add(time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- r.Wait(bg) }() // sees the penalty: re-queues
	<-gb.entered
	cancelled := make(chan error, 1)
	go func() { cancelled <- r.Cancel(bg) }()
	early := false
	select {
	case <-cancelled: // Cancel did not wait for the re-queue
		early = true
	case <-time.After(100 * time.Millisecond): // Cancel waits for the re-queue to finish
	}
	close(gb.release)
	if !early {
		<-cancelled
	}
	for done := false; !done; { // the re-queued reservation sleeps on the virtual clock
		select {
		case <-waited:
			done = true
		case <-time.After(time.Millisecond):
			clk.Advance(time.Hour)
		}
	}
	gb.mu.Lock()
	defer gb.mu.Unlock()
	seen := map[gcra.Ticket]bool{}
	for _, tk := range gb.adjusted {
		if seen[tk] {
			t.Fatalf("ticket %+v adjusted twice (all: %+v)", tk, gb.adjusted)
		}
		seen[tk] = true
	}
}

// TestFarRetryAfterHoldsBack: a penalty until a date centuries away (a Retry-After past
// what a time.Duration holds) holds the key back; it never overflows into the past and
// drops the penalty.
func TestFarRetryAfterHoldsBack(t *testing.T) {
	l, clk := newVirtual(t, "10/s burst=10")
	clk.Advance(time.Minute) // a clock past its origin: now + 300 years overflows an int64
	if err := l.Penalize(bg, "api", clk.Now().AddDate(300, 0, 0)); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour)
	if l.Allow(bg, "api") {
		t.Fatal("allowed during a penalty that ends in 300 years")
	}
}

// TestPenaltiesOnNewKeysStayBounded: penalties on ever new keys never grow the limiter past
// its key cap, whether the backend refuses the keys (the default at its cap) or makes room
// for them (a daemon's evicting backend).
func TestPenaltiesOnNewKeysStayBounded(t *testing.T) {
	for _, evict := range []bool{false, true} {
		t.Run(fmt.Sprint("evictLive=", evict), func(t *testing.T) {
			clk := clock.NewVirtual()
			opts := []Option{WithClock(clk), WithMaxKeys(1000)}
			if evict {
				b := local.New(local.WithClock(clk), local.WithMaxKeys(1000), local.WithEvictLive())
				defer b.Close()
				opts = append(opts, WithBackend(b))
			}
			l, err := New(MustParse("1/h"), opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			for i := 0; i < 20_000; i++ {
				l.Penalize(bg, fmt.Sprint("tag-", i), clk.Now().Add(7*24*time.Hour))
			}
			if n := l.penalties.Len(); n > 1000 {
				t.Fatalf("%d penalties remembered with a key cap of 1000", n)
			}
			held := 0
			for range l.penalties.All() {
				held++
			}
			if held != l.penalties.Len() {
				t.Fatalf("count %d, table %d", l.penalties.Len(), held)
			}
		})
	}
}
