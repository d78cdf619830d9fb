package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/sluicehq/sluice/store/redis" // redis:// for Dial

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/keytable"
	"github.com/sluicehq/sluice/lease/allot"
	"github.com/sluicehq/sluice/priority"
	"github.com/sluicehq/sluice/store"
)

// Defaults of the backend beyond MemberConfig.
const (
	DefaultIdleAfter    = time.Minute            // a key with no decision for this long is released and forgotten
	DefaultStoreTimeout = 500 * time.Millisecond // a store round trip that takes longer has failed
)

// Backend is the lease mode's backend (a backend.Backend for sluice.WithBackend): one
// member of every limit it decides, deciding in process at memory speed on the share it
// leases from a store.Store. One goroutine renews the leases (batched into one store round trip
// per renewal for all keys), and Close stops it and hands every share back.
//
// It is safe for concurrent use. Make one with New; the zero value is not usable.
type Backend struct {
	owned      io.Closer // the store's client, when Dial opened it: closed by Close
	apply      applier
	clock      clock.Clock
	real       *clock.Real // clock, when it is a real one: read without an interface call (AllowOneRef)
	id         string
	mcfg       MemberConfig
	relayAbove int // WithRelayAbove, or 0: relayAbove
	idleAfter  int64
	timeout    time.Duration
	observer   Observer
	log        *slog.Logger
	crowded    sync.Map // key -> struct{}: the keys warned of as shared by too many members (warnCrowded)
	crowdSince sync.Map // key -> int64: since when its limit has been beyond the claim (judgeCrowd)
	crowdAfter int64    // crowdLasting, or a test's

	keys       *keytable.Table[keyRecs] // each key's records
	wake       chan struct{}
	sleepUntil atomic.Int64 // when the renewal goroutine wakes by itself (MaxInt64 while awake)
	quit       chan struct{}
	done       chan struct{}
	closed     atomic.Bool
	roundTrips atomic.Int64
	closeOnce  sync.Once
}

var (
	_ backend.Backend = (*Backend)(nil)
	_ backend.Allower = (*Backend)(nil)
	_ backend.Capable = (*Backend)(nil)
)

// Capabilities reports what the backend decides (backend.Capable): windowed quotas, whose
// tokens its members draw in chunks of each window's count (docs/lease.md, "Windowed
// quotas"), only beside other windowed quotas, not beside rates (tokens drawn for a window
// and a share of a rate are not granted together); and ramps, which it ramps itself: the
// allocation ramps the capacity it shares out from when the limit's record was made, so
// the whole pool ramps together and a member that restarts does not restart the ramp.
// A decision may keep part of the burst for a higher class (ByValue:
// backend.Request.Core): the member keeps that part of its share's burst (docs/lease.md,
// "Headroom for higher classes").
func (b *Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{Windows: true, Ramps: true, SharedRamps: true, WindowsAlone: true, ByValue: true}
}

// recordLimit is l as the store's record holds it: a windowed quota's windows fall on the
// store's Unix time, whatever the origin of the caller's clock.
func recordLimit(l gcra.Limit) gcra.Limit {
	l.Origin = 0
	return l
}

// keyRecs is what the member holds of one key: a record for each limit it decides the key
// under. Its entry leaves the table with its last record.
type keyRecs struct {
	recs   atomic.Pointer[[]*rec] // replaced whole under mu: lookups read it without a lock
	mu     sync.Mutex
	gone   bool         // the entry left the table: records go to a fresh one (under mu)
	limits []gcra.Limit // the limits the key was last decided under (under mu)
}

type keyEntry = keytable.Entry[keyRecs]

// find returns the record of limit l, or nil.
func (k *keyRecs) find(l *gcra.Limit) *rec {
	if rs := k.recs.Load(); rs != nil {
		for _, r := range *rs {
			if sameLimit(&r.limit, l) {
				return r
			}
		}
	}
	return nil
}

// sameLimit is *a == *b, field by field: the compiler compares a struct of this size with
// a call to memequal, which took a tenth of a fast decision's time (issue [22]), and copies
// the structs it is given by value first.
func sameLimit(a, b *gcra.Limit) bool {
	return a.T == b.T && a.Tau == b.Tau && a.Window == b.Window && a.Origin == b.Origin && a.Ramp.T0 == b.Ramp.T0 && a.Ramp.Over == b.Ramp.Over &&
		a.Rise == b.Rise // nil here: the limiter gives a backend that ramps itself (SharedRamps) no Rise
}

// rec is the member's side of one key's limit.
type rec struct {
	key     string
	limit   gcra.Limit                // as asked (the member's record holds recordLimit of it)
	mu      sync.Mutex                // taken with lock: r.m is read and changed under it
	fast    atomic.Pointer[fastShare] // single permits granted without mu, nil while there is no share
	stale   atomic.Bool               // the key is decided under other limits now: release at once
	m       *allot.Member
	changed chan struct{} // made by the first waiter (watch), closed when an answer from the store arrives
}

// watch returns the channel closed at the next answer from the store; r.mu is held.
func (r *rec) watch() <-chan struct{} {
	if r.changed == nil {
		r.changed = make(chan struct{})
	}
	return r.changed
}

// Observer is told, after every answer from the store, what a member holds of one limit
// (its share, epoch, lease expiry, demand, used against granted). ObserveLease is called
// from the renewal goroutine: it must be fast and must not call the backend.
type Observer interface {
	ObserveLease(Status)
}

// ObserverFunc adapts a function to an Observer.
type ObserverFunc func(Status)

