package ratehdr

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/limitconv"
)

// Write sets the rate-limit fields of an answer given under limits (sluice.Limits, each
// named by its text form) to a request decided so: the IETF draft's RateLimit-Policy (one
// member per limit, with q the rate, w the period in seconds and a burst parameter) and
// RateLimit (r remaining, t seconds until the key is full again), and Heroku's
// RateLimit-Remaining. A denial (allowed false) also gets Retry-After (whole seconds,
// rounded up) and Retry-After-Ms. Read reads back what it writes. It is the one writer of
// these fields: package sluice's middleware and package httplimit's SetRateLimitHeaders
// call it.
func Write[L interface {
	~limitconv.Fields[R]
	String() string
}, R ~limitconv.RampFields](h http.Header, limits []L, allowed bool, remaining int64, retryAfter, resetAfter time.Duration) {
	var pol strings.Builder
	for i, l := range limits {
		f := limitconv.Fields[R](l)
		if i > 0 {
			pol.WriteString(", ")
		}
		pol.WriteString(strconv.Quote(l.String()))
		pol.WriteString(";q=")
		pol.WriteString(strconv.FormatInt(f.Rate, 10))
		pol.WriteString(";w=")
		pol.WriteString(strconv.FormatInt(ceilSeconds(f.Period), 10))
		pol.WriteString(";burst=")
		pol.WriteString(strconv.FormatInt(limitconv.Burst(l), 10))
	}
	set(h, kPolicy, pol.String())
	name := "default"
	if len(limits) > 0 {
		name = limits[0].String()
	}
	set(h, kRateLimit, strconv.Quote(name)+";r="+strconv.FormatInt(remaining, 10)+";t="+strconv.FormatInt(ceilSeconds(resetAfter), 10))
	set(h, kTrio[0].remaining, strconv.FormatInt(remaining, 10))
	if !allowed {
		set(h, kRetryAfter, strconv.FormatInt(ceilSeconds(retryAfter), 10))
		set(h, kRetryAfterMs, strconv.FormatInt(int64((retryAfter+time.Millisecond-1)/time.Millisecond), 10))
	}
}

// set is h.Set for a key already canonical: h.Set would canonicalize it on every answer
// (most of the cost of writing the fields, in the simulator's adaptive mode).
func set(h http.Header, k, v string) { h[k] = []string{v} }

// ceilSeconds is d in whole seconds, rounded up; 0 if d is not positive.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}
