package adaptive

import (
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice/internal/ratehdr"
)

// Config tunes a Controller. The zero value of each field means its default.
type Config struct {
	// Reserve is the part of the API's burst a client leaves unspent, in time at the
	// limit's rate (default 250 ms; at most half the burst, if the API names it, and at
	// least one request): the pool's cushion against the requests other clients have in
	// flight.
	Reserve time.Duration
	// Increase is how fast a client's rate grows while the API reports more than the
	// reserve left, per second, as a part of the limit's rate (default 0.1: from nothing
	// to the whole limit in ten seconds, on top of the spare capacity it spends). Every
	// client grows at the same pace whatever
	// its request rate, which is what makes the pool converge to equal rates.
	Increase float64
	// Decrease multiplies a client's rate each time a response shows the reserve dipped
	// into (default 0.85). A faster client sees more responses, so it backs off more.
	Decrease float64
	// Horizon is how long a client takes to spend what the API reports above the reserve
	// (default 1 s): a lone client uses a full burst quickly; several spend it together
	// without overshooting.
	Horizon time.Duration
	// Jitter lengthens each pause by up to this part of it, at random (default 0.1).
	Jitter float64
}

func (c Config) withDefaults() Config {
	if c.Reserve == 0 {
		c.Reserve = 250 * time.Millisecond
	}
	if c.Increase == 0 {
		c.Increase = 0.1
	}
	if c.Decrease == 0 {
		c.Decrease = 0.85
	}
	if c.Horizon == 0 {
		c.Horizon = time.Second
	}
	if c.Jitter == 0 {
		c.Jitter = 0.1
	}
	return c
}

// Validate reports whether c can be used.
func (c Config) Validate() error {
	switch {
	case c.Reserve < 0, c.Horizon < 0:
		return fmt.Errorf("adaptive: Reserve %v and Horizon %v must not be negative", c.Reserve, c.Horizon)
	case c.Increase < 0 || c.Increase > 10:
		return fmt.Errorf("adaptive: Increase %v must be in [0, 10]", c.Increase)
	case c.Decrease < 0 || c.Decrease >= 1:
		return fmt.Errorf("adaptive: Decrease %v must be in [0, 1)", c.Decrease)
	case c.Jitter < 0 || c.Jitter > 1:
		return fmt.Errorf("adaptive: Jitter %v must be in [0, 1]", c.Jitter)
	}
	return nil
}

// Controller is one client's pacing (the deterministic core of the adaptive mode): it
// learns a safe request rate from the API's answers alone (Observe) and says when the
// next request may be sent (Next). It knows nothing of the other clients sharing the
// token; it reads the limit's rate from the policy the API reports, and the capacity left
// from the remaining count, and keeps that count near a small reserve: its rate grows by a
// fixed step per second while more is left (additive increase, the same for every client)
// and shrinks by a factor when less is (multiplicative decrease), which drives a pool of
// such clients to equal rates summing to the limit; what is left above the reserve is
// spent over Horizon on top. A 429 halves the rate, once per event, and holds the client
// back for the Retry-After the API names.
//
// Times are nanoseconds on the caller's monotonic clock. It is not safe for concurrent
// use: the goroutines of a process share one Controller under a lock (Transport does).
type Controller struct {
	cfg Config
	rng uint64

	limit   float64 // the limit's rate, requests a second (0: not yet known)
	burst   float64 // its burst, if reported (0: not known)
	rate    float64 // this client's pace, requests a second
	spare   float64 // what the API reports left above the reserve
	lastObs int64   // when the last answer was observed
	next    int64   // when the next request may go
	hold    int64   // no request before this (a Retry-After)
	holdSet int64   // the hold the last halving answered: one halving per event
	started bool
}

// New returns a Controller.
func New(cfg Config, seed uint64) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Controller{cfg: cfg.withDefaults(), rng: seed | 1}, nil
}

// Rate returns the client's current pace, requests a second (0 before the first answer
// names a limit).
func (c *Controller) Rate() float64 { return c.rate }

