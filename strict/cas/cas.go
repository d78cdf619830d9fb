package cas

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/classboard"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/rkey"
	"github.com/sluicehq/sluice/priority"
	"github.com/sluicehq/sluice/store"
)

// Defaults.
const (
	DefaultPrefix  = "s1:"                  // the record names' prefix: the format version
	DefaultTimeout = 500 * time.Millisecond // longest wait for a round of the store
	// MaxAttempts is how many times a round reads, decides and writes back the keys whose
	// records keep changing under it before their calls fail with store.ErrConflict (an ErrUnavailable).
	MaxAttempts = 8
)

// Backend decides permits on state kept in a store.Store, one record per key read with
// the store's time and written back by compare-and-set: the strict mode on etcd or
// ZooKeeper (packages store/etcd and store/zk), or on any store that keeps the
// store.Store contract. The Go GCRA core (package gcra) decides. It implements
// backend.Backend, backend.Resetter and backend.Pinger. It is safe for concurrent use; make
// one with New. Close it when done; the store (and its client) stays the caller's.
type Backend struct {
	store   store.Store
	prefix  string
	timeout time.Duration

	mu     sync.Mutex
	busy   bool   // a round is on its way
	next   *round // the calls that came meanwhile, if any
	posts  []*op  // posts on boards of classes that ride on the next round to start (classes.go)
	closed atomic.Bool

	stats struct{ rounds, attempts, conflicts, writes atomic.Int64 }
}

var (
	_ backend.Backend  = (*Backend)(nil)
	_ backend.Resetter = (*Backend)(nil)
	_ backend.Pinger   = (*Backend)(nil)
)

// Option configures a Backend.
type Option interface{ apply(*Backend) }

type optionFunc func(*Backend)

func (f optionFunc) apply(b *Backend) { f(b) }

// WithPrefix sets the prefix of every record's name in the store (default DefaultPrefix):
// a key's record is PREFIX + the key as a hash tag (see RecordID). The store's own prefix
// or path (lease.WithEtcdPrefix, lease.WithZKPath) comes before it.
func WithPrefix(p string) Option { return optionFunc(func(b *Backend) { b.prefix = p }) }

// WithTimeout bounds how long a round of the store may take, retries included (default
// DefaultTimeout). A call waits for the round on its way, if any, then for its own: at
// most twice the time-out, or its context's deadline if sooner once its own round has
// begun. A call with no answer by then fails with backend.ErrUnavailable, and the
// limiter's fail mode answers it.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(b *Backend) {
		if d > 0 {
			b.timeout = d
		}
	})
}

// New returns a backend deciding on records in store. The caller keeps the store and
// whatever client it holds.
func New(store store.Store, opts ...Option) *Backend {
	b := &Backend{store: store, prefix: DefaultPrefix, timeout: DefaultTimeout}
	for _, o := range opts {
		o.apply(b)
	}
	return b
}

// RecordID returns the name of key's record in the store: the prefix and the key as a
// Redis Cluster hash tag ('\' and '}' escaped), so that distinct keys never share one.
func (b *Backend) RecordID(key string) string { return b.prefix + rkey.Tag(key) }

// Stats counts the backend's work.
type Stats struct {
	Rounds    int64 // rounds run (each one or more calls, on one or more keys)
	Attempts  int64 // reads of the store (a round's first and each retry)
	Writes    int64 // records written (a compare-and-set each)
	Conflicts int64 // writes that lost their compare-and-set and were tried again
}

// Stats returns the counts so far.
func (b *Backend) Stats() Stats {
	return Stats{Rounds: b.stats.rounds.Load(), Attempts: b.stats.attempts.Load(),
		Writes: b.stats.writes.Load(), Conflicts: b.stats.conflicts.Load()}
}

// opKind is what a call does to its key's state.
type opKind int

const (
	opDecide opKind = iota
	opAdjust
	opPenalize
	opReset
	opPost // a class's post on the key's board (classes.go)
	opRead // a read of the key's board
)

