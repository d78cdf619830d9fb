// Package backend is the contract between the public Limiter of package sluice and the
// places where decisions are made: in process (package local), in Redis, on leased
// capacity, or among gossiping peers. A backend decides GCRA requests for string keys;
// the limits come with each request, so one backend serves keys with different limits.
//
// Package backendtest holds the conformance suite that every backend runs.
package backend

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/priority"
)

// Errors a backend may return. The sluice package re-exports them.
var (
	// ErrClosed: the backend (or limiter) has been closed.
	ErrClosed = errors.New("sluice: closed")
	// ErrTooManyKeys: the backend holds its maximum number of keys, none of them idle, so a
	// new key cannot be tracked. The limiter's fail mode decides the answer.
	ErrTooManyKeys = errors.New("sluice: too many keys")
	// ErrUnavailable: the shared state the backend decides on (Redis, a lease store, the
	// daemon, the peers) could not be reached or did not answer in time. Backends wrap it
	// with what failed; the limiter answers it by its fail mode.
	ErrUnavailable = errors.New("sluice: unavailable")
	// ErrUnsupported: the backend cannot do what was asked (the daemon's protocol cannot
	// settle a reservation; a backend without Reset cannot forget a key).
	ErrUnsupported = errors.New("sluice: not supported by the backend")
)

// Request asks for N permits under Limits (already tightened by any safety margin).
type Request struct {
	Limits   []gcra.Limit  // 1 to gcra.MaxLimits limits; owned by the caller, read only
	N        int64         // permits wanted; 0 is a query
	MaxDelay time.Duration // how far ahead permits may be reserved; 0 is pessimistic
	// Core, when set, are the key's own limits, of which Limits keep part of each burst
	// for a higher class (Capabilities.ByValue; gcra.Limit.Keeping): the same rates, bursts
	// no larger. A backend that keeps more of a key than its limits' state (a share, an
	// owner) keeps it by Core and decides this request under Limits. nil: Limits are the
	// key's own. Owned by the caller, read only.
	Core []gcra.Limit
}

// Grant is a decision with the ticket that cancels or settles it. Ticket times are in the
// backend's own time base; callers use only the relative durations of the Result.
type Grant struct {
	gcra.Result
	Ticket gcra.Ticket
}

// Backend decides permits. Every method is safe for concurrent use, may block for I/O and
// honours ctx. Errors are either the caller's (gcra.ErrCostExceedsBurst,
// gcra.ErrInvalidCost, gcra.ErrInvalidLimits), ErrClosed, ErrTooManyKeys, or failures to
// reach shared state; the limiter applies its fail mode to the last kind.
type Backend interface {
	// Decide decides req for key and returns the grant or denial.
	Decide(ctx context.Context, key string, req Request) (Grant, error)
	// Adjust settles a grant to its real cost newN: 0 cancels it (the permits were not
	// used), less refunds what it safely can, more charges the difference at once.
	Adjust(ctx context.Context, key string, limits []gcra.Limit, t gcra.Ticket, newN int64) error
	// Penalize holds key back for d: nothing is granted before then, for any caller that
	// shares the backend's state (a 429 with Retry-After is news for the whole pool).
	Penalize(ctx context.Context, key string, limits []gcra.Limit, d time.Duration) error
	// Close releases the backend's resources and stops its goroutines. Later calls return
	// ErrClosed.
	Close() error
}

// Allower is an optional fast path a backend may offer: one permit under one limit, taken
// now or not at all, with no details of the decision. The limiter uses it for Allow when
// the key has one limit and no observer is set. Its answers must equal Decide's with
// N = 1 and MaxDelay = 0.
type Allower interface {
	AllowOne(ctx context.Context, key string, l gcra.Limit) (bool, error)
}

// Capabilities says which kinds of limit, beyond plain GCRA limits, a backend decides. Its
// zero value is plain limits only: a limiter refuses, when it is made or given new limits,
// a windowed quota (gcra.Limit.Window) or a ramp on a backend that does not say it
// decides them, rather than let it decide them wrongly.
type Capabilities struct {
	// Windows: the backend decides windowed quotas.
	Windows bool
	// Ramps: the backend takes limits that change from one decision to the next (a ramp's,
	// recomputed by the limiter at each decision) as one key's limits. Each such limit
	// carries its ramp (gcra.Limit.Rise): a backend that books permits ahead should space
	// them at the ramp's limit where they fall, as gcra.Decide does; one that ignores it
	// decides at the limit of the instant, which is safe but keeps the ramp's early pace.
	Ramps bool
	// SharedRamps: the backend ramps a limit itself, from state its callers share (the
	// lease mode's allocation ramps the whole pool together, from when the limit's record
	// was made, so that a caller that restarts does not restart the ramp). The limiter then
	// passes it the limit as it is once the ramp is over, with the ramp in gcra.Limit.Ramp,
	// instead of the limit the ramp has reached at each decision.
	SharedRamps bool
	// WindowsAlone: the backend decides a key's windowed quotas only when all the key's
	// limits are windows; a limiter refuses it limits that mix windows and rates.
	WindowsAlone bool
	// SharedLine: the backend decides each permit in one line per key that every process
	// shares (a store, or a daemon): where several processes wait on a key, a limiter then
	// shares it between processes by default, each holding a few places in the line
	// whatever its number of waiters (sluice.FairProcesses), rather than one place per
	// waiter, which gives a process of many goroutines most of the key.
	SharedLine bool
	// ByValue: the backend keeps a key's state apart from its limits, so that the limits of
	// one decision may differ from the next and apply to it alone: a lower priority's
	// decision under limits that keep part of the burst for higher ones (sluice.Headroom).
	ByValue bool
	// Classes: the backend decides by the class each call's context carries
	// (priority.Of) itself, keeping the higher classes' headroom where the key's state is
	// (the daemon, which hears every client's class): a limiter keeps none of its own in
	// front of it.
	Classes bool
}