// ObserveLease calls f(s).
func (f ObserverFunc) ObserveLease(s Status) { f(s) }

// Option configures a Backend.
type Option interface{ apply(*Backend) }

type optionFunc func(*Backend)

func (f optionFunc) apply(b *Backend) { f(b) }

// WithClock sets the clock (default clock.Default).
func WithClock(c clock.Clock) Option { return optionFunc(func(b *Backend) { b.clock = c }) }

// WithID names the member (default: host name, process id and a random suffix). Members
// of one limit need distinct names; two backends with the same name count as one member
// that restarted.
func WithID(id string) Option { return optionFunc(func(b *Backend) { b.id = id }) }

// WithConfig sets the allocation's settings for the records this member makes (default
// DefaultConfig()). A record keeps the settings it was made with, so every member of a
// limit should use the same.
func WithConfig(c Config) Option { return optionFunc(func(b *Backend) { b.apply.cfg = c }) }

// WithMemberConfig sets the member's settings (default DefaultMemberConfig()).
func WithMemberConfig(c MemberConfig) Option { return optionFunc(func(b *Backend) { b.mcfg = c }) }

// WithRenewEvery sets how often leases are renewed (MemberConfig.RenewEvery).
func WithRenewEvery(d time.Duration) Option {
	return optionFunc(func(b *Backend) { b.mcfg.RenewEvery = d })
}

// WithRelayAbove sets the number of live members past which this member relays a limit's
// renewals through the limit's allocator (default 16, allot.CrowdedAbove;
// docs/lease.md, "Crowded limits: the relay"). It is for tests that reach the relay with
// a few members (the robustness suite); the members of a limit should agree on it. Set,
// the relay runs on any clock (otherwise only on the real one), which must then pass in
// real time.
func WithRelayAbove(n int) Option { return optionFunc(func(b *Backend) { b.relayAbove = n }) }

// WithIdleAfter sets how long a key may go without a decision before its share is handed
// back and the key forgotten (default DefaultIdleAfter).
func WithIdleAfter(d time.Duration) Option {
	return optionFunc(func(b *Backend) { b.idleAfter = int64(d) })
}

// WithStoreTimeout bounds each store round trip (default DefaultStoreTimeout).
func WithStoreTimeout(d time.Duration) Option {
	return optionFunc(func(b *Backend) { b.timeout = d })
}

// WithObserver sets a hook told what the member holds after every answer from the store.
// It is called from the renewal goroutine, before the calls waiting for that answer go
// on, so it should be quick.
func WithObserver(o Observer) Option { return optionFunc(func(b *Backend) { b.observer = o }) }

// WithLogger sets where the backend says what an operator should know (default
// slog.Default()): a store met cold, whose limits are fenced for TTL + grace; a limit
// shared by more members than the mode claims to serve
// (MaxMembers).
func WithLogger(l *slog.Logger) Option { return optionFunc(func(b *Backend) { b.log = l }) }

// MaxMembers is the most members the lease mode claims to serve on one limit
// (docs/guarantees.md): every member's renewal changes the limit's one record, written by
// compare-and-set, so past sixteen members they go through an allocator elected among
// them, which writes it once a tick for all (docs/lease.md, "Crowded limits: the relay";
// 200 members measured through it), while the takes of a limit decided at the store
// still collide on it. The backend logs a warning, once per key, when a limit's record
// holds more, naming the strict mode, which decides each permit in the store whatever the
// pool.
const MaxMembers = 100

// MaxBucketMembers is the most members the lease mode claims to serve on one limit decided
// on its bucket: a limit with more members than permits of burst (decided at the store),
// no windowed quota and no ramp, which past allot.BucketAbove members is decided on a
// bucket of its own, one store call a permit, while its members confirm their
// registrations by reading its record (allot.OpConfirm), which is written about once in
// allot.BucketKeep/2. A thousand members measured on one Redis use 2,000/s burst=400 whole
// (BenchmarkLeaseRedisMembers, BENCHMARKS.md).
const MaxBucketMembers = 1000

// New returns a member of the limits it will be asked to decide, sharing them through
// store, and starts its renewal goroutine. Close it to hand its shares back.
func New(store store.Store, opts ...Option) (*Backend, error) {
	return newBackend(store, nil, opts)
}

// DefaultStorePrefix is the prefix of the records in a store that Dial opens.
const DefaultStorePrefix = "sluice:lease:"

// Dial opens the store url names (store.Open: memory://, redis://, rediss://,
// redis-cluster://, redis-sentinel://, and etcd:// or zk:// when package store/etcd or
// store/zk is linked, as store/all links both), its records under DefaultStorePrefix,
// checks that it answers, and returns a member on it that owns the store's client (Close
// closes it). strict.Dial takes the same URLs. A store seen for the first time fences its
// records for TTL + Grace (WaitUnfenced).
func Dial(ctx context.Context, url string, opts ...Option) (*Backend, error) {
	h, err := store.Open(ctx, url, store.WithPrefix(DefaultStorePrefix))
	if err != nil {
		return nil, err
	}
	if err := h.Ping(ctx); err != nil {
		h.Close()
		return nil, err
	}
	b, err := newBackend(h, h, opts)
	if err != nil {
		h.Close()
		return nil, err
	}
	return b, nil
}

