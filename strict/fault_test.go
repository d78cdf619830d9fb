package strict

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/testkit/poll"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// phase of a fault run, as seen by the callers.
const (
	phaseUp = iota
	phaseDown
	phaseRestarting // Redis is starting again: answers may come from either side
	phaseBack
)

type faultCounts struct {
	calls, allowed, errs [4]atomic.Int64
	maxLatency           atomic.Int64
	down                 time.Duration // from the kill to the restart
}

// faultRun runs goroutines that call Allow on a limiter over a Redis that is killed with
// SIGKILL after a while and restarted later, and reports what the callers saw in each
// phase. It checks that no call took longer than the time-out (plus scheduling slack)
// and that decisions come back from Redis after the restart.
func faultRun(t *testing.T, limit string, failMode backend.FailMode, opts ...Option) (*faultCounts, *Backend, *goredis.Client, *redistest.Server) {
	srv := redistest.New(t)
	const timeout = 200 * time.Millisecond
	o, err := redisstore.ClientOptions(srv.URL(), timeout)
	if err != nil {
		t.Fatal(err)
	}
	client := goredis.NewClient(o)
	t.Cleanup(func() { client.Close() })
	opts = append([]Option{WithTimeout(timeout), WithProbeEvery(50 * time.Millisecond), WithPrefix(prefix(t))}, opts...)
	b := New(client, opts...)
	t.Cleanup(func() { b.Close() })
	lim := sluice.MustNew(sluice.MustParse(limit), sluice.WithBackend(b), sluice.WithFailMode(failMode))
	defer lim.Close()

	var phase atomic.Int32
	var dumped atomic.Bool
	bound := latencyBound(timeout)
	var c faultCounts
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				p := phase.Load()
				start := time.Now()
				d, err := lim.AllowN(ctx, "api", 1)
				lat := time.Since(start)
				if lat > bound && dumped.CompareAndSwap(false, true) {
					buf := make([]byte, 1<<20)
					t.Logf("a call took %v; goroutines:\n%s", lat, buf[:runtime.Stack(buf, true)])
				}
				for {
					m := c.maxLatency.Load()
					if int64(lat) <= m || c.maxLatency.CompareAndSwap(m, int64(lat)) {
						break
					}
				}
				c.calls[p].Add(1)
				if d.Allowed {
					c.allowed[p].Add(1)
				}
				// The work between two decisions (the API call, or the next task): callers
				// that never pause (16 of them on 2 cores under the race detector) starve
				// the scheduler, and a caller whose time-out fired is then run late.
				time.Sleep(100 * time.Microsecond)
				if err != nil {
					c.errs[p].Add(1)
					if !errors.Is(err, backend.ErrUnavailable) && ctx.Err() == nil {
						t.Errorf("phase %d: unexpected error %v", p, err)
					}
					time.Sleep(time.Millisecond) // a caller backing off, as the demo's workers do
				}
			}
		}()
	}
	waitFor(t, "grants before the fault", func() bool { return c.allowed[phaseUp].Load() > 20 })
	srv.Kill()
	killed := time.Now()
	phase.Store(phaseDown)
	waitFor(t, "the breaker to open", func() bool { return b.Stats().Down })
	downCalls := c.calls[phaseDown].Load()
	waitFor(t, "calls during the outage", func() bool { return c.calls[phaseDown].Load() > downCalls+200 })
	time.Sleep(300 * time.Millisecond) // an outage of some length, for the fallback's share to show
	phase.Store(phaseRestarting)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	phase.Store(phaseBack)
	c.down = time.Since(killed)
	waitFor(t, "recovery after Redis returns", func() bool { return !b.Stats().Down && c.allowed[phaseBack].Load() > 20 })
	cancel()
	wg.Wait()
	st := b.Stats()
	t.Logf("calls up/down/back %d/%d/%d, allowed %d/%d/%d, errors %d/%d/%d; max latency %v; stats %+v",
		c.calls[phaseUp].Load(), c.calls[phaseDown].Load(), c.calls[phaseBack].Load(),
		c.allowed[phaseUp].Load(), c.allowed[phaseDown].Load(), c.allowed[phaseBack].Load(),
		c.errs[phaseUp].Load(), c.errs[phaseDown].Load(), c.errs[phaseBack].Load(), time.Duration(c.maxLatency.Load()), st)
	if lat := time.Duration(c.maxLatency.Load()); lat > bound {
		t.Errorf("a call took %v, over the time-out %v (bound with scheduling slack %v)", lat, timeout, bound)
	}
	if st.Failures == 0 || st.Probes == 0 {
		t.Errorf("the outage was not seen: %+v", st)
	}
	return &c, b, client, srv
}

