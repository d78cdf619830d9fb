package httplimit_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
)

// A denial's fields, as Limiter.Middleware writes them, and what a client reads back.
func ExampleSetRateLimitHeaders() {
	h := http.Header{}
	d := sluice.Decision{Remaining: 0, RetryAfter: 1500 * time.Millisecond, ResetAfter: 2 * time.Second}
	httplimit.SetRateLimitHeaders(h, sluice.MustParse("10/s burst=20"), d)
	fmt.Println(h.Get(httplimit.HeaderRateLimitPolicy))
	fmt.Println(h.Get(httplimit.HeaderRateLimit))
	fmt.Println(h.Get(httplimit.HeaderRetryAfter), h.Get(httplimit.HeaderRetryAfterMs))
	fmt.Println(httplimit.RetryAfter(h, time.Now()))
	// Output:
	// "10/s burst=20";q=10;w=1;burst=20
	// "10/s burst=20";r=0;t=2
	// 2 1500
	// 1.5s true
}
