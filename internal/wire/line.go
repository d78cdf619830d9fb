package wire

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// The line protocol (docs/protocol.md), byte-compatible with the DThrottle daemon's: a
// client sends a tag and '\n', the daemon answers exactly "OK\n" or "NO\n", in order;
// pipelining is allowed. Extensions live behind one reserved first character, '~':
//
//	~~TAG          the plain tag "~TAG" (a tag that begins with '~' is escaped by doubling it)
//	~OPTS TAG      options, comma-separated, then one space, then the tag:
//	                 n=N   take N permits (default 1)
//	                 v     answer with details: "OK r=REMAINING t=RESET_MS" or
//	                       "NO a=RETRY_AFTER_MS r=REMAINING t=RESET_MS"
//	                 w=MS  reserve: the permits may lie up to MS milliseconds ahead; the
//	                       answer is "OK d=DELAY_MS" (wait that long, then use them), with
//	                       r= and t= too if v is given
//	                 T     add the decision's time: "at=NS", the permit's slot in the back
//	                       end's time base (Redis TIME for the redis back end), for audits
//	                 p=MS  penalize: hold the tag back for MS milliseconds (a 429 with
//	                       Retry-After seen by a worker); answered "OK"
//	                 c=CLASS  the query's priority: critical, standard (the default) or
//	                       sheddable (docs/priorities.md)
//
// An extension line that cannot be read is answered "ER reason". A plain line is only
// ever answered OK or NO: an empty tag, a tag with control characters or one that is not
// UTF-8 gets NO. This file is the protocol's one codec: the daemon reads queries and
// writes answers with it, the client writes queries and reads answers.

// EscapeChar is the protocol's reserved first character.
const EscapeChar = '~'

// Bounds of the options.
const (
	MaxN         = 1 << 40              // n=
	MaxWaitMs    = 24 * 3600 * 1000     // w=: a day
	MaxPenaltyMs = 7 * 24 * 3600 * 1000 // p=: a week
)

// Query is one query line.
type Query struct {
	Tag       []byte // ParseQuery: aliases the line, valid until the line's buffer is reused
	N         int64  // permits; 1 unless n= says otherwise
	Verbose   bool   // v: answer with details
	Stamp     bool   // T: answer with the decision's time
	WaitMs    int64  // w=: how far ahead a reservation may lie; 0: now or not at all
	PenaltyMs int64  // p=: a penalty instead of a decision; 0: a decision
	// Expired (x): a report instead of a decision: N permits of a reservation for the tag
	// came too late to be used (past the client's margin) and were not used.
	Expired bool
	// Priority (c=): 1 critical, 0 standard (the default), -1 sheddable, as
	// sluice.Priority.
	Priority int8
}

// Plain reports whether q needs no option: it travels as the bare tag.
func (q Query) Plain() bool {
	return q.N == 1 && !q.Verbose && !q.Stamp && q.WaitMs == 0 && q.PenaltyMs == 0 && !q.Expired && q.Priority == 0
}

// Errors of extension lines, answered "ER ..." (plain lines never error).
var (
	ErrBadOptions = errors.New("bad options: want ~OPTS TAG with OPTS such as n=5,v or w=500 or p=1000 or c=critical")
	ErrNoTag      = errors.New("no tag after the options")
	ErrBadTag     = errors.New("bad tag: empty, not UTF-8, or with control characters")
)

// ParseQuery reads one line (without its '\n'; a trailing '\r' is dropped). ok is false
// for a plain line that must be answered NO; err is set for an extension line that must
// be answered "ER err". It allocates nothing.
func ParseQuery(line []byte) (q Query, ok bool, err error) {
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	q.N = 1
	if len(line) == 0 || line[0] != EscapeChar {
		q.Tag = line
		return q, ValidTag(line), nil
	}
	if len(line) > 1 && line[1] == EscapeChar {
		q.Tag = line[1:]
		return q, ValidTag(q.Tag), nil
	}
	sp := bytes.IndexByte(line, ' ')
	if sp < 0 {
		return q, false, ErrNoTag
	}
	opts, tag := line[1:sp], line[sp+1:]
	if len(opts) == 0 {
		return q, false, ErrBadOptions
	}
	for len(opts) > 0 {
		var opt []byte
		opt, opts, _ = bytes.Cut(opts, []byte{','})
		switch {
		case len(opt) == 1 && opt[0] == 'v':
			q.Verbose = true
		case len(opt) == 1 && opt[0] == 'T':
			q.Stamp = true
		case len(opt) == 1 && opt[0] == 'x':
			q.Expired = true
		case len(opt) > 2 && opt[0] == 'n' && opt[1] == '=':
			n, perr := strconv.ParseInt(string(opt[2:]), 10, 64)
			if perr != nil || n < 0 || n > MaxN {
				return q, false, ErrBadOptions
			}
			q.N = n
		case len(opt) > 2 && opt[0] == 'w' && opt[1] == '=':
			ms, perr := strconv.ParseInt(string(opt[2:]), 10, 64)
			if perr != nil || ms < 0 || ms > MaxWaitMs {
				return q, false, ErrBadOptions
			}
			q.WaitMs = ms
		case len(opt) > 2 && opt[0] == 'c' && opt[1] == '=':
			switch string(opt[2:]) {
			case "critical":
				q.Priority = 1
			case "standard":
				q.Priority = 0
			case "sheddable":
				q.Priority = -1
			default:
				return q, false, ErrBadOptions
			}
		case len(opt) > 2 && opt[0] == 'p' && opt[1] == '=':
			ms, perr := strconv.ParseInt(string(opt[2:]), 10, 64)
			if perr != nil || ms <= 0 || ms > MaxPenaltyMs {
				return q, false, ErrBadOptions
			}
			q.PenaltyMs = ms
		default:
			return q, false, ErrBadOptions
		}
	}
	if q.Expired && (q.Verbose || q.Stamp || q.WaitMs > 0 || q.PenaltyMs > 0 || q.N == 0 || q.Priority != 0) {
		return q, false, ErrBadOptions // a report takes n= alone
	}
	if !ValidTag(tag) {
		return q, false, ErrBadTag
	}
	q.Tag = tag
	return q, true, nil
}

