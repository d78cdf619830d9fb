package adaptive

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/internal/ratehdr"
	"github.com/sluicehq/sluice/priority"
)

// ErrRejected is returned (wrapped) by Transport for a request its controller rejected
// locally without sending it: the SRE strategy sheds load this way when the API refuses
// much of what the client sends. The caller may retry later.
var ErrRejected = errors.New("adaptive: request rejected locally: the API is refusing much of what this client sends")

// DefaultMaxKeys bounds the controllers a Transport keeps (one per key); past it, the
// least recently used is forgotten.
const DefaultMaxKeys = 1024

// Transport is an http.RoundTripper that paces the requests it sends through one
// Controller per key (the request's host, unless Key says otherwise): it waits each
// request's slot (or the end of the request's context), sends it, and feeds the answer
// back to the Controller. The goroutines of a process that use one Transport are one
// client.
//
// Requests carry a class (priority.With on their context: docs/priorities.md). A lower
// class gives way when the pace holds requests back: a sheddable request takes no slot
// while the slots taken reach more than one interval of the pace ahead (it waits until
// they do not), nor does a standard one while a critical request went through the key
// within the last few seconds, so that a higher class's request takes the next slot
// rather than queue behind theirs.
//
// Its zero value is usable: the Sluice strategy, the host as the key, no retries. It
// must not be copied after first use.
type Transport struct {
	// Base sends the requests (default http.DefaultTransport).
	Base http.RoundTripper
	// Key names the limit a request counts against (default: its URL's host). Requests
	// with one token to one API share a key.
	Key func(*http.Request) string
	// Config tunes the controllers (the strategy among others).
	Config Config
	// Cost, if set, estimates a request's cost in tokens before it is sent, for an API
	// that limits tokens as well as requests (an LLM's): the pace of tokens counts it.
	// Default: the mean of the costs settled so far.
	Cost func(*http.Request) int64
	// Used, if set, reads a request's real cost in tokens from its answer (for an LLM,
	// the usage it reports), which settles the estimate. Default: the estimate stands.
	Used func(*http.Response) int64
	// Retries is how many times a 429 is retried after its Retry-After (default 0), for
	// idempotent requests (GET, HEAD, OPTIONS, TRACE, PUT, DELETE, or a request with an
	// Idempotency-Key) whose body can be sent again.
	Retries int
	// RetryAny extends Retries to requests of every method (a 429 means the API did not
	// act on the request, if it follows the HTTP semantics); off by default.
	RetryAny bool
	// MaxKeys bounds the controllers kept (default DefaultMaxKeys).
	MaxKeys int
	// Clock is the time source (default clock.Default).
	Clock clock.Clock

	mu    sync.Mutex
	ctrls map[string]*keyed
	seed  uint64
}

type keyed struct {
	c        *Controller
	used     int64
	critical int64 // when a critical request last asked (0: never)
	last     int64 // the latest slot Next gave on the key
	// asking counts the requests of each class (by rank: critical, standard, sheddable)
	// that asked for a slot and have none yet.
	asking [3]int
}

// rank is a class's index in keyed.asking, the highest first.
func rank(c priority.Class) int { return 1 - int(max(min(c, priority.Critical), priority.Sheddable)) }

// criticalRecent is how long a critical request makes standard ones give way.
const criticalRecent = int64(5 * time.Second)

var _ http.RoundTripper = (*Transport)(nil)

func (t *Transport) clock() clock.Clock {
	if t.Clock != nil {
		return t.Clock
	}
	return clock.Default
}

// controller returns key's controller, made on first use. t.mu must be held.
func (t *Transport) controller(key string, now int64) (*Controller, error) {
	if k := t.ctrls[key]; k != nil {
		k.used = now
		return k.c, nil
	}
	if t.ctrls == nil {
		t.ctrls = map[string]*keyed{}
	}
	limit := t.MaxKeys
	if limit <= 0 {
		limit = DefaultMaxKeys
	}
	if len(t.ctrls) >= limit {
		old, at := "", int64(0)
		for k, v := range t.ctrls {
			if old == "" || v.used < at {
				old, at = k, v.used
			}
		}
		delete(t.ctrls, old)
	}
	t.seed += 0x9e3779b97f4a7c15
	c, err := New(t.Config, t.seed^uint64(time.Now().UnixNano()))
	if err != nil {
		return nil, err
	}
	t.ctrls[key] = &keyed{c: c, used: now}
	return c, nil
}

