package client_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/backendtest"
	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/internal/testkit/daemontest"
	"github.com/sluicehq/sluice/internal/testkit/proctest"
	"github.com/sluicehq/sluice/priority"
	"github.com/sluicehq/sluice/server"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var bg = context.Background()

func daemon(t *testing.T, clk clock.Clock, rules ...string) *server.Server {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.ListenLine, cfg.ListenHTTP = "127.0.0.1:0", ""
	cfg.Rules = daemontest.Rules(t, rules...)
	return daemontest.Start(t, cfg, server.WithClock(clk))
}

// TestPipelinedConcurrentUse: many goroutines share two pipelined connections; every
// answer reaches its own caller: exactly the burst is allowed.
func TestPipelinedConcurrentUse(t *testing.T) {
	s := daemon(t, clock.NewVirtual(), "api=100/s")
	c := client.New(s.LineAddr().String(), client.WithTimeout(5*time.Second))
	defer c.Close()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				if c.Allow(bg, "api") {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if allowed.Load() != 100 || c.Failures() != 0 {
		t.Fatalf("allowed %d (failures %d), want exactly the burst 100", allowed.Load(), c.Failures())
	}
	a, err := c.Query(bg, "~odd tag", 1, 0) // a tag that needs escaping
	if err != nil || !a.Allowed {
		t.Fatalf("escaped tag: %+v %v", a, err)
	}
	a, err = c.Query(bg, "api", 3, 0)
	if err != nil || a.Allowed || a.RetryAfter != 30*time.Millisecond {
		t.Fatalf("details: %+v %v", a, err)
	}
}

// TestInvalidTagIsNotSent: a tag with a line break (or another control character) would
// be two queries and shift every later answer on the pooled connection; the client
// refuses it before sending, and the answers that follow stay in step.
func TestInvalidTagIsNotSent(t *testing.T) {
	s := daemon(t, clock.NewVirtual(), "api=100/s burst=2", "x=1/h")
	c := client.New(s.LineAddr().String(), client.WithTimeout(5*time.Second), client.WithConns(1))
	defer c.Close()
	for _, tag := range []string{"x\napi", "", "a\x00b", "\xff"} {
		if _, err := c.Query(bg, tag, 1, 0); !errors.Is(err, client.ErrInvalidTag) {
			t.Errorf("Query(%q): %v, want ErrInvalidTag", tag, err)
		}
		if err := c.Penalize(bg, tag, time.Second); !errors.Is(err, client.ErrInvalidTag) {
			t.Errorf("Penalize(%q): %v, want ErrInvalidTag", tag, err)
		}
		if c.Allow(bg, tag) {
			t.Errorf("Allow(%q) = true", tag)
		}
	}
	if !c.Allow(bg, "x") || c.Allow(bg, "x") || !c.Allow(bg, "api") || !c.Allow(bg, "api") || c.Allow(bg, "api") {
		t.Error("the answers after the invalid tags are out of step (or a tag reached the daemon)")
	}
}

// TestCallerCancellationIsNotAFailure: a caller whose context ends (a handler whose
// request was cancelled) gets its context's error; the connection others share stays, and
// the client does not back off as if the daemon had failed.
func TestCallerCancellationIsNotAFailure(t *testing.T) {
	s := daemon(t, clock.NewVirtual(), "x=1/h")
	c := client.New(s.LineAddr().String(), client.WithTimeout(5*time.Second), client.WithConns(1))
	defer c.Close()
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if _, err := c.Query(ctx, "other", 1, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v, want context.Canceled", err)
	}
	if c.Failures() != 0 {
		t.Errorf("%d failures counted for a caller's cancellation", c.Failures())
	}
	// Decided by the daemon, not by the fail mode (which would allow both).
	if !c.Allow(bg, "x") || c.Allow(bg, "x") {
		t.Error("after a caller's cancellation, answers came from the fail mode")
	}
}

// TestFailOpenAndBackOff: with no daemon, calls are answered by the fail mode within the
// time-out, and during the back-off without touching the network; once the daemon is
// back, a probe finds it.
func TestFailOpenAndBackOff(t *testing.T) {
	// Nobody listens there now; a daemon will. The port lies below the ephemeral range,
	// so no connection's source port takes it meanwhile (proctest.FreePort).
	addr := proctest.FreeAddr(t)
	c := client.New(addr, client.WithTimeout(50*time.Millisecond), client.WithBackoff(200*time.Millisecond, time.Second))
	defer c.Close()
	start := time.Now()
	if !c.Allow(bg, "api") {
		t.Fatal("fail open answered NO")
	}
	for i := 0; i < 100; i++ {
		if _, err := c.Query(bg, "api", 1, 0); !errors.Is(err, backend.ErrUnavailable) {
			t.Fatalf("during the back-off: %v", err)
		}
	}
	if c.Failures() != 1 {
		t.Errorf("failures %d: calls during the back-off must not touch the network", c.Failures())
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("101 calls took %v with the daemon down", time.Since(start))
	}
	closed := client.New(addr, client.WithFailMode(backend.FailClosed), client.WithTimeout(50*time.Millisecond))
	defer closed.Close()
	if closed.Allow(bg, "api") {
		t.Fatal("fail closed answered OK")
	}
	// A failed answer says when the client asks again (its back-off), so a caller that
	// waits does not spin.
	if a, err := closed.Query(bg, "api", 1, 0); !a.Failed || a.Allowed || a.RetryAfter < 100*time.Millisecond || !errors.Is(err, backend.ErrUnavailable) {
		t.Errorf("a failed query: %+v %v, want a denial with RetryAfter >= 100ms", a, err)
	}
	// The daemon comes up on that address: after the back-off a probe reaches it.
	cfg := server.DefaultConfig()
	cfg.ListenLine, cfg.ListenHTTP = addr, ""
	r, _ := server.ParseRuleFlag("api=1/h", false)
	cfg.Rules = []server.Rule{r}
	s, err := server.New(cfg, server.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Skipf("the port was taken meanwhile: %v", err)
	}
	defer s.Shutdown(bg)
	deadline := time.Now().Add(10 * time.Second)
	for {
		a, err := c.Query(bg, "api", 1, 0)
		if err == nil {
			if !a.Allowed || a.Failed {
				t.Fatalf("first answer from the daemon: %+v", a)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the client never found the daemon again")
		}
		time.Sleep(20 * time.Millisecond) // wait for the back-off to end
	}
	if c.Allow(bg, "api") {
		t.Fatal("1/h allowed twice")
	}
}

// TestLimiterThroughTheDaemon: the same sluice.Limiter code, deciding at the daemon.
func TestLimiterThroughTheDaemon(t *testing.T) {
	s := daemon(t, clock.Default, "api=20/s burst=1")
	c := client.New(s.LineAddr().String(), client.WithTimeout(2*time.Second))
	defer c.Close()
	l, err := sluice.New(sluice.MustParse("20/s burst=1"), sluice.WithBackend(c.Backend()))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !l.Allow(bg, "api") || l.Allow(bg, "api") {
		t.Fatal("Allow through the daemon: want one permit then none")
	}
	// Wait reserves at the daemon (w=) and sleeps: five permits take about 200 ms.
	start := time.Now()
	for i := 0; i < 5; i++ {
		if err := l.Wait(bg, "api"); err != nil {
			t.Fatal(err)
		}
	}
	if el := time.Since(start); el < 190*time.Millisecond {
		t.Errorf("five waits at 20/s took %v: the daemon's reservations were not honoured", el)
	}
	if err := l.Penalize(bg, "api", time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.AllowN(bg, "api", 1); d.Allowed || d.RetryAfter < 900*time.Millisecond {
		t.Fatalf("after a penalty of 1s: %+v", d)
	}
}

// stallingDaemon answers OK to every line, stalling 100 ms before every 300th line it
// reads (over all connections).
func stallingDaemon(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var lines atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					if _, err := r.ReadSlice('\n'); err != nil {
						return
					}
					if lines.Add(1)%300 == 0 {
						time.Sleep(100 * time.Millisecond)
					}
					if _, err := c.Write([]byte("OK\n")); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// TestCallsReturnWithinTheTimeOut: with a daemon that stalls past the time-out now and
// then, every call returns within its time-out (plus scheduling slack), whatever the other
// callers do to the shared connections; none panics. (A timed-out call used to wait for the
// connection's reader while another caller dialled a new one on the same WaitGroup: a
// "WaitGroup is reused" panic, or a call hung until the new connection failed.)
func TestCallsReturnWithinTheTimeOut(t *testing.T) {
	const timeout = 20 * time.Millisecond
	c := client.New(stallingDaemon(t), client.WithTimeout(timeout), client.WithBackoff(0, 0))
	defer c.Close()
	var worst atomic.Int64
	var calls atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(1500 * time.Millisecond)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				t0 := time.Now()
				_, err := c.Query(bg, "api", 1, 0)
				d := int64(time.Since(t0))
				calls.Add(1)
				for w := worst.Load(); d > w && !worst.CompareAndSwap(w, d); w = worst.Load() {
				}
				if err != nil && d < int64(time.Millisecond) {
					time.Sleep(time.Millisecond) // backing off: no hot spin, the slack is for the calls
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d calls, %d failed, slowest %v", calls.Load(), c.Failures(), time.Duration(worst.Load()))
	// The slack is for a loaded machine's scheduling. The defect made calls of 290 ms to
	// 120 s.
	if w := time.Duration(worst.Load()); w > timeout+250*time.Millisecond {
		t.Fatalf("a call took %v with a %v time-out", w, timeout)
	}
	if c.Failures() == 0 {
		t.Fatal("no call timed out: the daemon never stalled")
	}
}

// TestBackendClosed: the client's backend keeps the contract of every backend after Close.
func TestBackendClosed(t *testing.T) {
	backendtest.RunClosed(t, func(t *testing.T, clk *clock.Virtual) backend.Backend {
		s := daemon(t, clk, "*=1/s")
		return client.New(s.LineAddr().String()).Backend()
	})
}

// TestExpiryReportedToTheDaemon: a permit reserved at the daemon (w=) that its worker
// comes to too late expires in the limiter (ErrPermitExpired, EventExpired), and the
// limiter reports it through the client, so that the daemon counts it in its /metrics.
func TestExpiryReportedToTheDaemon(t *testing.T) {
	cfg := server.DefaultConfig()
	cfg.ListenLine, cfg.ListenHTTP = "127.0.0.1:0", "127.0.0.1:0"
	rule, _ := server.ParseRuleFlag("api=10/s burst=1", false)
	cfg.Rules = append(cfg.Rules, rule)
	s, err := server.New(cfg, server.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(bg)
	c := client.New(s.LineAddr().String(), client.WithTimeout(2*time.Second))
	defer c.Close()
	clk := clock.NewVirtual() // the worker's: it is paused while its permit comes due
	var expired atomic.Int64
	l, err := sluice.New(sluice.MustParse("10/s burst=1"), sluice.WithBackend(c.Backend()), sluice.WithClock(clk),
		sluice.WithMargin(20*time.Millisecond), sluice.WithObserver(func(e sluice.Event) {
			if e.Kind == sluice.EventExpired {
				expired.Add(e.N)
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !l.Allow(bg, "api") {
		t.Fatal("the first permit was refused")
	}
	r, err := l.Reserve(bg, "api", 1)
	if err != nil || !r.Allowed || r.Delay <= 0 {
		t.Fatalf("reserve: %+v %v, want a permit ahead", r.Decision, err)
	}
	clk.Advance(r.Delay + 50*time.Millisecond) // 50 ms late with a 20 ms margin
	if err := r.Wait(bg); !errors.Is(err, sluice.ErrPermitExpired) {
		t.Fatalf("Wait 50 ms late = %v, want ErrPermitExpired", err)
	}
	if expired.Load() != 1 {
		t.Fatalf("expired %d, want 1", expired.Load())
	}
	resp, err := http.Get("http://" + s.HTTPAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if want := `sluice_permits_expired_total{rule="api"} 1`; !strings.Contains(string(b), want) {
		t.Errorf("/metrics lacks %s", want)
	}
}

// TestClassesReachTheDaemon: the class on a call's context travels to the daemon (c=), so
// the daemon keeps the headroom for the higher class across its clients: a sheddable
// flood through one limiter leaves 40% of the burst to a critical caller of another
// (priority.DefaultHeadroom), which takes the rest. (The client sent no class: the flood
// took the whole burst, and the critical caller none.)
func TestClassesReachTheDaemon(t *testing.T) {
	s := daemon(t, clock.Default, "api=1/h burst=10")
	newLimiter := func() *sluice.Limiter {
		c := client.New(s.LineAddr().String(), client.WithTimeout(2*time.Second))
		l, err := sluice.New(sluice.MustParse("1/h burst=10"), sluice.WithBackend(c.Backend()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close(); c.Close() })
		return l
	}
	critical, shed := priority.With(bg, priority.Critical), priority.With(bg, priority.Sheddable)
	lc, ls := newLimiter(), newLimiter()
	if d, err := lc.AllowN(critical, "api", 0); err != nil || !d.Allowed {
		t.Fatalf("a critical query: %+v, %v", d, err) // the daemon now knows the class asks
	}
	flood := 0
	for ls.Allow(shed, "api") {
		if flood++; flood > 10 {
			break
		}
	}
	if flood != 6 {
		t.Errorf("a sheddable flood beside a critical caller took %d permits of a burst of 10, want 6 (40%% kept)", flood)
	}
	// A client's Query carries the class too (a standard one would be granted: it keeps
	// 15% of the burst).
	c := client.New(s.LineAddr().String())
	defer c.Close()
	if a, err := c.Query(shed, "api", 1, 0); err != nil || a.Allowed {
		t.Errorf("a sheddable query with 40%% of the burst left: %+v, %v", a, err)
	}
	got := 0
	for lc.Allow(critical, "api") {
		got++
	}
	if got != 10-flood {
		t.Errorf("the critical caller then took %d permits, want the %d left", got, 10-flood)
	}
}

// lineDaemon is a daemon's line protocol on loopback for one connection: answer gives the
// answer to each line (its number from 1, without its '\n'); lines returns the lines read.
func lineDaemon(t *testing.T, answer func(n int, line string) string) (addr string, lines func() []string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimSpace(line)
			mu.Lock()
			got = append(got, line)
			n := len(got)
			mu.Unlock()
			if _, err := c.Write([]byte(answer(n, line) + "\n")); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().String(), func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// TestClassesToAnOlderDaemon: a daemon of a release before classes refuses the c= option
// ("ER bad options"); the client asks again without it, and from then on sends none, so a
// critical call is answered as a standard one was (it was refused, whatever the daemon's
// limits).
func TestClassesToAnOlderDaemon(t *testing.T) {
	addr, lines := lineDaemon(t, func(_ int, line string) string {
		switch {
		case strings.Contains(line, "c="):
			return "ER bad options: want ~OPTS TAG with OPTS such as n=5,v or w=500 or p=1000"
		case strings.HasPrefix(line, "~"):
			return "OK 0 0 0 0"
		}
		return "OK"
	})
	c := client.New(addr, client.WithTimeout(2*time.Second), client.WithConns(1))
	defer c.Close()
	critical := priority.With(bg, priority.Critical)
	for i := range 3 {
		if !c.Allow(critical, "api") {
			t.Fatalf("critical Allow %d refused by a daemon that reads no classes", i)
		}
	}
	if a, err := c.Query(priority.With(bg, priority.Sheddable), "api", 1, 0); err != nil || !a.Allowed {
		t.Fatalf("a sheddable Query: %+v, %v", a, err)
	}
	classed := 0
	for _, l := range lines() {
		if strings.Contains(l, "c=") {
			classed++
		}
	}
	if classed != 1 {
		t.Errorf("%d queries sent with a class to a daemon that refused the first; want 1 (%q)", classed, lines())
	}
}

// TestPlacesCarryTheRoomsHighestClass: through the daemon's client, a place the waiting
// room takes in the daemon's line is of the room's highest class waiting, whichever
// waiter takes it (the daemon keeps the headroom by it): a sheddable waiter that comes
// while a critical one waits in the room asks for its place as critical. (It asked as
// sheddable, and the daemon kept 40% of the burst from the place the room would serve to
// the critical waiter first.)
func TestPlacesCarryTheRoomsHighestClass(t *testing.T) {
	// Each place answered after 20 ms (the room learns the round trip, and holds several
	// places at 100/s), the first at once, the others 400 ms ahead, so that the waiters
	// are all in the room together.
	addr, got := lineDaemon(t, func(n int, _ string) string {
		time.Sleep(20 * time.Millisecond)
		if n > 1 {
			return "OK d=400 r=0"
		}
		return "OK d=0 r=0"
	})
	c := client.New(addr, client.WithTimeout(2*time.Second), client.WithConns(1))
	defer c.Close()
	l, err := sluice.New(sluice.MustParse("100/s burst=1"), sluice.WithBackend(c.Backend()))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Wait(bg, "api"); err != nil { // the room learns the line's round trip
		t.Fatal(err)
	}
	var done sync.WaitGroup
	wait := func(p priority.Class) {
		done.Add(1)
		go func() {
			defer done.Done()
			if err := l.Wait(priority.With(bg, p), "api"); err != nil {
				t.Error(err)
			}
		}()
	}
	wait(priority.Sheddable)
	time.Sleep(60 * time.Millisecond)
	wait(priority.Critical)
	time.Sleep(60 * time.Millisecond)
	wait(priority.Sheddable) // the critical waiter's place is 400 ms ahead: it waits
	done.Wait()
	lines := got()
	if len(lines) < 4 {
		t.Fatalf("%d lines, want 4 places: %q", len(lines), lines)
	}
	if !strings.Contains(lines[3], "c=critical") {
		t.Errorf("the place taken while a critical waiter waited went as %q, want critical (all: %q)", lines[3], lines)
	}
}