// AppendQuery writes q's line, '\n' included: the bare tag (a leading '~' doubled) when q
// is plain, else its options. The tag must be valid (ValidTag) and the options within
// their bounds; AppendQuery does not check.
func AppendQuery(dst []byte, q Query) []byte {
	if q.Plain() {
		if len(q.Tag) > 0 && q.Tag[0] == EscapeChar {
			dst = append(dst, EscapeChar)
		}
		dst = append(dst, q.Tag...)
		return append(dst, '\n')
	}
	dst = append(dst, EscapeChar)
	sep := false
	opt := func(s string) {
		if sep {
			dst = append(dst, ',')
		}
		sep = true
		dst = append(dst, s...)
	}
	if q.PenaltyMs > 0 {
		opt("p=")
		dst = strconv.AppendInt(dst, q.PenaltyMs, 10)
	}
	if q.Expired {
		opt("x")
	}
	if q.N != 1 {
		opt("n=")
		dst = strconv.AppendInt(dst, q.N, 10)
	}
	if q.WaitMs > 0 {
		opt("w=")
		dst = strconv.AppendInt(dst, q.WaitMs, 10)
	}
	switch {
	case q.Priority > 0:
		opt("c=critical")
	case q.Priority < 0:
		opt("c=sheddable")
	}
	if q.Verbose {
		opt("v")
	}
	if q.Stamp {
		opt("T")
	}
	dst = append(dst, ' ')
	dst = append(dst, q.Tag...)
	return append(dst, '\n')
}

// Answer is one answer line.
type Answer struct {
	Allowed bool
	// DelayMs: for a reservation (w=), how long to wait before using the permits; -1 when
	// no reservation was asked (nothing is written).
	DelayMs int64
	// Verbose: RetryMs (denials only), Remaining and ResetMs are written.
	Verbose   bool
	RetryMs   int64
	Remaining int64
	ResetMs   int64
	// At: the decision's slot in the back end's time base (T); -1: none.
	At int64
	// Why (verbose answers only) says what decided where no limit did: WhyNoRule,
	// WhyUnlimited, WhyDeny, WhyDown; "" for a limit's decision.
	Why string
}

// The reasons a verbose answer may carry (why=...), where no limit decided.
const (
	WhyNoRule    = "no-rule"   // no rule matches the tag: allowed, not limited
	WhyUnlimited = "unlimited" // its rule is unlimited: allowed
	WhyDeny      = "deny"      // its rule denies every request
	WhyDown      = "down"      // the back end could not decide: the fail mode answered
)

// AppendAnswer writes a's line, '\n' included.
func AppendAnswer(dst []byte, a Answer) []byte {
	if a.Allowed {
		dst = append(dst, "OK"...)
		if a.DelayMs >= 0 {
			dst = append(dst, " d="...)
			dst = strconv.AppendInt(dst, a.DelayMs, 10)
		}
	} else {
		dst = append(dst, "NO"...)
	}
	if a.Verbose {
		if !a.Allowed {
			dst = append(dst, " a="...)
			dst = strconv.AppendInt(dst, a.RetryMs, 10)
		}
		dst = append(dst, " r="...)
		dst = strconv.AppendInt(dst, a.Remaining, 10)
		dst = append(dst, " t="...)
		dst = strconv.AppendInt(dst, a.ResetMs, 10)
		if a.Why != "" {
			dst = append(dst, " why="...)
			dst = append(dst, a.Why...)
		}
	}
	if a.At >= 0 && a.Allowed {
		dst = append(dst, " at="...)
		dst = strconv.AppendInt(dst, a.At, 10)
	}
	return append(dst, '\n')
}

// AppendRefusal writes an "ER reason" line.
func AppendRefusal(dst []byte, reason string) []byte {
	dst = append(dst, "ER "...)
	dst = append(dst, reason...)
	return append(dst, '\n')
}

// RefusedError is an "ER reason" answer: the daemon refused the query.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return "the daemon refused the query: " + e.Reason }

// ParseAnswer reads one answer line (without its '\n'). An "ER reason" line is a
// *RefusedError; fields it does not know are skipped, so that a newer daemon may add some.
func ParseAnswer(b []byte) (Answer, error) {
	a := Answer{DelayMs: -1, At: -1}
	switch {
	case bytes.HasPrefix(b, []byte("OK")):
		a.Allowed = true
	case bytes.HasPrefix(b, []byte("NO")):
	case bytes.HasPrefix(b, []byte("ER")):
		return a, &RefusedError{Reason: string(bytes.TrimSpace(b[2:]))}
	default:
		return a, fmt.Errorf("unreadable answer %q", b)
	}
	for _, f := range bytes.Fields(b[2:]) {
		k, v, ok := bytes.Cut(f, []byte("="))
		if !ok {
			continue
		}
		if string(k) == "why" {
			a.Why = string(v)
			continue
		}
		x, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			continue
		}
		switch string(k) {
		case "d":
			a.DelayMs = x
		case "a":
			a.RetryMs, a.Verbose = x, true
		case "r":
			a.Remaining, a.Verbose = x, true
		case "t":
			a.ResetMs, a.Verbose = x, true
		case "at":
			a.At = x
		}
	}
	return a, nil
}
