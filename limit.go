package sluice

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gcra"
)

// Limit is one rate limit: Rate permits per Period, with up to Burst permits at once after
// an idle spell. Burst = 1 is the strict "at most one every Period/Rate";
// Burst = Rate (the default when a limit is parsed or built without a burst) lets a full
// period's worth go at once, as Heroku's 4,500 an hour does.
//
// Conformance: over every window of length w, at most Burst + floor(w/T) permits are
// granted, where T = Period/Rate is the emission interval (rounded up to a whole
// nanosecond, so a limit is never exceeded by rounding).
//
// The text form, shared by every interface of Sluice, is RATE/PERIOD with an optional
// burst: "100/s", "4500/h", "1/6s", "10/s burst=20", "2/1500ms". See ParseLimit.
type Limit struct {
	Rate   int64         // permits per Period, > 0
	Period time.Duration // > 0
	Burst  int64         // permits at once; 0 means Rate
}

// Limits is the set of limits one key carries: a permit needs all of them ("100/s burst=20;
// 4500/h; 50000/24h"). At most gcra.MaxLimits.
type Limits []Limit

// PerSecond returns rate permits a second, with a burst of rate.
func PerSecond(rate int64) Limit { return Limit{Rate: rate, Period: time.Second, Burst: rate} }

// PerMinute returns rate permits a minute, with a burst of rate.
func PerMinute(rate int64) Limit { return Limit{Rate: rate, Period: time.Minute, Burst: rate} }

// PerHour returns rate permits an hour, with a burst of rate.
func PerHour(rate int64) Limit { return Limit{Rate: rate, Period: time.Hour, Burst: rate} }

// Every returns one permit every d, with a burst of one: "at most one request every d".
func Every(d time.Duration) Limit { return Limit{Rate: 1, Period: d, Burst: 1} }

// WithBurst returns a copy of l with the given burst.
func (l Limit) WithBurst(burst int64) Limit { l.Burst = burst; return l }

// Limits returns l as a one-element Limits.
func (l Limit) Limits() Limits { return Limits{l} }

// burst is l.Burst with the default applied.
func (l Limit) burst() int64 {
	if l.Burst == 0 {
		return l.Rate
	}
	return l.Burst
}

// Interval is the emission interval T = Period/Rate, rounded up to a whole nanosecond.
func (l Limit) Interval() time.Duration {
	if l.Rate <= 0 {
		return 0
	}
	return time.Duration((int64(l.Period) + l.Rate - 1) / l.Rate)
}

// Validate reports whether l is usable, naming the bad part.
func (l Limit) Validate() error {
	switch {
	case l.Rate <= 0:
		return &LimitError{Input: l.String(), Part: strconv.FormatInt(l.Rate, 10), Reason: "the rate must be a positive whole number"}
	case l.Period <= 0:
		return &LimitError{Input: l.String(), Part: l.Period.String(), Reason: "the period must be positive"}
	case int64(l.Period) < l.Rate:
		return &LimitError{Input: l.String(), Part: l.String(), Reason: "faster than one permit a nanosecond"}
	case l.Burst < 0:
		return &LimitError{Input: l.String(), Part: strconv.FormatInt(l.Burst, 10), Reason: "the burst must be positive"}
	case l.burst() > gcra.MaxTau/int64(l.Interval()+1):
		return &LimitError{Input: l.String(), Part: strconv.FormatInt(l.burst(), 10), Reason: "the burst times the interval must stay under 36 years"}
	}
	return nil
}

// Core returns the limit in the GCRA core's units, tightened by a jitter tolerance
// (docs/concepts.md): with Burst > 1, ceil(margin/T) permits of the burst are held in reserve;
// with Burst = 1 (or once the reserve would take the whole burst), permits are spaced T
// plus the rest of the margin apart. A zero margin gives the limit exactly.
func (l Limit) Core(margin time.Duration) gcra.Limit {
	t := int64(l.Interval())
	b := l.burst()
	m := int64(max(margin, 0))
	if m == 0 {
		return gcra.Limit{T: t, Tau: b * t}
	}
	if k := (m + t - 1) / t; k < b {
		return gcra.Limit{T: t, Tau: (b - k) * t}
	}
	t2 := t + m - (b-1)*t
	return gcra.Limit{T: t2, Tau: t2}
}

// String returns the text form, which ParseLimit reads back to the same Limit.
func (l Limit) String() string {
	var sb strings.Builder
	sb.WriteString(strconv.FormatInt(l.Rate, 10))
	sb.WriteByte('/')
	sb.WriteString(formatPeriod(l.Period))
	if l.Burst != 0 && l.Burst != l.Rate {
		sb.WriteString(" burst=")
		sb.WriteString(strconv.FormatInt(l.Burst, 10))
	}
	return sb.String()
}

// MarshalText implements encoding.TextMarshaler with the text form.
func (l Limit) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseLimit.
func (l *Limit) UnmarshalText(b []byte) error {
	v, err := ParseLimit(string(b))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

// String joins the limits' text forms with "; ".
func (ls Limits) String() string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = l.String()
	}
	return strings.Join(parts, "; ")
}

