package httplimit

import (
	"net/http"
	"time"

	"github.com/sluicehq/sluice"
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
// Retry-After (whole seconds, rounded up) and Retry-After-Ms. sluice.Limiter.Middleware
// writes the same fields.
func SetRateLimitHeaders(h http.Header, limits sluice.Limits, d sluice.Decision) {
	ratehdr.Write(h, limits, d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter)
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
