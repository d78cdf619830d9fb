package sluice

import (
	"context"
	"net/http"
	"strings"
	"time"
)

// KeyFunc picks the key a request is throttled under. An empty key means "do not
// throttle this request".
type KeyFunc func(*http.Request) string

// KeyByHost throttles by the request's host (the API), the default.
func KeyByHost(r *http.Request) string {
	if r.URL != nil && r.URL.Host != "" {
		return r.URL.Host
	}
	return r.Host
}

// KeyByToken throttles by the request's API token: the bearer token of Authorization, or
// else the X-Api-Token header. Use it when one limit applies per token.
func KeyByToken(r *http.Request) string {
	if a := r.Header.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
		return strings.TrimSpace(a[7:])
	}
	return r.Header.Get("X-Api-Token")
}

// KeyByHeader throttles by the value of a header.
func KeyByHeader(name string) KeyFunc {
	return func(r *http.Request) string { return r.Header.Get(name) }
}

// Transport is an http.RoundTripper that throttles outbound calls to a shared API: each
// request waits for its key's permit (bounded by its context and the limiter's maximum
// wait) before it is sent, and a 429 answer with Retry-After is reported to the limiter
// (Penalize), so that every worker sharing the limiter's state holds back until then.
//
// It follows net/http's rules: it is safe for concurrent use, never modifies the request,
// closes the request body when it does not send it, and returns err == nil whenever it
// got a response (a 429 included).
type Transport struct {
	// Limiter decides the permits. Required.
	Limiter *Limiter
	// Base sends the requests; nil means http.DefaultTransport.
	Base http.RoundTripper
	// Key picks a request's key; nil means KeyByHost.
	Key KeyFunc
	// Cost is a request's weight in permits; nil means 1.
	Cost func(*http.Request) int
	// Pessimistic makes a request that has no permit now fail at once with a
	// *ThrottledError instead of waiting.
	Pessimistic bool
	// DefaultPenalty is how long the pool holds back after a 429 that names no wait; zero
	// means not at all (the 429 is still returned to the caller).
	DefaultPenalty time.Duration
}

// Transport returns an http.RoundTripper that throttles requests through l before
// sending them with base (nil: http.DefaultTransport), keyed by host:
//
//	client := &http.Client{Transport: l.Transport(nil)}
func (l *Limiter) Transport(base http.RoundTripper) *Transport {
	return &Transport{Limiter: l, Base: base}
}

// RoundTrip waits for the request's permit, sends it, and reports a 429 to the limiter.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	key := KeyByHost(req)
	if t.Key != nil {
		key = t.Key(req)
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if key == "" {
		return base.RoundTrip(req)
	}
	n := 1
	if t.Cost != nil {
		n = t.Cost(req)
	}
	ctx := req.Context()
	var err error
	if t.Pessimistic {
		var d Decision
		d, err = t.Limiter.AllowN(ctx, key, n)
		if err == nil && !d.Allowed {
			err = &ThrottledError{Key: key, RetryAfter: d.RetryAfter}
		}
	} else {
		_, err = t.Limiter.WaitN(ctx, key, n)
	}
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	resp, err := base.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		now := t.Limiter.clock.Now()
		d, ok := RetryAfter(resp.Header, now)
		if !ok {
			d = t.DefaultPenalty
		}
		if d > 0 {
			// The penalty must land even if the caller's context ends now.
			_ = t.Limiter.Penalize(context.WithoutCancel(ctx), key, now.Add(d))
		}
	}
	return resp, err
}

// Middleware throttles inbound requests: a request whose key has a permit now goes on to
// next with the rate-limit headers set; one that has none is answered 429 with
// Retry-After and the same headers. key nil means the client's address (the host part of
// RemoteAddr); an empty key is not throttled. A backend failure is answered per the
// limiter's fail mode (denied requests get 503 when the limiter fails closed).
func (l *Limiter) Middleware(key KeyFunc) func(http.Handler) http.Handler {
	if key == nil {
		key = KeyByRemoteAddr
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			k := key(r)
			if k == "" {
				next.ServeHTTP(w, r)
				return
			}
			d, err := l.AllowN(r.Context(), k, 1)
			SetRateLimitHeaders(w.Header(), l.limits, d)
			switch {
			case err != nil:
				http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			case !d.Allowed:
				http.Error(w, "too many requests", http.StatusTooManyRequests)
			default:
				next.ServeHTTP(w, r)
			}
		})
	}
}

// KeyByRemoteAddr keys a request by the client's IP address (RemoteAddr without the
// port). Behind a proxy, key by the header the proxy sets instead (KeyByHeader).
func KeyByRemoteAddr(r *http.Request) string {
	a := r.RemoteAddr
	if i := strings.LastIndexByte(a, ':'); i >= 0 && !strings.HasSuffix(a, "]") {
		a = a[:i]
	}
	return strings.Trim(a, "[]")
}
