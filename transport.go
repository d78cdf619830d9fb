package sluice

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/internal/ratehdr"
)

// Transport is an http.RoundTripper that throttles outbound calls to a shared API. Each
// request waits for its key's permit (bounded by its context and the limiter's maximum
// wait) before it is sent. A 429 answer is reported to the limiter (Penalize), so that
// every worker sharing the limiter's state holds back until its Retry-After, or for
// DefaultPenalty when it has none. Idempotent requests may be retried after a 429
// (Retries).
//
// It follows net/http's rules: it is safe for concurrent use, never modifies the request,
// closes the request body when it does not send it, and returns err == nil whenever it
// got a response (a 429 included).
type Transport struct {
	// Limiter decides the permits. Required.
	Limiter *Limiter
	// Base sends the requests; nil means http.DefaultTransport.
	Base http.RoundTripper
	// Key picks a request's key (an httplimit.KeyFunc); nil means by host
	// (httplimit.KeyByHost). An empty key is not throttled.
	Key func(*http.Request) string
	// Cost is a request's weight in permits; nil means 1.
	Cost func(*http.Request) int64
	// Pessimistic makes a request that has no permit now fail at once with a
	// *ThrottledError instead of waiting.
	Pessimistic bool
	// DefaultPenalty is how long the pool holds back after a 429 that names no wait (no
	// Retry-After): such a 429 says the API counted more than the limiter did. Zero means
	// the shortest period of the limiter's limits, at most a minute, after which the API's
	// window has moved on (1s for 100/s, 6s for 1/6s, a minute for 4500/h). Negative: do
	// not hold back (the 429 is still returned to the caller).
	DefaultPenalty time.Duration
	// Retries is how many times a request answered 429 is sent again (default 0: the 429
	// goes back to the caller). Only idempotent requests are retried (GET, HEAD, OPTIONS,
	// TRACE, PUT, DELETE, or one with an Idempotency-Key header) whose body can be sent
	// again (none, or GetBody set, as http.NewRequest does for in-memory bodies). Each
	// retry waits for a new permit, behind the hold the 429 set, within the request's
	// context; when that wait fails or the retries run out, the last 429 is returned.
	Retries int
}

// maxDefaultPenalty caps the hold after a 429 without Retry-After.
const maxDefaultPenalty = time.Minute

// Transport returns an http.RoundTripper that throttles requests through l before
// sending them with base (nil: http.DefaultTransport), keyed by host:
//
//	client := &http.Client{Transport: l.Transport(nil)}
func (l *Limiter) Transport(base http.RoundTripper) *Transport {
	return &Transport{Limiter: l, Base: base}
}

// RoundTrip waits for the request's permit, sends it, reports a 429 to the limiter, and
// retries an idempotent request after a 429 when Retries allows.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	key := ratehdr.HostKey(req)
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
	n := int64(1)
	if t.Cost != nil {
		n = t.Cost(req)
	}
	if err := t.permit(req.Context(), key, n); err != nil {
		closeBody(req)
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		resp, err := base.RoundTrip(req)
		if err != nil || resp.StatusCode != http.StatusTooManyRequests {
			return resp, err
		}
		t.hold(req.Context(), key, resp)
		if attempt > t.Retries || !ratehdr.Replayable(req) {
			return resp, nil
		}
		next := req.Clone(req.Context())
		if req.Body != nil && req.Body != http.NoBody {
			if next.Body, err = req.GetBody(); err != nil {
				return resp, nil
			}
		}
		if err := t.permit(req.Context(), key, n); err != nil {
			closeBody(next)
			return resp, nil // the caller gets the 429 it would have had without retries
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10)) // lets the connection be reused
		resp.Body.Close()
		req = next
	}
}

// permit waits for (or, pessimistic, takes at once) n permits of key.
func (t *Transport) permit(ctx context.Context, key string, n int64) error {
	if !t.Pessimistic {
		_, err := t.Limiter.WaitN(ctx, key, n)
		return err
	}
	d, err := t.Limiter.AllowN(ctx, key, n)
	if err == nil && !d.Allowed {
		err = &ThrottledError{Key: key, RetryAfter: d.RetryAfter}
	}
	return err
}

// hold holds the pool back after a 429: until its Retry-After, or for the default
// penalty.
func (t *Transport) hold(ctx context.Context, key string, resp *http.Response) {
	now := t.Limiter.clock.Now()
	d, ok := ratehdr.RetryAfter(resp.Header, now)
	if !ok {
		d = t.DefaultPenalty
		if d == 0 {
			d = maxDefaultPenalty
			for _, l := range t.Limiter.Limits() {
				d = min(d, l.Period)
			}
		}
	}
	if d > 0 {
		// The penalty must land even if the caller's context ends now.
		_ = t.Limiter.Penalize(context.WithoutCancel(ctx), key, now.Add(d))
	}
}

func closeBody(r *http.Request) {
	if r.Body != nil {
		r.Body.Close()
	}
}

// Middleware throttles inbound requests. A request whose key has a permit now goes on to
// next with the rate-limit headers set (httplimit.SetRateLimitHeaders). One that has none
// is answered 429 with Retry-After and the same headers. key (an httplimit.KeyFunc) picks
// a request's key, and nil means the client's address (httplimit.KeyByRemoteAddr). An
// empty key is not throttled. A backend failure is answered per the limiter's fail mode
// (denied requests get 503 when the limiter fails closed).
func (l *Limiter) Middleware(key func(*http.Request) string) func(http.Handler) http.Handler {
	if key == nil {
		key = ratehdr.RemoteAddrKey
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			k := key(r)
			if k == "" {
				next.ServeHTTP(w, r)
				return
			}
			d, err := l.AllowN(r.Context(), k, 1)
			ratehdr.Write(w.Header(), l.Limits(), d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter)
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
