package adaptive

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/ratehdr"
)

// api is a strict GCRA referee in virtual time: it answers each request as the referee
// does, with the limit's policy, the requests remaining, and on a refusal a 429 with
// Retry-After.
type api struct {
	l        gcra.Limit
	rate     int64 // per second
	burst    int64
	tat      int64
	accepted int64
	refused  int64
}

func newAPI(rate, burst int64) *api {
	t := int64(time.Second) / rate
	return &api{l: gcra.Limit{T: t, Tau: burst * t}, rate: rate, burst: burst}
}

func (a *api) serve(now int64) ratehdr.Facts {
	tat, ok := gcra.AllowOne(a.tat, a.l, now)
	f := ratehdr.Facts{Status: 200}
	if ok {
		a.tat = tat
		a.accepted++
	} else {
		a.refused++
		f.Status = 429
		f.RetryAfter, f.HasRetryAfter = time.Duration(gcra.Wait(a.tat, a.l, now, 1)), true
	}
	left := gcra.Level(a.tat, a.l, now) / a.l.T
	f.Quotas = []ratehdr.Quota{{Name: "default", Limit: a.rate, Remaining: max(left, 0), Reset: -1, Window: time.Second, Burst: a.burst}}
	return f
}

// client is one process: a Controller, and demand (requests it wants to send) from
// start to end.
type client struct {
	c          *Controller
	start, end int64
	at         int64 // its next request's slot
	sent       int64
}

// run plays clients against a in virtual time: each sends its next request at its slot
// (no network delay) until the end. It returns each client's accepted requests.
func run(t *testing.T, a *api, cs []*client, end int64) []int64 {
	t.Helper()
	got := make([]int64, len(cs))
	for _, c := range cs {
		c.at = c.c.Next(c.start)
	}
	for {
		var next *client
		i := -1
		for j, c := range cs {
			if c.at < c.end && c.at < end && (next == nil || c.at < next.at) {
				next, i = c, j
			}
		}
		if next == nil {
			return got
		}
		now := next.at
		before := a.accepted
		next.c.Observe(now, a.serve(now))
		got[i] += a.accepted - before
		next.sent++
		next.at = next.c.Next(now + 1)
	}
}

func newClient(t *testing.T, seed uint64, start, end time.Duration) *client {
	c, err := New(Config{}, seed)
	if err != nil {
		t.Fatal(err)
	}
	return &client{c: c, start: int64(start) + 1, end: int64(end)}
}

// TestLoneClientTakesTheCapacity: one client alone on 20/s burst 10 spends what is left
// quickly and then runs near the limit, with few refusals.
func TestLoneClientTakesTheCapacity(t *testing.T) {
	a := newAPI(20, 10)
	cs := []*client{newClient(t, 1, 0, time.Minute)}
	run(t, a, cs, int64(time.Minute))
	capacity := float64(a.burst) + 20*60
	t.Logf("accepted %d of %.0f, refused %d, rate %.1f/s", a.accepted, capacity, a.refused, cs[0].c.Rate())
	if u := float64(a.accepted) / capacity; u < 0.9 {
		t.Errorf("utilization %.3f alone, want at least 0.9", u)
	}
	if r := float64(a.refused) / float64(a.accepted+a.refused); r > 0.01 {
		t.Errorf("429 ratio %.4f alone, want at most 0.01", r)
	}
}

// TestPoolConvergesUnderTheLimit: five clients that share nothing, started together,
// share 20/s burst 10 for ten minutes: together near the limit, few refusals, no client
// starved.
func TestPoolConvergesUnderTheLimit(t *testing.T) {
	a := newAPI(20, 10)
	var cs []*client
	for i := range 5 {
		cs = append(cs, newClient(t, uint64(i+1), 0, 10*time.Minute))
	}
	got := run(t, a, cs, int64(10*time.Minute))
	capacity := float64(a.burst) + 20*600
	ratio := float64(a.refused) / float64(a.accepted+a.refused)
	t.Logf("accepted %d of %.0f, 429 ratio %.4f, per client %v", a.accepted, capacity, ratio, got)
	if u := float64(a.accepted) / capacity; u < 0.85 {
		t.Errorf("utilization %.3f, want at least 0.85", u)
	}
	if ratio > 0.02 {
		t.Errorf("429 ratio %.4f, want at most 0.02", ratio)
	}
	for i, n := range got {
		if n < int64(capacity)/5/4 {
			t.Errorf("client %d got %d of a fair %0.f", i, n, capacity/5)
		}
	}
}

// TestOneHalvingPerRefusal: the goroutines of a process refused together back off once,
// and nothing is sent before the Retry-After.
func TestOneHalvingPerRefusal(t *testing.T) {
	c, _ := New(Config{}, 1)
	ok := ratehdr.Facts{Status: 200, Quotas: []ratehdr.Quota{{Limit: 20, Remaining: 9, Reset: -1, Window: time.Second, Burst: 10}}}
	c.Observe(1, ok)
	r0 := c.Rate()
	refused := ratehdr.Facts{Status: 429, RetryAfter: time.Second, HasRetryAfter: true, Quotas: ok.Quotas}
	c.Observe(2, refused)
	c.Observe(3, refused) // a second goroutine's refusal of the same moment
	if c.Rate() != r0/2 {
		t.Fatalf("rate %v after two refusals of one moment, want %v (one halving)", c.Rate(), r0/2)
	}
	if at := c.Next(4); at < 2+int64(time.Second) {
		t.Fatalf("next request at %v, before the Retry-After", time.Duration(at))
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{{Decrease: 1}, {Increase: -1}, {Jitter: 2}, {Reserve: -1}} {
		if _, err := New(c, 1); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
