package strict_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/strict"
)

// A pool of processes shares one limit, one request every 6 seconds, through one Redis.
// Each process makes the same limiter, and Redis decides for all of them.
func Example() {
	ctx := context.Background()
	url := strict.SharedURL() // "redis://HOST:PORT" of your Redis
	b, err := strict.Dial(ctx, url, strict.WithPrefix(fmt.Sprintf("example:%d:", time.Now().UnixNano())))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	l := sluice.MustNew(sluice.MustParse("1/6s"), sluice.WithBackend(b))
	defer l.Close()

	fmt.Println(l.Allow(ctx, "token-a")) // the permit
	fmt.Println(l.Allow(ctx, "token-a")) // the next is 6s away
	d, _ := l.AllowN(ctx, "token-a", 1)
	fmt.Println(d.Allowed, d.RetryAfter > 5*time.Second)
	// Output:
	// true
	// false
	// false true
}
