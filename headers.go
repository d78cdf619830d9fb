package sluice

import (
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/internal/ratehdr"
)

// Header names Sluice writes and reads.
const (
	HeaderRetryAfter      = "Retry-After"         // RFC 9110: delta-seconds or an HTTP-date
	HeaderRetryAfterMs    = "Retry-After-Ms"      // milliseconds; sent by some APIs, read first
	HeaderRateLimitPolicy = "RateLimit-Policy"    // IETF draft-ietf-httpapi-ratelimit-headers
	HeaderRateLimit       = "RateLimit"           // IETF draft: remaining and reset
	HeaderRemaining       = "RateLimit-Remaining" // Heroku's form, also read by older clients
)

// SetRateLimitHeaders writes the rate-limit fields of a response under limits for decision
// d: the IETF draft's RateLimit-Policy (one member per limit, with q the rate, w the
// period in seconds and a burst parameter) and RateLimit (r remaining, t seconds until
// the key is full again), and Heroku's RateLimit-Remaining. On a denial it also writes
// Retry-After (whole seconds, rounded up) and Retry-After-Ms.
func SetRateLimitHeaders(h http.Header, limits Limits, d Decision) {
	var pol strings.Builder
	for i, l := range limits {
		if i > 0 {
			pol.WriteString(", ")
		}
		pol.WriteString(strconv.Quote(l.String()))
		pol.WriteString(";q=")
		pol.WriteString(strconv.FormatInt(l.Rate, 10))
		pol.WriteString(";w=")
		pol.WriteString(strconv.FormatInt(ceilSeconds(l.Period), 10))
		pol.WriteString(";burst=")
		pol.WriteString(strconv.FormatInt(limitconv.Burst(l), 10))
	}
	set(h, kPolicy, pol.String())
	name := "default"
	if len(limits) > 0 {
		name = limits[0].String()
	}
	set(h, kRateLimit, strconv.Quote(name)+";r="+strconv.FormatInt(d.Remaining, 10)+";t="+strconv.FormatInt(ceilSeconds(d.ResetAfter), 10))
	set(h, kRemaining, strconv.FormatInt(d.Remaining, 10))
	if !d.Allowed {
		set(h, kRetryAfter, strconv.FormatInt(ceilSeconds(d.RetryAfter), 10))
		set(h, kRetryAfterMs, strconv.FormatInt(int64((d.RetryAfter+time.Millisecond-1)/time.Millisecond), 10))
	}
}

// The fields' canonical keys, computed once: h.Set would canonicalize them on every
// answer (most of the cost of writing them, in the simulator's adaptive mode).
var (
	kPolicy       = textproto.CanonicalMIMEHeaderKey(HeaderRateLimitPolicy)
	kRateLimit    = textproto.CanonicalMIMEHeaderKey(HeaderRateLimit)
	kRemaining    = textproto.CanonicalMIMEHeaderKey(HeaderRemaining)
	kRetryAfter   = textproto.CanonicalMIMEHeaderKey(HeaderRetryAfter)
	kRetryAfterMs = textproto.CanonicalMIMEHeaderKey(HeaderRetryAfterMs)
)

// set is h.Set for a key already canonical.
func set(h http.Header, k, v string) { h[k] = []string{v} }

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// RetryAfter reads how long a response asks the caller to wait: Retry-After-Ms if present,
// else Retry-After in either of its forms (delta-seconds, or an HTTP-date compared with
// now). It reports false when the response names no wait, or names it badly or beyond a
// year.
func RetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	return ratehdr.RetryAfter(h, now)
}

// Remaining reads how many requests a response says are left, in any of the forms APIs
// use: the IETF draft's RateLimit field, RateLimit-Remaining (Heroku),
// X-RateLimit-Remaining (GitHub and many others), OpenAI's x-ratelimit-remaining-requests,
// Anthropic's anthropic-ratelimit-requests-remaining. It reports false when none is
// present and well formed.
func Remaining(h http.Header) (int64, bool) { return ratehdr.Remaining(h) }
