package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/httplimit"
)

// The strict mode's example: one permit every 6 seconds, requests at t=2, 8, 13 and 14.
func ExampleLimiter_Allow() {
	clk := clock.NewVirtual()
	l := sluice.MustNew(sluice.MustParse("1/6s"), sluice.WithClock(clk))
	defer l.Close()
	for _, at := range []time.Duration{2, 8, 13, 14} {
		clk.Set(int64(at * time.Second))
		fmt.Printf("t=%-2d %v\n", int(at), l.Allow(context.Background(), "api"))
	}
	// Output:
	// t=2  true
	// t=8  true
	// t=13 false
	// t=14 true
}

func ExampleLimiter_AllowN() {
	l := sluice.MustNew(sluice.MustParse("10/s burst=5"), sluice.WithClock(clock.NewVirtual()))
	defer l.Close()
	d, _ := l.AllowN(context.Background(), "api", 4)
	fmt.Println(d.Allowed, d.Remaining)
	d, _ = l.AllowN(context.Background(), "api", 4)
	fmt.Println(d.Allowed, d.Remaining, d.RetryAfter)
	// Output:
	// true 1
	// false 1 300ms
}

func ExampleLimiter_Reserve() {
	l := sluice.MustNew(sluice.MustParse("1/s burst=1"), sluice.WithClock(clock.NewVirtual()))
	defer l.Close()
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		r, _ := l.Reserve(ctx, "api", 1)
		fmt.Println(r.Allowed, r.Delay)
	}
	// Output:
	// true 0s
	// true 1s
	// true 2s
}

// An LLM API counts tokens, known only from its response: reserve an estimate, settle to
// the real count.
func ExampleReservation_Settle() {
	l := sluice.MustNew(sluice.MustParse("10000/m"), sluice.WithClock(clock.NewVirtual()))
	defer l.Close()
	ctx := context.Background()
	r, _ := l.Reserve(ctx, "llm", 4000)
	// ... call the API; it reports 1500 tokens used.
	r.Settle(ctx, 1500)
	d, _ := l.AllowN(ctx, "llm", 8500)
	fmt.Println(d.Allowed)
	// Output: true
}

func ExampleWrap() {
	l := sluice.MustNew(sluice.MustParse("1/6s"), sluice.WithClock(clock.NewVirtual()))
	defer l.Close()
	square := func(_ context.Context, x int) (int, error) { return x * x, nil }
	throttled := sluice.Wrap(l, "api", square, sluice.Pessimistic())
	ctx := context.Background()
	fmt.Println(throttled(ctx, 3))
	_, err := throttled(ctx, 4)
	fmt.Println(errors.Is(err, sluice.ErrThrottled))
	// Output:
	// 9 <nil>
	// true
}

func ExampleLimiter_Penalize() {
	clk := clock.NewVirtual()
	l := sluice.MustNew(sluice.MustParse("100/s"), sluice.WithClock(clk))
	defer l.Close()
	ctx := context.Background()
	// A worker got 429 with Retry-After: 30. Every caller of the key holds back.
	l.Penalize(ctx, "api", clk.Now().Add(30*time.Second))
	fmt.Println(l.Allow(ctx, "api"))
	clk.Advance(30 * time.Second)
	fmt.Println(l.Allow(ctx, "api"))
	// Output:
	// false
	// true
}

func ExampleParse() {
	ls, err := sluice.Parse("100/s burst=20; 4500/h")
	fmt.Println(ls, err)
	_, err = sluice.Parse("ten per sec")
	fmt.Println(err)
	// Output:
	// 100/s burst=20; 4500/h <nil>
	// sluice: bad limit "ten per sec": no '/' between rate and period: "ten" (want RATE/PERIOD [burst=N | window] [ramp=RATE/PERIOD..DURATION], e.g. 100/s, 1/6s, 10/s burst=20, 10000/24h window, 100/s ramp=10/s..60s)
}

func ExampleBackoff_Retry() {
	clk := clock.NewVirtual()
	l := sluice.MustNew(sluice.MustParse("1/s burst=1"), sluice.WithClock(clk))
	defer l.Close()
	ctx := context.Background()
	l.Allow(ctx, "api")
	go func() { // play time forward for the example
		clk.BlockUntil(ctx, 1)
		at, _ := clk.Next()
		clk.Set(at)
	}()
	b := sluice.Backoff{Clock: clk, Rand: func() float64 { return 0 }}
	err := b.Retry(ctx, func(ctx context.Context) error {
		return l.Do(ctx, "api", func(context.Context) error { return nil }, sluice.Pessimistic())
	})
	fmt.Println(err, time.Duration(clk.Nanotime()))
	// Output: <nil> 1s
}