// latencyBound is the time-out plus the scheduling slack of this build: goroutines stall
// in allocation for hundreds of milliseconds under the race detector on 2 cores.
func latencyBound(timeout time.Duration) time.Duration {
	if raceEnabled {
		return timeout + time.Second
	}
	return timeout + 150*time.Millisecond
}

// waitFor polls cond until it holds or 20 seconds pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, what, 20*time.Second, 5*time.Millisecond, cond)
}

// TestFaultFailClosed: while Redis is down every call is denied with
// backend.ErrUnavailable, within the time-out. Decisions resume from Redis after it
// returns.
func TestFaultFailClosed(t *testing.T) {
	c, _, _, _ := faultRun(t, "1000/s burst=50", backend.FailClosed)
	if n := c.allowed[phaseDown].Load(); n != 0 {
		t.Errorf("%d calls allowed while Redis was down, failing closed", n)
	}
	if c.errs[phaseDown].Load() == 0 {
		t.Error("no call failed while Redis was down")
	}
}

// TestFaultFailOpen: while Redis is down every call is allowed.
func TestFaultFailOpen(t *testing.T) {
	c, _, _, _ := faultRun(t, "1000/s burst=50", backend.FailOpen)
	if c.errs[phaseDown].Load() != 0 {
		t.Errorf("%d errors while failing open", c.errs[phaseDown].Load())
	}
	// The calls made in the instant of the kill may have been answered by Redis (and
	// denied); all the rest were allowed.
	if down, allowed := c.calls[phaseDown].Load(), c.allowed[phaseDown].Load(); allowed < down*9/10 {
		t.Errorf("%d of %d calls allowed while failing open", allowed, down)
	}
}

// TestFaultFallback: with the local fallback at half the limit, calls go on being
// decided while Redis is down, at most at that share, and what was admitted is charged
// back to Redis when it returns: the hourly limit's TAT in Redis carries it.
func TestFaultFallback(t *testing.T) {
	const share = 0.5
	c, b, client, _ := faultRun(t, "100/s burst=10; 100000/h", backend.FailClosed, WithFailLocal(share))
	st := b.Stats()
	if st.Fallbacks == 0 || c.allowed[phaseDown].Load() == 0 {
		t.Fatalf("the fallback decided nothing: %+v", st)
	}
	if c.errs[phaseDown].Load() > 16 {
		// Only the calls in flight at the kill (one per goroutine) may fail.
		t.Errorf("%d errors while the fallback answered", c.errs[phaseDown].Load())
	}
	// At most the share: half the burst and half the rate over the outage, plus the calls
	// Redis answered in the instant of the kill (one per goroutine).
	if max := 5 + int64(50*c.down.Seconds()) + 16; c.allowed[phaseDown].Load() > max {
		t.Errorf("%d grants during a %v outage, over the fallback's share (%d)", c.allowed[phaseDown].Load(), c.down, max)
	}
	// The hourly limit (T = 36ms) must carry every permit granted while down: its TAT in
	// Redis is at least (grants up + grants down) × T ahead of the first grant.
	v, err := client.Get(context.Background(), b.KeyName("api")).Result()
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(v)
	hs, _ := strconv.ParseInt(f[5], 10, 64)
	hns, _ := strconv.ParseInt(f[6], 10, 64)
	hourly := hs*1e9 + hns
	now := time.Now().UnixNano()
	owed := time.Duration(hourly - now)
	down := c.allowed[phaseDown].Load()
	if min := time.Duration(down) * 36 * time.Millisecond / 2; owed < min {
		t.Errorf("hourly TAT %v ahead of now after %d fallback grants, want at least %v", owed, down, min)
	}
	t.Logf("fallback grants %d; the hourly limit's TAT is %v ahead", down, owed)
}