// op is one call: its request and, once its round is written, its outcome.
type op struct {
	kind     opKind
	key      string
	limits   []gcra.Limit
	n        int64 // decide: permits; adjust: the new cost
	maxDelay int64
	ticket   gcra.Ticket
	d        int64 // penalize: for how long; post: how long the post lasts
	class    priority.Class

	grant backend.Grant
	ago   [len(classboard.Classes)]int64 // read: how long ago each class was posted, -1 if not
	err   error
}

// board reports whether o is on its key's board of classes rather than its state.
func (o *op) board() bool { return o.kind == opPost || o.kind == opRead }

func checkRequest(limits []gcra.Limit, n int64) error {
	if n < 0 {
		return gcra.ErrInvalidCost
	}
	if err := gcra.ValidateLimits(limits); err != nil {
		return err
	}
	for _, l := range limits {
		if l.Window > 0 {
			return fmt.Errorf("%w: the cas backend decides GCRA limits, not windowed quotas", backend.ErrUnsupported)
		}
	}
	if n > gcra.MaxCost(limits) {
		return gcra.ErrCostExceedsBurst
	}
	return nil
}

// Capabilities reports that every process shares each key's line in the store, that the
// backend decides ramps, and that a key's state (its TATs) is apart from its limits
// (backend.Capable). The limiter sends each decision the limit of its instant with its
// ramp (gcra.Limit.Rise), which the Go core applies as the Redis script does. It may send
// a lower class's decision limits that keep part of the burst (sluice.WithHeadroom): the
// core decides under them as under any. Windowed quotas are not decided here.
func (*Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{SharedLine: true, Ramps: true, ByValue: true}
}

// Decide decides req for key on its record, at the store's time.
func (b *Backend) Decide(ctx context.Context, key string, req backend.Request) (backend.Grant, error) {
	if err := checkRequest(req.Limits, req.N); err != nil {
		return backend.Grant{}, err
	}
	return b.do(ctx, &op{kind: opDecide, key: key, limits: req.Limits, n: req.N, maxDelay: int64(max(req.MaxDelay, 0))})
}

// Adjust settles a grant to its real cost newN (see backend.Backend and gcra.Adjust), at
// the store's time.
func (b *Backend) Adjust(ctx context.Context, key string, limits []gcra.Limit, t gcra.Ticket, newN int64) error {
	if err := checkRequest(limits, 0); err != nil {
		return err
	}
	if newN < 0 {
		return gcra.ErrInvalidCost
	}
	_, err := b.do(ctx, &op{kind: opAdjust, key: key, limits: limits, ticket: t, n: newN})
	return err
}

// Penalize holds key back for d, for every process that shares the store.
func (b *Backend) Penalize(ctx context.Context, key string, limits []gcra.Limit, d time.Duration) error {
	if err := checkRequest(limits, 0); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	_, err := b.do(ctx, &op{kind: opPenalize, key: key, limits: limits, d: int64(d)})
	return err
}

// Reset forgets key (backend.Resetter): its record is deleted.
func (b *Backend) Reset(ctx context.Context, key string) error {
	_, err := b.do(ctx, &op{kind: opReset, key: key})
	return err
}

// Ping reports whether the store answers within the time-out (backend.Pinger): the
// store's own Ping if it has one, else a read of no records.
func (b *Backend) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	var err error
	if p, ok := b.store.(backend.Pinger); ok {
		err = p.Ping(ctx)
	} else {
		_, err = b.store.Load(ctx, nil)
	}
	if err != nil {
		return unavailable(err)
	}
	return nil
}

// Close makes later calls return backend.ErrClosed. Calls on their way finish within the
// time-out. It does not close the store.
func (b *Backend) Close() error {
	b.closed.Store(true)
	return nil
}

// round is a batch of calls made while the round before it was on its way.
type round struct {
	ops   []*op
	start chan struct{} // closed when the round before has returned
	done  chan struct{} // closed when every op's outcome is set
}

