package server

import (
	"errors"
	"strconv"

	"github.com/sluicehq/sluice/internal/wire"
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
//
// An extension line that cannot be read is answered "ER reason". A plain line is only
// ever answered OK or NO: an empty tag, a tag with control characters or one that is not
// UTF-8 gets NO.

// EscapeChar is the protocol's reserved first character.
const EscapeChar = '~'

// query is one parsed line.
type query struct {
	tag      []byte // aliases the line: valid until the next read
	n        int64
	verbose  bool
	stamp    bool  // answer with the decision's time
	wait     int64 // milliseconds a reservation may lie ahead; 0: now or not at all
	penalize int64 // milliseconds; 0: a decision
}

// errors of extension lines, answered "ER ..." (plain lines never error).
var (
	errBadOptions = errors.New("bad options: want ~OPTS TAG with OPTS such as n=5,v or w=500 or p=1000")
	errNoTag      = errors.New("no tag after the options")
	errBadTag     = errors.New("bad tag: empty, not UTF-8, or with control characters")
)

// parseLine reads one line (without its '\n'; a trailing '\r' is dropped). ok is false for
// a plain line that must be answered NO; err is set for an extension line that must be
// answered "ER err".
func parseLine(line []byte) (q query, ok bool, err error) {
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	q.n = 1
	if len(line) == 0 || line[0] != EscapeChar {
		q.tag = line
		return q, wire.ValidTag(line), nil
	}
	if len(line) > 1 && line[1] == EscapeChar {
		q.tag = line[1:]
		return q, wire.ValidTag(q.tag), nil
	}
	// ~OPTS TAG
	sp := -1
	for i, c := range line {
		if c == ' ' {
			sp = i
			break
		}
	}
	if sp < 0 {
		return q, false, errNoTag
	}
	opts, tag := line[1:sp], line[sp+1:]
	if len(opts) == 0 {
		return q, false, errBadOptions
	}
	for len(opts) > 0 {
		var opt []byte
		opt, opts = cutByte(opts, ',')
		switch {
		case len(opt) == 1 && opt[0] == 'v':
			q.verbose = true
		case len(opt) == 1 && opt[0] == 'T':
			q.stamp = true
		case len(opt) > 2 && opt[0] == 'n' && opt[1] == '=':
			n, perr := strconv.ParseInt(string(opt[2:]), 10, 64)
			if perr != nil || n < 0 || n > 1<<40 {
				return q, false, errBadOptions
			}
			q.n = n
		case len(opt) > 2 && opt[0] == 'w' && opt[1] == '=':
			ms, perr := strconv.ParseInt(string(opt[2:]), 10, 64)
			if perr != nil || ms < 0 || ms > 24*3600*1000 {
				return q, false, errBadOptions
			}
			q.wait = ms
		case len(opt) > 2 && opt[0] == 'p' && opt[1] == '=':
			ms, perr := strconv.ParseInt(string(opt[2:]), 10, 64)
			if perr != nil || ms <= 0 || ms > 7*24*3600*1000 {
				return q, false, errBadOptions
			}
			q.penalize = ms
		default:
			return q, false, errBadOptions
		}
	}
	if !wire.ValidTag(tag) {
		return q, false, errBadTag
	}
	q.tag = tag
	return q, true, nil
}

func cutByte(b []byte, sep byte) (before, after []byte) {
	for i, c := range b {
		if c == sep {
			return b[:i], b[i+1:]
		}
	}
	return b, nil
}

// appendAnswer writes a decision's answer. delayMs < 0 means no reservation was asked;
// at < 0 no time stamp.
func appendAnswer(dst []byte, allowed, verbose bool, delayMs, remaining, retryMs, resetMs, at int64) []byte {
	if allowed {
		dst = append(dst, "OK"...)
		if delayMs >= 0 {
			dst = append(dst, " d="...)
			dst = strconv.AppendInt(dst, delayMs, 10)
		}
	} else {
		dst = append(dst, "NO"...)
	}
	if verbose {
		if !allowed {
			dst = append(dst, " a="...)
			dst = strconv.AppendInt(dst, retryMs, 10)
		}
		dst = append(dst, " r="...)
		dst = strconv.AppendInt(dst, remaining, 10)
		dst = append(dst, " t="...)
		dst = strconv.AppendInt(dst, resetMs, 10)
	}
	if at >= 0 && allowed {
		dst = append(dst, " at="...)
		dst = strconv.AppendInt(dst, at, 10)
	}
	return append(dst, '\n')
}