// TestFaultTimeout: a Redis that hangs (SIGSTOP: connections open, no answer) behind a
// go-redis client left at its defaults (3 retries, 3s read time-out). Every call still
// returns within the backend's time-out, later calls fail at once while the breaker is
// open, and decisions resume when Redis does.
func TestFaultTimeout(t *testing.T) {
	srv := redistest.New(t)
	client := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer client.Close()
	const timeout = 150 * time.Millisecond
	b := New(client, WithTimeout(timeout), WithProbeEvery(50*time.Millisecond), WithPrefix(prefix(t)))
	defer b.Close()
	lim := sluice.MustNew(sluice.MustParse("1000/s"), sluice.WithBackend(b))
	defer lim.Close()
	if !lim.Allow(ctx, "k") {
		t.Fatal("no grant before the fault")
	}
	srv.Pause()
	var wg sync.WaitGroup
	var slowest atomic.Int64
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				start := time.Now()
				d, err := lim.AllowN(ctx, "k", 1)
				lat := time.Since(start)
				if d.Allowed || !errors.Is(err, backend.ErrUnavailable) {
					t.Errorf("hung Redis: %+v %v", d, err)
				}
				if int64(lat) > slowest.Load() {
					slowest.Store(int64(lat))
				}
			}
		}()
	}
	wg.Wait()
	if lat := time.Duration(slowest.Load()); lat > latencyBound(timeout) {
		t.Errorf("a call took %v with a time-out of %v", lat, timeout)
	}
	if !b.Stats().Down {
		t.Error("the breaker did not open")
	}
	srv.Resume()
	waitFor(t, "recovery", func() bool { return lim.Allow(ctx, "k") })
	t.Logf("slowest call %v; %+v", time.Duration(slowest.Load()), b.Stats())
}

// TestFaultUnpayableDebt: a debt the fallback ran up on a key that Redis refuses (the key
// holds something other than Sluice state) is dropped and counted when Redis returns; it
// does not keep the breaker open, and every key on the fallback, for good.
func TestFaultUnpayableDebt(t *testing.T) {
	srv := redistest.New(t)
	const timeout = 200 * time.Millisecond
	client := newClient(t, srv.URL())
	b := New(client, WithTimeout(timeout), WithProbeEvery(50*time.Millisecond), WithPrefix(prefix(t)), WithFailLocal(1))
	defer b.Close()
	if _, err := srv.Do("SET", b.KeyName("junk"), "not sluice state"); err != nil {
		t.Fatal(err)
	}
	ls := []gcra.Limit{{T: int64(time.Minute), Tau: int64(time.Minute)}} // still owed when Redis returns
	srv.Pause()
	g, err := b.Decide(ctx, "junk", backend.Request{Limits: ls, N: 1})
	srv.Resume()
	if err != nil || !g.Allowed || !b.Stats().Down {
		t.Fatalf("while Redis was paused: %+v %v %+v, want a grant of the fallback", g, err, b.Stats())
	}
	waitFor(t, "the breaker to close", func() bool { return !b.Stats().Down })
	if st := b.Stats(); st.Unpaid != 1 {
		t.Errorf("stats %+v, want one unpaid debt", st)
	}
	if g, err := b.Decide(ctx, "other", backend.Request{Limits: ls, N: 1}); err != nil || !g.Allowed {
		t.Errorf("after recovery: %+v %v", g, err)
	}
}