// Wait blocks until the key's permit is due (here on a virtual clock, played forward by
// the example), or returns an error if ctx ends first or the permit lies beyond its
// deadline.
func ExampleLimiter_Wait() {
	clk := clock.NewVirtual()
	l := sluice.MustNew(sluice.MustParse("2/s burst=1"), sluice.WithClock(clk))
	defer l.Close()
	ctx := context.Background()
	play, stop := context.WithCancel(ctx)
	defer stop()
	go func() { // play time forward for the example: wake each sleeper when it sleeps
		for clk.BlockUntil(play, 1) == nil {
			at, _ := clk.Next()
			clk.Set(at)
		}
	}()
	for i := 0; i < 3; i++ {
		if err := l.Wait(ctx, "api"); err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("call", i, "at", time.Duration(clk.Nanotime()))
	}
	// A deadline nearer than the next permit: refused at once, nothing taken.
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	fmt.Println(errors.Is(l.Wait(short, "api"), sluice.ErrThrottled))
	// Output:
	// call 0 at 0s
	// call 1 at 500ms
	// call 2 at 1s
	// true
}

// Do runs a function once its permit is granted; the function can settle the real cost
// of the call through the reservation in its context.
func ExampleLimiter_Do() {
	l := sluice.MustNew(sluice.MustParse("10000/m"), sluice.WithClock(clock.NewVirtual()))
	defer l.Close()
	ctx := context.Background()
	err := l.Do(ctx, "llm", func(ctx context.Context) error {
		// ... call the API with an estimate of 4000 tokens; it reports 1500 used.
		return sluice.ReservationFromContext(ctx).Settle(ctx, 1500)
	}, sluice.Cost(4000))
	d, _ := l.AllowN(ctx, "llm", 0) // a look at the state
	fmt.Println(err, d.Remaining)
	// Output: <nil> 8500
}

// Transport throttles an http.Client: each request waits for its host's permit, and a
// 429 holds every request of the pool back (until its Retry-After, or for a period).
func ExampleTransport() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))
	defer api.Close()
	l := sluice.MustNew(sluice.MustParse("100/s burst=10"))
	defer l.Close()
	client := &http.Client{Transport: &sluice.Transport{
		Limiter: l,
		Retries: 2, // send an idempotent request again after a 429, behind the hold
	}}
	for i := 0; i < 3; i++ {
		resp, err := client.Get(api.URL)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Print(resp.StatusCode, " ", string(body))
	}
	// Output:
	// 200 hello
	// 200 hello
	// 200 hello
}

// Middleware throttles inbound requests by client address: past the limit, a 429 with
// Retry-After and the RateLimit headers.
func ExampleLimiter_Middleware() {
	l := sluice.MustNew(sluice.MustParse("2/m"), sluice.WithClock(clock.NewVirtual()))
	defer l.Close()
	h := l.Middleware(httplimit.KeyByRemoteAddr)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "ok")
	}))
	for i := 0; i < 3; i++ {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "192.0.2.7:40000"
		h.ServeHTTP(w, r)
		fmt.Printf("%d %q\n", w.Code, w.Header().Get("Retry-After"))
	}
	// Output:
	// 200 ""
	// 200 ""
	// 429 "30"
}

// A daily quota, counted from 00:00 UTC (GitHub's hourly one would be "5000/h window"):
// weighted requests draw on it, and once it is spent the next permit comes at midnight.
func ExampleLimit_window() {
	clk := clock.NewVirtualAt(time.Date(2026, 3, 1, 18, 0, 0, 0, time.UTC))
	l := sluice.MustNew(sluice.MustParse("10000/24h window"), sluice.WithClock(clk))
	defer l.Close()
	ctx := context.Background()
	d, _ := l.AllowN(ctx, "user", 9998)
	fmt.Println(d.Allowed, d.Remaining)
	d, _ = l.AllowN(ctx, "user", 3)
	fmt.Println(d.Allowed, d.RetryAfter)
	// Output:
	// true 2
	// false 6h0m0s
}

// A ramp: from 10/s to 100/s over a minute, then 100/s, for a downstream that warms up.
// The burst rises with the rate.
func ExampleLimit_ramp() {
	clk := clock.NewVirtual()
	l := sluice.MustNew(sluice.MustParse("100/s ramp=10/s..60s"), sluice.WithClock(clk))
	defer l.Close()
	fmt.Println(l.Limits())
	for i, at := range []time.Duration{0, 30 * time.Second, time.Minute} {
		clk.Set(int64(at))
		d, _ := l.AllowN(context.Background(), fmt.Sprint("key", i), 0) // a look at a new key
		fmt.Printf("at %v: burst %d\n", at, d.Remaining)
	}
	// Output:
	// 100/s ramp=10/s..1m
	// at 0s: burst 10
	// at 30s: burst 55
	// at 1m0s: burst 100
}