func newBackend(store store.Store, owned io.Closer, opts []Option) (*Backend, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: no store", allot.ErrInvalidConfig)
	}
	b := &Backend{owned: owned, apply: applier{store: store, cfg: DefaultConfig()}, clock: clock.Default, mcfg: DefaultMemberConfig(), idleAfter: int64(DefaultIdleAfter),
		timeout: DefaultStoreTimeout, wake: make(chan struct{}, 1), keys: keytable.New[keyRecs](), quit: make(chan struct{}), done: make(chan struct{}),
		crowdAfter: int64(crowdLasting)}
	for _, o := range opts {
		o.apply(b)
	}
	b.apply.log = b.log
	b.apply.clock = b.clock
	b.real, _ = b.clock.(*clock.Real)
	if err := b.mcfg.Validate(); err != nil {
		return nil, err
	}
	if err := b.apply.cfg.Validate(); err != nil {
		return nil, err
	}
	if b.timeout <= 0 || b.idleAfter <= 0 {
		return nil, fmt.Errorf("%w: store timeout and idle time must be positive", allot.ErrInvalidConfig)
	}
	if b.id == "" {
		host, _ := os.Hostname()
		b.id = fmt.Sprintf("%s-%d-%08x", host, os.Getpid(), rand.Uint32())
	}
	if _, real := b.clock.(*clock.Real); real || b.relayAbove > 0 {
		// The relay paces its reads in real time: a member on a virtual clock (tests that
		// move time themselves) writes its record directly, whatever the pool, unless it
		// was asked for a relay (WithRelayAbove: a test's clock that runs in real time).
		b.apply.relay = newRelay(b.id, b.mcfg.RenewEvery, b.clock)
		if b.relayAbove > 0 {
			b.apply.relay.above = b.relayAbove
		}
	}
	go b.run()
	return b, nil
}

// ID returns the member's name.
func (b *Backend) ID() string { return b.id }

// RoundTrips returns how many round trips to the store the backend has made.
func (b *Backend) RoundTrips() int64 { return b.roundTrips.Load() }

// records returns key's records for limits, in the order of limits, using out's storage,
// creating those it lacks. A key that gets a record is marked as decided under limits: the
// records of the limits it was decided under before, and no longer is, are marked stale
// (the key's limits changed: a reload), and their shares go back at the next round, not
// after they idle out.
func (b *Backend) records(key string, limits []gcra.Limit, out *[gcra.MaxLimits]*rec) []*rec {
	rs := out[:len(limits)]
	if e := b.keys.Load(key); e != nil {
		all := true
		for i, l := range limits {
			if rs[i] = e.Val.find(&l); rs[i] == nil {
				all = false
				break
			}
		}
		if all {
			return rs
		}
	}
	for {
		e, _ := b.keys.LoadOrStore(key, nil)
		k := &e.Val
		k.mu.Lock()
		if k.gone {
			k.mu.Unlock()
			continue // it left the table meanwhile
		}
		var list []*rec
		if p := k.recs.Load(); p != nil {
			list = *p
		}
		added := false
		for i, l := range limits {
			if rs[i] = k.find(&l); rs[i] == nil {
				rs[i] = &rec{key: key, limit: l, m: allot.NewMember(b.id, recordLimit(l), b.mcfg, b.clock.Nanotime())}
				next := append(slices.Clip(list), rs[i]) // a new slice: lookups read the old one
				k.recs.Store(&next)
				list = next
				added = true
			}
		}
		if added {
			for _, old := range k.limits {
				if !slices.Contains(limits, old) {
					if r := k.find(&old); r != nil {
						r.stale.Store(true)
					}
				}
			}
			k.limits = slices.Clone(limits)
		}
		k.mu.Unlock()
		if added {
			b.nudge()
		}
		return rs
	}
}

// forget takes r, released, out of its key's records, and the key's entry out of the
// table with its last record; r.mu is held, so that a caller that finds r released and
// looks again does not find it.
func (b *Backend) forget(e *keyEntry, r *rec) {
	k := &e.Val
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.gone {
		return
	}
	var list []*rec
	for _, x := range *k.recs.Load() {
		if x != r {
			list = append(list, x)
		}
	}
	k.recs.Store(&list)
	if len(list) == 0 {
		k.gone = true
		b.keys.Delete(e) // its limits are forgotten with it (bounded memory)
	}
}

// allRecords yields every record the member holds, with its key's entry.
func (b *Backend) allRecords(yield func(*keyEntry, *rec) bool) {
	for e := range b.keys.All() {
		if p := e.Val.recs.Load(); p != nil {
			for _, r := range *p {
				if !yield(e, r) {
					return
				}
			}
		}
	}
}

// lock locks rs (once each: two equal limits are one record) in a fixed order, and
// reports false (unlocking) if one was released (an idle key forgotten meanwhile): the
// caller then takes fresh records.
func lock(rs []*rec) bool {
	order := rs
	if len(rs) > 1 {
		order = slices.Clone(rs)
		slices.SortFunc(order, func(a, b *rec) int {
			if c := cmp.Compare(a.m.Limit().T, b.m.Limit().T); c != 0 {
				return c
			}
			return cmp.Compare(a.m.Limit().Tau, b.m.Limit().Tau)
		})
		order = slices.Compact(order)
	}
	for i, r := range order {
		r.lock()
		if r.m.Released() {
			for _, u := range order[:i+1] {
				u.unlock()
			}
			return false
		}
	}
	return true
}

func unlock(rs []*rec) {
	for i, r := range rs {
		if !slices.Contains(rs[:i], r) {
			r.unlock()
		}
	}
}