// TestLedgerChargedInOneBatch: what the fallback admitted on many keys while Redis was
// down is charged, when it returns, in one batch: submitted one at a time, each charge
// went alone from the prober's goroutine, a round trip after another within one
// time-out, so a ledger of many keys took many probes to pay off.
func TestLedgerChargedInOneBatch(t *testing.T) {
	srv := redistest.New(t)
	b, err := dialRedis(ctx, srv.URL(), WithTimeout(200*time.Millisecond), WithProbeEvery(50*time.Millisecond),
		WithPrefix(prefix(t)), WithFailLocal(1))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ls := []gcra.Limit{{T: int64(time.Minute), Tau: int64(time.Minute)}} // still owed when Redis returns
	if g, err := b.Decide(ctx, "warm", backend.Request{Limits: ls, N: 0}); err != nil || g.Allowed != true {
		t.Fatalf("before the fault: %+v %v", g, err)
	}
	if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	const keys = 20
	srv.Pause()
	for i := 0; i < keys; i++ {
		if g, err := b.Decide(ctx, fmt.Sprintf("k%d", i), backend.Request{Limits: ls, N: 1}); err != nil || !g.Allowed {
			srv.Resume()
			t.Fatalf("key %d while Redis was paused: %+v %v, want a grant of the fallback", i, g, err)
		}
	}
	if !b.Stats().Down {
		srv.Resume()
		t.Fatal("the breaker did not open")
	}
	srv.Resume()
	waitFor(t, "the breaker to close", func() bool { return !b.Stats().Down })
	for i := 0; i < keys; i++ {
		if n, err := srv.Do("EXISTS", b.KeyName(fmt.Sprintf("k%d", i))); err != nil || n != ":1" {
			t.Fatalf("key %d not charged after recovery: %v %v", i, n, err)
		}
	}
	info, err := srv.Do("INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	_, after, _ := strings.Cut(info, "cmdstat_evalsha:calls=")
	calls, _, _ := strings.Cut(after, ",")
	// The first decision's script call, sent before Redis stopped answering, may still
	// run when it resumes; then the ledger's batch (or two, if the probe that closes the
	// breaker charges part of it and the rest comes just after).
	if n, _ := strconv.Atoi(calls); n > 3 {
		t.Errorf("script calls to charge %d keys after an outage: %s, want at most 3 (one batch)", keys, calls)
	}
}

// TestDirectTimeout: through a backend made by Dial (whose client honours deadlines, so
// that its calls wait without a timer of their own), a hung Redis (SIGSTOP) answers no
// call. Each call still returns within the time-out of its own start, with
// backend.ErrUnavailable: the lone call in flight, a call its caller sends beside it, and
// calls queued behind those two (as many batches as WithPipelines allows), which leave
// only when one fails and must not get a whole time-out more.
func TestDirectTimeout(t *testing.T) {
	srv := redistest.New(t)
	const timeout = 1500 * time.Millisecond
	b, err := dialRedis(ctx, srv.URL(), WithTimeout(timeout), WithPipelines(2, 64), WithPrefix(prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	l := gcra.Limit{T: 1000, Tau: 1_000_000}
	if ok, err := b.AllowOne(ctx, "warm", l); err != nil || !ok {
		t.Fatalf("before the fault: %v %v", ok, err)
	}
	srv.Pause()
	defer srv.Resume()
	var wg sync.WaitGroup
	var slowest atomic.Int64
	call := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			ok, err := b.AllowOne(ctx, fmt.Sprintf("k%d", i), l)
			lat := time.Since(start)
			if ok || !errors.Is(err, backend.ErrUnavailable) {
				t.Errorf("call %d on a hung Redis: %v %v", i, ok, err)
			}
			for {
				s := slowest.Load()
				if int64(lat) <= s || slowest.CompareAndSwap(s, int64(lat)) {
					break
				}
			}
		}()
	}
	call(0) // sent by itself
	time.Sleep(50 * time.Millisecond)
	call(1) // one of these two is sent beside it by its caller, the other queues
	call(2)
	time.Sleep(200 * time.Millisecond)
	for i := 3; i < 6; i++ {
		call(i) // queued behind the two in flight for about 1.3 s of their 1.5
	}
	wg.Wait()
	if lat := time.Duration(slowest.Load()); lat > latencyBound(timeout) {
		t.Errorf("a call took %v with a time-out of %v", lat, timeout)
	}
}
