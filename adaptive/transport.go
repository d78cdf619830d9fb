package adaptive

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/ratehdr"
)

// Transport is an http.RoundTripper that paces the requests it sends through one
// Controller per key (the request's host, unless Key says otherwise), waiting each
// request's slot (or the request's context), and feeds every answer back to the
// Controller. The goroutines of a process that use one Transport are one client.
//
// Its zero value is usable. It must not be copied after first use.
type Transport struct {
	// Base sends the requests (default http.DefaultTransport).
	Base http.RoundTripper
	// Key names the limit a request counts against (default: its URL's host). Requests
	// with one token to one API share a key.
	Key func(*http.Request) string
	// Config tunes the controllers.
	Config Config
	// Retries is how many times a 429 is retried after its Retry-After, for idempotent
	// requests only (GET, HEAD, OPTIONS, TRACE, PUT, DELETE, or a request with an
	// Idempotency-Key); default 0.
	Retries int

	mu    sync.Mutex
	ctrls map[string]*Controller
	seed  uint64
}

var _ http.RoundTripper = (*Transport)(nil)

func (t *Transport) controller(key string) (*Controller, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c := t.ctrls[key]; c != nil {
		return c, nil
	}
	if t.ctrls == nil {
		t.ctrls = map[string]*Controller{}
	}
	t.seed += 0x9e3779b97f4a7c15
	c, err := New(t.Config, t.seed^uint64(time.Now().UnixNano()))
	if err != nil {
		return nil, err
	}
	t.ctrls[key] = c
	return c, nil
}

// RoundTrip waits for the request's slot, sends it, and learns from the answer. It follows
// net/http's rules: it does not modify the request, and it closes the body of a request it
// does not send.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	key := req.URL.Host
	if t.Key != nil {
		key = t.Key(req)
	}
	c, err := t.controller(key)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	for attempt := 0; ; attempt++ {
		if err := t.wait(req.Context(), c); err != nil {
			closeBody(req)
			return nil, err
		}
		resp, err := base.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		facts := ratehdr.Read(resp.StatusCode, resp.Header, time.Now())
		t.mu.Lock()
		c.Observe(monotonic(), facts)
		t.mu.Unlock()
		if !facts.Throttled() || attempt >= t.Retries || !ratehdr.Replayable(req) {
			return resp, nil
		}
		resp.Body.Close()
		if req.GetBody != nil {
			body, err := req.GetBody()
			if err != nil {
				return nil, err
			}
			req = req.Clone(req.Context())
			req.Body = body
		}
	}
}

// wait sleeps until the controller's next slot, or until ctx ends.
func (t *Transport) wait(ctx context.Context, c *Controller) error {
	t.mu.Lock()
	now := monotonic()
	at := c.Next(now)
	t.mu.Unlock()
	if at <= now {
		return ctx.Err()
	}
	tm := time.NewTimer(time.Duration(at - now))
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

var epoch = time.Now()

// monotonic is the process' monotonic clock, in nanoseconds.
func monotonic() int64 { return int64(time.Since(epoch)) + 1 }

func closeBody(r *http.Request) {
	if r.Body != nil {
		r.Body.Close()
	}
}