func (b *Backend) nudge() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// nudgeFor wakes the renewal goroutine if a member's request is due (at due) before it
// would wake by itself: a denied caller must not make it walk every record for nothing.
func (b *Backend) nudgeFor(due int64) {
	if due < b.sleepUntil.Load() {
		b.nudge()
	}
}

// Decide decides req for key on the member's shares (see backend.Backend). A key seen for
// the first time joins its limits' pools first (one store round trip). When the member
// holds no usable share, or the permits would fall after its lease's end, Decide waits
// for the next renewal within req.MaxDelay (a caller that may wait), and otherwise
// answers with a denial whose RetryAfter says when to ask again. Under req.Core's limits
// (the key's own, which name its records) it keeps of each share's burst the part that
// req.Limits keep of the limit's for a higher class (allot.DecideKeeping).
func (b *Backend) Decide(ctx context.Context, key string, req backend.Request) (backend.Grant, error) {
	if b.closed.Load() {
		return backend.Grant{}, backend.ErrClosed
	}
	if err := gcra.ValidateLimits(req.Limits); err != nil {
		return backend.Grant{}, err
	}
	if req.N > gcra.MaxCost(req.Limits) {
		return backend.Grant{}, gcra.ErrCostExceedsBurst
	}
	// The records are the key's own limits'; a request that keeps headroom for a higher
	// class (req.Core set) is decided on them keeping the same part of each share's burst.
	names := req.Limits
	var keep [gcra.MaxLimits]float64
	var kept *[gcra.MaxLimits]float64 // nil: the request keeps nothing
	if req.Core != nil {
		some, err := keptFractions(req.Core, req.Limits, &keep)
		if err != nil {
			return backend.Grant{}, err
		}
		if names = req.Core; some {
			kept = &keep
		}
	}
	md := int64(max(req.MaxDelay, 0))
	critical := priority.Of(ctx) == priority.Critical
	start := b.clock.Nanotime()
	var ms [gcra.MaxLimits]*allot.Member
	var buf [gcra.MaxLimits]*rec
	joins := 0
	for counted := false; ; counted = true {
		rs := b.records(key, names, &buf)
		for !lock(rs) {
			// A record released meanwhile (idle, or the backend closing): it is gone from
			// the map, so asking again makes a fresh one.
			if b.closed.Load() {
				return backend.Grant{}, backend.ErrClosed
			}
			rs = b.records(key, names, &buf)
		}
		now := b.clock.Nanotime()
		left := max(md-(now-start), 0)
		for i, r := range rs {
			ms[i] = r.m
		}
		var res gcra.Result
		var tk gcra.Ticket
		var out allot.Outcome
		var err error
		// Called directly, not through a func value, so that ms stays on the stack.
		if counted {
			res, tk, out, err = allot.DecideAgainKeeping(ms[:len(rs)], now, req.N, left, kept) // its permits were counted in the demand already
		} else {
			if critical {
				for i, m := range ms[:len(rs)] {
					if !slices.Contains(ms[:i], m) {
						m.AskedCritical(req.N) // that part of its demand is given first
					}
				}
			}
			res, tk, out, err = allot.DecideKeeping(ms[:len(rs)], now, req.N, left, kept)
		}
		if out == allot.AtStore {
			borrow := rs[0].m.Borrowing()
			g, err := b.decideAtStore(ctx, key, rs, ms[:len(rs)], now, req.N, left) // unlocks rs
			if borrow && !g.Allowed && ctx.Err() == nil && !b.closed.Load() {
				continue // the pool was short (or the store did not answer): decide again on the share
			}
			if err != nil || g.Allowed || g.RetryAfter <= 0 || g.RetryAfter > left-(b.clock.Nanotime()-now) {
				return g, err
			}
			// Told when its turn comes, within the caller's bound: it waits, keeping its
			// place in the store's line, and asks again.
			if err := b.waitChange(ctx, nil, time.Duration(g.RetryAfter)); err != nil {
				return backend.Grant{}, err
			}
			continue
		}
		var ch <-chan struct{}
		joining := false
		due := int64(math.MaxInt64)
		if out == allot.NoLease || out == allot.LeaseEnds || out == allot.TooFar {
			w := rs[0]
			for _, r := range rs {
				due = min(due, r.m.Due(now))
			}
			for _, r := range rs {
				if r.m.Joining() || r.m.Drawing(now) {
					// A key seen for the first time: its first decision waits for the
					// joins and the first share (or their failure), whatever the
					// caller's bound; and a windowed quota's member short of tokens
					// waits for its draw (one round trip) while the window has some.
					w, joining = r, true
					break
				}
				if _, ok := r.m.Usable(now); !ok {
					w = r
				}
			}
			ch = w.watch()
		}
		unlock(rs)
		if err != nil {
			return backend.Grant{}, err
		}
		if out == allot.Granted || out == allot.Throttled {
			return backend.Grant{Result: res, Ticket: tk}, nil
		}
		wait := time.Duration(left)
		switch {
		case out == allot.TooFar:
			wait = time.Duration(max(res.RetryAfter, 1)) // then book it, within the horizon
		case joining:
			b.nudgeFor(due)
			wait = b.timeout
			if joins++; joins > 8 {
				return backend.Grant{Result: gcra.Result{RetryAfter: res.RetryAfter}}, nil
			}
		case wait <= 0:
			b.nudgeFor(due)
			return backend.Grant{Result: gcra.Result{RetryAfter: res.RetryAfter, ResetAfter: res.ResetAfter}}, nil
		default:
			b.nudgeFor(due)
		}
		b.waiting(rs, 1)
		err = b.waitChange(ctx, ch, wait)
		b.waiting(rs, -1)
		if err != nil {
			return backend.Grant{}, err
		}
		if joining {
			start = b.clock.Nanotime() // the caller's bound counts from the join
		}
	}
}

