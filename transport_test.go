package sluice_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/referee"
)

var bg = context.Background()

// arrivals wraps a handler and records the virtual time of every request it sees.
type arrivals struct {
	clk  *clock.Virtual
	next http.Handler
	mu   sync.Mutex
	at   []int64
}

func (a *arrivals) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.at = append(a.at, a.clk.Nanotime())
	a.mu.Unlock()
	a.next.ServeHTTP(w, r)
}

// drive plays virtual time for a pool of workers: whenever every live worker sleeps on the
// clock, it moves time to the next timer. Time never moves while a worker is between its
// wake-up and its next sleep, so the referee judges each request at the exact time it was
// decided. Workers decrement live as they finish; drive returns when none is left.
func drive(clk *clock.Virtual, live *atomic.Int64) {
	for live.Load() > 0 {
		if n := live.Load(); n > 0 && int64(clk.Pending()) >= n {
			if at, ok := clk.Next(); ok {
				clk.Set(at)
				continue
			}
		}
		time.Sleep(100 * time.Microsecond) // wait for the condition: every worker asleep
	}
}

// TestTransportPoolObeysTheReferee: 8 workers share one limiter through the transport;
// the referee enforces the same limit strictly and sees no violation, and the workers use
// the whole limit.
func TestTransportPoolObeysTheReferee(t *testing.T) {
	clk := clock.NewVirtual()
	limits := sluice.MustParse("10/s burst=3")
	ref, _ := referee.New(limits, referee.WithClock(clk))
	srv := httptest.NewServer(ref)
	defer srv.Close()
	l := sluice.MustNew(limits, sluice.WithClock(clk))
	defer l.Close()
	client := &http.Client{Transport: l.Transport(nil)}

	const workers = 8
	const perWorker = 15
	var live atomic.Int64
	live.Store(workers)
	for w := 0; w < workers; w++ {
		go func() {
			defer live.Add(-1)
			for i := 0; i < perWorker; i++ {
				req, _ := http.NewRequest("GET", srv.URL+"/v1/items", nil)
				req.Header.Set("Authorization", "Bearer shared")
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	drive(clk, &live)
	st := ref.Stats()
	if st.Rejected != 0 {
		t.Errorf("the referee rejected %d requests", st.Rejected)
	}
	if st.Accepted != workers*perWorker {
		t.Errorf("accepted %d, want %d", st.Accepted, workers*perWorker)
	}
	// 120 requests at 10/s with a burst of 3: the last is due at (120-3) * 100ms.
	if got, want := time.Duration(st.LastNs), 11700*time.Millisecond; got != want {
		t.Errorf("last request at %v, want %v (no capacity lost)", got, want)
	}
}

// TestTransport429HoldsThePoolBack: the limiter believes 10/s, but the API allows 1/s (the
// token is shared with someone else). The first 429 carries Retry-After; every worker of
// the pool then holds back until it has passed.
func TestTransport429HoldsThePoolBack(t *testing.T) {
	clk := clock.NewVirtual()
	ref, _ := referee.New(sluice.MustParse("1/s burst=1"), referee.WithClock(clk))
	rec := &arrivals{clk: clk, next: ref}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	l := sluice.MustNew(sluice.MustParse("10/s burst=1"), sluice.WithClock(clk))
	defer l.Close()
	client := &http.Client{Transport: &sluice.Transport{Limiter: l, Key: httplimit.KeyByToken}}

	const workers = 4
	var live atomic.Int64
	live.Store(workers)
	var got429 atomic.Int64
	for w := 0; w < workers; w++ {
		go func() {
			defer live.Add(-1)
			for i := 0; i < 3; i++ {
				req, _ := http.NewRequest("GET", srv.URL, nil)
				req.Header.Set("X-Api-Token", "shared")
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				if resp.StatusCode == 429 {
					got429.Add(1)
				}
			}
		}()
	}
	drive(clk, &live)

	rec.mu.Lock()
	at := append([]int64(nil), rec.at...)
	rec.mu.Unlock()
	// t=0 accepted; t=100ms rejected with Retry-After 900ms; nothing may arrive before 1s.
	if len(at) < 3 || at[0] != 0 || at[1] != int64(100*time.Millisecond) {
		t.Fatalf("arrivals %v", at)
	}
	if at[2] < int64(time.Second) {
		t.Errorf("a request arrived at %v, inside the Retry-After window that ends at 1s", time.Duration(at[2]))
	}
	if got429.Load() == 0 {
		t.Errorf("no 429 reached the callers: a RoundTripper must return the response")
	}
}

type closeRecorder struct {
	io.Reader
	closed atomic.Bool
}

func (c *closeRecorder) Close() error { c.closed.Store(true); return nil }

// TestTransportFollowsNetHTTPRules: the request is never modified, an unsent body is
// closed, and a 429 comes back with err == nil.
func TestTransportFollowsNetHTTPRules(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer srv.Close()
	clk := clock.NewVirtual()
	l := sluice.MustNew(sluice.MustParse("1/h burst=1"), sluice.WithClock(clk))
	defer l.Close()
	tr := &sluice.Transport{Limiter: l, Pessimistic: true}

	body := &closeRecorder{Reader: strings.NewReader("payload")}
	req, _ := http.NewRequest("POST", srv.URL+"/a?b=c", body)
	req.Header.Set("X-Trace", "1")
	before := req.Clone(bg)
	resp, err := tr.RoundTrip(req)
	if err != nil || resp.StatusCode != 429 {
		t.Fatalf("got %v %v, want a 429 response and no error", resp, err)
	}
	resp.Body.Close()
	if req.URL.String() != before.URL.String() || req.Method != before.Method || len(req.Header) != len(before.Header) ||
		req.Header.Get("X-Trace") != "1" {
		t.Errorf("the request was modified: %v %v", req.URL, req.Header)
	}

	body2 := &closeRecorder{Reader: strings.NewReader("payload")}
	req2, _ := http.NewRequest("POST", srv.URL, body2)
	if _, err := tr.RoundTrip(req2); !errors.Is(err, sluice.ErrThrottled) {
		t.Fatalf("second request: %v, want ErrThrottled", err)
	}
	if !body2.closed.Load() {
		t.Errorf("the body of an unsent request was not closed")
	}

	// A waiting request whose context ends is not sent, and its body is closed.
	tr.Pessimistic = false
	ctx, cancel := context.WithTimeout(bg, 10*time.Millisecond)
	defer cancel()
	body3 := &closeRecorder{Reader: strings.NewReader("x")}
	req3, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, body3)
	if _, err := tr.RoundTrip(req3); !errors.Is(err, sluice.ErrThrottled) {
		t.Fatalf("a permit an hour away with a 10ms deadline: %v", err)
	}
	if !body3.closed.Load() {
		t.Errorf("the body of a request refused on its deadline was not closed")
	}
}

func TestMiddleware(t *testing.T) {
	clk := clock.NewVirtual()
	l := sluice.MustNew(sluice.MustParse("2/s"), sluice.WithClock(clk))
	defer l.Close()
	var served atomic.Int64
	h := l.Middleware(httplimit.KeyByHeader("X-Client"))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		w.Write([]byte("ok"))
	}))
	call := func(client string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/", nil)
		if client != "" {
			req.Header.Set("X-Client", client)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	steps := []struct {
		client, retry, remaining string
		code                     int
	}{
		{"a", "", "1", 200},
		{"a", "", "0", 200},
		{"a", "1", "0", 429},
		{"b", "", "1", 200},
		{"", "", "", 200}, // no key: not throttled
	}
	for i, s := range steps {
		w := call(s.client)
		if w.Code != s.code || w.Header().Get("Retry-After") != s.retry || w.Header().Get("RateLimit-Remaining") != s.remaining {
			t.Errorf("step %d: got %d retry=%q remaining=%q, want %d %q %q", i, w.Code,
				w.Header().Get("Retry-After"), w.Header().Get("RateLimit-Remaining"), s.code, s.retry, s.remaining)
		}
	}
	if served.Load() != 4 {
		t.Errorf("served %d, want 4", served.Load())
	}
	clk.Advance(500 * time.Millisecond)
	if w := call("a"); w.Code != 200 {
		t.Errorf("after 500ms: %d", w.Code)
	}
}
