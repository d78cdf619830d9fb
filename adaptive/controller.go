package adaptive

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/ratehdr"
)

// Strategy is how a Controller learns its pace from the API's answers.
type Strategy uint8

// The strategies. Sluice is the default; the others are the published designs it is
// measured against (docs/adaptive.md has the table).
const (
	// Sluice uses every signal an answer gives: the limit's rate, the capacity left and
	// how it moves between the client's own requests (from which it estimates what the
	// whole pool spends), and Retry-After. It steers the pool's spending so that the
	// capacity left stays near a small reserve, and drifts every client towards an equal
	// share.
	Sluice Strategy = iota
	// Heroku is the algorithm of the Heroku client study (docs/concepts.md, "Where each
	// design came from"), as written. Each goroutine sleeps before each request. A 429
	// doubles the sleep, once per event across the goroutines. Each success takes off
	// remaining × sleep / (limit × time factor), the time factor being high just after a
	// doubling. Each sleep is lengthened by up to Config.Jitter (10% by default). It does
	// not pace before the first 429.
	Heroku
	// Cubic is the AWS SDKs' adaptive retry rate limiter: a token bucket filled at a
	// rate cut to 0.7 of the measured send rate on each throttle, and regrown along
	// CUBIC's curve (C = 0.4) after it; no pacing before the first throttle.
	Cubic
	// SRE is client-side adaptive throttling from Google's SRE book ("Handling
	// Overload"): no pacing; each request is rejected locally with probability
	// max(0, (requests − 2 × accepts) / (requests + 1)) over the last two minutes.
	SRE
)

// Seed is Heroku's former name.
//
// Deprecated: use Heroku. Seed is kept for one release.
const Seed = Heroku

var strategyNames = [...]string{Sluice: "sluice", Heroku: "heroku", Cubic: "cubic", SRE: "sre"}

// formerNames are strategies' former names, still read for one release.
var formerNames = map[string]Strategy{"seed": Heroku}

// Strategies lists every strategy, the default first.
func Strategies() []Strategy { return []Strategy{Sluice, Heroku, Cubic, SRE} }

// String returns the strategy's name: "sluice", "heroku", "cubic" or "sre".
func (s Strategy) String() string {
	if int(s) < len(strategyNames) {
		return strategyNames[s]
	}
	return fmt.Sprintf("Strategy(%d)", uint8(s))
}

// ParseStrategy reads a strategy's name: sluice, heroku, cubic or sre. It still reads the
// former name seed as Heroku, for one release; FormerName tells such a name apart.
func ParseStrategy(name string) (Strategy, error) {
	for i, n := range strategyNames {
		if strings.EqualFold(name, n) {
			return Strategy(i), nil
		}
	}
	if s, ok := FormerName(name); ok {
		return s, nil
	}
	return 0, fmt.Errorf("adaptive: unknown strategy %q (known: %s)", name, strings.Join(strategyNames[:], ", "))
}

// FormerName reports whether name is a strategy's former name, and the strategy it names.
// ParseStrategy reads such a name for one release more; a program that reads names from
// its user should tell them the name now (the strategy's String).
func FormerName(name string) (Strategy, bool) {
	s, ok := formerNames[strings.ToLower(name)]
	return s, ok
}