// keptFractions sets keep[i] to the fraction of core[i]'s burst that kept[i] keeps for a
// higher class (backend.Request.Core), and reports whether any keeps something (a
// windowed quota keeps nothing). It returns gcra.ErrInvalidLimits unless kept are core's
// limits at the same rates with bursts no larger.
func keptFractions(core, kept []gcra.Limit, keep *[gcra.MaxLimits]float64) (some bool, err error) {
	if len(core) != len(kept) {
		return false, fmt.Errorf("%w: %d limits keep headroom of %d", gcra.ErrInvalidLimits, len(kept), len(core))
	}
	if err := gcra.ValidateLimits(core); err != nil {
		return false, err
	}
	for i := range core {
		c, k := &core[i], &kept[i]
		if k.T != c.T || k.Tau > c.Tau || k.Window != c.Window {
			return false, fmt.Errorf("%w: kept limit %+v of %+v", gcra.ErrInvalidLimits, *k, *c)
		}
		keep[i] = float64(c.Burst()-k.Burst()) / float64(c.Burst())
		some = some || keep[i] > 0
	}
	return some, nil
}

// waiting tells rs's members that a caller starts or stops waiting for a share.
func (b *Backend) waiting(rs []*rec, delta int) {
	for i, r := range rs {
		if !slices.Contains(rs[:i], r) {
			r.lock()
			r.m.Wait(delta)
			r.unlock()
		}
	}
}

// waitChange waits until ch is closed, d has passed, ctx is done or the backend closes.
func (b *Backend) waitChange(ctx context.Context, ch <-chan struct{}, d time.Duration) error {
	t := b.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-t.C():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-b.quit:
		return backend.ErrClosed
	}
}

// AllowOne takes one permit for key under l if one is free now (backend.Allower).
func (b *Backend) AllowOne(ctx context.Context, key string, l gcra.Limit) (bool, error) {
	return b.AllowOneRef(ctx, key, &l)
}

// AllowOneRef is AllowOne with the limit passed by reference, as the limiter calls it (a
// copy of the limit on the stack for each call is part of the fast path's cost).
func (b *Backend) AllowOneRef(ctx context.Context, key string, l *gcra.Limit) (bool, error) {
	if b.closed.Load() {
		return false, backend.ErrClosed
	}
	if e := b.keys.Load(key); e != nil {
		if r := e.Val.find(l); r != nil {
			var now int64
			if b.real != nil {
				now = b.real.Nanotime() // inlined: no call through the interface
			} else {
				now = b.clock.Nanotime()
			}
			if f := r.fast.Load(); f != nil && f.allow(now) {
				return true, nil
			}
			if allowed, ok := b.allowLocked(r, now); ok {
				return allowed, nil
			}
		}
	}
	return b.allowLongWay(ctx, key, l)
}

// allowLocked is AllowOne's decision under r's lock, when the fast path refused or was
// shut, at the fast path's reading of the clock (a moment older once the lock is taken: a
// decision at an earlier instant grants no permit a later one would not). ok is false
// when the caller goes the long way.
//
//go:noinline
func (b *Backend) allowLocked(r *rec, now int64) (allowed, ok bool) {
	r.lock()
	defer r.unlock()
	if r.m.Released() {
		return false, false
	}
	if allowed, ok = r.m.AllowOne(now); !ok {
		// Refused where the member may borrow (or no usable share): the long way would
		// first decide again on the share, at a fresh reading of the clock. That is done
		// here, at a fraction of its cost (no lookup, no second lock): a member running at
		// its share's rate mostly finds its next permit due by then.
		allowed, ok = r.m.AllowOne(b.clock.Nanotime())
	}
	return allowed, ok
}

// allowLongWay is AllowOne by Decide (out of line: its frame is AllowOne's cost).
//
//go:noinline
func (b *Backend) allowLongWay(ctx context.Context, key string, l *gcra.Limit) (bool, error) {
	g, err := b.Decide(ctx, key, backend.Request{Limits: []gcra.Limit{*l}, N: 1})
	return g.Allowed, err
}

// Adjust settles a grant (see backend.Backend and lease.Adjust).
func (b *Backend) Adjust(ctx context.Context, key string, limits []gcra.Limit, t gcra.Ticket, newN int64) error {
	if b.closed.Load() {
		return backend.ErrClosed
	}
	if err := gcra.ValidateLimits(limits); err != nil {
		return err
	}
	var buf [gcra.MaxLimits]*rec
	rs := b.records(key, limits, &buf)
	if !lock(rs) {
		return nil // the key was forgotten: nothing left to settle
	}
	var ms [gcra.MaxLimits]*allot.Member
	for i, r := range rs {
		ms[i] = r.m
	}
	now := b.clock.Nanotime()
	err := allot.Adjust(ms[:len(rs)], now, t, newN)
	// Limits whose permits were taken at the store are settled there.
	var calls []call
	for i, r := range rs {
		if t.TatAfter[i] == allot.TakenAtStore && newN != t.N && !slices.Contains(rs[:i], r) {
			calls = append(calls, b.takeCall(key, r.m, r.m.GiveRequest(now, t.N-newN), now))
		}
	}
	unlock(rs)
	if len(calls) > 0 {
		sctx, cancel := context.WithTimeout(ctx, b.timeout)
		defer cancel()
		res, serr := b.apply.applyTakes(sctx, calls)
		for k := range res {
			switch {
			case serr != nil || newN <= t.N:
			case res[k].err != nil:
				serr = res[k].err // a charge at a bucket that failed
			case !res[k].rep.Taken:
				serr = errors.New("the store did not count the charge")
			}
		}
		if serr != nil && err == nil && newN > t.N {
			err = fmt.Errorf("sluice lease: settle %q at the store: %w", key, serr) // a lost charge is an error; a lost refund only wastes permits
		}
	}
	return err
}

