package sluice

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/limitconv"
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
// Two other kinds of limit are written the same way:
//
//   - A windowed quota ("10000/24h window", Window set): at most Rate permits in each fixed
//     window of Period, the windows aligned to whole multiples of Period since the Unix
//     epoch, so that a daily quota resets at 00:00 UTC and an hourly one on the hour, as
//     an API that counts per calendar window does. What a window leaves unused does not
//     carry over. Its burst is its count (Burst is Rate).
//   - A ramp ("100/s ramp=10/s..60s", Ramp set): the limit starts at Ramp's rate (the
//     burst scaled alike) and rises linearly to Rate/Period over Ramp.Over, from when the
//     limit takes effect (New or SetLimits); after that it is the plain limit.
//
// The text form, shared by every interface of Sluice, is RATE/PERIOD with optional
// options: "100/s", "4500/h", "1/6s", "10/s burst=20", "2/1500ms", "10000/24h window",
// "100/s ramp=10/s..60s". See Parse. In code, a limit is parsed (MustParse("10/s
// burst=20")) or written as a literal (Limit{Rate: 10, Period: time.Second, Burst: 20}).
type Limit struct {
	Rate   int64         // permits per Period, > 0
	Period time.Duration // > 0
	Burst  int64         // permits at once; 0 means Rate
	Window bool          // a quota of Rate per fixed window of Period (see above)
	Ramp   Ramp          // the zero value: no ramp
}

// Ramp is where a limit starts and how long it takes to rise to its full rate: Rate
// permits per Period at first, the limit's own rate Over later. Its zero value is no ramp.
type Ramp struct {
	Rate   int64         // permits per Period at the start, > 0 and no faster than the limit
	Period time.Duration // > 0
	Over   time.Duration // > 0
}

// text is the ramp's text form without the "ramp=": "10/s..1m".
func (r Ramp) text() string {
	return strconv.FormatInt(r.Rate, 10) + "/" + formatPeriod(r.Period) + ".." + formatDuration(r.Over)
}

// Limits is the set of limits one key carries: a permit needs all of them ("100/s burst=20;
// 4500/h; 50000/24h"). At most gcra.MaxLimits.
type Limits []Limit

// validate reports whether l is usable, naming the bad part.
func (l Limit) validate() error {
	switch {
	case l.Rate <= 0:
		return &LimitError{Input: l.String(), Part: strconv.FormatInt(l.Rate, 10), Reason: "the rate must be a positive whole number"}
	case l.Period <= 0:
		return &LimitError{Input: l.String(), Part: l.Period.String(), Reason: "the period must be positive"}
	case int64(l.Period) < l.Rate:
		return &LimitError{Input: l.String(), Part: l.String(), Reason: "faster than one permit a nanosecond"}
	case l.Burst < 0:
		return &LimitError{Input: l.String(), Part: strconv.FormatInt(l.Burst, 10), Reason: "the burst must be positive"}
	case limitconv.Burst(l) > gcra.MaxTau/int64(limitconv.Interval(l)+1):
		return &LimitError{Input: l.String(), Part: strconv.FormatInt(limitconv.Burst(l), 10), Reason: "the burst times the interval must stay under 36 years"}
	case l.Window && l.Burst != 0 && l.Burst != l.Rate:
		return &LimitError{Input: l.String(), Part: "burst=" + strconv.FormatInt(l.Burst, 10), Reason: "a windowed quota has no burst of its own (its count is its rate)"}
	case l.Window && int64(l.Period) > gcra.MaxTau:
		return &LimitError{Input: l.String(), Part: formatPeriod(l.Period), Reason: "a window must be shorter than 36 years"}
	case l.Window && l.Ramp != (Ramp{}):
		return &LimitError{Input: l.String(), Part: "ramp=" + l.Ramp.text(), Reason: "a windowed quota cannot ramp"}
	case l.Ramp != (Ramp{}):
		return l.Ramp.validate(l)
	}
	return nil
}

func (r Ramp) validate(l Limit) error {
	bad := func(reason string) error {
		return &LimitError{Input: l.String(), Part: "ramp=" + r.text(), Reason: reason}
	}
	switch {
	case r.Rate <= 0 || r.Period <= 0 || r.Over <= 0:
		return bad("a ramp needs a positive start rate and duration")
	case int64(r.Period) < r.Rate:
		return bad("the ramp starts faster than one permit a nanosecond")
	}
	// r.Rate/r.Period <= l.Rate/l.Period, exactly: r.Rate*l.Period <= l.Rate*r.Period.
	ah, al := bits.Mul64(uint64(r.Rate), uint64(l.Period))
	bh, bl := bits.Mul64(uint64(l.Rate), uint64(r.Period))
	if ah > bh || ah == bh && al > bl {
		return bad("a ramp must start no faster than the limit it rises to")
	}
	return nil
}