// Capable is an optional interface of back ends that decide more than plain GCRA limits.
// Capabilities must be a constant of the backend's type, answered even on a nil pointer of
// it: a configuration is checked against a backend not connected yet (`sluice serve
// --check-config`).
type Capable interface {
	Capabilities() Capabilities
}

// CapabilitiesOf returns what be says it decides (Capable), or the zero Capabilities.
func CapabilitiesOf(be Backend) Capabilities {
	if c, ok := be.(Capable); ok {
		return c.Capabilities()
	}
	return Capabilities{}
}

// Resetter is an optional interface of back ends that can forget a key: its next request is
// decided as a new key's (its whole burst free) and any penalty on it is lifted, for every
// caller that shares the backend's state. An operator uses it to lift a penalty a client
// set by mistake or malice.
type Resetter interface {
	Reset(ctx context.Context, key string) error
}

// ExpiryReporter is an optional interface of back ends that want to know of reserved
// permits their caller did not use because they came too late (sluice.ErrPermitExpired):
// the daemon's client reports them so that the daemon counts them in its /metrics. The
// limiter calls ReportExpired after giving such permits back, outside its locks; it may
// block for I/O and should honour ctx. An error is the caller's to ignore.
type ExpiryReporter interface {
	ReportExpired(ctx context.Context, key string, n int64) error
}

// Pinger is an optional interface of back ends that depend on something remote: Ping
// reports whether it answers now. The daemon's /readyz uses it.
type Pinger interface {
	Ping(ctx context.Context) error
}

// KeyCounter is an optional interface of back ends that can count the keys they hold in
// shared state, for the daemon's sluice_keys gauge. CountKeys may take time in proportion
// to the keys (a SCAN of Redis): the daemon calls it in the background now and then, never
// per decision.
type KeyCounter interface {
	CountKeys(ctx context.Context) (int64, error)
}

// UnavailableError is a failure to reach the shared state that says when to try again: a
// back end that probes for the return of its store (Redis, the daemon) knows when it will
// next look, and a caller that retries sooner spins for nothing. It matches
// ErrUnavailable with errors.Is.
type UnavailableError struct {
	// RetryAfter is how long until the back end next tries to reach its shared state.
	RetryAfter time.Duration
	// Err is what failed; it wraps ErrUnavailable.
	Err error
}

// Error names what failed and when the back end next tries to reach its shared state.
func (e *UnavailableError) Error() string {
	return fmt.Sprintf("%v (retry after %v)", e.Err, e.RetryAfter)
}

// Unwrap returns what failed.
func (e *UnavailableError) Unwrap() error { return e.Err }

// Is reports whether target is ErrUnavailable.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// RetryAfter returns the retry hint of an *UnavailableError err wraps, if any.
func RetryAfter(err error) (time.Duration, bool) {
	var ue *UnavailableError
	if errors.As(err, &ue) && ue.RetryAfter > 0 {
		return ue.RetryAfter, true
	}
	return 0, false
}

// FailMode says what is answered when the shared state a decision needs cannot be reached
// (docs/concepts.md, "Fail modes"). The same three names serve every mode, flag and file.
type FailMode int

const (
	// FailDefault, the zero value, is the default of the place it is set: FailClosed for a
	// limiter and the daemon, FailLocal for a lease member, FailOpen for the daemon's client.
	FailDefault FailMode = iota
	// FailClosed denies: no over-admission.
	FailClosed
	// FailOpen allows: unbounded over-admission while the failure lasts, for callers who
	// prefer availability.
	FailOpen
	// FailLocal decides locally on a share of the limit. The lease mode runs on its
	// expired lease for the store's grace (no over-admission). The strict mode on Redis
	// decides on a configured share and charges it back when Redis returns. A backend
	// offers it or refuses it; a limiter whose backend still fails answers as FailClosed.
	FailLocal
)

// String returns the mode's name: "default", "closed", "open" or "local".
func (m FailMode) String() string {
	switch m {
	case FailDefault:
		return "default"
	case FailClosed:
		return "closed"
	case FailOpen:
		return "open"
	case FailLocal:
		return "local"
	}
	return fmt.Sprintf("FailMode(%d)", int(m))
}

// ParseFailMode reads "closed", "open" or "local".
func ParseFailMode(s string) (FailMode, error) {
	switch s {
	case "closed":
		return FailClosed, nil
	case "open":
		return FailOpen, nil
	case "local":
		return FailLocal, nil
	}
	return 0, fmt.Errorf("sluice: bad fail mode %q (want closed, open or local)", s)
}

// ClassBoard is an optional interface of back ends whose line every process shares
// (Capabilities.SharedLine): a board, in the shared state, of the classes (package
// priority) that asked for a key recently, so that one process's lower-class decisions
// and places in the key's line keep the headroom of a higher class that asks in another
// (docs/priorities.md). The limiter posts a class when a caller of it asks (now and then,
// not at every call), and reads the board before a lower class decides (now and then).
// Both methods are safe for concurrent use, may block for I/O and honour ctx; an error
// leaves the board as it was, and the limiter goes on with what it knew.
type ClassBoard interface {
	// PostClass records that a caller of class c (priority.Critical or priority.Standard;
	// others are ignored) asked for key now. The board forgets it after recent.
	PostClass(ctx context.Context, key string, c priority.Class, recent time.Duration) error
	// ClassesPosted returns how long ago priority.Critical and priority.Standard were last
	// posted for key, each negative if it was not posted within the recent it was posted
	// with.
	ClassesPosted(ctx context.Context, key string) (critical, standard time.Duration, err error)
}