// do runs o in a round and returns its outcome. The calls of one process combine: while
// one round is on its way, the calls that come join the next, which runs when it returns,
// as one read of all their records and one write, each key's calls in arrival order. So a
// process's calls never lose a compare-and-set to each other, only to other processes'.
// A call that gives up (its context ends) while its round is on its way returns at once
// and never reads o again: the round still writes o's outcome, for nobody.
func (b *Backend) do(ctx context.Context, o *op) (backend.Grant, error) {
	if b.closed.Load() {
		return backend.Grant{}, backend.ErrClosed
	}
	b.mu.Lock()
	if !b.busy {
		b.busy = true
		ops := append(b.takePosts(), o)
		b.mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, b.timeout)
		b.run(rctx, ops)
		cancel()
		b.handOff()
		return o.grant, o.err
	}
	r, lead := b.next, false
	if r == nil {
		r, lead = &round{start: make(chan struct{}), done: make(chan struct{})}, true
		b.next = r
	}
	r.ops = append(r.ops, o)
	b.mu.Unlock()
	if lead {
		<-r.start // the round on its way ends within its time-out
		b.mu.Lock()
		b.next = nil // sealed: later calls make the round after
		ops := append(b.takePosts(), r.ops...)
		b.mu.Unlock()
		// The other calls ride on this round: the leader's cancel must not end it (their
		// outcome would be unknown); the time-out bounds it, and the leader's deadline.
		deadline := time.Now().Add(b.timeout)
		if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
			deadline = dl
		}
		rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
		b.run(rctx, ops)
		cancel()
		close(r.done)
		b.handOff()
		return o.grant, o.err
	}
	select {
	case <-r.done:
		return o.grant, o.err
	case <-ctx.Done():
		// The round may still be written: a grant's outcome is unknown, as a store call's
		// that timed out.
		if errors.Is(ctx.Err(), context.Canceled) {
			return backend.Grant{}, ctx.Err()
		}
		return backend.Grant{}, fmt.Errorf("%w: sluice cas: %w", backend.ErrUnavailable, ctx.Err())
	}
}

// handOff ends a round: the next one starts, or the backend is idle.
func (b *Backend) handOff() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.next != nil {
		close(b.next.start)
		return
	}
	b.busy = false
}

// group is the calls of a round on one record: a key's state, or its board of classes.
type group struct {
	id    string
	board bool
	ops   []*op
}

// run decides ops and sets each one's outcome: it reads their keys' records with the
// store's time, applies each key's calls in order, and writes back every record that
// changed by compare-and-set; the keys whose record changed meanwhile are read, decided
// and written again, up to MaxAttempts, after a short jittered pause.
func (b *Backend) run(ctx context.Context, ops []*op) {
	b.stats.rounds.Add(1)
	var pending []*group
	byID := map[string]*group{}
	for _, o := range ops {
		id := b.RecordID
		if o.board() {
			id = b.boardID
		}
		g := byID[id(o.key)]
		if g == nil {
			g = &group{id: id(o.key), board: o.board()}
			byID[g.id] = g
			pending = append(pending, g)
		}
		g.ops = append(g.ops, o)
	}
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == MaxAttempts {
			fail(pending, fmt.Errorf("%w: %w (%d attempts)", backend.ErrUnavailable, store.ErrConflict, MaxAttempts))
			return
		}
		if attempt > 0 {
			// Jittered, growing: processes that collided do not collide again in step.
			d := time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 6)))
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				fail(pending, unavailable(ctx.Err()))
				return
			case <-t.C:
			}
		}
		var err error
		if pending, err = b.attempt(ctx, pending); err != nil {
			fail(pending, unavailable(err))
			return
		}
	}
}

// fail sets err as the outcome of every call of groups.
func fail(groups []*group, err error) {
	for _, g := range groups {
		for _, o := range g.ops {
			o.grant, o.err = backend.Grant{}, err
		}
	}
}

