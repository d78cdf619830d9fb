package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/clock"
)

// The seed's timeline: one permit every 6 seconds, requests at t=2, 8, 13 and 14.
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
		fmt.Println(r.OK(), r.Delay)
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
	// sluice: bad limit "ten per sec": "ten": no '/' between rate and period (want RATE/PERIOD [burst=N], e.g. 100/s, 4500/h, 1/6s, 10/s burst=20)
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