// Next reserves the next request's slot at or after now and returns it.
func (c *Controller) Next(now int64) int64 {
	if gap := now - c.lastObs; c.started && c.rate > 0 && float64(gap) > 2e9/c.rate {
		// Quiet for two of its own slots or more (RFC 2861's restart after idle): what
		// it knew of the capacity left is stale, and others have taken up its rate
		// meanwhile. Its rate halves for every two Horizons it was quiet, down to a sixteenth
		// of the limit; the answers raise it again as fast as there is room.
		c.spare = 0
		c.rate = max(c.rate*math.Exp2(-float64(gap)/float64(2*c.cfg.Horizon)), min(c.rate, c.limit/16))
		c.lastObs = now // decayed once per quiet spell
	}
	at := max(now, c.next, c.hold)
	c.next = at + c.pause()
	return at
}

// pause is the gap between two requests at the current pace, with jitter; before any
// answer names the limit, 100 ms (a probe, not a burst).
func (c *Controller) pause() int64 {
	if !c.started {
		return int64(100 * time.Millisecond)
	}
	r := c.rate + c.spare/c.cfg.Horizon.Seconds()
	if r <= 0 {
		return int64(time.Second)
	}
	p := float64(time.Second) / r
	p *= 1 + c.cfg.Jitter*c.random()
	return int64(min(p, float64(time.Hour)))
}

// random returns a number in [0, 1) (xorshift64*: the core stays deterministic).
func (c *Controller) random() float64 {
	c.rng ^= c.rng >> 12
	c.rng ^= c.rng << 25
	c.rng ^= c.rng >> 27
	return float64((c.rng*2685821657736338717)>>11) / (1 << 53)
}

// Observe learns from one answer, received at now.
func (c *Controller) Observe(now int64, f ratehdr.Facts) {
	q, ok := requestQuota(f)
	if ok && q.Limit > 0 && q.Window > 0 {
		c.limit = float64(q.Limit) / q.Window.Seconds()
		if q.Burst > 0 {
			c.burst = float64(q.Burst)
		}
	}
	dt := 0.0
	if c.lastObs != 0 {
		dt = min(float64(now-c.lastObs)/1e9, 1)
	}
	c.lastObs = now
	if !c.started && c.limit > 0 {
		c.started = true
		c.rate = c.limit / 16 // a guess, low: what is left above the reserve is spent on top, and the rate grows
	}
	if f.Throttled() {
		c.spare = 0
		hold := now
		if f.HasRetryAfter {
			hold = now + int64(f.RetryAfter)
		}
		if c.holdSet == 0 || now >= c.holdSet {
			// One halving per event: the goroutines of a process that were refused
			// together back off once.
			c.rate /= 2
			c.holdSet = max(hold, now+1)
		}
		c.hold = max(c.hold, hold)
		c.next = max(c.next, c.hold)
		c.bound()
		return
	}
	if !ok || q.Remaining < 0 || c.limit <= 0 {
		return
	}
	reserve := c.limit * c.cfg.Reserve.Seconds()
	if c.burst > 0 {
		reserve = min(reserve, c.burst/2)
	}
	reserve = max(1, reserve)
	left := float64(q.Remaining)
	if left >= reserve {
		c.rate += c.cfg.Increase * c.limit * dt
		c.spare = left - reserve
	} else {
		c.rate *= c.cfg.Decrease
		c.spare = 0
	}
	c.bound()
}

func (c *Controller) bound() {
	if c.limit > 0 {
		c.rate = min(max(c.rate, c.limit/1000), 2*c.limit)
	}
	if math.IsNaN(c.rate) {
		c.rate = 0
	}
}

// requestQuota is the response's first request quota (not a token quota).
func requestQuota(f ratehdr.Facts) (ratehdr.Quota, bool) {
	for _, q := range f.Quotas {
		if !q.Tokens() {
			return q, true
		}
	}
	return ratehdr.Quota{}, false
}