// unavailable wraps a failure to get an answer from the store in backend.ErrUnavailable,
// if the store did not.
func unavailable(err error) error {
	if errors.Is(err, backend.ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: sluice cas: %w", backend.ErrUnavailable, err)
}

// attempt reads, decides and writes the pending groups once. It returns the groups whose
// write lost its compare-and-set; on an error, those whose outcome is not known.
func (b *Backend) attempt(ctx context.Context, pending []*group) ([]*group, error) {
	b.stats.attempts.Add(1)
	ids := make([]string, len(pending))
	for i, g := range pending {
		ids[i] = g.id
	}
	snap, err := b.store.Load(ctx, ids)
	if err != nil {
		return pending, err
	}
	if len(snap.Records) != len(ids) {
		return pending, fmt.Errorf("the store read %d records of %d", len(snap.Records), len(ids))
	}
	var writes []store.Write
	var written []*group
	for k, g := range pending {
		rec := snap.Records[k]
		// The store's time for this record: never earlier than its last writer's (see
		// docs/consensus.md).
		now := snap.Now
		if rec.Now != 0 {
			now = rec.Now
		}
		if g.board {
			if w, ok := boardWrite(g, rec, now); ok {
				writes = append(writes, w)
				written = append(written, g)
			}
			continue
		}
		var st state
		if rec.Version != 0 {
			if st, err = unmarshal(rec.Data); err != nil {
				fail([]*group{g}, fmt.Errorf("sluice cas: record %s: %w", g.id, err))
				continue
			}
		}
		dirty := false
		for _, o := range g.ops {
			dirty = apply(&st, o, now) || dirty
		}
		w := store.Write{ID: g.id, Version: rec.Version, Keep: time.Duration(max(st.latest()-now, int64(time.Second)))}
		switch {
		case !dirty:
			continue // denials and queries write nothing: the outcomes stand
		case st.tats == nil && st.hold == 0: // a reset, nothing after it
			if rec.Version == 0 {
				continue // nothing to delete
			}
		default:
			w.Data = marshal(st)
		}
		writes = append(writes, w)
		written = append(written, g)
	}
	if len(writes) == 0 {
		return nil, nil
	}
	b.stats.writes.Add(int64(len(writes)))
	vers, err := b.store.Swap(ctx, writes)
	if err != nil {
		return written, err
	}
	if len(vers) != len(writes) {
		return written, fmt.Errorf("the store answered %d writes of %d", len(vers), len(writes))
	}
	var again []*group
	for k, g := range written {
		if vers[k] == 0 {
			b.stats.conflicts.Add(1)
			again = append(again, g)
		}
	}
	return again, nil
}

// boardWrite applies g's posts and reads to its board, rec as read at now, and returns
// the write that brings the record up to date, if any: the board with the new posts, or
// its deletion once every post is over.
func boardWrite(g *group, rec store.Record, now int64) (store.Write, bool) {
	var bd board
	if rec.Version != 0 {
		var err error
		if bd, err = unmarshalBoard(rec.Data); err != nil {
			fail([]*group{g}, fmt.Errorf("sluice cas: record %s: %w", g.id, err))
			return store.Write{}, false
		}
	}
	dirty := false
	for _, o := range g.ops {
		dirty = applyBoard(&bd, o, now) || dirty
	}
	w := store.Write{ID: g.id, Version: rec.Version}
	switch keep := bd.Keep(now); {
	case keep == 0 && rec.Version != 0:
		return w, true // every post is over: deleted
	case !dirty:
		return store.Write{}, false
	default:
		w.Data, w.Keep = marshalBoard(bd), time.Duration(keep)
		return w, true
	}
}

// apply applies o to st at now (the GCRA core decides), sets o's outcome, and reports
// whether st is to be written back (a denial or a query changes nothing).
func apply(st *state, o *op, now int64) bool {
	o.grant, o.err = backend.Grant{}, nil
	switch o.kind {
	case opDecide:
		tats := st.tats
		st.fit(len(o.limits))
		res, tk, err := gcra.Decide(st.tats, o.limits, now, o.n, o.maxDelay)
		o.grant, o.err = backend.Grant{Result: res, Ticket: tk}, err
		if err != nil || !res.Allowed || o.n == 0 {
			st.tats = tats // as read: nothing to write
			return false
		}
	case opAdjust:
		st.fit(len(o.limits))
		hold := st.hold
		if hold <= now {
			hold = 0
		}
		_, o.err = gcra.Adjust(st.tats, o.limits, now, o.ticket, o.n, hold)
	case opPenalize:
		st.fit(len(o.limits))
		until := gcra.After(now, o.d)
		gcra.Penalize(st.tats, o.limits, now, until)
		st.hold = max(st.hold, until)
	case opReset:
		*st = state{}
	}
	return true
}
