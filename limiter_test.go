package sluice

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
)

// TestZeroLimiter: a zero Limiter answers every call with backend.ErrClosed (false for
// Allow), never a panic.
func TestZeroLimiter(t *testing.T) {
	var l Limiter
	if l.Allow(bg, "k") {
		t.Error("Allow granted")
	}
	if _, err := l.AllowN(bg, "k", 1); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("AllowN: %v", err)
	}
	if _, err := l.Reserve(bg, "k", 1); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Reserve: %v", err)
	}
	if err := l.Wait(bg, "k"); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Wait: %v", err)
	}
	if err := l.Do(bg, "k", func(context.Context) error { return nil }); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Do: %v", err)
	}
	if err := l.Penalize(bg, "k", time.Now().Add(time.Second)); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Penalize: %v", err)
	}
	if err := l.Reset(bg, "k"); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Reset: %v", err)
	}
	if err := l.SetLimits(MustParse("1/s")); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("SetLimits: %v", err)
	}
	if l.Limits() != nil || l.Close() != nil {
		t.Errorf("Limits %v", l.Limits())
	}
	w := httptest.NewRecorder()
	l.Middleware(nil)(http.NotFoundHandler()).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if w.Code != http.StatusServiceUnavailable {
		t.Errorf("Middleware: %d", w.Code)
	}
}

// TestSetLimits: new limits apply from the next decision, each key keeping its state
// (GCRA keeps when a key is next due, not a count of tokens): the permit a key was due
// under the old limits comes on time, neither sooner nor later, and the new limits space
// the ones after it.
func TestSetLimits(t *testing.T) {
	l, clk := newVirtual(t, "1/s burst=1")
	ms := time.Millisecond
	steps := []struct {
		at      time.Duration
		set     string
		allowed bool
	}{
		{0, "", true},
		{100 * ms, "", false},
		{100 * ms, "10/s burst=1", false},
		{999 * ms, "", false}, // due at 1s, as under 1/s
		{1000 * ms, "", true},
		{1050 * ms, "", false},
		{1100 * ms, "", true}, // 10/s from then on
		{1100 * ms, "1/h burst=1", false},
		{1200 * ms, "", true}, // the permit it was due
		{time.Hour, "", false},
		{time.Hour + 1200*ms, "", true}, // 1/h from then on
	}
	for i, s := range steps {
		clk.Set(int64(s.at))
		if s.set != "" {
			if err := l.SetLimits(MustParse(s.set)); err != nil {
				t.Fatal(err)
			}
		}
		if got := l.Allow(bg, "k"); got != s.allowed {
			t.Errorf("step %d at %v: got %v, want %v", i, s.at, got, s.allowed)
		}
	}
	if l.Limits().String() != "1/h" {
		t.Errorf("Limits: %v", l.Limits())
	}
	if err := l.SetLimits(Limits{{Rate: 0, Period: time.Second}}); !errors.Is(err, ErrBadLimit) || l.Limits().String() != "1/h" {
		t.Errorf("bad limits: %v, and the limits are now %v", err, l.Limits())
	}
}

// TestSetLimitsUnderLoad changes the limits, from one to two of them and back, while
// goroutines decide, reserve, wait and settle (the race detector judges).
func TestSetLimitsUnderLoad(t *testing.T) {
	l := MustNew(MustParse("1000/s"))
	defer l.Close()
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				switch g {
				case 0:
					l.Allow(ctx, "k")
				case 1:
					if r, err := l.Reserve(ctx, "k", 2); err == nil {
						r.Settle(ctx, 1)
					}
				default:
					l.Wait(ctx, "k")
				}
			}
		}()
	}
	for i := 0; ctx.Err() == nil; i++ {
		next := "2000/s"
		if i%2 == 1 {
			next = "500/s; 20000/m"
		}
		if err := l.SetLimits(MustParse(next)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
}

// TestMarginWarning: a margin that costs a limit much of its rate is logged, with the
// burst that would keep the rate; a margin the burst absorbs is not.
func TestMarginWarning(t *testing.T) {
	for i, c := range []struct {
		limit  string
		margin time.Duration
		warn   string
	}{
		{"100/s burst=1", time.Second, "rate_kept=1.0% burst_keeping_the_rate=101"},
		{"100/s burst=1", time.Millisecond, ""},
		{"100/s burst=20", 50 * time.Millisecond, ""},
		{"1/6s", 100 * time.Millisecond, ""},
	} {
		var buf bytes.Buffer
		l, err := New(MustParse(c.limit), WithMargin(c.margin), WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
		if got := buf.String(); (c.warn == "") != (got == "") || !strings.Contains(got, c.warn) {
			t.Errorf("case %d %s with margin %v: logged %q, want %q", i, c.limit, c.margin, got, c.warn)
		}
	}
}

// TestFailClosedSaysWhenToRetry: a denial for a backend failure carries a RetryAfter, so
// callers that read only the decision do not retry at once.
func TestFailClosedSaysWhenToRetry(t *testing.T) {
	l, _ := newVirtual(t, "1/h", WithMaxKeys(1))
	l.Allow(bg, "a")
	d, err := l.AllowN(bg, "b", 1)
	if d.Allowed || !errors.Is(err, backend.ErrUnavailable) || d.RetryAfter != unavailableRetry {
		t.Errorf("got %+v %v, want a denial with RetryAfter %v", d, err, unavailableRetry)
	}
}