// RoundTrip waits for the request's slot, sends it, and learns from the answer. It
// follows net/http's rules: it does not modify the request, it closes the body of a
// request it does not send, and it returns a nil error whenever it got a response.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	key := req.URL.Host
	if t.Key != nil {
		key = t.Key(req)
	}
	var cost int64
	if t.Cost != nil {
		cost = max(t.Cost(req), 0)
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	clk := t.clock()
	class := priority.Of(req.Context())
	var asking *keyed // while the request asks for a slot and has none: counted in it
	defer func() {
		if asking != nil {
			t.mu.Lock()
			asking.asking[rank(class)]--
			t.mu.Unlock()
		}
	}()
	var notBefore int64 // a retry waits for the Retry-After its refusal named
	for attempt := 0; ; attempt++ {
		t.mu.Lock()
		now := clk.Nanotime()
		c, err := t.controller(key, now)
		if k := t.ctrls[key]; err == nil && asking != k {
			if asking != nil {
				asking.asking[rank(class)]--
			}
			asking = k
			k.asking[rank(class)]++
		}
		var at int64
		var out Outcome
		if err == nil {
			if wake, ok := t.givesWay(key, class, now, c); ok {
				// A lower class takes no slot far ahead: it waits until the slots taken are
				// near, behind any higher class's request that takes one meanwhile.
				at, out = wake, Wait
			} else if at, out = c.Next(now, cost); out == Send {
				k := t.ctrls[key]
				k.last = max(k.last, at)
				k.asking[rank(class)]--
				asking = nil
			}
		}
		t.mu.Unlock()
		if err != nil {
			closeBody(req)
			return nil, err
		}
		switch out {
		case Reject:
			closeBody(req)
			return nil, fmt.Errorf("%w: %w", ErrRejected, &sluice.ThrottledError{Key: key})
		case Wait:
			if err := clk.Sleep(req.Context(), time.Duration(at-now)); err != nil {
				closeBody(req)
				return nil, err
			}
			attempt-- // not an attempt: the slot was not this request's yet
			continue
		}
		at = max(at, notBefore)
		err = nil
		if d, ok := req.Context().Deadline(); ok && clk.Now().Add(time.Duration(at-now)).After(d) {
			// The slot comes after the deadline: refuse now rather than wait in vain.
			err = &sluice.ThrottledError{Key: key, RetryAfter: time.Duration(at - now)}
		} else {
			err = clk.Sleep(req.Context(), time.Duration(at-now))
		}
		var sent int64
		for err == nil {
			// Its slot has come: it goes now, or later if the request before it went late
			// (see Controller.went).
			t.mu.Lock()
			now := clk.Nanotime()
			goAt := c.went(at, now)
			t.mu.Unlock()
			if goAt <= now {
				sent = max(at, now) // later than its slot if the timer fired late
				break
			}
			err = clk.Sleep(req.Context(), time.Duration(goAt-now))
		}
		if err != nil {
			t.mu.Lock()
			c.Cancel(at, cost)
			t.mu.Unlock()
			closeBody(req)
			return nil, err
		}
		// The request goes now, and the next interval counts from now.
		resp, err := base.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		facts := ratehdr.Read(resp.StatusCode, resp.Header, clk.Now())
		used := cost
		if t.Used != nil {
			if u := t.Used(resp); u > 0 {
				used = u
			}
		}
		t.mu.Lock()
		c.observe(clk.Nanotime(), sent, facts, used)
		t.mu.Unlock()
		if !facts.Throttled() || attempt >= t.Retries || !(ratehdr.Replayable(req) || t.RetryAny && bodyReplayable(req)) {
			return resp, nil
		}
		resp.Body.Close()
		notBefore = clk.Nanotime() + int64(facts.RetryAfter)
		req = req.Clone(req.Context())
		if req.GetBody != nil {
			body, err := req.GetBody()
			if err != nil {
				return nil, err
			}
			req.Body = body
		}
	}
}

// bodyReplayable reports whether req's body can be sent again (none, or GetBody set).
func bodyReplayable(r *http.Request) bool {
	return r.Body == nil || r.Body == http.NoBody || r.GetBody != nil
}

func closeBody(r *http.Request) {
	if r.Body != nil {
		r.Body.Close()
	}
}

// givesWay reports whether a request of class at now waits rather than take a slot of c
// (see Transport), and until when: a sheddable one while the slots taken reach more than
// an interval ahead, and a standard one too while a critical request asked for key
// recently. It notes a critical request. t.mu must be held.
func (t *Transport) givesWay(key string, class priority.Class, now int64, c *Controller) (wake int64, ok bool) {
	k := t.ctrls[key]
	switch {
	case class == priority.Critical:
		k.critical = now
		return 0, false
	case class == priority.Standard && (k.critical == 0 || now-k.critical > criticalRecent):
		return 0, false
	}
	iv := c.interval()
	higher := k.asking[0] > 0 || class == priority.Sheddable && k.asking[1] > 0
	if higher {
		// A higher class's request asks for a slot (the controller told it to wait for
		// one): it goes first.
		return now + iv, true
	}
	if k.last-now <= iv {
		return 0, false
	}
	return k.last - iv, true
}
