// Package ratehdr reads what an HTTP response says about the rate limits it is under: the
// wait it asks for (Retry-After, Retry-After-Ms) and the quotas it reports, in every form
// APIs use: the IETF draft's RateLimit and RateLimit-Policy fields (the structured form
// and the older dictionary form), the RateLimit-Limit/Remaining/Reset trio (Heroku sends
// RateLimit-Remaining alone), X-RateLimit-Limit/Remaining/Reset (GitHub's reset is an
// absolute Unix time), OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens}
// (reset as a Go-style duration, "6m0s", "12ms") and Anthropic's
// anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}
// (reset as an RFC 3339 time).
//
// It is deterministic (the caller passes now) and never fails: a field that is missing or
// malformed is left out, and every number is bounded.
//
// It is also the one implementation of the rest of Sluice's HTTP side that both the root
// package and package httplimit use: the writer of the fields a limiter answers with
// (Write), the keys a request is throttled by by default (HostKey, RemoteAddrKey), and
// whether a request may be sent again after a 429 (Replayable).
package ratehdr

import (
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"
)

// Bounds on what a response may report; larger values are treated as malformed.
const (
	maxCount = 1e15                 // limits and remaining counts
	maxWait  = 366 * 24 * time.Hour // waits and resets
	// epochAfter: a reset larger than this many seconds is an absolute Unix time
	// (GitHub's X-RateLimit-Reset), not a delay.
	epochAfter = 1e9
)

// Quota is one limit a response reports. Counts are -1 and durations negative when the
// response does not give them.
type Quota struct {
	// Name is the quota's name: the IETF policy's name (e.g. "default"), or what it
	// counts for the providers' fields ("requests", "tokens", "input-tokens",
	// "output-tokens"); "" for the unnamed trios.
	Name      string
	Limit     int64
	Remaining int64
	// Reset is how long until the quota is full again (IETF: t), or until its window
	// resets (the trios, the providers).
	Reset time.Duration
	// Window is the policy's window (IETF RateLimit-Policy w), 0 when not given.
	Window time.Duration
	// Burst is the policy's burst, if it names one (Sluice's RateLimit-Policy burst
	// parameter); -1 when not given.
	Burst int64
}

// Tokens reports whether the quota counts tokens rather than requests.
func (q Quota) Tokens() bool { return strings.Contains(q.Name, "tokens") }

// Facts is what one response says.
type Facts struct {
	Status int
	// RetryAfter is the wait the response asks for, if HasRetryAfter.
	RetryAfter    time.Duration
	HasRetryAfter bool
	// RetryAfterInSeconds: the wait was named in whole seconds (Retry-After, as a number
	// or an HTTP-date), not milliseconds; the API may have rounded it by up to a second.
	RetryAfterInSeconds bool
	// Quotas are the limits the response reports, the generic fields' first (the IETF
	// draft's, else the RateLimit-* trio's, else the X-RateLimit-* trio's), then the
	// providers'.
	Quotas []Quota
}

// Throttled reports whether the response refused the request for its rate: a 429, or a
// 503 that names a wait.
func (f Facts) Throttled() bool {
	return f.Status == http.StatusTooManyRequests || (f.Status == http.StatusServiceUnavailable && f.HasRetryAfter)
}

// Read reads a response's status and header at now (the time it arrived).
func Read(status int, h http.Header, now time.Time) Facts {
	f := Facts{Status: status}
	f.RetryAfter, f.HasRetryAfter, f.RetryAfterInSeconds = retryAfter(h, now)
	switch {
	case get(h, kRateLimit) != "" || get(h, kPolicy) != "":
		f.Quotas = ietf(h)
	case get(h, kTrio[0].remaining) != "" || get(h, kTrio[0].limit) != "":
		f.Quotas = trio(h, kTrio[0], now)
	case get(h, kTrio[1].remaining) != "" || get(h, kTrio[1].limit) != "":
		f.Quotas = trio(h, kTrio[1], now)
	}
	f.Quotas = append(f.Quotas, openAI(h)...)
	f.Quotas = append(f.Quotas, anthropic(h, now)...)
	return f
}

// RetryAfter reads how long a response asks the caller to wait: Retry-After-Ms if present,
// else Retry-After in either of its forms (delta-seconds, or an HTTP-date compared with
// now). It reports false when the response names no wait or names it badly.
func RetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	d, ok, _ := retryAfter(h, now)
	return d, ok
}

