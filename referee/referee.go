// Package referee plays the rate-limited API: an HTTP server that enforces limits strictly
// per token with GCRA, answers 200 or 429 (with Retry-After and the RateLimit fields), and
// counts what it accepted and rejected. A rejection is a violation of the limit by its
// callers. The demo, the tests and the simulator judge Sluice with it, and users run it as
// `sluice referee` to test their own clients.
//
// It is modelled on a Heroku-style API that follows GCRA, made strict: no slack, no reservation, every request judged at the instant it arrives.
package referee

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
)

// DefaultMaxTokens caps the tokens a referee tracks; past it, requests with new tokens get
// 503 (the referee is a test instrument: it must not grow without bound either).
const DefaultMaxTokens = 100_000

// Referee enforces limits per token. It is an http.Handler: GET /stats answers the counts
// as JSON, every other request is a call to the API. Safe for concurrent use.
type Referee struct {
	limits    sluice.Limits
	core      []gcra.Limit
	clock     clock.Clock
	dateRetry bool
	maxTokens int

	mu     sync.Mutex
	tokens map[string]*token
	total  Counts
}

type token struct {
	tats []int64
	c    Counts
}

// Counts are what the referee saw for one token, or in all.
type Counts struct {
	Accepted int64 `json:"accepted"`
	Rejected int64 `json:"rejected"` // violations: requests past the limit
	// FirstNs and LastNs are the referee clock's Nanotime of the first and last accepted
	// request (0 if none).
	FirstNs int64 `json:"first_ns,omitempty"`
	LastNs  int64 `json:"last_ns,omitempty"`
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

// WithMaxTokens caps the tokens tracked (default DefaultMaxTokens).
func WithMaxTokens(n int) Option { return optionFunc(func(r *Referee) { r.maxTokens = n }) }

// New returns a referee enforcing limits on every token.
func New(limits sluice.Limits, opts ...Option) (*Referee, error) {
	if err := limits.Validate(); err != nil {
		return nil, err
	}
	r := &Referee{limits: limits, core: limits.Core(0), clock: clock.Default, maxTokens: DefaultMaxTokens, tokens: map[string]*token{}}
	for _, o := range opts {
		o.apply(r)
	}
	return r, nil
}

// Limits returns the limits the referee enforces.
func (r *Referee) Limits() sluice.Limits { return r.limits }

// ErrTooManyTokens is returned by Judge past the token cap.
var ErrTooManyTokens = errors.New("referee: too many tokens")

// Judge decides one request of cost n for tok arriving at the referee clock's Nanotime at,
// and counts it. It is what ServeHTTP does, without HTTP: the simulator calls it at
// virtual times.
func (r *Referee) Judge(tok string, n int64, at int64) (sluice.Decision, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.tokens[tok]
	if t == nil {
		if len(r.tokens) >= r.maxTokens {
			return sluice.Decision{}, ErrTooManyTokens
		}
		t = &token{tats: make([]int64, len(r.core))}
		r.tokens[tok] = t
	}
	res, _, err := gcra.Decide(t.tats, r.core, at, n, 0)
	if err != nil {
		// A cost above the burst can never be accepted: it is a violation like any other.
		res = gcra.Result{RetryAfter: 0}
	}
	d := sluice.Decision{
		Allowed:    res.Allowed,
		Remaining:  res.Remaining,
		RetryAfter: time.Duration(res.RetryAfter),
		ResetAfter: time.Duration(res.ResetAfter),
	}
	if d.Allowed {
		for _, c := range []*Counts{&t.c, &r.total} {
			c.Accepted += n
			if c.FirstNs == 0 {
				c.FirstNs = at
			}
			c.LastNs = at
		}
	} else {
		t.c.Rejected += max(n, 1)
		r.total.Rejected += max(n, 1)
	}
	return d, nil
}

// SetLimits changes the limits enforced from now on (an API that changed its limit). Each
// token keeps its state for the limits that remain at the same place in the list.
func (r *Referee) SetLimits(limits sluice.Limits) error {
	if err := limits.Validate(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.limits, r.core = limits, limits.Core(0)
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
func TokenOf(req *http.Request) string { return sluice.KeyByToken(req) }

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
	d, err := r.Judge(tok, 1, at)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	sluice.SetRateLimitHeaders(w.Header(), r.limits, d)
	if !d.Allowed && r.dateRetry {
		// HTTP-dates have whole seconds: round the wait up so the date is never early.
		until := r.clock.Now().Add(d.RetryAfter + time.Second - 1).UTC().Truncate(time.Second)
		w.Header().Set(sluice.HeaderRetryAfter, until.Format(http.TimeFormat))
		w.Header().Del(sluice.HeaderRetryAfterMs)
	}
	w.Header().Set("Content-Type", "application/json")
	if !d.Allowed {
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprintf(w, "{\"error\":\"rate limit exceeded\",\"retry_after_ms\":%d}\n", d.RetryAfter.Milliseconds())
		return
	}
	fmt.Fprintf(w, "{\"ok\":true,\"remaining\":%d}\n", d.Remaining)
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
