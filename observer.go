package sluice

import (
	"time"

	"github.com/sluicehq/sluice/backend"
)

// Event is what an observer (WithObserver) is told. It is passed by value and holds no
// reference the observer must release.
type Event struct {
	Kind     EventKind
	Key      string
	N        int64
	Decision Decision
	Latency  time.Duration // time the backend took to decide
	Wait     time.Duration // the wait or penalty length
	Err      error
	FailMode backend.FailMode
}

// EventKind says what an Event reports.
type EventKind int

const (
	// EventDecision: a request was decided (Decision, Latency, Err set).
	EventDecision EventKind = iota
	// EventWait: a caller starts waiting for a reserved permit (Wait set), or gave up the
	// wait (Err set to the context's error).
	EventWait
	// EventError: the backend failed and the fail mode answered (Err, FailMode set).
	EventError
	// EventPenalty: Penalize held the key back for Wait.
	EventPenalty
	// EventSettle: a reservation was cancelled (N = 0) or settled to N.
	EventSettle
	// EventExpired: a reserved permit came to be used later than the margin allows (its
	// caller was paused, its machine stalled), so it was not used (Wait set to how late it
	// was); see ErrPermitExpired.
	EventExpired
)

// String returns the kind's name: "decision", "wait", "error", "penalty", "settle" or
// "expired".
func (k EventKind) String() string {
	switch k {
	case EventDecision:
		return "decision"
	case EventWait:
		return "wait"
	case EventError:
		return "error"
	case EventPenalty:
		return "penalty"
	case EventSettle:
		return "settle"
	case EventExpired:
		return "expired"
	}
	return "unknown"
}
