// Package referee plays the rate-limited API: an HTTP server that enforces limits strictly
// per token with GCRA, answers 200 or 429 (with Retry-After and the RateLimit fields), and
// counts what it accepted and rejected. A rejection is a violation of the limit by its
// callers. The demo, the tests and the simulator judge Sluice with it, and users run it as
// `sluice referee` to test their own clients.
//
// It is modelled on a Heroku-style API that follows GCRA, made strict: no slack, no
// reservation, every request judged at the instant it arrives. With WithCostLimits it is
// an LLM-style API instead: requests per minute plus tokens per minute, each request's
// cost in tokens taken from its X-Cost header, and with WithStyle it answers in OpenAI's
// or Anthropic's header fields.
package referee

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/limitconv"
)

// DefaultMaxTokens caps the tokens a referee tracks; past it, requests with new tokens get
// 503 (the referee is a test instrument: it must not grow without bound either).
const DefaultMaxTokens = 100_000

// Referee enforces limits per token. It is an http.Handler: GET /stats answers the counts
// as JSON, every other request is a call to the API. Safe for concurrent use.
type Referee struct {
	limits    sluice.Limits
	core      []gcra.Limit
	costs     sluice.Limits // limits on each request's cost (an LLM's tokens), if any
	costCore  []gcra.Limit
	style     Style
	clock     clock.Clock
	dateRetry bool
	maxTokens int

	mu     sync.Mutex
	tokens map[string]*token
	total  Counts
}

type token struct {
	tats  []int64
	ctats []int64 // the cost limits' state
	c     Counts
}

// Counts are what the referee saw for one token, or in all.
type Counts struct {
	Accepted int64 `json:"accepted"`
	Rejected int64 `json:"rejected"` // violations: requests past the limit
	// FirstNs and LastNs are the referee clock's Nanotime of the first and last accepted
	// request (0 if none).
	FirstNs int64 `json:"first_ns,omitempty"`
	LastNs  int64 `json:"last_ns,omitempty"`
	// Cost is the cost of the accepted requests (an LLM-style referee's tokens).
	Cost int64 `json:"cost,omitempty"`
}

// Stats is the answer of GET /stats.
type Stats struct {
	Limits string `json:"limits"`
	Counts        // every token together
	// Tokens are the counts per token, named by MaskToken: tokens are secrets.
	Tokens map[string]Counts `json:"tokens"`
}

// Option configures a Referee.
type Option interface{ apply(*Referee) }

type optionFunc func(*Referee)

func (f optionFunc) apply(r *Referee) { f(r) }

// WithClock sets the clock requests are judged by (default clock.Default).
func WithClock(c clock.Clock) Option { return optionFunc(func(r *Referee) { r.clock = c }) }

// WithDateRetryAfter makes 429 answers give Retry-After as an HTTP-date instead of
// delta-seconds (both forms are in RFC 9110; clients must read both).
func WithDateRetryAfter() Option { return optionFunc(func(r *Referee) { r.dateRetry = true }) }

// WithCostLimits makes the referee an LLM-style API: besides its limits on requests
// (each request costs one), each API token has these limits on what requests cost (an
// LLM's tokens per minute, e.g. "40000/m"), each request's cost read from its X-Cost
// header (default 1). A request is accepted only if every limit allows it.
func WithCostLimits(l sluice.Limits) Option {
	return optionFunc(func(r *Referee) { r.costs = l })
}

// WithStyle sets the header fields the answers carry (default IETF).
func WithStyle(s Style) Option { return optionFunc(func(r *Referee) { r.style = s }) }

// WithMaxTokens caps the tokens tracked (default DefaultMaxTokens).
func WithMaxTokens(n int) Option { return optionFunc(func(r *Referee) { r.maxTokens = n }) }

