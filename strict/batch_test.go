package strict

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// testCall is a call on key with op, for the grouping tests.
func testCall(key string, op byte, vnow int64) *call {
	return &call{key: key, op: op, virtual: vnow != 0, vnow: vnow, done: make(chan struct{}, 1)}
}

// TestGrouping: a batch is split into script calls by what may share one (every key for
// one Redis, a key for other clients; and the virtual now of tests), each with its keys
// in order of first arrival and its calls ordered by key, each key's calls in arrival
// order.
func TestGrouping(t *testing.T) {
	batch := []*call{
		testCall("{a}", 'a', 0), testCall("{b}", 'd', 0), testCall("{a}", 'd', 0),
		testCall("x{foo}", 'a', 0), testCall("{b}", 'a', 0), testCall("y{foo}", 'a', 0),
		testCall("{a}", 'a', 7),
	}
	type want struct {
		keys  string
		calls []int
		other bool
	}
	for _, c := range []struct {
		how  grouping
		want []want
	}{
		{groupAll, []want{
			{"{a} {b} x{foo} y{foo}", []int{0, 2, 1, 4, 3, 5}, true},
			{"{a}", []int{6}, true},
		}},
		{groupEachKey, []want{
			{"{a}", []int{0, 2}, true},
			{"{b}", []int{1, 4}, true},
			{"x{foo}", []int{3}, false},
			{"y{foo}", []int{5}, false},
			{"{a}", []int{6}, true},
		}},
	} {
		var bb batchBuilder
		for round := 0; round < 2; round++ { // the buffers are reused
			bb.group(c.how, batch)
			if len(bb.groups) != len(c.want) {
				t.Fatalf("grouping %d: %d groups, want %d", c.how, len(bb.groups), len(c.want))
			}
			for i, w := range c.want {
				g := &bb.groups[i]
				var calls []int
				for _, gc := range g.calls {
					for j, bc := range batch {
						if gc == bc {
							calls = append(calls, j)
						}
					}
				}
				if got := strings.Join(g.keys, " "); got != w.keys || fmt.Sprint(calls) != fmt.Sprint(w.calls) || g.other != w.other {
					t.Errorf("grouping %d, group %d: keys %q calls %v other %v, want %q %v %v", c.how, i, got, calls, g.other, w.keys, w.calls, w.other)
				}
				g.keys, g.calls = g.keys[:0], g.calls[:0]
			}
			bb.groups = bb.groups[:0]
		}
	}
}

// TestGroupingMany: batches of many keys and groups (past the linear searches) keep every
// call, each key's calls in order.
func TestGroupingMany(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var bb batchBuilder
	for round := 0; round < 20; round++ {
		batch := make([]*call, 1+rng.IntN(256))
		arrival := map[*call]int{}
		for i := range batch {
			batch[i] = testCall(fmt.Sprintf("k{%d}", rng.IntN(1+round*5)), 'a', 0)
			arrival[batch[i]] = i
		}
		for _, how := range []grouping{groupAll, groupEachKey} {
			bb.group(how, batch)
			seen := 0
			for i := range bb.groups {
				g := &bb.groups[i]
				last := map[string]int{}
				for _, c := range g.calls {
					if g.keys[c.ki] != c.key {
						t.Fatalf("call on %s indexed as key %s", c.key, g.keys[c.ki])
					}
					if l, ok := last[c.key]; ok && l > arrival[c] {
						t.Fatalf("calls on %s out of arrival order", c.key)
					}
					last[c.key] = arrival[c]
					seen++
				}
				g.keys, g.calls = g.keys[:0], g.calls[:0]
			}
			if how == groupAll && len(bb.groups) != 1 {
				t.Fatalf("groupAll made %d groups", len(bb.groups))
			}
			bb.groups = bb.groups[:0]
			if seen != len(batch) {
				t.Fatalf("grouping %d kept %d calls of %d", how, seen, len(batch))
			}
		}
	}
}

// batchKey is one key of a batched differential sequence: its limits (sometimes two sets,
// as when two limiters with different limits share a key), and the Go core's state of it.
type batchKey struct {
	name   string
	limits [][]gcra.Limit
	m      model
	open   []openTicket
}

type openTicket struct {
	tk gcra.Ticket
	ls []gcra.Limit
}

// view is the key's state as an operation under k limits sees it: the first k TATs of
// the state, fresh ones beyond it.
func (m *model) view(k int) []int64 {
	v := make([]int64, k)
	copy(v, m.tats)
	return v
}

