package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/rkey"
	"github.com/sluicehq/sluice/lease/allot"
	"github.com/sluicehq/sluice/store"
)

// MaxAttempts is how many times a batch is read, applied and written back before the
// requests whose records keep changing under them get store.ErrConflict.
const MaxAttempts = 8

// call is one member's request about the record of key under limit.
type call struct {
	key   string
	limit gcra.Limit
	req   allot.Request
	// bucket, if its ID is not "", is the bucket the call is decided on (a take, a give or
	// a settlement of a limit decided there: applyTakes).
	bucket allot.BucketRef
}

// result is the outcome of one call.
type result struct {
	rep allot.Reply
	err error
}

// RecordID names the record of key under limit l in a store: the key as a Redis Cluster
// hash tag (so that every limit of a key shares a slot), then the limit's emission
// interval and tolerance, and a windowed quota's window (":w" and its nanoseconds) or a
// ramp (":r" T0 ":" Over) where the limit has one.
func RecordID(key string, l gcra.Limit) string {
	id := rkey.Tag(key) + ":" + strconv.FormatInt(l.T, 10) + ":" + strconv.FormatInt(l.Tau, 10)
	if l.Window > 0 {
		id += ":w" + strconv.FormatInt(l.Window, 10)
	}
	if !l.Ramp.IsZero() {
		id += ":r" + strconv.FormatInt(l.Ramp.T0, 10) + ":" + strconv.FormatInt(l.Ramp.Over, 10)
	}
	return id
}

// applier applies members' requests to a store.Store: it reads the records a batch needs with
// the store's time, runs the allocation (allot.State.Apply) on them, and writes back
// every record whose version is unchanged; the requests on records that changed meanwhile
// are tried again (read, apply, write), up to MaxAttempts, after a short jittered pause.
//
// Reading the time before writing is conservative: a lease granted at the time read
// expires earlier than one timed at the write, and a lease or quarantine judged ended at
// the time read has ended by the write.
type applier struct {
	store store.Store
	cfg   Config // the settings of the records it makes

	conflicts atomic.Int64 // writes that lost their compare-and-set
	fences    atomic.Int64 // records made or found fenced (a lost or rewound record)

	log    *slog.Logger  // where a fence is said (nil: slog.Default())
	fenced atomic.Uint64 // the store incarnation (its Since, as a uint64) a fence was last said for
	// fencedTill is when the latest fence the store made (or its young incarnation would
	// make) ends, on clock: /readyz says so until then (Backend.Ping).
	fencedTill atomic.Int64
	clock      clock.Clock

	newInc func() uint64 // tests only: deterministic incarnations (nil: allot.NewIncarnation)

	relay *relay // the relays of crowded limits (nil: none)
}

func (a *applier) incarnation() uint64 {
	if a.newInc != nil {
		return a.newInc()
	}
	return allot.NewIncarnation()
}

// sayFenced logs, once per store incarnation (since: when it began, or when a record was
// found lost), that a record is fenced until fence: no permit of its limit before then.
// A daemon or a library that answers no for a second or two after it meets a new store
// would otherwise say nothing of why.
func (a *applier) sayFenced(id string, since, now, fence int64) {
	a.noteFence(now, fence)
	if a.fenced.Swap(uint64(since)) == uint64(since) {
		return
	}
	log := a.log
	if log == nil {
		log = slog.Default()
	}
	log.Warn("lease: limits fenced: the store has no record of the leases granted from it before (a first use, a restart or a flush, which it cannot tell apart), so no permit of a limit it makes is granted until every such lease has ended (TTL + grace); lease.WaitUnfenced waits it out before a workload starts (docs/lease.md)",
		"record", id, "for", time.Duration(fence-now).Round(time.Millisecond))
}

// group is the calls of one batch on one record (its confirms in a group of their own).
type group struct {
	id    string
	limit gcra.Limit
	idx   []int  // the calls', in order
	seen  uint64 // the newest version of the record any call of the batch has seen
	done  bool
}