// New returns a referee enforcing limits on every token.
func New(limits sluice.Limits, opts ...Option) (*Referee, error) {
	if err := limits.Validate(); err != nil {
		return nil, err
	}
	r := &Referee{limits: limits, core: limitconv.Core(limits, 0), clock: clock.Default, maxTokens: DefaultMaxTokens, tokens: map[string]*token{}}
	for _, o := range opts {
		o.apply(r)
	}
	if len(r.costs) > 0 {
		if err := r.costs.Validate(); err != nil {
			return nil, fmt.Errorf("referee: cost limits: %w", err)
		}
		r.costCore = limitconv.Core(r.costs, 0)
	}
	if int(r.style) >= len(styleNames) {
		return nil, fmt.Errorf("referee: unknown style %d", r.style)
	}
	return r, nil
}

// Limits returns the limits the referee enforces.
func (r *Referee) Limits() sluice.Limits { return r.limits }

// ErrTooManyTokens is returned by Judge past the token cap.
var ErrTooManyTokens = errors.New("referee: too many tokens")

// Judge decides one request of cost n for tok arriving at the referee clock's Nanotime at,
// and counts it. It is what ServeHTTP does, without HTTP, for a referee without cost
// limits: the simulator calls it at virtual times.
func (r *Referee) Judge(tok string, n int64, at int64) (sluice.Decision, error) {
	v, err := r.call(tok, n, 0, at)
	return v.Requests, err
}

// Verdict is the referee's answer to one request.
type Verdict struct {
	Allowed bool
	// Requests is the decision of the limits on requests; Cost that of the cost limits
	// (zero without them). Each tells what is left under its limits after the request.
	Requests, Cost sluice.Decision
	// RetryAfter is, when refused, how long until every limit would allow the request.
	RetryAfter time.Duration
}

// Call decides one request costing cost (its X-Cost: an LLM's tokens; ignored without
// cost limits) for tok arriving at the referee clock's Nanotime at, and counts it. It is
// what ServeHTTP does, without HTTP.
func (r *Referee) Call(tok string, cost int64, at int64) (Verdict, error) {
	return r.call(tok, 1, cost, at)
}

func (r *Referee) call(tok string, n, cost int64, at int64) (Verdict, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.tokens[tok]
	if t == nil {
		if len(r.tokens) >= r.maxTokens {
			return Verdict{}, ErrTooManyTokens
		}
		t = &token{tats: make([]int64, len(r.core)), ctats: make([]int64, len(r.costCore))}
		r.tokens[tok] = t
	}
	// Decide on copies: the request is accepted only if every limit allows it, and a
	// refusal by one consumes nothing from the others.
	var tats, ctats [gcra.MaxLimits]int64
	copy(tats[:], t.tats)
	copy(ctats[:], t.ctats)
	req := judge(tats[:len(t.tats)], r.core, at, n)
	var v Verdict
	v.Allowed = req.Allowed
	var cres gcra.Result
	if len(r.costCore) > 0 {
		cres = judge(ctats[:len(t.ctats)], r.costCore, at, cost)
		v.Allowed = v.Allowed && cres.Allowed
	}
	if v.Allowed {
		copy(t.tats, tats[:])
		copy(t.ctats, ctats[:])
	} else {
		// Report what is left as it stands: nothing was consumed.
		v.RetryAfter = time.Duration(max(req.RetryAfter, cres.RetryAfter))
		req, _, _ = gcra.Decide(t.tats, r.core, at, 0, 0)
		if len(r.costCore) > 0 {
			cres, _, _ = gcra.Decide(t.ctats, r.costCore, at, 0, 0)
		}
	}
	v.Requests = decision(req, v.Allowed, v.RetryAfter)
	if len(r.costCore) > 0 {
		v.Cost = decision(cres, v.Allowed, v.RetryAfter)
	}
	if v.Allowed {
		for _, c := range []*Counts{&t.c, &r.total} {
			c.Accepted += n
			c.Cost += cost
			if c.FirstNs == 0 {
				c.FirstNs = at
			}
			c.LastNs = at
		}
	} else {
		t.c.Rejected += max(n, 1)
		r.total.Rejected += max(n, 1)
	}
	return v, nil
}

