package strict

// The package's errors: the values callers test for with errors.Is, the error types, and
// which failures mean that Redis could not decide.

import (
	"errors"
	"fmt"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend"
)

// Every failure to get an answer from Redis in time (a connection error, no answer within
// the time-out, a Redis that is loading or without a master, or the circuit breaker open
// after such a failure) wraps backend.ErrUnavailable; the limiter's fail mode answers it.
var (
	// ErrMixedWindows: the strict mode on Redis decides a key's windowed quotas only when
	// all its limits are windows.
	ErrMixedWindows = fmt.Errorf("%w: the strict mode on Redis decides a windowed quota only beside other windowed quotas, not beside a rate", backend.ErrUnsupported)
)

// ReplyError is an answer from Redis that the backend cannot use: an error raised by the
// script (bad arguments, a key holding another state format) or a reply of the wrong
// shape. It is not a sign that Redis is down.
type ReplyError struct {
	Op    string // the script operation: decide, allow, settle, penalize, probe
	Key   string
	Reply any   // the reply received, if it had the wrong shape
	Err   error // the error Redis returned, if any
}

// Error names the operation, the key, and the error or the reply received.
func (e *ReplyError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("sluice redis: %s %q: %v", e.Op, e.Key, e.Err)
	}
	return fmt.Sprintf("sluice redis: %s %q: unexpected reply %#v", e.Op, e.Key, e.Reply)
}

// Unwrap returns the error Redis returned, if any.
func (e *ReplyError) Unwrap() error { return e.Err }

// unavailable reports whether err means that Redis could not decide (as opposed to a
// decision refused because of its arguments).
func unavailable(err error) bool {
	if err == nil {
		return false
	}
	var rerr goredis.Error
	if errors.As(err, &rerr) && !errors.Is(err, goredis.ErrClosed) {
		msg := rerr.Error()
		for _, p := range []string{"LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "OOM", "NOREPLICAS"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	// Anything else is the connection's: refused, reset, closed, timed out.
	return true
}

// scriptError is an error the script reported for one record: a key holding another state
// format, or a value that is not a string. It is Redis' answer, not a sign that Redis is
// down.
type scriptError string

func (e scriptError) Error() string { return string(e) }

// RedisError marks it as an error from Redis (goredis.Error).
func (scriptError) RedisError() {}
