package strict

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/backendtest"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
)

var ctx = context.Background()

// virtualFactory makes backends whose script reads the suite's virtual clock (the
// test-only entry point) instead of Redis TIME.
func virtualFactory(t *testing.T, clk *clock.Virtual) backend.Backend {
	return New(newClient(t, shared.URL()), withNow(clk.Nanotime), WithTimeout(5*time.Second), WithPrefix(prefix(t)))
}

func TestConformance(t *testing.T) { backendtest.Run(t, virtualFactory) }

func TestAllower(t *testing.T) { backendtest.RunAllower(t, virtualFactory) }

func TestKeyName(t *testing.T) {
	b := New(newClient(t, shared.URL()))
	defer b.Close()
	for _, c := range []struct{ key, want string }{
		{"api", "sluice:v1:{api}"},
		{"", `sluice:v1:{\0}`},
		{"a}b", `sluice:v1:{a\]b}`},
		{`a\]b`, `sluice:v1:{a\\]b}`},
		{"{x}", `sluice:v1:{{x\]}`},
	} {
		if got := b.KeyName(c.key); got != c.want {
			t.Errorf("KeyName(%q) = %q, want %q", c.key, got, c.want)
		}
	}
}

// TestRealTimeAndTTL: with Redis TIME, a grant's ticket is in Redis' time base (Unix
// nanoseconds), the key carries a TTL that ends when it is idle, but not before a second
// (the script's MINTTL), and it vanishes then.
func TestRealTimeAndTTL(t *testing.T) {
	c := newClient(t, shared.URL())
	b := New(c, WithPrefix(prefix(t)), WithTimeout(5*time.Second))
	defer b.Close()
	ls := []gcra.Limit{{T: int64(50 * time.Millisecond), Tau: int64(100 * time.Millisecond)}}
	before := time.Now().UnixNano()
	g, err := b.Decide(ctx, "k", backend.Request{Limits: ls, N: 2})
	if err != nil || !g.Allowed {
		t.Fatalf("%+v %v", g, err)
	}
	after := time.Now().UnixNano()
	if g.Ticket.At < before-int64(time.Second) || g.Ticket.At > after+int64(time.Second) {
		t.Errorf("ticket at %d, not Redis' Unix time around %d", g.Ticket.At, before)
	}
	name := b.KeyName("k")
	ttl, err := c.PTTL(ctx, name).Result()
	if err != nil || ttl <= 500*time.Millisecond || ttl > time.Second {
		t.Fatalf("PTTL = %v %v, want within (500ms, 1s]: idle within 100ms, kept a second", ttl, err)
	}
	slow := []gcra.Limit{{T: int64(1500 * time.Millisecond), Tau: int64(3 * time.Second)}}
	if g, err := b.Decide(ctx, "slow", backend.Request{Limits: slow, N: 2}); err != nil || !g.Allowed {
		t.Fatalf("%+v %v", g, err)
	}
	if ttl, err := c.PTTL(ctx, b.KeyName("slow")).Result(); err != nil || ttl <= 2*time.Second || ttl > 3001*time.Millisecond {
		t.Fatalf("PTTL = %v %v, want within (2s, 3.001s]: idle in 3s", ttl, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.Exists(ctx, name).Val() == 1 {
		if time.Now().After(deadline) {
			t.Fatal("the idle key did not expire")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if g, _ := b.Decide(ctx, "k", backend.Request{Limits: ls, N: 2}); !g.Allowed {
		t.Fatal("an expired key was not fresh")
	}
}

// TestNoScript: after SCRIPT FLUSH (as after a restart) calls reload the script by
// themselves, and each is decided once.
func TestNoScript(t *testing.T) {
	b := New(newClient(t, shared.URL()), WithPrefix(prefix(t)), WithTimeout(5*time.Second))
	defer b.Close()
	ls := []gcra.Limit{{T: int64(time.Second), Tau: int64(3 * time.Second)}}
	for i := 0; i < 5; i++ {
		if _, err := shared.Do("SCRIPT", "FLUSH"); err != nil {
			t.Fatal(err)
		}
		g, err := b.Decide(ctx, "k", backend.Request{Limits: ls, N: 1})
		if err != nil {
			t.Fatalf("call %d after SCRIPT FLUSH: %v", i, err)
		}
		if want := i < 3; g.Allowed != want {
			t.Fatalf("call %d: allowed %v, want %v (each call charged once)", i, g.Allowed, want)
		}
	}
}

// TestWrongFormat: a key holding state of another format is refused with a ReplyError,
// not misread, and does not open the breaker.
func TestWrongFormat(t *testing.T) {
	c := newClient(t, shared.URL())
	b := New(c, WithPrefix(prefix(t)), WithTimeout(5*time.Second))
	defer b.Close()
	c.Set(ctx, b.KeyName("k"), "2 0 0 5 0", 0)
	_, err := b.Decide(ctx, "k", backend.Request{Limits: []gcra.Limit{{T: 1, Tau: 1}}, N: 1})
	var re *ReplyError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "format 2") {
		t.Fatalf("got %v, want a ReplyError naming format 2", err)
	}
	if errors.Is(err, ErrUnavailable) || b.Stats().Down {
		t.Fatal("a script error was taken for Redis being down")
	}
}

func TestRequestErrors(t *testing.T) {
	b := New(newClient(t, shared.URL()), WithPrefix(prefix(t)))
	defer b.Close()
	ls := []gcra.Limit{{T: 10, Tau: 30}}
	if _, err := b.Decide(ctx, "k", backend.Request{Limits: ls, N: 4}); !errors.Is(err, gcra.ErrCostExceedsBurst) {
		t.Errorf("cost over the burst: %v", err)
	}
	if _, err := b.Decide(ctx, "k", backend.Request{Limits: ls, N: -1}); !errors.Is(err, gcra.ErrInvalidCost) {
		t.Errorf("negative cost: %v", err)
	}
	if _, err := b.Decide(ctx, "k", backend.Request{Limits: nil, N: 1}); !errors.Is(err, gcra.ErrInvalidLimits) {
		t.Errorf("no limits: %v", err)
	}
}

// TestAllowExpiry: in real time, an allowance's key (the lone call's and the lean batch's,
// which give Redis the expiry as a time) expires at its TAT, or a second after the
// script's now if that is later; never sooner.
func TestAllowExpiry(t *testing.T) {
	c := newClient(t, shared.URL())
	b := New(c, WithPrefix(prefix(t)), WithTimeout(5*time.Second))
	defer b.Close()
	fast := gcra.Limit{T: 1000, Tau: 1_000_000}                                        // TAT within a µs: a second's TTL
	slow := gcra.Limit{T: int64(1500 * time.Millisecond), Tau: int64(6 * time.Second)} // 1.5 s a permit
	var bb batchBuilder
	run := func(l gcra.Limit, keys ...string) {
		t.Helper()
		calls := make([]*call, len(keys))
		for i, k := range keys {
			calls[i] = b.allowCall(k, l)
			calls[i].state.Store(callSent)
		}
		bb.exec(b.p, calls)
		for i, cl := range calls {
			if ok, valid := decodeAllow(cl.res); cl.err != nil || !valid || !ok {
				t.Fatalf("allowance on %s: %v %v %v", keys[i], ok, valid, cl.err)
			}
		}
	}
	ttl := func(key string, lo, hi time.Duration) {
		t.Helper()
		d, err := c.PTTL(ctx, b.KeyName(key)).Result()
		if err != nil || d <= lo || d > hi {
			t.Errorf("PTTL of %s = %v %v, want within (%v, %v]", key, d, err, lo, hi)
		}
	}
	run(fast, "lone")
	run(fast, "f1", "f2", "f3")
	run(slow, "s1")       // lone: TAT now + 1.5 s
	run(slow, "s2", "s3") // lean batch: TATs now + 1.5 s
	run(slow, "s3", "s4") // s3 now + 3 s, s4 + 1.5 s
	run(slow, "s3", "s5") // s3 now + 4.5 s
	for _, k := range []string{"lone", "f1", "f2", "f3"} {
		ttl(k, 500*time.Millisecond, 1001*time.Millisecond) // the expiry a time rounded up to the ms
	}
	for _, k := range []string{"s1", "s2", "s4", "s5"} {
		ttl(k, 1100*time.Millisecond, 1501*time.Millisecond)
	}
	ttl("s3", 4100*time.Millisecond, 4501*time.Millisecond)
}
