package referee

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
)

// HeaderCost is the request header an LLM-style referee reads a request's cost from, in
// tokens (see WithCostLimits).
const HeaderCost = "X-Cost"

// maxCost bounds a request's X-Cost.
const maxCost = 1e12

// Style is the header fields a referee's answers carry.
type Style uint8

// The styles.
const (
	// IETF: the IETF draft's RateLimit-Policy and RateLimit (with a "tokens" policy for
	// the cost limits), Heroku's RateLimit-Remaining; Retry-After and Retry-After-Ms on a
	// refusal.
	IETF Style = iota
	// OpenAI: x-ratelimit-{limit,remaining,reset}-{requests,tokens}, the limits counted
	// per minute and the resets as durations ("6m0s", "12ms"); Retry-After and
	// Retry-After-Ms on a refusal.
	OpenAI
	// Anthropic: anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}, the
	// limits counted per minute and the resets as RFC 3339 times; Retry-After on a
	// refusal.
	Anthropic
	// Heroku: RateLimit-Remaining alone, as Heroku's API answers (no limit, no window, no
	// Retry-After): a client must learn the rate from how the count moves.
	Heroku
	// Bare: no field but Retry-After (and Retry-After-Ms) on a refusal: a client learns
	// from its 429s alone.
	Bare
)

var styleNames = [...]string{IETF: "ietf", OpenAI: "openai", Anthropic: "anthropic", Heroku: "heroku", Bare: "bare"}

// String returns the style's name: "ietf", "openai", "anthropic", "heroku" or "bare".
func (s Style) String() string {
	if int(s) < len(styleNames) {
		return styleNames[s]
	}
	return fmt.Sprintf("Style(%d)", uint8(s))
}

// ParseStyle reads a style's name: ietf, openai, anthropic, heroku or bare.
func ParseStyle(name string) (Style, error) {
	for i, n := range styleNames {
		if strings.EqualFold(name, n) {
			return Style(i), nil
		}
	}
	return 0, fmt.Errorf("referee: unknown style %q (known: %s)", name, strings.Join(styleNames[:], ", "))
}

// MarshalText writes the style's name.
func (s Style) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a style's name.
func (s *Style) UnmarshalText(b []byte) error {
	v, err := ParseStyle(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// WriteHeaders writes what verdict v says into an answer's header h, in the referee's
// style, at the wall time now (Anthropic's resets are times). ServeHTTP writes its
// answers with it; the simulator reads them back as a client would.
func (r *Referee) WriteHeaders(h http.Header, v Verdict, now time.Time) {
	r.mu.Lock()
	limits, costs := r.limits, r.costs
	r.mu.Unlock()
	d := v.Requests
	d.Allowed, d.RetryAfter = v.Allowed, v.RetryAfter
	switch r.style {
	case OpenAI:
		openAI(h, "requests", limits, v.Requests)
		if len(costs) > 0 {
			openAI(h, "tokens", costs, v.Cost)
		}
	case Anthropic:
		anthropic(h, "requests", limits, v.Requests, now)
		if len(costs) > 0 {
			anthropic(h, "tokens", costs, v.Cost, now)
		}
	case Heroku:
		h.Set(httplimit.HeaderRemaining, strconv.FormatInt(v.Requests.Remaining, 10))
		return
	case Bare:
	default:
		httplimit.SetRateLimitHeaders(h, limits, d)
		if len(costs) > 0 {
			c := costs[0]
			h.Set(httplimit.HeaderRateLimitPolicy, h.Get(httplimit.HeaderRateLimitPolicy)+fmt.Sprintf(`, "tokens";q=%d;w=%d`, c.Rate, ceilSeconds(c.Period)))
			h.Set(httplimit.HeaderRateLimit, h.Get(httplimit.HeaderRateLimit)+fmt.Sprintf(`, "tokens";r=%d;t=%d`, v.Cost.Remaining, ceilSeconds(v.Cost.ResetAfter)))
		}
	}
	if v.Allowed {
		return
	}
	if r.dateRetry {
		// HTTP-dates have whole seconds: round the wait up so the date is never early.
		until := now.Add(v.RetryAfter + time.Second - 1).UTC().Truncate(time.Second)
		h.Set(httplimit.HeaderRetryAfter, until.Format(http.TimeFormat))
		h.Del(httplimit.HeaderRetryAfterMs)
		return
	}
	h.Set(httplimit.HeaderRetryAfter, strconv.FormatInt(ceilSeconds(v.RetryAfter), 10))
	if r.style != Anthropic {
		h.Set(httplimit.HeaderRetryAfterMs, strconv.FormatInt(int64((v.RetryAfter+time.Millisecond-1)/time.Millisecond), 10))
	}
}

// perMinute is the first limit's count per minute, as the providers' fields state it.
func perMinute(ls sluice.Limits) int64 {
	l := ls[0]
	return int64(float64(l.Rate) * float64(time.Minute) / float64(l.Period))
}

func openAI(h http.Header, kind string, ls sluice.Limits, d sluice.Decision) {
	h.Set("X-Ratelimit-Limit-"+kind, strconv.FormatInt(perMinute(ls), 10))
	h.Set("X-Ratelimit-Remaining-"+kind, strconv.FormatInt(d.Remaining, 10))
	h.Set("X-Ratelimit-Reset-"+kind, d.ResetAfter.Round(time.Millisecond).String())
}

func anthropic(h http.Header, kind string, ls sluice.Limits, d sluice.Decision, now time.Time) {
	p := "Anthropic-Ratelimit-" + kind + "-"
	h.Set(p+"Limit", strconv.FormatInt(perMinute(ls), 10))
	h.Set(p+"Remaining", strconv.FormatInt(d.Remaining, 10))
	// Whole seconds, rounded up: the time is never early.
	h.Set(p+"Reset", now.Add(d.ResetAfter+time.Second-1).UTC().Truncate(time.Second).Format(time.RFC3339))
}

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}
