package sluice

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/backend"
)

// Errors the limiter returns, for errors.Is. A failure of the backend is declared where it
// arises, in package backend (backend.ErrClosed, backend.ErrTooManyKeys,
// backend.ErrUnavailable with *backend.UnavailableError, backend.ErrUnsupported), and a
// cost above the burst in package gcra (gcra.ErrCostExceedsBurst).
var (
	// ErrThrottled: the request was not granted within the bound the caller set (a
	// pessimistic call, or a wait longer than allowed). Errors wrapping it are
	// *ThrottledError values carrying RetryAfter.
	ErrThrottled = errors.New("sluice: throttled")
	// ErrPermitExpired: a reserved permit came to be used later than the margin allows
	// (its caller was paused, its machine stalled). Used now, it could reach the API too
	// close to the next one, so Reservation.Wait gave it back instead. The lateness
	// allowed is what the limit tolerates less half the margin, and at most the margin:
	// half the margin with burst 1 (see WithMargin). The caller may ask again.
	ErrPermitExpired = errors.New("sluice: permit expired")
	// ErrBadLimit is wrapped by every *LimitError.
	ErrBadLimit = errors.New("sluice: bad limit")
)

// ThrottledError is a denial reported as an error (Wait, Do, Wrap). It matches
// ErrThrottled with errors.Is.
type ThrottledError struct {
	Key        string
	RetryAfter time.Duration // when the same request could be granted at once
}

// Error says which key was throttled and when to ask again.
func (e *ThrottledError) Error() string {
	return fmt.Sprintf("sluice: throttled: key %q: retry after %v", e.Key, e.RetryAfter)
}

// Is reports whether target is ErrThrottled.
func (e *ThrottledError) Is(target error) bool { return target == ErrThrottled }

// LimitError reports a limit that cannot be parsed or used, naming the bad part.
type LimitError struct {
	Input  string // the whole text given
	Part   string // the part that is wrong
	Reason string
}

// Error names the limit, what is wrong in it and where, with the text form's grammar.
func (e *LimitError) Error() string {
	return fmt.Sprintf("sluice: bad limit %q: %s", e.Input, e.Detail())
}

// Detail is what is wrong, naming the bad part once (not the whole limit, which the
// caller may already name: a flag's value), with the text form's grammar.
func (e *LimitError) Detail() string {
	const grammar = " (want RATE/PERIOD [burst=N | window] [ramp=RATE/PERIOD..DURATION], e.g. 100/s, 1/6s, 10/s burst=20, 10000/24h window, 100/s ramp=10/s..60s)"
	if e.Part == "" || e.Part == e.Input {
		return e.Reason + grammar
	}
	return fmt.Sprintf("%s: %q%s", e.Reason, e.Part, grammar)
}

// Unwrap returns ErrBadLimit.
func (e *LimitError) Unwrap() error { return ErrBadLimit }

// errZero is what a zero Limiter answers: it has no limits and no backend.
var errZero = fmt.Errorf("%w: a zero Limiter decides nothing: make one with New", backend.ErrClosed)
