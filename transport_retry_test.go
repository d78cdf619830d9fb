package sluice_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/clock"
)

// TestTransport429WithoutRetryAfter: a 429 that names no wait holds the pool back for
// DefaultPenalty, by default the shortest period of the limits; negative: not at all.
func TestTransport429WithoutRetryAfter(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer srv.Close()
	for i, c := range []struct {
		limits  string
		penalty time.Duration
		held    time.Duration
	}{
		{"100/s burst=10", 0, time.Second},
		{"1/6s", 0, 6 * time.Second},
		{"100/s; 4500/h", 0, time.Second},
		{"4500/h", 0, time.Minute}, // at most a minute
		{"100/s", 5 * time.Second, 5 * time.Second},
		{"100/s", -1, 0},
	} {
		clk := clock.NewVirtual()
		l := sluice.MustNew(sluice.MustParse(c.limits), sluice.WithClock(clk))
		client := &http.Client{Transport: &sluice.Transport{Limiter: l, DefaultPenalty: c.penalty, Key: func(*http.Request) string { return "api" }}}
		resp, err := client.Get(srv.URL)
		if err != nil || resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("case %d: %v %v", i, resp, err)
		}
		resp.Body.Close()
		steps := []struct {
			at      time.Duration
			allowed bool
		}{{c.held - time.Millisecond, c.held == 0}, {c.held, true}}
		if c.held == 0 {
			steps = steps[1:]
		}
		for j, s := range steps {
			clk.Set(int64(max(s.at, 0)))
			if got := l.Allow(bg, "api"); got != s.allowed {
				t.Errorf("case %d (%s, DefaultPenalty %v) step %d at %v: allowed %v, want %v", i, c.limits, c.penalty, j, s.at, got, s.allowed)
			}
		}
		l.Close()
	}
}

// flaky answers 429 to the first `fail` requests, then 200, recording each body.
type flaky struct {
	mu     sync.Mutex
	fail   int
	bodies []string
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.bodies = append(f.bodies, string(b))
	n := len(f.bodies)
	f.mu.Unlock()
	if n <= f.fail {
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	w.Write([]byte("ok"))
}

// TestTransportRetries429: idempotent requests whose body can be sent again are retried
// after a 429, each retry behind the hold and on a new permit, at most Retries times;
// others get their 429 at once, as does a request whose context ends before the retry's
// permit.
func TestTransportRetries429(t *testing.T) {
	l := sluice.MustNew(sluice.MustParse("1000/s burst=10"))
	defer l.Close()
	type request struct {
		method, body, idemKey string
		opaqueBody            bool // a body without GetBody: it cannot be sent again
	}
	for i, c := range []struct {
		req      request
		retries  int
		penalty  time.Duration
		deadline time.Duration
		status   int
		sent     int
	}{
		{request{method: "GET"}, 2, 10 * time.Millisecond, 0, 200, 3},
		{request{method: "GET"}, 1, 10 * time.Millisecond, 0, 429, 2},
		{request{method: "GET"}, 0, 10 * time.Millisecond, 0, 429, 1},
		{request{method: "POST", body: "payload"}, 2, 10 * time.Millisecond, 0, 429, 1},
		{request{method: "POST", body: "payload", idemKey: "k1"}, 2, 10 * time.Millisecond, 0, 200, 3},
		{request{method: "PUT", body: "payload"}, 2, 10 * time.Millisecond, 0, 200, 3},
		{request{method: "PUT", body: "payload", opaqueBody: true}, 2, 10 * time.Millisecond, 0, 429, 1},
		{request{method: "GET"}, 2, time.Hour, time.Second, 429, 1}, // the hold outlasts the context
	} {
		f := &flaky{fail: 2}
		srv := httptest.NewServer(f)
		tr := &sluice.Transport{Limiter: l, Retries: c.retries, DefaultPenalty: c.penalty, Key: func(*http.Request) string { return "k" + string(rune('a'+i)) }}
		ctx := context.Background()
		if c.deadline > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, c.deadline)
			defer cancel()
		}
		var body io.Reader
		if c.req.body != "" {
			body = strings.NewReader(c.req.body)
			if c.req.opaqueBody {
				body = io.MultiReader(body)
			}
		}
		req, _ := http.NewRequestWithContext(ctx, c.req.method, srv.URL, body)
		if c.req.idemKey != "" {
			req.Header.Set("Idempotency-Key", c.req.idemKey)
		}
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		resp.Body.Close()
		srv.Close()
		if resp.StatusCode != c.status || len(f.bodies) != c.sent {
			t.Errorf("case %d %+v: status %d after %d requests, want %d after %d", i, c.req, resp.StatusCode, len(f.bodies), c.status, c.sent)
		}
		for j, b := range f.bodies {
			if b != c.req.body {
				t.Errorf("case %d: request %d carried %q, want %q", i, j, b, c.req.body)
			}
		}
	}
}