// retryAfter is RetryAfter, and whether the wait was named in whole seconds.
func retryAfter(h http.Header, now time.Time) (d time.Duration, ok, inSeconds bool) {
	if v := strings.TrimSpace(get(h, kRetryAfterMs)); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 && ms < float64(maxWait/time.Millisecond) {
			return time.Duration(ms * float64(time.Millisecond)), true, false
		}
	}
	v := strings.TrimSpace(get(h, kRetryAfter))
	if v == "" {
		return 0, false, false
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s < 0 || s > int64(maxWait/time.Second) {
			return 0, false, false
		}
		return time.Duration(s) * time.Second, true, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return clampWait(t.Sub(now)), true, true
	}
	return 0, false, false
}

// Remaining reads how many requests a response says are left: its first request quota
// that gives a remaining count. It reports false when none does.
func Remaining(h http.Header) (int64, bool) {
	for _, q := range Read(0, h, time.Time{}).Quotas {
		if !q.Tokens() && q.Remaining >= 0 {
			return q.Remaining, true
		}
	}
	return 0, false
}

func newQuota(name string) Quota {
	return Quota{Name: name, Limit: -1, Remaining: -1, Reset: -1, Burst: -1}
}

// ietf reads the draft's RateLimit and RateLimit-Policy fields: the structured form
// (`"name";r=50;t=30` and `"name";q=100;w=10`, one member per policy) or the older
// dictionary form (`limit=100, remaining=50, reset=30`).
func ietf(h http.Header) []Quota {
	rl := strings.Join(h[kRateLimit], ", ")
	if isDictionary(rl) {
		q := newQuota("")
		for _, kv := range splitTop(rl, ',') {
			k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
			q.set(strings.ToLower(strings.TrimSpace(k)), v)
		}
		return []Quota{q}
	}
	var qs []Quota
	index := map[string]int{}
	get := func(name string) *Quota {
		i, ok := index[name]
		if !ok {
			i = len(qs)
			index[name] = i
			qs = append(qs, newQuota(name))
		}
		return &qs[i]
	}
	// The policies (q, w, burst) first, then what is left of each (r, t): the keys do not
	// overlap, so one reading serves both fields.
	for _, field := range []string{strings.Join(h[kPolicy], ", "), rl} {
		for _, m := range splitTop(field, ',') {
			name, params, ok := member(m)
			if !ok {
				continue
			}
			q := get(name)
			for _, p := range params {
				k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
				q.set(strings.ToLower(strings.TrimSpace(k)), strings.TrimSpace(v))
			}
		}
	}
	return qs
}

// set sets the quota's field the draft's key k names: the structured form's keys (q, w,
// burst in the policy; r, t in RateLimit) and the older dictionary form's (limit,
// remaining, reset). Unknown keys are ignored.
func (q *Quota) set(k, v string) {
	switch k {
	case "q", "limit":
		q.Limit = count(v)
	case "r", "remaining":
		q.Remaining = count(v)
	case "t", "reset":
		q.Reset = seconds(v)
	case "w":
		if w := seconds(v); w > 0 {
			q.Window = w
		}
	case "burst":
		q.Burst = count(v)
	}
}

// isDictionary reports whether a RateLimit field is the older draft's dictionary form.
func isDictionary(v string) bool {
	return !strings.Contains(v, ";") && strings.Contains(strings.ToLower(v), "remaining=")
}

// member splits one structured-field member, `"name";k=v;k=v` or `name;k=v`, into its
// name and its parameters (`k=v`).
func member(m string) (name string, params []string, ok bool) {
	parts := splitTop(strings.TrimSpace(m), ';')
	if len(parts) == 0 {
		return "", nil, false
	}
	name = strings.TrimSpace(parts[0])
	if uq, err := strconv.Unquote(name); err == nil {
		name = uq // a quoted name may hold anything
	} else if name == "" || strings.ContainsAny(name, `="`) {
		return "", nil, false
	}
	return name, parts[1:], true
}