// Penalize holds key back for d: at once in this member, and in the whole pool as soon
// as the others renew (within one renewal interval), through the store.
func (b *Backend) Penalize(ctx context.Context, key string, limits []gcra.Limit, d time.Duration) error {
	if b.closed.Load() {
		return backend.ErrClosed
	}
	if err := gcra.ValidateLimits(limits); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	var buf [gcra.MaxLimits]*rec
	rs := b.records(key, limits, &buf)
	for !lock(rs) { // released meanwhile: see Decide
		if b.closed.Load() {
			return backend.ErrClosed
		}
		rs = b.records(key, limits, &buf)
	}
	var ms [gcra.MaxLimits]*allot.Member
	for i, r := range rs {
		ms[i] = r.m
	}
	now := b.clock.Nanotime()
	until := gcra.After(now, int64(d))
	k := allot.Penalize(ms[:len(rs)], now, until)
	req := ms[k].PenalizeRequest(now, until)
	c := call{key: key, limit: ms[k].Limit(), req: req}
	known, _ := ms[k].Bucket(now, RecordID(key, c.limit))
	unlock(rs)
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	b.roundTrips.Add(1)
	res, err := b.apply.apply(ctx, []call{c})
	if err == nil {
		err = res[0].err
	}
	if err == nil && res[0].rep.Bucket != 0 {
		// The limit is decided on its bucket (the record says so, whatever the member
		// knew): held back there, for every member at once.
		known = bucketOf(c, res[0].rep)
	}
	if known.ID != "" {
		c.bucket = known
		_, _, berr := b.apply.bucket(ctx, c)
		err = errors.Join(err, berr)
	}
	if err != nil {
		return fmt.Errorf("sluice lease: report the penalty on %q: %w", key, err)
	}
	return nil
}

// Leases returns what the member holds of every limit it decides, now.
func (b *Backend) Leases() []Status {
	now := b.clock.Nanotime()
	var out []Status
	for _, r := range b.allRecords {
		r.lock()
		st := r.m.Status(now)
		r.unlock()
		st.Key = r.key
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b Status) int {
		if c := cmp.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		return cmp.Compare(a.Limit.T, b.Limit.T)
	})
	return out
}

