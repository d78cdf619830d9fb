package ratehdr

import (
	"net/http"
	"reflect"
	"testing"
	"time"
)

var now = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func q(name string, limit, remaining int64, reset, window time.Duration) Quota {
	return Quota{Name: name, Limit: limit, Remaining: remaining, Reset: reset, Window: window, Burst: -1}
}

func withBurst(q Quota, b int64) Quota { q.Burst = b; return q }

func TestRead(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		h      http.Header
		want   Facts
	}{
		{"nothing", 200, hdr(), Facts{Status: 200}},
		{"retry-after seconds", 429, hdr("Retry-After", "7"),
			Facts{Status: 429, RetryAfter: 7 * time.Second, HasRetryAfter: true, RetryAfterInSeconds: true}},
		{"retry-after date", 429, hdr("Retry-After", now.Add(90*time.Second).Format(http.TimeFormat)),
			Facts{Status: 429, RetryAfter: 90 * time.Second, HasRetryAfter: true, RetryAfterInSeconds: true}},
		{"retry-after-ms first", 429, hdr("Retry-After", "2", "Retry-After-Ms", "1500"),
			Facts{Status: 429, RetryAfter: 1500 * time.Millisecond, HasRetryAfter: true}},
		{"retry-after malformed", 429, hdr("Retry-After", "soon"), Facts{Status: 429}},
		{"ietf structured, as sluice writes it", 200,
			hdr("RateLimit-Policy", `"100/s burst=20";q=100;w=1;burst=20`, "RateLimit", `"100/s burst=20";r=17;t=1`, "RateLimit-Remaining", "17"),
			Facts{Status: 200, Quotas: []Quota{withBurst(q("100/s burst=20", 100, 17, time.Second, time.Second), 20)}}},
		{"ietf two policies", 200,
			hdr("RateLimit-Policy", `"hour";q=4500;w=3600, "burst";q=10;w=1`, "RateLimit", `"hour";r=4000;t=600`),
			Facts{Status: 200, Quotas: []Quota{q("hour", 4500, 4000, 600*time.Second, time.Hour), q("burst", 10, -1, -1, time.Second)}}},
		{"ietf dictionary (older draft)", 200, hdr("RateLimit", "limit=100, remaining=50, reset=30"),
			Facts{Status: 200, Quotas: []Quota{q("", 100, 50, 30*time.Second, 0)}}},
		{"heroku", 200, hdr("RateLimit-Remaining", "4321"),
			Facts{Status: 200, Quotas: []Quota{q("", -1, 4321, -1, 0)}}},
		{"ratelimit trio", 200, hdr("RateLimit-Limit", "60", "RateLimit-Remaining", "59", "RateLimit-Reset", "12"),
			Facts{Status: 200, Quotas: []Quota{q("", 60, 59, 12*time.Second, 0)}}},
		{"github: reset is a unix time", 200,
			hdr("X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "4999", "X-RateLimit-Reset", "1795608000"),
			Facts{Status: 200, Quotas: []Quota{q("", 5000, 4999, time.Unix(1795608000, 0).Sub(now), 0)}}},
		{"x-ratelimit reset in seconds", 200, hdr("X-RateLimit-Remaining", "3", "X-RateLimit-Reset", "20"),
			Facts{Status: 200, Quotas: []Quota{q("", -1, 3, 20*time.Second, 0)}}},
		{"openai", 200, hdr(
			"x-ratelimit-limit-requests", "60", "x-ratelimit-remaining-requests", "59", "x-ratelimit-reset-requests", "1s",
			"x-ratelimit-limit-tokens", "150000", "x-ratelimit-remaining-tokens", "149984", "x-ratelimit-reset-tokens", "6m0s"),
			Facts{Status: 200, Quotas: []Quota{q("requests", 60, 59, time.Second, 0), q("tokens", 150000, 149984, 6*time.Minute, 0)}}},
		{"openai reset in milliseconds", 429, hdr("x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "12ms"),
			Facts{Status: 429, Quotas: []Quota{q("tokens", -1, 0, 12*time.Millisecond, 0)}}},
		{"anthropic", 200, hdr(
			"anthropic-ratelimit-requests-limit", "50", "anthropic-ratelimit-requests-remaining", "49",
			"anthropic-ratelimit-requests-reset", now.Add(1200*time.Millisecond).Format(time.RFC3339Nano),
			"anthropic-ratelimit-input-tokens-limit", "40000", "anthropic-ratelimit-input-tokens-remaining", "39000",
			"anthropic-ratelimit-input-tokens-reset", now.Add(time.Minute).Format(time.RFC3339)),
			Facts{Status: 200, Quotas: []Quota{q("requests", 50, 49, 1200*time.Millisecond, 0), q("input-tokens", 40000, 39000, time.Minute, 0)}}},
		{"malformed counts are left out", 200, hdr("RateLimit-Limit", "-5", "RateLimit-Remaining", "x", "RateLimit-Reset", "NaN"),
			Facts{Status: 200}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Read(tc.status, tc.h, now)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Read:\n got  %+v\n want %+v", got, tc.want)
			}
		})
	}
}