// splitTop splits s at sep outside double quotes.
func splitTop(s string, sep byte) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if quoted {
				i++
			}
		case '"':
			quoted = !quoted
		case sep:
			if !quoted {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// trio reads PREFIX-Limit, -Remaining and -Reset: seconds from now, or an absolute Unix
// time when larger than epochAfter (GitHub).
func trio(h http.Header, k keys, now time.Time) []Quota {
	q := newQuota("")
	q.Limit = count(get(h, k.limit))
	q.Remaining = count(get(h, k.remaining))
	if v := strings.TrimSpace(get(h, k.reset)); v != "" {
		if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 {
			if s > epochAfter {
				if !now.IsZero() {
					q.Reset = clampWait(time.Unix(int64(s), 0).Sub(now))
				}
			} else {
				q.Reset = seconds(v)
			}
		}
	}
	if q.Limit < 0 && q.Remaining < 0 {
		return nil
	}
	return []Quota{q}
}

// openAI reads x-ratelimit-{limit,remaining,reset}-{requests,tokens}.
func openAI(h http.Header) []Quota {
	var qs []Quota
	for i, kind := range openAIKinds {
		k := kOpenAI[i]
		q := newQuota(kind)
		q.Limit = count(get(h, k.limit))
		q.Remaining = count(get(h, k.remaining))
		if v := strings.TrimSpace(get(h, k.reset)); v != "" {
			if d, err := time.ParseDuration(v); err == nil && d >= 0 {
				q.Reset = clampWait(d)
			} else {
				q.Reset = seconds(v)
			}
		}
		if q.Limit >= 0 || q.Remaining >= 0 {
			qs = append(qs, q)
		}
	}
	return qs
}

// anthropic reads anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
// {limit,remaining,reset}, the reset an RFC 3339 time.
func anthropic(h http.Header, now time.Time) []Quota {
	var qs []Quota
	for i, kind := range anthropicKinds {
		k := kAnthropic[i]
		q := newQuota(kind)
		q.Limit = count(get(h, k.limit))
		q.Remaining = count(get(h, k.remaining))
		if v := strings.TrimSpace(get(h, k.reset)); v != "" && !now.IsZero() {
			if t, err := time.Parse(time.RFC3339, v); err == nil {
				q.Reset = clampWait(t.Sub(now))
			}
		}
		if q.Limit >= 0 || q.Remaining >= 0 {
			qs = append(qs, q)
		}
	}
	return qs
}

// The fields read, by their canonical keys (http.Header's), computed once: Read runs for
// every answer a client gets, and canonicalizing a key on each lookup was most of its
// cost.
var (
	kRateLimit    = textproto.CanonicalMIMEHeaderKey("RateLimit")
	kPolicy       = textproto.CanonicalMIMEHeaderKey("RateLimit-Policy")
	kRetryAfter   = textproto.CanonicalMIMEHeaderKey("Retry-After")
	kRetryAfterMs = textproto.CanonicalMIMEHeaderKey("Retry-After-Ms")
	kTrio         = [2]keys{trioKeys("RateLimit-"), trioKeys("X-RateLimit-")}

	openAIKinds    = [...]string{"requests", "tokens"}
	anthropicKinds = [...]string{"requests", "tokens", "input-tokens", "output-tokens"}
	kOpenAI        [len(openAIKinds)]keys
	kAnthropic     [len(anthropicKinds)]keys
)

func init() {
	for i, kind := range openAIKinds {
		kOpenAI[i] = keys{canon("X-Ratelimit-Limit-" + kind), canon("X-Ratelimit-Remaining-" + kind), canon("X-Ratelimit-Reset-" + kind)}
	}
	for i, kind := range anthropicKinds {
		p := "Anthropic-Ratelimit-" + kind + "-"
		kAnthropic[i] = keys{canon(p + "Limit"), canon(p + "Remaining"), canon(p + "Reset")}
	}
}

// keys are one quota's three fields.
type keys struct{ limit, remaining, reset string }

func trioKeys(prefix string) keys {
	return keys{canon(prefix + "Limit"), canon(prefix + "Remaining"), canon(prefix + "Reset")}
}

func canon(k string) string { return textproto.CanonicalMIMEHeaderKey(k) }

// get is h.Get for a key already canonical.
func get(h http.Header, k string) string {
	if v := h[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// count parses a non-negative count, -1 if missing or malformed.
func count(v string) int64 {
	v = strings.TrimSpace(v)
	if v == "" {
		return -1
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > maxCount {
		return -1
	}
	return n
}

// seconds parses a non-negative number of seconds (a fraction allowed), -1 if missing or
// malformed.
func seconds(v string) time.Duration {
	s, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || !(s >= 0 && s <= maxWait.Seconds()) { // NaN too
		return -1
	}
	return time.Duration(s * float64(time.Second))
}

func clampWait(d time.Duration) time.Duration { return min(max(d, 0), maxWait) }
