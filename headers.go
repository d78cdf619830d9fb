package sluice

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header names Sluice writes and reads.
const (
	HeaderRetryAfter       = "Retry-After"         // RFC 9110: delta-seconds or an HTTP-date
	HeaderRetryAfterMs     = "Retry-After-Ms"      // milliseconds; sent by some APIs, read first
	HeaderRateLimitPolicy  = "RateLimit-Policy"    // IETF draft-ietf-httpapi-ratelimit-headers
	HeaderRateLimit        = "RateLimit"           // IETF draft: remaining and reset
	HeaderRemaining        = "RateLimit-Remaining" // Heroku's form, also read by older clients
	headerXRateLimitRemain = "X-RateLimit-Remaining"
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
		pol.WriteString(strconv.FormatInt(l.burst(), 10))
	}
	h.Set(HeaderRateLimitPolicy, pol.String())
	name := "default"
	if len(limits) > 0 {
		name = limits[0].String()
	}
	h.Set(HeaderRateLimit, strconv.Quote(name)+";r="+strconv.FormatInt(d.Remaining, 10)+";t="+strconv.FormatInt(ceilSeconds(d.ResetAfter), 10))
	h.Set(HeaderRemaining, strconv.FormatInt(d.Remaining, 10))
	if !d.Allowed {
		h.Set(HeaderRetryAfter, strconv.FormatInt(ceilSeconds(d.RetryAfter), 10))
		h.Set(HeaderRetryAfterMs, strconv.FormatInt(int64((d.RetryAfter+time.Millisecond-1)/time.Millisecond), 10))
	}
}

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// RetryAfter reads how long a response asks the caller to wait: Retry-After-Ms if present,
// else Retry-After in either of its forms (delta-seconds, or an HTTP-date compared with
// now). It reports false when the response names no wait or names it badly.
func RetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	if v := strings.TrimSpace(h.Get(HeaderRetryAfterMs)); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 && ms < 1e12 {
			return time.Duration(ms * float64(time.Millisecond)), true
		}
	}
	v := strings.TrimSpace(h.Get(HeaderRetryAfter))
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s < 0 || s > 1e9 {
			return 0, false
		}
		return time.Duration(s) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// Remaining reads how many requests a response says are left: the IETF draft's RateLimit
// field (its r parameter), else RateLimit-Remaining or X-RateLimit-Remaining. It reports
// false when none is present and well formed.
func Remaining(h http.Header) (int64, bool) {
	if v := h.Get(HeaderRateLimit); v != "" {
		for _, p := range strings.Split(v, ";") {
			if k, val, ok := strings.Cut(strings.TrimSpace(p), "="); ok && k == "r" {
				if n, err := strconv.ParseInt(val, 10, 64); err == nil && n >= 0 {
					return n, true
				}
			}
		}
	}
	for _, name := range []string{HeaderRemaining, headerXRateLimitRemain} {
		if v := strings.TrimSpace(h.Get(name)); v != "" {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
				return n, true
			}
		}
	}
	return 0, false
}
