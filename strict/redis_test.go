package strict

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

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

// TestRampBookings: the script spaces bookings on a ramp where they fall, as the core.
func TestRampBookings(t *testing.T) { backendtest.RunRamps(t, virtualFactory) }

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
// nanoseconds), the key carries a TTL that ends after it is idle, but not before a second
// (the script's MINTTL; a decision under one limit is marked: see TestAllowExpiry), and
// it vanishes then.
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
	markedExpiry(t, c, name) // idle within 100 ms, kept until the second after the next
	ttl, err := c.PTTL(ctx, name).Result()
	if err != nil || ttl <= 500*time.Millisecond || ttl > 2100*time.Millisecond {
		t.Fatalf("PTTL = %v %v, want within (500ms, 2.1s]: idle within 100ms, kept into the second after the next", ttl, err)
	}
	slow := []gcra.Limit{{T: int64(1500 * time.Millisecond), Tau: int64(3 * time.Second)}}
	if g, err := b.Decide(ctx, "slow", backend.Request{Limits: slow, N: 2}); err != nil || !g.Allowed {
		t.Fatalf("%+v %v", g, err)
	}
	markedExpiry(t, c, b.KeyName("slow"))
	if ttl, err := c.PTTL(ctx, b.KeyName("slow")).Result(); err != nil || ttl <= 3500*time.Millisecond || ttl > 5*time.Second {
		t.Fatalf("PTTL = %v %v, want within (3.5s, 5s]: idle in 3s, expiring in the second after the next", ttl, err)
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
	if errors.Is(err, backend.ErrUnavailable) || b.Stats().Down {
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

// TestAllowExpiry: in real time, a key in the common state written by an allowance (the
// lone call's path and the lean batch's) or a decision under one limit (alone or in a
// lean batch) carries the expiry mark ("1 0 00 ...") and expires exactly at the start of
// the second two seconds after its TAT's second: between one and two seconds after its
// TAT, never sooner.
func TestAllowExpiry(t *testing.T) {
	c := newClient(t, shared.URL())
	b := New(c, WithPrefix(prefix(t)), WithTimeout(5*time.Second))
	defer b.Close()
	fast := gcra.Limit{T: 1000, Tau: 1_000_000}                                        // TAT within a µs of now
	slow := gcra.Limit{T: int64(1500 * time.Millisecond), Tau: int64(6 * time.Second)} // 1.5 s a permit
	run := func(l gcra.Limit, keys ...string) {
		t.Helper()
		runAllowances(t, b, l, keys...)
	}
	run(fast, "lone")
	run(fast, "f1", "f2", "f3")
	run(slow, "s1")       // lone: TAT now + 1.5 s
	run(slow, "s2", "s3") // lean batch: TATs now + 1.5 s
	run(slow, "s3", "s4") // s3 now + 3 s, s4 + 1.5 s
	run(slow, "s3", "s5") // s3 now + 4.5 s
	if g, err := b.Decide(ctx, "d", backend.Request{Limits: []gcra.Limit{slow}, N: 2}); err != nil || !g.Allowed {
		t.Fatalf("decision: %+v %v", g, err) // the shortcut of a decision under one limit: TAT now + 3 s
	}
	runDecisions(t, b, backend.Request{Limits: []gcra.Limit{slow}, N: 2}, "d1", "d2") // the lean batch of decisions
	runDecisions(t, b, backend.Request{Limits: []gcra.Limit{fast}, N: 1}, "d3", "d4", "d5")
	now := time.Now()
	for _, k := range []string{"lone", "f1", "f2", "f3", "s1", "s2", "s3", "s4", "s5", "d", "d1", "d2", "d3", "d4", "d5"} {
		tat := markedExpiry(t, c, b.KeyName(k))
		if lo, hi := now, now.Add(5*time.Second); tat.Before(lo.Add(-time.Second)) || tat.After(hi) {
			t.Errorf("%s: TAT %v, not around now (%v)", k, tat, now)
		}
	}
}

// runAllowances decides one allowance on each of keys in one batch (one key: the lone
// call's path; several: the lean batch), and fails unless each is granted.
func runAllowances(t *testing.T, b *Backend, l gcra.Limit, keys ...string) {
	t.Helper()
	for i, ok := range allowances(t, b, l, keys...) {
		if !ok {
			t.Fatalf("allowance on %s: denied", keys[i])
		}
	}
}

// allowances decides one allowance on each of keys in one batch (one key: the lone
// call's path; several: the lean batch), and returns whether each was granted.
func allowances(t *testing.T, b *Backend, l gcra.Limit, keys ...string) []bool {
	t.Helper()
	var bb batchBuilder
	calls := make([]*call, len(keys))
	for i, k := range keys {
		calls[i] = b.allowCall(k, l)
		calls[i].state.Store(callSent)
	}
	bb.exec(b.p, calls)
	granted := make([]bool, len(keys))
	for i, cl := range calls {
		ok, valid := decodeAllow(cl.res)
		if cl.err != nil || !valid {
			t.Fatalf("allowance on %s: %v %v %v", keys[i], ok, valid, cl.err)
		}
		granted[i] = ok
	}
	return granted
}

// runDecisions decides req on each of keys in one batch (several keys: the lean batch of
// decisions), and fails unless each is granted.
func runDecisions(t *testing.T, b *Backend, req backend.Request, keys ...string) {
	t.Helper()
	var bb batchBuilder
	calls := make([]*call, len(keys))
	for i, k := range keys {
		calls[i] = b.decideCall(k, req)
		calls[i].state.Store(callSent)
	}
	bb.exec(b.p, calls)
	for i, cl := range calls {
		g, ok := decodeDecision(cl.res, cl.now, req.Limits, req.N)
		if cl.err != nil || !ok || !g.Allowed {
			t.Fatalf("decision on %s: %+v %v %v", keys[i], g, ok, cl.err)
		}
	}
}

// markedExpiry checks that the key name holds the common state with the expiry mark and
// expires at the start of the second two seconds after its TAT's second, and returns its
// TAT.
func markedExpiry(t *testing.T, c *goredis.Client, name string) time.Time {
	t.Helper()
	v, err := c.Get(ctx, name).Result()
	var sec, ns int64
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if n, _ := fmt.Sscanf(v, "1 0 00 %d %d", &sec, &ns); n != 2 || v != fmt.Sprintf("1 0 00 %d %d", sec, ns) {
		t.Fatalf("%s holds %q, want the common state with the expiry mark (1 0 00 s ns)", name, v)
	}
	at, err := c.PExpireTime(ctx, name).Result()
	if want := time.Duration(sec+2) * time.Second; err != nil || at != want {
		t.Errorf("%s (TAT %d.%09d s) expires at %v %v, want %v", name, sec, ns, at, err, want)
	}
	return time.Unix(sec, ns)
}

// TestExpiryMarkKept: a write whose TAT falls in the second of a marked key's TAT keeps
// the key's expiry (SET ... KEEPTTL, cheaper at Redis than setting it), which the mark
// guarantees is the right one; an unmarked key's expiry (an older script's, or anything
// else's) is never kept, but set.
func TestExpiryMarkKept(t *testing.T) {
	c := newClient(t, shared.URL())
	b := New(c, WithPrefix(prefix(t)), WithTimeout(5*time.Second))
	defer b.Close()
	fast := gcra.Limit{T: 1000, Tau: 1_000_000}
	for _, keys := range [][]string{{"lone"}, {"b1", "b2"}} {
		// Retried when a second ends between the two writes (their TATs in two seconds).
		for try := 0; ; try++ {
			runAllowances(t, b, fast, keys...)
			first := markedExpiry(t, c, b.KeyName(keys[0]))
			odd := time.Duration(first.Unix()+7) * time.Second // an expiry no rule gives
			for _, k := range keys {
				c.PExpireAt(ctx, b.KeyName(k), time.UnixMilli(odd.Milliseconds()))
			}
			runAllowances(t, b, fast, keys...)
			v := c.Get(ctx, b.KeyName(keys[0])).Val()
			var sec, ns int64
			fmt.Sscanf(v, "1 0 00 %d %d", &sec, &ns)
			if sec != first.Unix() {
				if try < 5 {
					continue
				}
				t.Fatalf("six seconds ended between two writes")
			}
			for _, k := range keys {
				if at := c.PExpireTime(ctx, b.KeyName(k)).Val(); at != odd {
					t.Errorf("%v: a write in the TAT's second set the expiry (%v), did not keep it (%v)", keys, at, odd)
				}
			}
			break
		}
	}
	// Unmarked keys in the common state, as an older script wrote them, idle, each with an
	// expiry short of the mark's rule (100 ms from now).
	for _, keys := range [][]string{{"old"}, {"o1", "o2"}} {
		for _, k := range keys {
			now := time.Now()
			c.Set(ctx, b.KeyName(k), fmt.Sprintf("1 0 0 %d %d", now.Unix()-1, now.Nanosecond()), 0)
			c.PExpireAt(ctx, b.KeyName(k), now.Add(100*time.Millisecond))
		}
		runAllowances(t, b, fast, keys...)
		for _, k := range keys {
			markedExpiry(t, c, b.KeyName(k))
		}
	}
}

// TestExpiryMarkRead: every path reads a marked key's TAT, including the general one
// (the one format-1 scripts before the mark read it by): a key whose TAT is ten seconds
// ahead denies an allowance under a 3 s tolerance on each.
func TestExpiryMarkRead(t *testing.T) {
	c := newClient(t, shared.URL())
	b := New(c, WithPrefix(prefix(t)), WithTimeout(5*time.Second))
	defer b.Close()
	l := gcra.Limit{T: int64(time.Second), Tau: int64(3 * time.Second)}
	mark := func(keys ...string) {
		for _, k := range keys {
			tat := time.Now().Add(10 * time.Second)
			c.Set(ctx, b.KeyName(k), fmt.Sprintf("1 0 00 %d %d", tat.Unix(), tat.Nanosecond()), time.Minute)
		}
	}
	mark("lone", "b1", "b2", "one", "two")
	for _, keys := range [][]string{{"lone"}, {"b1", "b2"}} {
		for i, ok := range allowances(t, b, l, keys...) {
			if ok {
				t.Errorf("allowance on %s, TAT 10 s ahead: granted", keys[i])
			}
		}
	}
	if g, err := b.Decide(ctx, "one", backend.Request{Limits: []gcra.Limit{l}, N: 1}); err != nil || g.Allowed {
		t.Errorf("decision under one limit, TAT 10 s ahead: %+v %v", g, err)
	}
	two := []gcra.Limit{l, {T: int64(time.Millisecond), Tau: int64(time.Second)}}
	if g, err := b.Decide(ctx, "two", backend.Request{Limits: two, N: 1}); err != nil || g.Allowed {
		t.Errorf("decision under two limits (the general path), TAT 10 s ahead: %+v %v", g, err)
	}
}

// premarkScript is the script of the releases before the expiry mark (format 1 too),
// kept to prove that the two share keys during a rolling upgrade.
//
//go:embed testdata/sluice-premark.lua
var premarkScript string

// TestExpiryMarkMixedReleases: the script of the releases before the expiry mark reads a
// marked key exactly on each of its paths (a TAT ten seconds ahead denies under a 3 s
// tolerance), and writes an idle marked key back unmarked, with an expiry of its own
// around its TAT; this release then sets that key's expiry by the mark's rule, never
// keeping the old one.
func TestExpiryMarkMixedReleases(t *testing.T) {
	c := newClient(t, shared.URL())
	b := New(c, WithPrefix(prefix(t)), WithTimeout(5*time.Second))
	defer b.Close()
	old := goredis.NewScript(premarkScript)
	mark := func(ahead time.Duration, keys ...string) []string {
		names := make([]string, len(keys))
		for i, k := range keys {
			tat := time.Now().Add(ahead)
			names[i] = b.KeyName(k)
			c.Set(ctx, names[i], fmt.Sprintf("1 0 00 %d %d", tat.Unix(), tat.Nanosecond()), 0)
			c.PExpireAt(ctx, names[i], time.Unix(tat.Unix()+2, 0))
		}
		return names
	}
	// Tau 3 s, T 1 s: the lone allowance, the lean batch, a decision under one limit (n 1,
	// no wait), and under two (the general path).
	allow := []any{"", "1", "a", 3, 0, 1, 0}
	paths := []struct {
		name string
		keys []string
		args []any
		want []any
	}{
		{"lone allowance", []string{"lone"}, allow, []any{int64(0)}},
		{"lean batch", []string{"b1", "b2"}, append(slices.Clone(allow), "="), []any{int64(0), int64(0)}},
		{"decision under one limit", []string{"one"}, []any{"", "1", "d", 1, 0, 0, 1, 3, 0, 1, 0}, nil},
		{"decision under two limits", []string{"two"}, []any{"", "1", "d", 1, 0, 0, 2, 3, 0, 1, 0, 1, 0, 0, 1000000}, nil},
	}
	for _, p := range paths {
		names := mark(10*time.Second, p.keys...)
		got, err := old.Run(ctx, c, names, p.args...).Result()
		if err != nil {
			t.Fatalf("%s: %v", p.name, err)
		}
		if p.want != nil {
			if !reflect.DeepEqual(got, p.want) && !(len(p.want) == 1 && got == p.want[0]) {
				t.Errorf("%s on a marked key 10 s ahead: the old script answered %v, want %v", p.name, got, p.want)
			}
		} else if arr, ok := got.([]any); !ok || len(arr) < 1 || arr[0] != int64(0) {
			t.Errorf("%s on a marked key 10 s ahead: the old script answered %v, want a denial", p.name, got)
		}
	}
	// Idle marked keys: the old script grants, writes them unmarked with an expiry of its
	// own, and this release's next grant marks them with the mark's expiry again.
	for _, keys := range [][]string{{"idle"}, {"i1", "i2"}} {
		names := mark(-time.Second, keys...)
		args := slices.Clone(allow)
		for range keys[1:] {
			args = append(args, "=")
		}
		if _, err := old.Run(ctx, c, names, args...).Result(); err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			v := c.Get(ctx, n).Val()
			var sec, ns int64
			if k, _ := fmt.Sscanf(v, "1 0 0 %d %d", &sec, &ns); k != 2 || strings.HasPrefix(v, "1 0 00") {
				t.Fatalf("the old script wrote %q, want the common state unmarked", v)
			}
			// Its general path gave Redis a TTL, up to a millisecond short of the TAT (see
			// TestGeneralPathExpiryNotBeforeTAT).
			if at := c.PExpireTime(ctx, n).Val(); at < time.Duration(sec)*time.Second+time.Duration(ns)-time.Millisecond {
				t.Errorf("the old script's expiry %v is before its TAT %d.%09d", at, sec, ns)
			}
		}
		runAllowances(t, b, gcra.Limit{T: int64(time.Second), Tau: int64(3 * time.Second)}, keys...)
		for _, n := range names {
			markedExpiry(t, c, n)
		}
	}
}

// TestGeneralPathExpiryNotBeforeTAT: in real time, a key written by the general path (a
// decision under two limits) expires no sooner than its latest TAT. It expired up to a
// millisecond sooner when the script gave Redis a TTL (PX), rounded up from the script's
// now: Redis adds a TTL to its own clock's millisecond, truncated.
func TestGeneralPathExpiryNotBeforeTAT(t *testing.T) {
	c := newClient(t, shared.URL())
	b := New(c, WithPrefix(prefix(t)), WithTimeout(5*time.Second))
	defer b.Close()
	two := []gcra.Limit{{T: int64(time.Second), Tau: int64(3 * time.Second)}, {T: int64(time.Second), Tau: int64(2 * time.Second)}}
	for i := 0; i < 5; i++ {
		k := fmt.Sprint("k", i)
		g, err := b.Decide(ctx, k, backend.Request{Limits: two, N: 1})
		if err != nil || !g.Allowed {
			t.Fatalf("%+v %v", g, err)
		}
		v := c.Get(ctx, b.KeyName(k)).Val()
		var hs, hn, s1, n1, s2, n2 int64
		if n, _ := fmt.Sscanf(v, "1 %d %d %d %d %d %d", &hs, &hn, &s1, &n1, &s2, &n2); n != 6 {
			t.Fatalf("%s holds %q, want a hold and two TATs", k, v)
		}
		latest := max(time.Duration(s1)*time.Second+time.Duration(n1), time.Duration(s2)*time.Second+time.Duration(n2))
		if at := c.PExpireTime(ctx, b.KeyName(k)).Val(); at < latest {
			t.Errorf("%s (latest TAT %v) expires at %v, %v before it", k, latest, at, latest-at)
		}
	}
}