// apply applies calls and returns one result per call. A non-nil error means the outcome
// of every call not yet written is unknown (the store was not reached); a call's own
// failure (allot.ErrStaleEpoch, store.ErrConflict, store.ErrBadRecord) is in its result.
//
// The members of one process that share a store (and a Config) combine their rounds: while
// one round is on its way, the calls that come join the next, which runs as one batch when
// it returns (one read and one write for all of them). So they never lose a
// compare-and-set to each other, only to other processes, and a process makes one round
// at a time per store whatever its number of members. On etcd or ZooKeeper, whose writes
// are disk writes, eight members of one process renewing every 40 ms lost 63% of their
// writes to each other (each loss a read and a write more) before they combined.
func (a *applier) apply(ctx context.Context, calls []call) ([]result, error) {
	if a.newInc != nil { // tests that need their own incarnations apply alone
		return a.applyNow(ctx, calls)
	}
	if t := reflect.TypeOf(a.store); t == nil || !t.Comparable() {
		return a.applyNow(ctx, calls)
	}
	key := combineKey{a.store, a.cfg}
	combining.Lock()
	c := combining.m[key]
	if c == nil {
		c = &combiner{}
		combining.m[key] = c
	}
	if !c.busy {
		c.busy = true
		combining.Unlock()
		res, err := a.applyNow(ctx, calls)
		c.handOff(key)
		return res, err
	}
	r, lead := c.next, false
	if r == nil {
		r, lead = &round{start: make(chan struct{}), done: make(chan struct{})}, true
		c.next = r
	}
	off := len(r.calls)
	r.calls = append(r.calls, calls...)
	combining.Unlock()
	if lead {
		// The round on its way ends within its own store time-out.
		<-r.start
		combining.Lock()
		c.next = nil // sealed: later calls make the round after
		combining.Unlock()
		// Other members' calls ride on this round: the leader's cancel must not make their
		// outcome look known (a cancelled call is taken as not made); its deadline bounds it.
		rctx, cancel := context.WithoutCancel(ctx), func() {}
		if dl, ok := ctx.Deadline(); ok {
			rctx, cancel = context.WithDeadline(rctx, dl)
		}
		r.res, r.err = a.applyNow(rctx, r.calls)
		cancel()
		close(r.done)
		c.handOff(key)
	} else {
		select {
		case <-r.done:
		case <-ctx.Done():
			// The round may still be written: the outcome is unknown, as a store call's
			// that timed out.
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("%w: lease store: %w", backend.ErrUnavailable, ctx.Err())
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	return r.res[off : off+len(calls)], nil
}

// combining holds the combiners of the stores a process's members are using.
var combining = struct {
	sync.Mutex
	m map[combineKey]*combiner
}{m: map[combineKey]*combiner{}}

type combineKey struct {
	store store.Store
	cfg   Config
}

// combiner is one store's rounds in this process.
type combiner struct {
	busy bool   // a round is on its way
	next *round // the calls that came meanwhile, if any
}

// round is a batch of several members' calls.
type round struct {
	calls []call
	start chan struct{} // closed when the round before has returned
	done  chan struct{} // closed when res and err are set
	res   []result
	err   error
}

// handOff ends a round: the next one starts, or the combiner is dropped.
func (c *combiner) handOff(key combineKey) {
	combining.Lock()
	defer combining.Unlock()
	if c.next != nil {
		close(c.next.start)
		return
	}
	c.busy = false
	delete(combining.m, key)
}

// applyNow applies calls in rounds of its own (see apply).
func (a *applier) applyNow(ctx context.Context, calls []call) ([]result, error) {
	out := make([]result, len(calls))
	var groups []*group
	byID := map[string]*group{}
	for i, c := range calls {
		id := RecordID(c.key, c.limit)
		k := id
		if c.req.Op == allot.OpConfirm {
			k += "\x00confirm" // a group of its own: read, and written only if it changes the record
		}
		g := byID[k]
		if g == nil {
			g = &group{id: id, limit: c.limit}
			byID[k] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
	}
	// Every group of a record judges it by the newest version any call on it has seen: a
	// group of confirms is answered from the record as read only if no call of the batch
	// finds it rewound.
	seen := map[string]uint64{}
	for _, g := range groups {
		for _, i := range g.idx {
			seen[g.id] = max(seen[g.id], calls[i].req.Seen)
		}
	}
	for _, g := range groups {
		g.seen = seen[g.id]
	}
	// A borrow on a crowded limit is refused here (relay.borrowsCrowded).
	groups = slices.DeleteFunc(groups, func(g *group) bool {
		g.idx = slices.DeleteFunc(g.idx, func(i int) bool {
			if a.relay.borrowsCrowded(g.id, calls[i]) {
				out[i] = result{err: errCrowdedBorrow}
				return true
			}
			return false
		})
		return len(g.idx) == 0
	})
	// A group with a join reads the record first (attempt): on its bucket, a join is a
	// read (allot.State.confirm), which a relay would have made a write.
	var relayed []*group
	pending := slices.DeleteFunc(slices.Clone(groups), func(g *group) bool {
		if !g.joins(calls) && a.relayable(g, calls) {
			relayed = append(relayed, g)
			return true
		}
		return false
	})
	pending0 := pending
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == MaxAttempts {
			for _, g := range pending {
				for _, i := range g.idx {
					out[i] = result{err: fmt.Errorf("%w (%d attempts)", store.ErrConflict, MaxAttempts)}
				}
			}
			break
		}
		if attempt > 0 {
			// Jittered, growing: members that collided do not collide again in step.
			if err := clock.Default.Sleep(ctx, time.Duration(rand.Int64N(int64(time.Millisecond)<<min(attempt, 6)))); err != nil {
				return nil, err
			}
		}
		var err error
		if pending, err = a.attempt(ctx, calls, pending, out); err != nil {
			return nil, err
		}
		// Lost to other writers on a crowded record: its requests go to its allocator.
		pending = slices.DeleteFunc(pending, func(g *group) bool {
			if a.relayable(g, calls) {
				relayed = append(relayed, g)
				return true
			}
			return false
		})
	}
	if len(relayed) > 0 {
		if err := a.relayCalls(ctx, calls, relayed, out); err != nil {
			return nil, err
		}
	}
	for _, g := range pending0 {
		for _, i := range g.idx {
			if out[i].err == nil {
				a.relay.answered(g.id, true)
			}
		}
	}
	return out, nil
}

// relayable reports whether a group's calls go through its limit's relay: the limit is
// crowded, each call may be relayed, and no member has two calls in it.
func (a *applier) relayable(g *group, calls []call) bool {
	for k, i := range g.idx {
		if !a.relay.relayable(g.id, calls[i]) {
			return false
		}
		for _, j := range g.idx[:k] {
			if calls[j].req.Member == calls[i].req.Member {
				return false
			}
		}
	}
	return true
}

// attempt reads, applies and writes the pending groups once, and returns those whose
// write lost its compare-and-set.
func (a *applier) attempt(ctx context.Context, calls []call, pending []*group, out []result) ([]*group, error) {
	ids := make([]string, len(pending))
	for i, g := range pending {
		ids[i] = g.id
	}
	snap, err := a.load(ctx, ids)
	if err != nil {
		return nil, err
	}
	var writes []store.Write
	var written, deferred []*group
	writing := make(map[string]bool, len(pending))
	staged := make([]result, len(calls))
	for k, g := range pending {
		rec := snap.Records[k]
		now := snap.Now
		if rec.Now != 0 {
			now = rec.Now
		}
		st, err := a.state(g, rec, now, snap.Since)
		if err != nil {
			for _, i := range g.idx {
				out[i] = result{err: err}
			}
			g.done = true
			continue
		}
		onBucket := st.OnBucket()
		a.relay.saw(g.id, len(st.Members), onBucket)
		if g.joins(calls) && a.relayable(g, calls) {
			// Joins read the record before they go to its relay (applyNow): crowded and
			// not on its bucket, they go there unwritten.
			deferred = append(deferred, g)
			continue
		}
		readOnly, busy := g.readsOnly(calls, rec, onBucket), st.BucketBusy
		for _, i := range g.idx {
			rep, err := st.Apply(now, st.Cfg, calls[i].req)
			staged[i] = result{rep: rep, err: err}
		}
		if readOnly && st.BucketBusy == busy {
			// Reads that changed nothing: answered from the record as read.
			for _, i := range g.idx {
				out[i] = staged[i]
				out[i].rep.Version = rec.Version
			}
			g.done = true
			continue
		}
		if writing[g.id] {
			// Another group of the batch writes the record (a group of confirms beside
			// other calls): one write of a record per batch (etcd refuses two in one
			// transaction); this one is applied again at the next attempt.
			deferred = append(deferred, g)
			continue
		}
		w := store.Write{ID: g.id, Version: rec.Version}
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
		writing[g.id] = true
	}
	if len(writes) == 0 {
		return deferred, nil
	}
	vers, err := a.swap(ctx, writes)
	if err != nil {
		return nil, err
	}
	again := deferred
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

// readsOnly reports whether a group holds only confirms (allot.OpConfirm), or requests
// that are reads of a record on its bucket (onBucket, as read: allot.ReadOnBucket), of a
// record the store has, as new as every version the batch's calls on it have seen
// (group.seen): applied, they change nothing but the record's BucketBusy (and its expired
// entries, with it), and if they leave that as it is the group is answered from the
// record as read, without a write. A record made (missing) or found rewound (older than
// a version seen) is written, as for any request: its fence must be kept.
func (g *group) readsOnly(calls []call, rec store.Record, onBucket bool) bool {
	if rec.Version == 0 || g.seen > rec.Version {
		return false
	}
	for _, i := range g.idx {
		if op := calls[i].req.Op; op != allot.OpConfirm && !(onBucket && allot.ReadOnBucket(op)) {
			return false
		}
	}
	return true
}

// joins reports whether a group holds a join.
func (g *group) joins(calls []call) bool {
	return slices.ContainsFunc(g.idx, func(i int) bool { return calls[i].req.Op == allot.OpJoin })
}

// load reads ids, and swap writes writes, as the store does, with an answer of the wrong
// length an error (backend.ErrUnavailable) rather than an index out of range.
func (a *applier) load(ctx context.Context, ids []string) (store.Snapshot, error) {
	snap, err := a.store.Load(ctx, ids)
	if err == nil && len(snap.Records) != len(ids) {
		err = fmt.Errorf("%w: the store read %d records of %d", backend.ErrUnavailable, len(snap.Records), len(ids))
	}
	return snap, err
}

func (a *applier) swap(ctx context.Context, writes []store.Write) ([]uint64, error) {
	vers, err := a.store.Swap(ctx, writes)
	if err == nil && len(vers) != len(writes) {
		err = fmt.Errorf("%w: the store answered %d writes of %d", backend.ErrUnavailable, len(vers), len(writes))
	}
	return vers, err
}

// state decodes a group's record, or makes it. A record is made fenced (the whole limit
// counted as held until every lease granted before has ended: TTL + Grace) when it may
// have held leases still in use: the store's incarnation is younger than that (it lost
// its records), or a member has seen a version of the record (it existed). A record older
// than a version a member has seen went back in time (a failover that lost writes, an old
// copy restored): it is fenced too, and takes a new incarnation, so that registrations it
// lost can never be mistaken for the ones it has.
func (a *applier) state(g *group, rec store.Record, now, since int64) (*allot.State, error) {
	seen := g.seen // the newest version its calls have seen (applyNow, allocateOnce)
	if rec.Version == 0 {
		cfg := a.cfg
		fence := int64(0)
		switch {
		case seen > 0:
			fence = cfg.FenceAfterRestart(now)
		case since != store.Fresh && now < cfg.FenceAfterRestart(since):
			fence = cfg.FenceAfterRestart(since)
		}
		if fence != 0 {
			a.fences.Add(1)
			a.sayFenced(g.id, since, now, fence)
		}
		st, err := allot.NewState(g.limit, a.incarnation(), now, fence, cfg)
		if err == nil && seen > 0 {
			// A member holds tokens drawn from the lost record in this window: how many
			// it handed out is unknown (a windowed quota; nothing for a rate).
			st.SpendWindow(now)
		}
		return st, err
	}
	st, err := allot.UnmarshalState(rec.Data)
	if err != nil {
		return nil, fmt.Errorf("record %s: %w", g.id, err)
	}
	if st.Limit != g.limit {
		return nil, fmt.Errorf("%w: record %s holds limit %+v", store.ErrBadRecord, g.id, st.Limit)
	}
	if rec.Version < seen {
		a.fences.Add(1)
		st.Rewound(now, a.incarnation())
		a.sayFenced(g.id, now, now, st.Fence)
	}
	return st, nil
}

// noteFence records that the store fences records until fence (its clock; now is its
// clock's time), on the applier's clock.
func (a *applier) noteFence(now, fence int64) {
	if fence <= now || a.clock == nil {
		return
	}
	till := a.clock.Nanotime() + (fence - now)
	for {
		old := a.fencedTill.Load()
		if old >= till || a.fencedTill.CompareAndSwap(old, till) {
			return
		}
	}
}

// fenceLeft is how long the store's latest fence still lasts (0: none).
func (a *applier) fenceLeft() time.Duration {
	if a.clock == nil {
		return 0
	}
	return time.Duration(max(a.fencedTill.Load()-a.clock.Nanotime(), 0))
}