// MarshalText writes the strategy's name.
func (s Strategy) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a strategy's name.
func (s *Strategy) UnmarshalText(b []byte) error {
	v, err := ParseStrategy(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// Config tunes a Controller. The zero value of each field means its default.
type Config struct {
	// Strategy is how the controller learns (default Sluice).
	Strategy Strategy
	// Limit is the request limit assumed when the answers do not say the limit's rate
	// (Heroku sends the remaining count alone; the Heroku strategy then assumes 4,500 an
	// hour). The zero value: learned from the answers (the IETF draft's RateLimit-Policy;
	// OpenAI's and Anthropic's fields, which count per minute).
	Limit sluice.Limit
	// Reserve is the capacity the Sluice strategy leaves unspent, in time at the limit's
	// rate: default 16 s, plus a round trip, at least two requests, and at most half of
	// what the burst holds above one request (none for a burst of fewer than four). It
	// is the pool's cushion against the requests other clients send before they hear of
	// a change. It is spent at the end of a run at most, so a constant reserve costs
	// nothing of the rate.
	Reserve time.Duration
	// Horizon is how fast the Sluice strategy lets a pool spend what is left above the
	// reserve (default 1 s): a lone client uses a full burst quickly, and several spend
	// it together without overshooting, each seeing the same count fall.
	Horizon time.Duration
	// Fairness is the part of the limit's rate by which every Sluice client raises its
	// pace per second, whatever its pace (default 0.002); the pool's correction then
	// takes it back in proportion to each client's pace, which drifts the clients to
	// equal shares.
	Fairness float64
	// Jitter lengthens each pause by up to this part of it, at random (default 0.1, as
	// in the Heroku client study).
	Jitter float64
}

func (c Config) withDefaults() Config {
	if c.Reserve == 0 {
		c.Reserve = 16 * time.Second
	}
	if c.Horizon == 0 {
		c.Horizon = time.Second
	}
	if c.Fairness == 0 {
		c.Fairness = 0.002
	}
	if c.Jitter == 0 {
		c.Jitter = 0.1
	}
	return c
}

// Validate reports whether c can be used.
func (c Config) Validate() error {
	switch {
	case int(c.Strategy) >= len(strategyNames):
		return fmt.Errorf("adaptive: unknown strategy %d", c.Strategy)
	case c.Limit != (sluice.Limit{}) && sluice.Limits{c.Limit}.Validate() != nil:
		return fmt.Errorf("adaptive: Limit: %w", sluice.Limits{c.Limit}.Validate())
	case c.Reserve < 0, c.Horizon < 0:
		return fmt.Errorf("adaptive: Reserve %v and Horizon %v must not be negative", c.Reserve, c.Horizon)
	case c.Fairness < 0 || c.Fairness > 1:
		return fmt.Errorf("adaptive: Fairness %v must be in [0, 1]", c.Fairness)
	case c.Jitter < 0 || c.Jitter > 1:
		return fmt.Errorf("adaptive: Jitter %v must be in [0, 1]", c.Jitter)
	}
	return nil
}

// The limits a Controller learns: requests, and tokens (the LLM providers').
const (
	reqQ = iota
	tokQ
	nQuotas
)

// Controller is one client's pacing, the deterministic core of the adaptive mode: it
// learns a safe pace from the API's answers alone (Observe) and says when each request
// may be sent (Next). It knows nothing of the other clients sharing the token, not even
// how many they are. It can learn two limits at once, requests and tokens (an LLM API's
// per-minute pairs); the tighter paces.
//
// Times are nanoseconds on the caller's monotonic clock (any origin, the same for every
// call). A Controller is not safe for concurrent use: the goroutines of a process share
// one under a lock, and are one client (Transport does this).
type Controller struct {
	cfg Config
	rng uint64
	s   strategy

	q        [nQuotas]quota
	meanCost float64     // tokens per request, learned from the settled costs
	rtt      float64     // the time from a request's slot to its answer, seconds (smoothed)
	rtts     [16]float64 // the last round trips (rtt's samples), a ring at rttN
	rttN     int
	// the latest slot whose request went, when it went, and its round trip once its answer
	// came (see went)
	wentSlot, wentAt, wentRTT int64
	wentSet, wentAnswered     bool
	hold                      int64 // no request before this (a Retry-After)
	cut                       int64 // the last decrease: a refusal of a request sent before it is the same event
}

// strategy is one way of learning. next is asked for the slot of a request of the given
// costs (requests, tokens) at now (see Controller.Next). cancel gives back a slot next
// gave. observe learns from one answer.
type strategy interface {
	next(c *Controller, now int64, cost [nQuotas]float64) (int64, Outcome)
	cancel(c *Controller, at int64, cost [nQuotas]float64)
	observe(c *Controller, a *answer)
	rate(c *Controller) float64
}

// quota is what the controller knows of one limit.
type quota struct {
	known bool    // the answers (or Config.Limit) gave its rate
	count float64 // its count per window (4500 for 4500/h)
	limit float64 // its rate, units a second
	burst float64 // the most at once (the count per window when not reported)
	// what the last answer said, when it gave a remaining count
	remaining float64
	seen      bool
}

// answer is one answer, as the strategies read it.
type answer struct {
	now, sent  int64
	throttled  bool
	newEvent   bool  // a refusal of a request sent after the last one's: a new event
	retryAfter int64 // -1: none named
	// retryInSeconds: the wait was named in whole seconds, which the API may have rounded
	// by up to a second
	retryInSeconds bool
	cost           [nQuotas]float64
	remaining      [nQuotas]float64 // -1: not reported
}

// New returns a Controller. seed drives its jitter (and the sre strategy's draws): the
// same seed and inputs give the same decisions.
func New(cfg Config, seed uint64) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Controller{cfg: cfg.withDefaults(), rng: seed | 1}
	if l := cfg.Limit; l != (sluice.Limit{}) {
		c.q[reqQ].setLimit(float64(l.Rate), l.Period, float64(l.Burst))
	}
	switch c.cfg.Strategy {
	case Heroku:
		c.s = &herokuStrategy{}
	case Cubic:
		c.s = newCubic()
	case SRE:
		c.s = &sreStrategy{}
	default:
		c.s = &sluiceStrategy{}
	}
	return c, nil
}

// Strategy returns the controller's strategy.
func (c *Controller) Strategy() Strategy { return c.cfg.Strategy }

// Rate returns the client's current pace of requests a second (0 while it does not
// pace: before it has learned anything, or for the strategies that pace only after a
// refusal).
func (c *Controller) Rate() float64 { return c.s.rate(c) }

// interval is one interval of the pace, in nanoseconds: at least a millisecond, a second
// while the controller has no rate.
func (c *Controller) interval() int64 {
	r := c.Rate()
	if !(r > 0) {
		return int64(time.Second)
	}
	return max(int64(1e9/r), int64(time.Millisecond))
}

// Outcome is what Next decided for a request.
type Outcome uint8

// The outcomes.
const (
	// Send: the slot at the time returned is the request's; send it then.
	Send Outcome = iota
	// Wait: the slots before the time returned are taken; ask again then (a goroutine
	// does not hold a slot far ahead, at a pace that may change before it comes).
	Wait
	// Reject: the client rejects the request locally; do not send it (the SRE strategy
	// sheds load this way; the others never do).
	Reject
)

// Next decides, at now, about the next request of the given token cost (0 if unknown or
// not an LLM call): send it at the time returned (now or later), ask again then, or do
// not send it.
func (c *Controller) Next(now int64, tokens int64) (int64, Outcome) {
	cost := [nQuotas]float64{1, float64(max(tokens, 0))}
	if cost[tokQ] == 0 {
		cost[tokQ] = c.meanCost
	}
	return c.s.next(c, now, cost)
}

// Cancel gives back the slot at that Next gave (Send) a request of the given token cost,
// when the request is not sent after all (its context ended first).
func (c *Controller) Cancel(at int64, tokens int64) {
	cost := [nQuotas]float64{1, float64(max(tokens, 0))}
	if cost[tokQ] == 0 {
		cost[tokQ] = c.meanCost
	}
	c.s.cancel(c, at, cost)
}

// Answer is one response, as a Controller learns from it.
type Answer struct {
	Status int
	Header http.Header
	// Date is the wall time the answer arrived: a Retry-After or a reset given as a date
	// is read against it.
	Date time.Time
	// Sent is when its request was sent: the slot Next gave (or later), on the
	// controller's clock.
	Sent int64
	// Tokens is the request's real cost in tokens, if the answer settled it (0: unknown;
	// the cost given to Next stands).
	Tokens int64
}

// Observe learns from an answer received at now.
func (c *Controller) Observe(now int64, a Answer) {
	c.observe(now, a.Sent, ratehdr.Read(a.Status, a.Header, a.Date), a.Tokens)
}

// observe learns from what an answer said (f), its request sent at sent, received at now.
func (c *Controller) observe(now, sent int64, f ratehdr.Facts, tokens int64) {
	a := answer{now: now, sent: min(sent, now), throttled: f.Throttled(), retryAfter: -1, remaining: [nQuotas]float64{-1, -1}}
	if f.HasRetryAfter {
		a.retryAfter, a.retryInSeconds = int64(f.RetryAfter), f.RetryAfterInSeconds
	}
	a.cost = [nQuotas]float64{1, float64(max(tokens, 0))}
	if tokens > 0 {
		// The mean cost paces requests whose cost is not known in advance.
		if c.meanCost == 0 {
			c.meanCost = float64(tokens)
		} else {
			c.meanCost += (float64(tokens) - c.meanCost) / 8
		}
	} else {
		a.cost[tokQ] = c.meanCost
	}
	var got [nQuotas]bool
	for _, q := range f.Quotas {
		i := reqQ
		if q.Tokens() {
			i = tokQ
		}
		if got[i] {
			continue // the first of each kind (Anthropic's tokens before input-tokens)
		}
		got[i] = true
		w := q.Window
		if w <= 0 && q.Name != "" {
			w = time.Minute // OpenAI's and Anthropic's limits count per minute
		}
		if q.Limit > 0 && w > 0 {
			c.q[i].setLimit(float64(q.Limit), w, float64(q.Burst))
		}
		if q.Remaining >= 0 {
			a.remaining[i] = float64(q.Remaining)
			c.q[i].remaining, c.q[i].seen = a.remaining[i], true
		}
	}
	d := float64(a.now-a.sent) / 1e9
	if c.rtt == 0 {
		c.rtt = d
	} else {
		c.rtt += (d - c.rtt) / 8
	}
	c.rtts[c.rttN%len(c.rtts)] = d
	c.rttN++
	if c.wentSet && a.sent >= c.wentAt {
		c.wentRTT, c.wentAnswered = a.now-a.sent, true // the last request that went
	}
	if a.throttled && a.sent >= c.cut {
		// One event, one decrease: the goroutines refused together (their requests sent
		// before the first refusal came back) back off once.
		a.newEvent = true
		c.cut = now
	}
	if a.throttled && a.retryAfter > 0 {
		c.hold = max(c.hold, now+a.retryAfter)
	}
	c.s.observe(c, &a)
}

// went returns when the request of the slot at may go, asked at now: now (and it records
// that the request goes now), or later (ask again then). On a burst too small to count in (the Sluice strategy), a request
// goes no sooner than the limit's interval plus the last request's round trip after that
// request went: its way to the API was at most that round trip, so the next one cannot
// arrive early however short its own way (the longest of the last round trips while that
// answer has not come). It counts from when the last request went, not from its slot: a
// goroutine that took the next slot (one interval ahead) before the last request's timer
// fired late would otherwise send it too soon, and be refused. Transport calls it; the
// simulator's requests go at their slots.
func (c *Controller) went(at, now int64) int64 {
	goAt := now
	if k := c.q[reqQ]; c.cfg.Strategy == Sluice && k.known && k.burst < 2 && c.wentSet && at > c.wentSlot {
		way := int64(c.rttMax() * 1e9)
		if c.wentAnswered {
			way = c.wentRTT
		}
		goAt = max(now, c.wentAt+int64(1e9/k.limit)+way)
	}
	if goAt == now && (!c.wentSet || at >= c.wentSlot) {
		c.wentSlot, c.wentAt, c.wentSet, c.wentAnswered = at, now, true, false
	}
	return goAt
}

// rttMax is the longest of the last round trips, seconds: the most a request's way to the
// API may have been longer than the next one's.
func (c *Controller) rttMax() float64 {
	m := c.rtt
	for _, d := range c.rtts {
		m = max(m, d)
	}
	return m
}

// setLimit records a limit of count units per window, with burst (<= 0: not reported).
func (q *quota) setLimit(count float64, window time.Duration, burst float64) {
	q.known = true
	q.count = count
	q.limit = count / window.Seconds()
	if burst <= 0 {
		burst = count
	}
	q.burst = burst
}

// jittered lengthens a pause p (nanoseconds) by up to Jitter of it.
func (c *Controller) jittered(p float64) float64 { return p * (1 + c.cfg.Jitter*c.random()) }

// random returns a number in [0, 1) (xorshift64*: the core stays deterministic).
func (c *Controller) random() float64 {
	c.rng ^= c.rng >> 12
	c.rng ^= c.rng << 25
	c.rng ^= c.rng >> 27
	return float64((c.rng*2685821657736338717)>>11) / (1 << 53)
}

// maxPause bounds every pause a strategy asks for.
const maxPause = float64(time.Hour)

// nanos converts seconds to a pause in nanoseconds, bounded.
func nanos(s float64) int64 {
	if math.IsNaN(s) || s <= 0 {
		return 0
	}
	return int64(min(s*1e9, maxPause))
}