// judge decides n permits under limits, in place. A cost above a burst can never be
// accepted: it is refused like any other request past the limit.
func judge(tats []int64, limits []gcra.Limit, at, n int64) gcra.Result {
	res, _, err := gcra.Decide(tats, limits, at, n, 0)
	if err != nil {
		return gcra.Result{}
	}
	return res
}

func decision(res gcra.Result, allowed bool, retry time.Duration) sluice.Decision {
	d := sluice.Decision{Allowed: allowed, Remaining: res.Remaining, ResetAfter: time.Duration(res.ResetAfter)}
	if !allowed {
		d.RetryAfter = retry
	}
	return d
}

// SetLimits changes the limits enforced from now on (an API that changed its limit). Each
// token keeps its state for the limits that remain at the same place in the list.
func (r *Referee) SetLimits(limits sluice.Limits) error {
	if err := limits.Validate(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.limits, r.core = limits, limitconv.Core(limits, 0)
	for _, t := range r.tokens {
		if len(t.tats) != len(r.core) {
			tats := make([]int64, len(r.core))
			copy(tats, t.tats)
			t.tats = tats
		}
	}
	return nil
}

// Stats returns a copy of the counts.
func (r *Referee) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Stats{Limits: r.limits.String(), Counts: r.total, Tokens: make(map[string]Counts, len(r.tokens))}
	for k, t := range r.tokens {
		s.Tokens[MaskToken(k)] = t.c
	}
	return s
}

// MaskToken is how a token is named in Stats: its first four characters and a hash, so
// that /stats tells tokens apart without showing them.
func MaskToken(tok string) string {
	h := sha256.Sum256([]byte(tok))
	return tok[:min(4, len(tok))] + "~" + hex.EncodeToString(h[:4])
}

// Reset forgets every token and count.
func (r *Referee) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tokens = map[string]*token{}
	r.total = Counts{}
}

// TokenOf reads a request's API token: the bearer token of Authorization, else the
// X-Api-Token header.
func TokenOf(req *http.Request) string { return httplimit.KeyByToken(req) }

// ServeHTTP answers GET /stats with the counts, and every other request as the API: 401
// without a token, 200 within the limit, 429 past it.
func (r *Referee) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	at := r.clock.Nanotime()
	if req.URL.Path == "/stats" && req.Method == http.MethodGet {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(r.Stats())
		return
	}
	tok := TokenOf(req)
	if tok == "" {
		http.Error(w, "referee: no API token (send Authorization: Bearer TOKEN or X-Api-Token)", http.StatusUnauthorized)
		return
	}
	cost := int64(1)
	if v := req.Header.Get(HeaderCost); v != "" {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n < 0 || n > maxCost {
			http.Error(w, fmt.Sprintf("referee: bad %s %q: want a whole number of tokens from 0 to %d", HeaderCost, v, int64(maxCost)), http.StatusBadRequest)
			return
		}
		cost = n
	}
	v, err := r.Call(tok, cost, at)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	r.WriteHeaders(w.Header(), v, r.clock.Now())
	w.Header().Set("Content-Type", "application/json")
	if !v.Allowed {
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprintf(w, "{\"error\":\"rate limit exceeded\",\"retry_after_ms\":%d}\n", v.RetryAfter.Milliseconds())
		return
	}
	fmt.Fprintf(w, "{\"ok\":true,\"remaining\":%d}\n", v.Requests.Remaining)
}

// Summary writes the counts per token as text, busiest first.
func (s Stats) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "limits %s: accepted %d, rejected %d\n", s.Limits, s.Accepted, s.Rejected)
	names := make([]string, 0, len(s.Tokens))
	for k := range s.Tokens {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := s.Tokens[names[i]], s.Tokens[names[j]]
		if a.Accepted != b.Accepted {
			return a.Accepted > b.Accepted
		}
		return names[i] < names[j]
	})
	for _, k := range names {
		fmt.Fprintf(&b, "  %-24s accepted %d, rejected %d\n", k, s.Tokens[k].Accepted, s.Tokens[k].Rejected)
	}
	return b.String()
}
