package lease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/allot"
	"github.com/sluicehq/sluice/internal/rkey"
)

// ErrConflict: a request kept losing the compare-and-set on its record to other members'
// writes, MaxAttempts times in a row. The member treats it as a failed request and tries
// again at its next renewal.
var ErrConflict = errors.New("sluice lease: too many conflicting writes")

// MaxAttempts is how many times a batch is read, applied and written back before the
// requests whose records keep changing under them get ErrConflict.
const MaxAttempts = 8

// call is one member's request about the record of key under limit.
type call struct {
	key   string
	limit gcra.Limit
	req   allot.Request
}

// result is the outcome of one call.
type result struct {
	rep allot.Reply
	err error
}

// RecordID names the record of key under limit l in a store: the key as a Redis Cluster
// hash tag (so that every limit of a key shares a slot), then the limit's emission
// interval and tolerance.
func RecordID(key string, l gcra.Limit) string {
	return rkey.Tag(key) + ":" + strconv.FormatInt(l.T, 10) + ":" + strconv.FormatInt(l.Tau, 10)
}

// applier applies members' requests to a Store: it reads the records a batch needs with
// the store's time, runs the allocation (allot.State.Apply) on them, and writes back
// every record whose version is unchanged; the requests on records that changed meanwhile
// are tried again (read, apply, write), up to MaxAttempts, after a short jittered pause.
//
// Reading the time before writing is conservative: a lease granted at the time read
// expires earlier than one timed at the write, and a lease or quarantine judged ended at
// the time read has ended by the write.
type applier struct {
	store Store
	cfg   Config // the settings of the records it makes

	conflicts atomic.Int64 // writes that lost their compare-and-set
	fences    atomic.Int64 // records made or found fenced (a lost or rewound record)

	newInc func() uint64 // tests only: deterministic incarnations (nil: allot.NewIncarnation)
}

func (a *applier) incarnation() uint64 {
	if a.newInc != nil {
		return a.newInc()
	}
	return allot.NewIncarnation()
}

// group is the calls of one batch on one record.
type group struct {
	id    string
	limit gcra.Limit
	idx   []int // the calls', in order
	done  bool
}

