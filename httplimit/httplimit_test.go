package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/ratehdr"
)

func TestKeyFuncs(t *testing.T) {
	r := httptest.NewRequest("GET", "http://api.example/x", nil)
	r.RemoteAddr = "[::1]:5555"
	r.Header.Set("Authorization", "Bearer abc")
	if httplimit.KeyByHost(r) != "api.example" || httplimit.KeyByToken(r) != "abc" || httplimit.KeyByRemoteAddr(r) != "::1" {
		t.Errorf("keys: %q %q %q", httplimit.KeyByHost(r), httplimit.KeyByToken(r), httplimit.KeyByRemoteAddr(r))
	}
	r.RemoteAddr = "10.1.2.3:80"
	if httplimit.KeyByRemoteAddr(r) != "10.1.2.3" {
		t.Errorf("ipv4: %q", httplimit.KeyByRemoteAddr(r))
	}
}

func TestRetryAfterForms(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		h    map[string]string
		want time.Duration
		ok   bool
	}{
		{map[string]string{"Retry-After": "3"}, 3 * time.Second, true},
		{map[string]string{"Retry-After": now.Add(90 * time.Second).Format(http.TimeFormat)}, 90 * time.Second, true},
		{map[string]string{"Retry-After": now.Add(-time.Hour).Format(http.TimeFormat)}, 0, true},
		{map[string]string{"Retry-After": "3", "Retry-After-Ms": "250"}, 250 * time.Millisecond, true},
		{map[string]string{"Retry-After": "soon"}, 0, false},
		{map[string]string{"Retry-After": "-1"}, 0, false},
		{map[string]string{}, 0, false},
	}
	for i, c := range cases {
		h := http.Header{}
		for k, v := range c.h {
			h.Set(k, v)
		}
		d, ok := httplimit.RetryAfter(h, now)
		if d != c.want || ok != c.ok {
			t.Errorf("case %d %v: got %v %v, want %v %v", i, c.h, d, ok, c.want, c.ok)
		}
	}
	h := http.Header{}
	h.Set("RateLimit", `"x";r=7;t=3`)
	if n, ok := httplimit.Remaining(h); n != 7 || !ok {
		t.Errorf("Remaining from RateLimit: %d %v", n, ok)
	}
	h = http.Header{}
	h.Set("X-RateLimit-Remaining", "4")
	if n, ok := httplimit.Remaining(h); n != 4 || !ok {
		t.Errorf("Remaining from X-RateLimit-Remaining: %d %v", n, ok)
	}
}

// TestSetRateLimitHeaders: the fields written under a limiter's limits, and read back.
func TestSetRateLimitHeaders(t *testing.T) {
	h := http.Header{}
	httplimit.SetRateLimitHeaders(h, sluice.MustParse("10/s burst=20; 4500/h"), sluice.Decision{Remaining: 0, RetryAfter: 1500 * time.Millisecond, ResetAfter: 2 * time.Second})
	for k, want := range map[string]string{
		httplimit.HeaderRateLimitPolicy: `"10/s burst=20";q=10;w=1;burst=20, "4500/h";q=4500;w=3600;burst=4500`,
		httplimit.HeaderRateLimit:       `"10/s burst=20";r=0;t=2`,
		httplimit.HeaderRemaining:       "0",
		httplimit.HeaderRetryAfter:      "2",
		httplimit.HeaderRetryAfterMs:    "1500",
	} {
		if got := h.Get(k); got != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
	f := ratehdr.Read(http.StatusTooManyRequests, h, time.Now())
	if !f.Throttled() || f.RetryAfter != 1500*time.Millisecond || len(f.Quotas) != 2 || f.Quotas[0].Burst != 20 {
		t.Errorf("read back: %+v", f)
	}
	h = http.Header{}
	httplimit.SetRateLimitHeaders(h, sluice.MustParse("1/6s"), sluice.Decision{Allowed: true, Remaining: 1})
	if h.Get(httplimit.HeaderRetryAfter) != "" || h.Get(httplimit.HeaderRemaining) != "1" {
		t.Errorf("an allowance: %v", h)
	}
}