// String returns the text form, which Parse reads back to the same Limit.
func (l Limit) String() string {
	var sb strings.Builder
	sb.WriteString(strconv.FormatInt(l.Rate, 10))
	sb.WriteByte('/')
	sb.WriteString(formatPeriod(l.Period))
	if l.Burst != 0 && l.Burst != l.Rate {
		sb.WriteString(" burst=")
		sb.WriteString(strconv.FormatInt(l.Burst, 10))
	}
	if l.Window {
		sb.WriteString(" window")
	}
	if l.Ramp != (Ramp{}) {
		sb.WriteString(" ramp=")
		sb.WriteString(l.Ramp.text())
	}
	return sb.String()
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
		if err := l.validate(); err != nil {
			return err
		}
	}
	return nil
}

// Parse reads one or more limits joined with ";": "100/s burst=20; 4500/h". Each is in
// the text form: RATE/PERIOD, where RATE is a positive whole number and PERIOD a unit (ns,
// us, ms, s, m, h, d, or second, minute, hour, day) with an optional count before it
// ("6s", "1500ms", "24h"), then optionally "burst=N", and "window" for a windowed quota
// ("10000/24h window") or "ramp=RATE/PERIOD..DURATION" for a ramp ("100/s
// ramp=10/s..60s": from 10/s to 100/s over 60 s; DURATION is a count and a unit as in a
// period, "90s", "5m", "1h").
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

func parseOne(input, s string) (Limit, error) {
	bad := func(part, reason string) (Limit, error) {
		return Limit{}, &LimitError{Input: input, Part: part, Reason: reason}
	}
	fields := strings.Fields(s)
	if len(fields) == 0 {
		if strings.Contains(input, ";") {
			return bad("", "an empty limit between or after ';' (write '10/s', or '10/s; 1000/h')")
		}
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
		switch {
		case f == "window":
			if l.Window {
				return bad(f, "window given twice")
			}
			l.Window = true
		case ok && k == "burst":
			if l.Burst != 0 {
				return bad(f, "burst given twice")
			}
			b, err := strconv.ParseInt(v, 10, 64)
			if err != nil || b <= 0 {
				return bad(v, "the burst must be a positive whole number")
			}
			l.Burst = b
		case ok && k == "ramp":
			if l.Ramp != (Ramp{}) {
				return bad(f, "ramp given twice")
			}
			r, err := parseRamp(v)
			if err != nil {
				return bad(v, err.Error())
			}
			l.Ramp = r
		default:
			return bad(f, "unknown option (the options are burst=N, window and ramp=RATE/PERIOD..DURATION)")
		}
	}
	if l.Window && l.Burst != 0 {
		return bad("burst="+strconv.FormatInt(l.Burst, 10), "a windowed quota has no burst of its own (its count is its rate)")
	}
	if l.Burst == 0 {
		l.Burst = l.Rate
	}
	return l, nil
}

// parseRamp reads RATE/PERIOD..DURATION.
func parseRamp(s string) (Ramp, error) {
	from, over, ok := strings.Cut(s, "..")
	if !ok {
		return Ramp{}, errors.New("a ramp is RATE/PERIOD..DURATION, e.g. ramp=10/s..60s")
	}
	rate, period, ok := strings.Cut(from, "/")
	if !ok {
		return Ramp{}, errors.New("no '/' in the ramp's start rate (e.g. ramp=10/s..60s)")
	}
	r, err := strconv.ParseInt(rate, 10, 64)
	if err != nil || r <= 0 {
		return Ramp{}, errors.New("the ramp's start rate must be a positive whole number")
	}
	p, err := parsePeriod(period)
	if err != nil {
		return Ramp{}, fmt.Errorf("the ramp's period: %w", err)
	}
	if over == "" || over[0] < '0' || over[0] > '9' {
		return Ramp{}, errors.New("the ramp's duration must be a count and a unit (e.g. 60s)")
	}
	d, err := parsePeriod(over)
	if err != nil {
		return Ramp{}, fmt.Errorf("the ramp's duration: %w", err)
	}
	return Ramp{Rate: r, Period: p, Over: d}, nil
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

// formatDuration writes d in the largest unit that divides it, with its count ("1m").
func formatDuration(d time.Duration) string {
	p := formatPeriod(d)
	if p != "" && (p[0] < '0' || p[0] > '9') {
		return "1" + p
	}
	return p
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