// Close stops the renewal goroutine and hands every share back to the store at once (one
// touch reads the store once when the member starts. A store seen for the first time (a
// Redis just started or flushed, an etcd or ZooKeeper without the lease mode's meta key)
// begins its incarnation at its first read, and fences every record it makes for TTL +
// Grace after that (it cannot tell that no lease was granted from it before): read now,
// the fence runs from the member's start, not from its first decision, which would
// otherwise find every limit fenced for its first second and a half. It changes nothing
// else, and a store that does not answer is asked again by the first round that needs it.
func (b *Backend) touch() {
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	go func() {
		select {
		case <-b.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	if snap, err := b.apply.store.Load(ctx, nil); err == nil && snap.Since != store.Fresh {
		b.apply.noteFence(snap.Now, b.apply.cfg.FenceAfterRestart(snap.Since))
	}
}

// round trip). Later calls return backend.ErrClosed. It returns the store's error, if the
// release could not be delivered (the shares then end with their leases).
func (b *Backend) Close() error {
	var err error
	b.closeOnce.Do(func() {
		b.closed.Store(true)
		close(b.quit)
		<-b.done
		now := b.clock.Nanotime()
		var calls []call
		for e, r := range b.allRecords {
			r.lock()
			if req, ok := r.m.Release(now); ok {
				calls = append(calls, call{key: r.key, limit: r.m.Limit(), req: req})
			}
			b.forget(e, r) // under the lock, as round does: a released record is never found
			r.unlock()
		}
		if len(calls) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
			defer cancel()
			b.roundTrips.Add(1)
			if _, e := b.apply.apply(ctx, calls); e != nil {
				err = fmt.Errorf("sluice lease: release on close: %w", e)
			}
		}
		b.apply.relay.close() // after the releases: this member may be the one that applies them
		if b.owned != nil {
			b.owned.Close()
		}
	})
	return err
}

// run is the renewal goroutine: it sends what is due (in one round trip), applies the
// answers, and sleeps until the next due time or a nudge.
func (b *Backend) run() {
	defer close(b.done)
	b.touch()
	t := b.clock.NewTimer(time.Hour)
	defer t.Stop()
	for {
		b.sleepUntil.Store(math.MaxInt64) // awake: a nudge now is kept for after this round
		next := b.round()
		select {
		case <-b.quit:
			return
		default:
		}
		d := next - b.clock.Nanotime()
		if d <= 0 {
			// Due already (the clock moved during the round): another round at once. A
			// virtual clock fires a timer of no duration only when it next moves.
			continue
		}
		t.Reset(time.Duration(d))
		b.sleepUntil.Store(next) // once the timer is set: whoever sees it may move a virtual clock past it
		select {
		case <-t.C():
		case <-b.wake:
		case <-b.quit:
			return
		}
	}
}

type pending struct {
	r     *rec
	nonce uint64
}

// round sends every request due within a quarter of a renewal interval in one round trip,
// applies the answers, and returns when the next is due.
func (b *Backend) round() int64 {
	now := b.clock.Nanotime()
	early := int64(b.mcfg.RenewEvery) / 4
	var calls []call
	var owners []pending
	for e, r := range b.allRecords {
		r.lock()
		if r.m.Released() {
			r.unlock()
			continue
		}
		if r.m.Idle(now, b.idleAfter) || (r.stale.Load() && r.m.Idle(now, 0)) {
			if req, ok := r.m.Release(now); ok {
				calls = append(calls, call{key: r.key, limit: r.m.Limit(), req: req})
				owners = append(owners, pending{})
			}
			b.forget(e, r)
			r.unlock()
			continue
		}
		if req, ok := r.m.Request(now, early); ok {
			calls = append(calls, call{key: r.key, limit: r.m.Limit(), req: req})
			owners = append(owners, pending{r, req.Nonce})
		}
		r.unlock()
	}
	if len(calls) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
		b.roundTrips.Add(1)
		res, err := b.apply.apply(ctx, calls)
		cancel()
		sent := now
		if err == nil && len(res) != len(calls) {
			err = fmt.Errorf("%w: lease store: %d answers to %d requests", backend.ErrUnavailable, len(res), len(calls))
		}
		if err != nil && !errors.Is(err, backend.ErrUnavailable) {
			err = fmt.Errorf("%w: lease store: %w", backend.ErrUnavailable, err)
		}
		now = b.clock.Nanotime()
		for i, p := range owners {
			if p.r == nil {
				continue
			}
			var rep allot.Reply
			e := err
			if e == nil {
				rep, e = res[i].rep, res[i].err
			}
			p.r.lock()
			at := b.clock.Nanotime() // read under the lock: every decision on the record before it was on the old lease
			p.r.m.Receive(at, p.nonce, rep, e)
			live, onBucket, central := p.r.m.Live(), p.r.m.OnBucket(), p.r.m.Central()
			changed := p.r.changed // nil if nobody waits
			p.r.changed = nil
			var st Status
			if b.observer != nil {
				st = p.r.m.Status(at)
				st.Key, st.Asked = p.r.key, sent
			}
			p.r.unlock()
			if b.observer != nil {
				b.observer.ObserveLease(st) // before the waiters wake: they see it observed
			}
			b.judgeCrowd(p.r.key, live, beyondClaim(live, onBucket, central), at)
			if changed != nil {
				close(changed)
			}
		}
	}
	next := int64(math.MaxInt64)
	for _, r := range b.allRecords {
		r.lock()
		next = min(next, r.m.Due(now), r.m.LastCall()+b.idleAfter)
		r.unlock()
	}
	if next == math.MaxInt64 {
		next = now + int64(time.Hour)
	}
	return next
}

// Ping reports whether the store answers, if it can say (a Redis store can; a
// store.Memory always does), and whether the store fences the limits it makes
// (backend.Pinger: the daemon's /readyz answers 503 with the reason meanwhile). A store
// seen for the first time (a new Redis, or one flushed or restarted empty) fences every
// limit for TTL + grace, since it cannot tell that no lease was granted from it before;
// `sluice store init` prepares a new store so that it does not.
func (b *Backend) Ping(ctx context.Context) error {
	if p, ok := b.apply.store.(backend.Pinger); ok {
		if err := p.Ping(ctx); err != nil {
			return err
		}
	}
	if left := b.apply.fenceLeft(); left > 0 {
		return fmt.Errorf("%w: lease: limits fenced for %v more: the store has no record of the leases granted from it before (a first use, a restart or a flush); a new store prepared with `sluice store init` is not fenced (docs/lease.md)",
			backend.ErrUnavailable, left.Round(time.Millisecond))
	}
	return nil
}