func TestThrottled(t *testing.T) {
	for _, tc := range []struct {
		f    Facts
		want bool
	}{
		{Facts{Status: 429}, true},
		{Facts{Status: 503, HasRetryAfter: true}, true},
		{Facts{Status: 503}, false},
		{Facts{Status: 200, HasRetryAfter: true}, false},
	} {
		if got := tc.f.Throttled(); got != tc.want {
			t.Errorf("%+v: %v", tc.f, got)
		}
	}
}

func TestRemaining(t *testing.T) {
	for _, tc := range []struct {
		h    http.Header
		want int64
		ok   bool
	}{
		{hdr("RateLimit", `"default";r=3;t=1`, "RateLimit-Remaining", "9"), 3, true},
		{hdr("RateLimit-Remaining", "9"), 9, true},
		{hdr("X-RateLimit-Remaining", "8"), 8, true},
		{hdr("x-ratelimit-remaining-tokens", "100", "x-ratelimit-remaining-requests", "4"), 4, true},
		{hdr("x-ratelimit-remaining-tokens", "100"), 0, false},
		{hdr(), 0, false},
	} {
		if n, ok := Remaining(tc.h); n != tc.want || ok != tc.ok {
			t.Errorf("%v: %d %v, want %d %v", tc.h, n, ok, tc.want, tc.ok)
		}
	}
}

// FuzzRead: no header value makes Read panic or report a count or a wait out of bounds.
func FuzzRead(f *testing.F) {
	f.Add("RateLimit", `"a";r=1;t=2`, "RateLimit-Policy", `"a";q=3;w=4`)
	f.Add("RateLimit", "limit=1, remaining=2, reset=3", "Retry-After", "5")
	f.Add("X-RateLimit-Reset", "1795608000", "X-RateLimit-Remaining", "1")
	f.Add("x-ratelimit-reset-tokens", "6m0s", "x-ratelimit-remaining-tokens", "1")
	f.Add("anthropic-ratelimit-tokens-reset", "2026-11-25T12:00:01Z", "anthropic-ratelimit-tokens-limit", "9")
	f.Add("Retry-After-Ms", "1e300", "RateLimit", `"\"";r=`)
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		fs := Read(429, hdr(k1, v1, k2, v2), now)
		if fs.RetryAfter < 0 || fs.RetryAfter > maxWait {
			t.Fatalf("retry after %v", fs.RetryAfter)
		}
		for _, q := range fs.Quotas {
			if q.Limit < -1 || q.Limit > maxCount || q.Remaining < -1 || q.Remaining > maxCount ||
				q.Reset < -1 || q.Reset > maxWait || q.Window < 0 || q.Window > maxWait {
				t.Fatalf("quota out of bounds: %+v", q)
			}
		}
	})
}