// TestDifferentialBatches runs random batches through the script, each batch in one
// script call at one virtual now, and through the Go core applied to the batch's
// operations in order: decisions on one key or on several keys with their own limits,
// repeated operations (sent as '='), settlements of earlier grants, penalties, queries,
// cost errors, keys on a ramp. Decisions, tickets and the final states must be identical.
func TestDifferentialBatches(t *testing.T) {
	sequences := 2_000
	if raceEnabled {
		// What it checks is the script's arithmetic, not goroutines; the race detector
		// would only slow it down (the pipeliner's races are exercised by the other tests).
		sequences = 1_000
	}
	if testing.Short() {
		sequences = 200
	}
	const workers = 16
	client := newClient(t, shared.URL())
	pfx := prefix(t)
	var next, ops, batches atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var now atomic.Int64
			b := New(client, withNow(now.Load), WithPrefix(pfx), WithTimeout(30*time.Second), WithPipelines(1, 8))
			b.p.refs = w%2 == 0 // half the workers send keys and fields as pointers, as Dial's backend does
			defer b.Close()
			var bb batchBuilder
			for {
				seq := next.Add(1) - 1
				if seq >= int64(sequences) {
					return
				}
				n, nb, err := runBatches(b, &bb, client, &now, seq)
				ops.Add(int64(n))
				batches.Add(int64(nb))
				if err != nil {
					errs <- fmt.Errorf("sequence %d: %w", seq, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d sequences, %d batches, %d operations, identical", sequences, batches.Load(), ops.Load())
}

// pending is an operation of a batch with what the core says of it.
type pending struct {
	c    *call
	k    *batchKey
	what string
	ls   []gcra.Limit
	// The core's answer: a decision (and its ticket), an allowance, or an error.
	want    gcra.Result
	wantTk  gcra.Ticket
	wantErr error
	allow   bool
	n, md   int64
}

func runBatches(b *Backend, bb *batchBuilder, client *goredis.Client, now *atomic.Int64, seq int64) (ops, batches int, err error) {
	rng := rand.New(rand.NewPCG(uint64(seq), 0xba7c4))
	now.Store(randomBase(rng))
	keys := make([]*batchKey, 1+rng.IntN(5))
	for i := range keys {
		k := &batchKey{name: fmt.Sprintf("%d.%d", seq, i), limits: [][]gcra.Limit{randomLimits(rng)}}
		if seq%3 == 0 && rng.IntN(2) == 0 {
			randomRises(rng, k.limits[0]) // a ramp's decisions ('r' records) among the others
		}
		if i > 0 && rng.IntN(3) == 0 {
			k.limits[0] = keys[0].limits[0] // keys sharing limits: their operations repeat as '='
		}
		if rng.IntN(4) == 0 {
			// A second set, on the same scale: the stored TATs grow and shrink with the
			// number of limits of the operation that writes them.
			alt := randomLimits(rng)
			for j := range alt {
				alt[j] = k.limits[0][min(j, len(k.limits[0])-1)]
				if j > 0 && rng.IntN(2) == 0 {
					alt[j].Tau = alt[j].T * (1 + rng.Int64N(8))
				}
			}
			k.limits = append(k.limits, alt)
		}
		keys[i] = k
	}
	T := keys[0].limits[0][0].T
	steps := 2 + rng.IntN(12)
	for step := 0; step < steps; step++ {
		switch rng.IntN(4) {
		case 0:
		case 1:
			now.Add(rng.Int64N(2 * T))
		case 2:
			now.Add(max(0, T*rng.Int64N(3)+rng.Int64N(3)-1))
		default:
			k := keys[rng.IntN(len(keys))]
			ls := k.limits[0]
			now.Add(rng.Int64N(3 * max(ls[rng.IntN(len(ls))].Tau, 1)))
		}
		at := now.Load()
		// The batch, applied to the core in order as it is built.
		size := 1 + rng.IntN(24)
		ps := make([]pending, 0, size)
		var last *pending
		if ls := keys[0].limits[0]; len(keys) > 1 && len(ls) == 1 && rng.IntN(3) == 0 {
			// The script's lean batches: each key once, in any order, an allowance under
			// one limit, or a decision of n > 0 permits under one limit with one maxDelay
			// (keys whose state is not the common one go on to its general path).
			decide := rng.IntN(2) == 0
			n, md := int64(1), int64(0)
			if decide {
				n = 1 + rng.Int64N(min(gcra.MaxCost(ls), 6))
				if rng.IntN(2) == 0 {
					md = rng.Int64N(4 * ls[0].Tau)
				}
			}
			for _, i := range rng.Perm(len(keys)) {
				k := keys[i]
				v := k.m.view(1)
				p := pending{k: k, ls: ls, what: "decide", n: n, md: md, allow: !decide}
				p.want, p.wantTk, _ = gcra.Decide(v, ls, at, n, md)
				if decide {
					p.c = b.decideCall(k.name, backend.Request{Limits: ls, N: n, MaxDelay: time.Duration(md)})
				} else {
					p.c = b.allowCall(k.name, ls[0])
				}
				if p.want.Allowed {
					k.m.tats = v
				}
				ps = append(ps, p)
			}
			size = len(ps)
		}
		for len(ps) < size {
			k := keys[rng.IntN(len(keys))]
			if last != nil && rng.IntN(4) == 0 {
				k = last.k // the same key again
			}
			ls := k.limits[rng.IntN(len(k.limits))]
			v := k.m.view(len(ls))
			p := pending{k: k, ls: ls}
			switch op := rng.IntN(10); {
			case op < 6: // decide
				if last != nil && last.what == "decide" && rng.IntN(3) == 0 && sameLimits(last.ls, ls) {
					p.n, p.md, p.allow = last.n, last.md, last.allow // the same operation: '='
				} else {
					maxCost := gcra.MaxCost(ls)
					p.n = rng.Int64N(min(maxCost, 6) + 1)
					if rng.IntN(40) == 0 && maxCost < math.MaxInt64 {
						p.n = maxCost + 1 // a cost error (checked before sending)
					}
					switch rng.IntN(4) {
					case 1:
						p.md = rng.Int64N(4 * T)
					case 2:
						p.md = rng.Int64N(4 * ls[len(ls)-1].Tau)
					case 3:
						p.md = math.MaxInt64
					}
					p.allow = len(ls) == 1 && p.n == 1 && p.md == 0 && rng.IntN(2) == 0
				}
				p.what = "decide"
				p.want, p.wantTk, p.wantErr = gcra.Decide(v, ls, at, p.n, p.md)
				if p.wantErr != nil {
					if err := checkRequest(ls, p.n); !errors.Is(err, p.wantErr) {
						return ops, batches, fmt.Errorf("step %d: checkRequest %v, core %v", step, err, p.wantErr)
					}
					continue // never sent
				}
				req := backend.Request{Limits: ls, N: p.n, MaxDelay: time.Duration(p.md)}
				if p.allow {
					p.c = b.allowCall(k.name, ls[0])
				} else {
					p.c = b.decideCall(k.name, req)
				}
				if p.want.Allowed && p.n > 0 {
					k.m.tats = v // a grant writes; a denial or a query does not
				}
			case op < 8 && len(k.open) > 0: // cancel or settle a grant of an earlier batch
				i := rng.IntN(len(k.open))
				tk, ls := k.open[i].tk, k.open[i].ls
				k.open = append(k.open[:i], k.open[i+1:]...)
				v = k.m.view(len(ls))
				p.ls = ls
				newN := rng.Int64N(2*tk.N + 2)
				if rng.IntN(3) == 0 {
					newN = 0
				}
				hold := k.m.hold
				if hold <= at {
					hold = 0
				}
				if _, err := gcra.Adjust(v, ls, at, tk, newN, hold); err != nil {
					return ops, batches, fmt.Errorf("step %d: core Adjust: %v", step, err)
				}
				p.what = fmt.Sprintf("settle %d to %d", tk.N, newN)
				p.c = b.adjustCall(k.name, ls, tk, newN)
				k.m.tats = v // a settlement writes
			case op < 9: // penalize
				d := 1 + rng.Int64N(3*T)
				k.m.hold = max(k.m.hold, at+d)
				gcra.Penalize(v, ls, at, at+d)
				k.m.tats = v // a penalty writes
				p.what = fmt.Sprintf("penalize %d", d)
				p.c = b.penalizeCall(k.name, ls, d)
			default: // a query
				p.what, p.n = "decide", 0
				p.want, p.wantTk, _ = gcra.Decide(v, ls, at, 0, 0)
				p.c = b.decideCall(k.name, backend.Request{Limits: ls})
			}
			ps = append(ps, p)
			last = &ps[len(ps)-1]
		}
		if len(ps) == 0 {
			continue
		}
		calls := make([]*call, len(ps))
		for i := range ps {
			calls[i] = ps[i].c
			calls[i].state.Store(callSent)
		}
		bb.exec(b.p, calls) // one script call: one Redis, one virtual now
		batches++
		for i := range ps {
			p := &ps[i]
			<-p.c.done
			ops++
			fail := func(format string, a ...any) error {
				return fmt.Errorf("step %d, operation %d of %d on key %s (limits %v, now %d), %s: %s",
					step, i, len(ps), p.k.name, p.ls, at, p.what, fmt.Sprintf(format, a...))
			}
			if p.c.err != nil {
				return ops, batches, fail("error %v", p.c.err)
			}
			switch {
			case p.what != "decide":
				if !done(p.c.res) {
					return ops, batches, fail("result %v", p.c.res)
				}
			case p.allow:
				got, ok := decodeAllow(p.c.res)
				if !ok || got != p.want.Allowed {
					return ops, batches, fail("allow = %v (%v), core %v", got, p.c.res, p.want.Allowed)
				}
			default:
				g, ok := decodeDecision(p.c.res, p.c.now, p.ls, p.n)
				if !ok || p.c.now != at {
					return ops, batches, fail("reply %v at %d", p.c.res, p.c.now)
				}
				if g.Result != p.want || idleSame(g.Ticket, at) != idleSame(p.wantTk, at) {
					return ops, batches, fail("n=%d md=%d:\n script %+v %+v\n core   %+v %+v", p.n, p.md, g.Result, g.Ticket, p.want, p.wantTk)
				}
				if p.want.Allowed && p.n > 0 {
					p.k.open = append(p.k.open, openTicket{p.wantTk, p.ls})
				}
			}
			p.c.release()
		}
	}
	for _, k := range keys {
		if err := checkState(client, b, k.name, k.m, now.Load()); err != nil {
			return ops, batches, fmt.Errorf("key %s: %w", k.name, err)
		}
	}
	return ops, batches, nil
}

func sameLimits(a, b []gcra.Limit) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// checkState compares the state left in Redis with the core's: the same TATs (a TAT in the
// past is the same as none) and the same penalty in force, or no key at all if the
// core's is idle.
func checkState(client *goredis.Client, b *Backend, key string, m model, at int64) error {
	v, err := client.Get(ctx, b.KeyName(key)).Result()
	if errors.Is(err, goredis.Nil) {
		if !gcra.Idle(m.tats, at) || m.hold > at {
			return fmt.Errorf("key gone, core state %v hold %d at %d", m.tats, m.hold, at)
		}
		return nil
	}
	if err != nil {
		return err
	}
	f := strings.Fields(v)
	if len(f) != 3+2*len(m.tats) || f[0] != "1" {
		return fmt.Errorf("stored state %q", v)
	}
	field := func(i int) int64 {
		s, _ := strconv.ParseInt(f[1+2*i], 10, 64)
		ns, _ := strconv.ParseInt(f[2+2*i], 10, 64)
		return s*1e9 + ns
	}
	hold := field(0)
	if (m.hold > at) != (hold > at) || (hold > at && hold != m.hold) {
		return fmt.Errorf("stored hold %d, core %d, at %d", hold, m.hold, at)
	}
	for i := range m.tats {
		tat := field(1 + i)
		if max(tat, at) != max(m.tats[i], at) {
			return fmt.Errorf("stored TAT %d = %d, core %d, at %d", i, tat, m.tats[i], at)
		}
	}
	return nil
}

// TestBatchKeyErrors: in one batch, a key holding state of another format and a key
// holding another type fail their own calls (a ReplyError, not Redis down) and are left
// as they were; the other keys' calls are decided.
func TestBatchKeyErrors(t *testing.T) {
	c := newClient(t, shared.URL())
	b := New(c, WithPrefix(prefix(t)), WithTimeout(5*time.Second))
	defer b.Close()
	c.Set(ctx, b.KeyName("v2"), "2 0 0 5 0", 0)
	c.HSet(ctx, b.KeyName("hash"), "f", "v")
	ls := []gcra.Limit{{T: int64(time.Second), Tau: int64(2 * time.Second)}}
	keys := []string{"ok", "v2", "hash", "ok", "v2", "ok", "ok2"}
	calls := make([]*call, len(keys))
	for i, k := range keys {
		calls[i] = b.decideCall(k, backend.Request{Limits: ls, N: 1})
		calls[i].state.Store(callSent)
	}
	var bb batchBuilder
	bb.exec(b.p, calls)
	for i, cl := range calls {
		<-cl.done
		switch keys[i] {
		case "v2", "hash":
			want := "format 2"
			if keys[i] == "hash" {
				want = "WRONGTYPE"
			}
			if cl.err == nil || !strings.Contains(cl.err.Error(), want) || unavailable(cl.err) {
				t.Errorf("call %d on %s: error %v, want a Redis error naming %s", i, keys[i], cl.err, want)
			}
		default:
			g, ok := decodeDecision(cl.res, cl.now, ls, 1)
			wantAllowed := keys[i] == "ok2" || i < 5 // "ok": a burst of 2
			if cl.err != nil || !ok || g.Allowed != wantAllowed {
				t.Errorf("call %d on %s: %+v %v %v, want allowed %v", i, keys[i], g, ok, cl.err, wantAllowed)
			}
		}
	}
	if v := c.Get(ctx, b.KeyName("v2")).Val(); v != "2 0 0 5 0" {
		t.Errorf("the key of format 2 was changed to %q", v)
	}
	if typ := c.Type(ctx, b.KeyName("hash")).Val(); typ != "hash" {
		t.Errorf("the hash became a %s", typ)
	}
	// The lean batches (each key once, in real time): the hash, which MGET reads as a
	// missing key, fails its call and stays a hash.
	for _, op := range []byte{'a', 'd'} {
		lean := []string{"fresh-" + string(op), "hash", "ok2"}
		for i, k := range lean {
			if op == 'a' {
				calls[i] = b.allowCall(k, ls[0])
			} else {
				calls[i] = b.decideCall(k, backend.Request{Limits: ls, N: 1})
			}
			calls[i].state.Store(callSent)
		}
		bb.exec(b.p, calls[:len(lean)])
		for i, cl := range calls[:len(lean)] {
			<-cl.done
			if lean[i] == "hash" {
				if cl.err == nil || !strings.Contains(cl.err.Error(), "WRONGTYPE") {
					t.Errorf("lean batch %c: call on the hash: error %v, want WRONGTYPE", op, cl.err)
				}
				continue
			}
			if cl.err != nil {
				t.Errorf("lean batch %c: call on %s: %v", op, lean[i], cl.err)
			}
		}
		if typ := c.Type(ctx, b.KeyName("hash")).Val(); typ != "hash" {
			t.Errorf("lean batch %c: the hash became a %s", op, typ)
		}
	}
	// Through the API, alone: a ReplyError, and the breaker stays closed.
	for key, want := range map[string]string{"hash": "WRONGTYPE", "v2": "format 2"} {
		_, err := b.Decide(ctx, key, backend.Request{Limits: ls, N: 1})
		_, err2 := b.AllowOne(ctx, key, ls[0])
		for _, err := range []error{err, err2} {
			var re *ReplyError
			if !errors.As(err, &re) || !strings.Contains(err.Error(), want) || errors.Is(err, backend.ErrUnavailable) || b.Stats().Down {
				t.Fatalf("%s: got %v (down %v), want a ReplyError naming %s", key, err, b.Stats().Down, want)
			}
		}
	}
}

// TestBatchWaitsForTheOneInFlight: while batches are in flight, the calls that arrive
// wait and leave together once as many as those in flight are queued (or when a batch
// returns), rather than each as a batch of its own: two batches in flight, each of about
// half the callers, decide more than one at a time or many small ones. Redis is stopped
// (SIGSTOP) to hold the batches in flight: a lone allowance, then one that leaves beside
// it (one queued, one in flight), then one that must wait (one queued, two in flight),
// then a second that makes two, which leave together; then a reservation, which leaves at
// once: 4 script calls for the 5 calls.
func TestBatchWaitsForTheOneInFlight(t *testing.T) {
	r := newHeldBatches(t, 4)
	r.loneAndBeside(r.allow)
	r.allow(2)
	r.waitQueued("a call queued behind them", 2, 1, "with a call queued behind two in flight: %d batches in flight, %d queued; want 2 and 1 (it waits)")
	r.allow(3)
	r.waitSent("two calls sent together beside the first two", 3)
	// A reservation (a waiter's place in line) does not wait: its caller sends it.
	r.reserve()
	r.waitSent("a reservation sent at once", 4)
	r.answered(5)
	r.wantScriptCalls(4, "4 allowances (two alone, then two together) and a reservation")
}

// TestCallBesideALoneOneSendsItself: a call that may leave at once and finds nothing
// queued is sent by its own caller, as a lone caller's is, rather than handed to a
// flusher and answered back: at two goroutines that was two goroutine switches a call,
// and sluice decided fewer a second than redis_rate (0.77 to 1.03 times in four rounds).
// Redis is stopped to hold the batches in flight: a lone allowance, one beside it, then a
// reservation (which leaves at once) are all sent by their callers; three allowances that
// queue behind them (as many as are in flight) leave together from a flusher.
func TestCallBesideALoneOneSendsItself(t *testing.T) {
	r := newHeldBatches(t, 4)
	r.loneAndBeside(r.allow)
	r.reserve()
	r.waitSent("a reservation sent at once", 3)
	if n := r.flushed(); n != 0 {
		t.Errorf("batches sent by flushers for a lone call, one beside it and a reservation: %d, want 0 (each sent by its caller)", n)
	}
	r.allow(2)
	r.allow(3)
	r.waitQueued("two calls queued behind them", 3, 2, "with two calls queued behind three in flight: %d batches in flight, %d queued; want 3 and 2 (they wait)")
	r.allow(4)
	r.waitSent("three calls sent together behind them", 4)
	if n := r.flushed(); n != 1 {
		t.Errorf("batches sent by flushers after three calls queued behind three in flight: %d, want 1", n)
	}
	r.answered(6)
	r.wantScriptCalls(4, "a lone call, one beside it, a reservation, then three together")
}

// TestBatchesInFlightAreBounded: no more batches are in flight at once than
// WithPipelines says, whoever sends them (Redis is stopped to hold them in flight): with
// two, a lone allowance and one beside it fly, and a reservation (which leaves at once
// when it may) and an allowance wait queued; when the first two are answered, both
// leave together.
func TestBatchesInFlightAreBounded(t *testing.T) {
	r := newHeldBatches(t, 2)
	r.loneAndBeside(r.allow)
	r.reserve()
	r.allow(2)
	r.waitQueued("two calls queued", 2, 2, "with WithPipelines(2, ...): %d batches in flight, %d calls queued; want 2 and 2")
	r.answered(4)
	r.wantScriptCalls(3, "two alone, then two together")
}

// TestBatchDecisionsNowOrNeverWait: a decision that never waits (AllowN: maxDelay 0)
// queued behind batches in flight waits as an allowance does, and leaves with the next
// (Redis is stopped to hold the batches in flight): a lone call, a second beside it, then
// two such decisions that leave together, in 3 script calls.
func TestBatchDecisionsNowOrNeverWait(t *testing.T) {
	r := newHeldBatches(t, 4)
	r.loneAndBeside(r.decide)
	r.decide(2)
	r.waitQueued("a decision queued behind them", 2, 1, "with a decision now or never queued behind two in flight: %d batches in flight, %d queued; want 2 and 1 (it waits)")
	r.decide(3)
	r.waitSent("two decisions sent together beside the first two", 3)
	r.answered(4)
	r.wantScriptCalls(3, "4 decisions now or never (two alone, then two together)")
}

// heldBatches is a backend on a Redis that is stopped (SIGSTOP) to hold its batches in
// flight, its script loaded and its command counts reset: the tests of how calls wait for
// the batch in flight.
type heldBatches struct {
	t       *testing.T
	srv     *redistest.Server
	b       *Backend
	l       gcra.Limit
	resumed bool
	errs    chan error // each call's outcome (see allow, decide, reserve)
}

func newHeldBatches(t *testing.T, pipelines int) *heldBatches {
	t.Helper()
	srv := redistest.New(t)
	ctx := context.Background()
	b, err := dialRedis(ctx, srv.URL(), WithPipelines(pipelines, 64), WithTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	l := gcra.Limit{T: 1000, Tau: 1_000_000}
	if ok, err := b.AllowOne(ctx, "warm", l); err != nil || !ok { // loads the script
		t.Fatalf("first call: %v %v", ok, err)
	}
	if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	r := &heldBatches{t: t, srv: srv, b: b, l: l, errs: make(chan error, 16)}
	srv.Pause()
	t.Cleanup(r.resume)
	return r
}

// allow makes an allowance on key k<i> in a goroutine of its own.
func (r *heldBatches) allow(i int) {
	go func() {
		ok, err := r.b.AllowOne(context.Background(), fmt.Sprintf("k%d", i), r.l)
		if err == nil && !ok {
			err = fmt.Errorf("call %d denied", i)
		}
		r.errs <- err
	}()
}

// decide makes a decision now or never (maxDelay 0) on key k<i> in a goroutine of its own.
func (r *heldBatches) decide(i int) {
	go func() {
		g, err := r.b.Decide(context.Background(), fmt.Sprintf("k%d", i), backend.Request{Limits: []gcra.Limit{r.l}, N: 1})
		if err == nil && !g.Allowed {
			err = fmt.Errorf("decision %d denied", i)
		}
		r.errs <- err
	}()
}

// reserve makes a reservation (a waiter's place in line) on key r in a goroutine of its own.
func (r *heldBatches) reserve() {
	go func() {
		g, err := r.b.Decide(context.Background(), "r", backend.Request{Limits: []gcra.Limit{r.l}, N: 1, MaxDelay: time.Second})
		if err == nil && !g.Allowed {
			err = errors.New("the reservation was refused")
		}
		r.errs <- err
	}()
}

// loneAndBeside makes call 0, waits for it to be in flight, then call 1, and waits for
// it to be sent beside it.
func (r *heldBatches) loneAndBeside(call func(int)) {
	r.t.Helper()
	call(0)
	r.waitSent("the first call in flight", 1)
	call(1)
	r.waitSent("a second call sent beside the first", 2)
}

// answered lets Redis answer and fails the test on any of the n calls' errors.
func (r *heldBatches) answered(n int) {
	r.t.Helper()
	r.resume()
	for i := 0; i < n; i++ {
		if err := <-r.errs; err != nil {
			r.t.Fatal(err)
		}
	}
}

// resume lets Redis answer again (once).
func (r *heldBatches) resume() {
	if !r.resumed {
		r.resumed = true
		r.srv.Resume()
	}
}

// state is how many batches are in flight and how many calls queued.
func (r *heldBatches) state() (inflight, queued int) {
	r.b.p.mu.Lock()
	defer r.b.p.mu.Unlock()
	return r.b.p.inflight, len(r.b.p.queue)
}

// flushed is how many batches the flushers have sent.
func (r *heldBatches) flushed() int64 { return r.b.p.flushed.Load() }

// waitSent waits until in batches are in flight and no call is queued (what).
func (r *heldBatches) waitSent(what string, in int) {
	r.t.Helper()
	r.waitFor(what, func(inflight, queued int) bool { return inflight == in && queued == 0 })
}

// waitQueued waits until q calls are queued (what), then fails the test unless in
// batches are in flight (msg formats the two counts): the queued calls wait.
func (r *heldBatches) waitQueued(what string, in, q int, msg string) {
	r.t.Helper()
	r.waitFor(what, func(_, queued int) bool { return queued == q })
	if gotIn, gotQ := r.state(); gotIn != in || gotQ != q {
		r.t.Fatalf(msg, gotIn, gotQ)
	}
}

// waitFor waits (10 s at most) until cond holds of the batches in flight and the calls queued.
func (r *heldBatches) waitFor(what string, cond func(inflight, queued int) bool) {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond(r.state()) {
		if time.Now().After(deadline) {
			in, q := r.state()
			r.t.Fatalf("%s: after 10 s, %d batches in flight and %d calls queued", what, in, q)
		}
		time.Sleep(time.Millisecond)
	}
}

// wantScriptCalls fails the test unless Redis ran n script calls since the counts were
// reset (for what).
func (r *heldBatches) wantScriptCalls(n int, what string) {
	r.t.Helper()
	if calls := r.scriptCalls(); calls != strconv.Itoa(n) {
		r.t.Errorf("script calls for %s: %q, want %d", what, calls, n)
	}
}

// scriptCalls is how many script calls Redis ran since the counts were reset.
func (r *heldBatches) scriptCalls() string {
	info, err := r.srv.Do("INFO", "commandstats")
	if err != nil {
		r.t.Fatal(err)
	}
	_, after, _ := strings.Cut(info, "cmdstat_evalsha:calls=")
	calls, _, _ := strings.Cut(after, ",")
	return calls
}