// decideAtStore decides n permits for a key some of whose limits are decided at the store
// (a limit too small to share out): it takes those at the store, in one round trip, and
// decides the others on the member's shares, at the latest of their times. rs are locked;
// it unlocks them. If any limit denies, what the others granted is given back.
func (b *Backend) decideAtStore(ctx context.Context, key string, rs []*rec, ms []*allot.Member, now, n, maxDelay int64) (backend.Grant, error) {
	var takes []call
	var at []int // the index in ms of each take
	var local []*allot.Member
	var localAt []int
	for i, m := range ms {
		if slices.Contains(ms[:i], m) {
			continue
		}
		if m.Central() || m.Borrowing() {
			if req, ok := m.TakeRequest(now, n, maxDelay); ok {
				takes = append(takes, b.takeCall(key, m, req, now))
				at = append(at, i)
				continue
			}
		}
		local, localAt = append(local, m), append(localAt, i)
	}
	var lres gcra.Result
	var ltk gcra.Ticket
	if len(local) > 0 {
		var out allot.Outcome
		var err error
		lres, ltk, out, err = allot.DecideAgain(local, now, n, maxDelay)
		if err != nil || out != allot.Granted {
			unlock(rs)
			if err != nil {
				return backend.Grant{}, err
			}
			return backend.Grant{Result: gcra.Result{RetryAfter: max(lres.RetryAfter, int64(b.mcfg.RenewEvery)/4)}}, nil
		}
	}
	unlock(rs)
	sctx, cancel := context.WithTimeout(ctx, b.timeout)
	b.roundTrips.Add(1)
	res, err := b.apply.applyTakes(sctx, takes)
	cancel()
	// Permits borrowed from the free capacity are the member's from the store's answer on,
	// not from when it asked: their slot is when the answer arrived (the store took them
	// from its pool at some instant in between).
	arrival := b.clock.Nanotime()
	var g backend.Grant
	g.Ticket.N, g.Delay, g.Allowed = n, lres.Delay, err == nil
	for k, i := range localAt {
		g.Ticket.TatAfter[i] = ltk.TatAfter[k]
	}
	var taken []int
	for k, i := range at {
		g.Ticket.TatAfter[i] = allot.TakenAtStore
		if err != nil {
			continue
		}
		r := res[k]
		if r.err != nil || !r.rep.Taken {
			g.Allowed = false
			g.RetryAfter = max(g.RetryAfter, r.rep.Wait)
			continue
		}
		taken = append(taken, k)
		g.Delay = max(g.Delay, r.rep.Wait)
		if takes[k].req.Borrow {
			g.Delay = max(g.Delay, arrival-now) // a borrow: the permit is the member's from the answer's arrival
		}
	}
	if !lock(rs) { // forgotten meanwhile (idle, or closing): what the store said stands
		if !g.Allowed {
			b.giveBack(takes, taken)
		}
		g.Ticket.At = now + g.Delay
		return g, nil
	}
	var borrowed []Status
	for k, i := range at {
		var rep allot.Reply
		e := err
		if e == nil {
			rep, e = res[k].rep, res[k].err
		}
		if !takes[k].req.Borrow {
			ms[i].Took(now, arrival, n, rep, e)
			continue
		}
		ms[i].TookBorrow(arrival, n, rep, e)
		if b.observer != nil && e == nil && rep.Taken {
			st := ms[i].Status(arrival) // At: the borrowed permits' slot
			st.Key, st.Asked, st.Borrowed = key, takes[k].req.Sent, n
			borrowed = append(borrowed, st)
		}
	}
	defer func() {
		for _, st := range borrowed {
			b.observer.ObserveLease(st) // after rs are unlocked
		}
	}()
	if !g.Allowed && len(local) > 0 {
		_ = allot.Adjust(local, now, ltk, 0) // the local part is given back too
	}
	unlock(rs)
	if err != nil {
		return backend.Grant{}, err
	}
	if !g.Allowed {
		b.giveBack(takes, taken)
		g.Delay = 0
		g.RetryAfter = max(g.RetryAfter, 1)
		return g, nil
	}
	g.Ticket.At = now + g.Delay
	return g, nil
}

// giveBack gives back, at the store, the permits of the takes that were granted (by index)
// when another limit of the same decision denied.
func (b *Backend) giveBack(takes []call, granted []int) {
	if len(granted) == 0 {
		return
	}
	var gives []call
	for _, k := range granted {
		c := takes[k]
		c.req.Op, c.req.MaxDelay = allot.OpGive, 0
		gives = append(gives, c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	_, _ = b.apply.applyTakes(ctx, gives) // a lost give-back only wastes permits
}

// takeCall is the call of a member's request about its permits (a take, a give, a
// settlement): at its limit's bucket if the member knows its limit is decided there.
func (b *Backend) takeCall(key string, m *allot.Member, req allot.Request, now int64) call {
	c := call{key: key, limit: m.Limit(), req: req}
	if !req.Borrow {
		c.bucket, _ = m.Bucket(now, RecordID(key, c.limit))
	}
	return c
}

// beyondClaim reports whether live members of a limit are more than the mode claims to
// serve: MaxBucketMembers on its bucket, or decided at the store (central: past
// allot.BucketAbove members it moves to its bucket at its next take); MaxMembers on a
// limit shared out.
func beyondClaim(live int64, onBucket, central bool) bool {
	if onBucket || central {
		return live > MaxBucketMembers
	}
	return live > MaxMembers
}

// crowdLasting is how long a limit must stay beyond the mode's claim, as this member's
// answers say, before the backend warns of it: a pool starting at once passes a hundred
// members while its record still shares the limit out, and moves to its bucket within a
// second or two (a thousand members each warned, 694 warnings in two runs of
// BenchmarkLeaseRedisMembers/members=1000).
const crowdLasting = 10 * time.Second

// judgeCrowd warns of key's limit (warnCrowded) once it has been beyond the claim for
// crowdLasting, at now.
func (b *Backend) judgeCrowd(key string, live int64, beyond bool, now int64) {
	if !beyond {
		b.crowdSince.Delete(key)
		return
	}
	since, _ := b.crowdSince.LoadOrStore(key, now)
	if now-since.(int64) >= b.crowdAfter {
		b.warnCrowded(key, live)
	}
}

// warnCrowded says, once per key, that a limit is shared by more members than the mode
// claims to serve.
func (b *Backend) warnCrowded(key string, live int64) {
	if _, dup := b.crowded.LoadOrStore(key, struct{}{}); dup {
		return
	}
	log := b.log
	if log == nil {
		log = slog.Default()
	}
	most := MaxMembers
	if live > MaxBucketMembers {
		most = MaxBucketMembers
	}
	log.Warn("lease: a limit shared by more members than the lease mode claims to serve (lease.MaxMembers on a limit it shares out, lease.MaxBucketMembers on one decided on its bucket): the renewals and joins of a limit shared out go through one allocator, which falls behind past a few hundred members (docs/lease.md, \"Crowded limits\"); share it through the strict mode",
		"key", key, "members", live, "most", most)
}