// MarshalText implements encoding.TextMarshaler with the text form.
func (ls Limits) MarshalText() ([]byte, error) { return []byte(ls.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with Parse.
func (ls *Limits) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*ls = v
	return nil
}

// Validate checks every limit and their number.
func (ls Limits) Validate() error {
	if len(ls) == 0 {
		return &LimitError{Reason: "no limit given"}
	}
	if len(ls) > gcra.MaxLimits {
		return &LimitError{Input: ls.String(), Part: ls.String(), Reason: fmt.Sprintf("more than %d limits on one key", gcra.MaxLimits)}
	}
	for _, l := range ls {
		if err := l.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// Core returns the limits in the GCRA core's units, each tightened by margin.
func (ls Limits) Core(margin time.Duration) []gcra.Limit {
	out := make([]gcra.Limit, len(ls))
	for i, l := range ls {
		out[i] = l.Core(margin)
	}
	return out
}

// ErrBadLimit is wrapped by every *LimitError.
var ErrBadLimit = errors.New("sluice: bad limit")

// LimitError reports a limit that cannot be parsed or used, naming the bad part.
type LimitError struct {
	Input  string // the whole text given
	Part   string // the part that is wrong
	Reason string
}

func (e *LimitError) Error() string {
	if e.Part == "" {
		return fmt.Sprintf("sluice: bad limit %q: %s (want RATE/PERIOD [burst=N], e.g. 100/s, 4500/h, 1/6s, 10/s burst=20)", e.Input, e.Reason)
	}
	return fmt.Sprintf("sluice: bad limit %q: %q: %s (want RATE/PERIOD [burst=N], e.g. 100/s, 4500/h, 1/6s, 10/s burst=20)", e.Input, e.Part, e.Reason)
}

// Unwrap returns ErrBadLimit.
func (e *LimitError) Unwrap() error { return ErrBadLimit }

// Parse reads one or more limits joined with ";": "100/s burst=20; 4500/h".
func Parse(s string) (Limits, error) {
	var ls Limits
	for part := range strings.SplitSeq(s, ";") {
		l, err := parseOne(s, part)
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
	}
	if err := ls.Validate(); err != nil {
		if le, ok := err.(*LimitError); ok {
			le.Input = s
		}
		return nil, err
	}
	return ls, nil
}

// MustParse is Parse that panics on error, for limits fixed in code.
func MustParse(s string) Limits {
	ls, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return ls
}

// ParseLimit reads one limit in the text form: RATE/PERIOD, where RATE is a positive whole
// number and PERIOD a unit (ns, us, ms, s, m, h, d, or second, minute, hour, day) with an
// optional count before it ("6s", "1500ms", "24h"), then optionally "burst=N".
func ParseLimit(s string) (Limit, error) {
	l, err := parseOne(s, s)
	if err != nil {
		return Limit{}, err
	}
	if err := l.Validate(); err != nil {
		if le, ok := err.(*LimitError); ok {
			le.Input = s
		}
		return Limit{}, err
	}
	return l, nil
}

func parseOne(input, s string) (Limit, error) {
	bad := func(part, reason string) (Limit, error) {
		return Limit{}, &LimitError{Input: input, Part: part, Reason: reason}
	}
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return bad("", "empty")
	}
	rate, period, ok := strings.Cut(fields[0], "/")
	if !ok {
		return bad(fields[0], "no '/' between rate and period")
	}
	var l Limit
	r, err := strconv.ParseInt(rate, 10, 64)
	if err != nil || r <= 0 {
		return bad(rate, "the rate must be a positive whole number")
	}
	l.Rate = r
	p, err := parsePeriod(period)
	if err != nil {
		return bad(period, err.Error())
	}
	l.Period = p
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k != "burst" {
			return bad(f, "unknown option (the only one is burst=N)")
		}
		if l.Burst != 0 {
			return bad(f, "burst given twice")
		}
		b, err := strconv.ParseInt(v, 10, 64)
		if err != nil || b <= 0 {
			return bad(v, "the burst must be a positive whole number")
		}
		l.Burst = b
	}
	if l.Burst == 0 {
		l.Burst = l.Rate
	}
	return l, nil
}

var units = map[string]time.Duration{
	"ns": time.Nanosecond, "us": time.Microsecond, "µs": time.Microsecond, "ms": time.Millisecond,
	"s": time.Second, "sec": time.Second, "second": time.Second,
	"m": time.Minute, "min": time.Minute, "minute": time.Minute,
	"h": time.Hour, "hr": time.Hour, "hour": time.Hour,
	"d": 24 * time.Hour, "day": 24 * time.Hour,
}

func parsePeriod(s string) (time.Duration, error) {
	if s == "" {
		return 0, errors.New("no period after '/'")
	}
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	unit, ok := units[s[i:]]
	if !ok {
		return 0, errors.New("unknown period unit (use ns, us, ms, s, m, h or d)")
	}
	if i == 0 {
		return unit, nil
	}
	n, err := strconv.ParseInt(s[:i], 10, 64)
	if err != nil || n <= 0 {
		return 0, errors.New("the period count must be a positive whole number")
	}
	if n > int64(1<<62)/int64(unit) {
		return 0, errors.New("the period is too long")
	}
	return time.Duration(n) * unit, nil
}

// formatPeriod writes d in the largest unit that divides it, omitting a count of one.
func formatPeriod(d time.Duration) string {
	if d <= 0 {
		return d.String()
	}
	for _, u := range []struct {
		name string
		d    time.Duration
	}{{"h", time.Hour}, {"m", time.Minute}, {"s", time.Second}, {"ms", time.Millisecond}, {"us", time.Microsecond}, {"ns", time.Nanosecond}} {
		if d%u.d == 0 {
			if d == u.d {
				return u.name
			}
			return strconv.FormatInt(int64(d/u.d), 10) + u.name
		}
	}
	return d.String()
}