// apply applies calls and returns one result per call. A non-nil error means the outcome
// of every call not yet written is unknown (the store was not reached); a call's own
// failure (ErrStaleEpoch, ErrConflict, ErrBadRecord) is in its result.
func (a *applier) apply(ctx context.Context, calls []call) ([]result, error) {
	out := make([]result, len(calls))
	var groups []*group
	byID := map[string]*group{}
	for i, c := range calls {
		id := RecordID(c.key, c.limit)
		g := byID[id]
		if g == nil {
			g = &group{id: id, limit: c.limit}
			byID[id] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
	}
	pending := groups
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == MaxAttempts {
			for _, g := range pending {
				for _, i := range g.idx {
					out[i] = result{err: fmt.Errorf("%w (%d attempts)", ErrConflict, MaxAttempts)}
				}
			}
			break
		}
		if attempt > 0 {
			// Jittered, growing: members that collided do not collide again in step.
			d := time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 6)))
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			case <-t.C:
			}
		}
		var err error
		if pending, err = a.attempt(ctx, calls, pending, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// attempt reads, applies and writes the pending groups once, and returns those whose
// write lost its compare-and-set.
func (a *applier) attempt(ctx context.Context, calls []call, pending []*group, out []result) ([]*group, error) {
	ids := make([]string, len(pending))
	for i, g := range pending {
		ids[i] = g.id
	}
	unlock, err := lockRecords(ctx, a.store, ids)
	if err != nil {
		return nil, err
	}
	defer unlock()
	snap, err := a.store.Load(ctx, ids)
	if err != nil {
		return nil, err
	}
	if len(snap.Records) != len(ids) {
		return nil, fmt.Errorf("%w: the store read %d records of %d", ErrUnavailable, len(snap.Records), len(ids))
	}
	var writes []Write
	var written []*group
	staged := make([]result, len(calls))
	for k, g := range pending {
		rec := snap.Records[k]
		now := snap.Now
		if rec.Now != 0 {
			now = rec.Now
		}
		st, err := a.state(g, rec, now, snap.Since, calls)
		if err != nil {
			for _, i := range g.idx {
				out[i] = result{err: err}
			}
			g.done = true
			continue
		}
		for _, i := range g.idx {
			rep, err := st.Apply(now, st.Cfg, calls[i].req)
			staged[i] = result{rep: rep, err: err}
		}
		w := Write{ID: g.id, Version: rec.Version}
		if st.Idle(now) {
			if rec.Version == 0 {
				// Nothing to keep: the answers stand as they are.
				for _, i := range g.idx {
					out[i] = staged[i]
				}
				g.done = true
				continue
			}
		} else {
			w.Data = allot.MarshalState(st)
			w.Keep = time.Duration(max(st.QuietAt()-now, int64(time.Second)))
		}
		writes = append(writes, w)
		written = append(written, g)
	}
	if len(writes) == 0 {
		return nil, nil
	}
	vers, err := a.store.Swap(ctx, writes)
	if err != nil {
		return nil, err
	}
	if len(vers) != len(writes) {
		return nil, fmt.Errorf("%w: the store answered %d writes of %d", ErrUnavailable, len(vers), len(writes))
	}
	var again []*group
	for k, g := range written {
		if vers[k] == 0 {
			a.conflicts.Add(1)
			again = append(again, g)
			continue
		}
		for _, i := range g.idx {
			out[i] = staged[i]
			out[i].rep.Version = vers[k]
		}
	}
	return again, nil
}

// state decodes a group's record, or makes it. A record is made fenced (the whole limit
// counted as held until every lease granted before has ended: TTL + Grace) when it may
// have held leases still in use: the store's incarnation is younger than that (it lost
// its records), or a member has seen a version of the record (it existed). A record older
// than a version a member has seen went back in time (a failover that lost writes, an old
// copy restored): it is fenced too, and takes a new incarnation, so that registrations it
// lost can never be mistaken for the ones it has.
func (a *applier) state(g *group, rec Record, now, since int64, calls []call) (*allot.State, error) {
	var seen uint64
	for _, i := range g.idx {
		seen = max(seen, calls[i].req.Seen)
	}
	if rec.Version == 0 {
		cfg := a.cfg
		fence := int64(0)
		switch {
		case seen > 0:
			fence = cfg.FenceAfterRestart(now)
		case since != minTime && now < cfg.FenceAfterRestart(since):
			fence = cfg.FenceAfterRestart(since)
		}
		if fence != 0 {
			a.fences.Add(1)
		}
		return allot.NewState(g.limit, a.incarnation(), now, fence, cfg)
	}
	st, err := allot.UnmarshalState(rec.Data)
	if err != nil {
		return nil, fmt.Errorf("record %s: %w", g.id, err)
	}
	if st.Limit != g.limit {
		return nil, fmt.Errorf("%w: record %s holds limit %+v", ErrBadRecord, g.id, st.Limit)
	}
	if rec.Version < seen {
		a.fences.Add(1)
		st.Incarnation = a.incarnation()
		st.Fence = max(st.Fence, st.Cfg.FenceAfterRestart(now))
		st.Pool, st.PoolAt = 0, max(st.PoolAt, now) // its burst refills after the fence
	}
	return st, nil
}

// The members of one process that share a store take turns on a record: an attempt holds
// its records from its read to its write, so that they never lose a compare-and-set to
// each other, only to other processes. On a store whose round trips take milliseconds
// (etcd, ZooKeeper: a write is a disk write) eight members of one process renewing every
// 40 ms lost 63% of their writes to each other, each loss a read and a write more.
var recordLocks = struct {
	sync.Mutex
	m map[recordLockKey]*recordLock
}{m: map[recordLockKey]*recordLock{}}

type recordLockKey struct {
	store Store
	id    string
}

type recordLock struct {
	ch   chan struct{} // holds a token while the record is held
	refs int           // holders and waiters: the lock is dropped at 0
}

// lockRecords holds records ids of store (in order, so that batches never wait on each
// other in a cycle) until unlock, or returns ctx's error. A store whose value cannot be
// a map key (not comparable) is not locked.
func lockRecords(ctx context.Context, store Store, ids []string) (unlock func(), err error) {
	if t := reflect.TypeOf(store); t == nil || !t.Comparable() {
		return func() {}, nil
	}
	sorted := slices.Sorted(slices.Values(ids))
	var held []*recordLock
	release := func(l *recordLock, key recordLockKey) {
		recordLocks.Lock()
		if l.refs--; l.refs == 0 {
			delete(recordLocks.m, key)
		}
		recordLocks.Unlock()
	}
	unlock = func() {
		for i, l := range held {
			<-l.ch
			release(l, recordLockKey{store, sorted[i]})
		}
	}
	for _, id := range sorted {
		key := recordLockKey{store, id}
		recordLocks.Lock()
		l := recordLocks.m[key]
		if l == nil {
			l = &recordLock{ch: make(chan struct{}, 1)}
			recordLocks.m[key] = l
		}
		l.refs++
		recordLocks.Unlock()
		select {
		case l.ch <- struct{}{}:
			held = append(held, l)
		case <-ctx.Done():
			release(l, key)
			unlock()
			return nil, ctx.Err()
		}
	}
	return unlock, nil
}
