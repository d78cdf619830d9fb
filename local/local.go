// Package local is the in-process backend, the embedded default of Sluice: exact GCRA
// decisions for many keys in one process, with no coordination.
//
// Keys with one limit are decided lock-free: the key's state is one atomic int64 (its TAT)
// updated by compare-and-swap, so parallel callers never share a lock, not even on the
// same key. Keys with several limits take a per-key mutex. Keys live in a sync.Map, whose
// reads do not write shared memory.
//
// A key whose TAT is in the past is indistinguishable from a new key, so idle keys are
// forgotten without changing any decision. A background sweep forgets them at most once
// per SweepEvery, started by a caller that inserts a key. At the key cap a new key takes
// the place of an idle key found in a small random sample, at a cost independent of the
// number of keys. When the sample holds none, the new key gets backend.ErrTooManyKeys and
// the limiter's fail mode answers it (deny, by default). With WithEvictLive it evicts the
// sampled key closest to idle instead. Existing keys are unaffected.
package local

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
)

// Defaults.
const (
	DefaultMaxKeys    = 1 << 20          // keys held at once (about 180 MB of heap when full: docs/local.md)
	DefaultSweepEvery = 10 * time.Second // how often idle keys are forgotten
	minSweepGap       = 50 * time.Millisecond
)

// dead marks a single-limit entry that a sweep removed; a caller that sees it retries on
// a fresh entry.
const dead = math.MinInt64

// Backend is the in-process backend. Use New; it is safe for concurrent use.
type Backend struct {
	clock      clock.Clock
	maxKeys    int64
	sweepEvery int64

	keys  sync.Map // string -> *single | *multi: the authority
	count atomic.Int64

	// snap is a read-only copy of the single-limit entries of keys, rebuilt in the
	// background once misses pass snapLimit. A plain Go map is read in about half the time
	// of sync.Map's trie on many keys; it holds the same *single values, so a decision made
	// through it updates the same state. Entries may be stale (dead): callers then fall back
	// to keys.
	snap       atomic.Pointer[map[string]*single]
	misses     atomic.Int64
	snapLimit  atomic.Int64
	rebuilding atomic.Bool
	wg         sync.WaitGroup // background sweeps and rebuilds
	lastSweep  atomic.Int64
	sweepMu    sync.Mutex
	swept      int64 // entries sweeps have looked at (under sweepMu): their cost
	bgSweep    atomic.Bool
	evicted    atomic.Int64
	evictLive  bool         // at the cap, evict a live key instead of refusing new ones
	liveEvict  atomic.Int64 // live keys evicted
	holds      sync.Map     // string -> int64: end of the key's latest penalty
	closed     atomic.Bool
}

var (
	_ backend.Backend  = (*Backend)(nil)
	_ backend.Allower  = (*Backend)(nil)
	_ backend.Resetter = (*Backend)(nil)
)

type single struct{ tat atomic.Int64 }

type multi struct {
	mu   sync.Mutex
	tats []int64 // nil once swept
}

// Option configures a Backend.
type Option interface{ apply(*Backend) }

type optionFunc func(*Backend)

func (f optionFunc) apply(b *Backend) { f(b) }

// WithClock sets the clock (default clock.Default).
func WithClock(c clock.Clock) Option { return optionFunc(func(b *Backend) { b.clock = c }) }

// WithMaxKeys caps the keys held at once (default DefaultMaxKeys). n <= 0 means no cap.
func WithMaxKeys(n int) Option {
	return optionFunc(func(b *Backend) {
		if n <= 0 {
			b.maxKeys = math.MaxInt64
		} else {
			b.maxKeys = int64(n)
		}
	})
}

// WithEvictLive makes a full backend evict a live key to make room for a new one, instead
// of refusing the new key with backend.ErrTooManyKeys (the default). The victim is, among
// a sample of keys, the one closest to idle (the earliest TAT): the least state is lost.
// An evicted key starts again with its full burst: over-admission of at most one burst per
// eviction, the price of accepting every new key under a flood. The daemon uses it.
func WithEvictLive() Option { return optionFunc(func(b *Backend) { b.evictLive = true }) }

// WithSweepEvery sets how often idle keys are forgotten (default DefaultSweepEvery).
func WithSweepEvery(d time.Duration) Option {
	return optionFunc(func(b *Backend) { b.sweepEvery = int64(max(d, minSweepGap)) })
}

// New returns an in-process backend.
func New(opts ...Option) *Backend {
	b := &Backend{clock: clock.Default, maxKeys: DefaultMaxKeys, sweepEvery: int64(DefaultSweepEvery)}
	for _, o := range opts {
		o.apply(b)
	}
	b.lastSweep.Store(b.clock.Nanotime())
	b.snapLimit.Store(minSnapMisses)
	return b
}

// minSnapMisses is how many misses of the read-only copy trigger its first rebuild.
const minSnapMisses = 256

// Len returns the number of keys held.
func (b *Backend) Len() int { return int(b.count.Load()) }

// Keys returns up to n of the keys held, in no particular order.
func (b *Backend) Keys(n int) []string {
	out := []string{}
	b.keys.Range(func(k, _ any) bool {
		if len(out) >= n {
			return false
		}
		out = append(out, k.(string))
		return true
	})
	return out
}

// Evicted returns the number of idle keys forgotten so far.
func (b *Backend) Evicted() int64 { return b.evicted.Load() }

// EvictedLive returns the number of live keys evicted to make room (WithEvictLive).
func (b *Backend) EvictedLive() int64 { return b.liveEvict.Load() }

// evictSample is how many keys an eviction looks at.
const evictSample = 32

// makeRoom frees one place at the key cap without scanning the map, and reports whether it
// did. It looks at up to three samples in turn. The first two are evictSample keys each,
// from random places in the read-only copy of the single-limit keys (whose iteration
// starts at random). The third is the map's first 4*evictSample keys, the only sample
// when there is no copy yet. It evicts an idle key if a sample holds one (an idle key
// decides as a new one: nothing is lost). Otherwise, with WithEvictLive, it evicts the
// sample's key closest to idle (the earliest TAT). Its cost is the samples', whatever the
// number of keys, so a flood of new keys at the cap never waits for a sweep.
func (b *Backend) makeRoom(now int64) bool {
	for try := 0; try < 3; try++ {
		var victimKey, victim any
		best := int64(math.MaxInt64)
		consider := func(k, v any) {
			t := entryTAT(v)
			if t != dead && t < best {
				best, victimKey, victim = t, k, v
			}
		}
		if try < 2 { // two samples from random places in the copy, then the map's first keys
			m := b.snap.Load()
			if m == nil {
				continue
			}
			seen, visited := 0, 0
			for k, e := range *m { // Go starts a map's iteration at a random place
				visited++
				if e.tat.Load() == dead { // gone since the copy was made
					if visited >= 4*evictSample {
						break
					}
					continue
				}
				consider(k, e)
				if seen++; seen >= evictSample || visited >= 4*evictSample {
					break
				}
			}
			if visited > 2*seen { // a stale copy: make a fresh one
				b.background(&b.rebuilding, b.rebuild)
			}
		} else {
			seen := 0
			b.keys.Range(func(k, v any) bool {
				consider(k, v)
				seen++
				return seen < 4*evictSample
			})
		}
		if victim == nil || (best > now && !b.evictLive) {
			continue
		}
		switch e := victim.(type) {
		case *single:
			if !e.tat.CompareAndSwap(best, dead) {
				continue
			}
		case *multi:
			e.mu.Lock()
			if e.tats == nil {
				e.mu.Unlock()
				continue
			}
			e.tats = nil
			e.mu.Unlock()
		}
		b.holds.Delete(victimKey) // a penalty goes with its key
		if !b.drop(victimKey, victim) {
			continue // a stale copy's entry: it was not in the map any more
		}
		if best <= now {
			b.evicted.Add(1)
		} else {
			b.liveEvict.Add(1)
		}
		return true
	}
	return false
}

// entryTAT returns the latest TAT of an entry (dead if it was removed).
func entryTAT(v any) int64 {
	switch e := v.(type) {
	case *single:
		return e.tat.Load()
	case *multi:
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.tats == nil {
			return dead
		}
		t := int64(math.MinInt64 + 1)
		for _, x := range e.tats {
			t = max(t, x)
		}
		return t
	}
	return dead
}

// Decide decides req for key at the backend clock's now.
func (b *Backend) Decide(_ context.Context, key string, req backend.Request) (backend.Grant, error) {
	if b.closed.Load() {
		return backend.Grant{}, backend.ErrClosed
	}
	now := b.clock.Nanotime()
	md := int64(max(req.MaxDelay, 0))
	if len(req.Limits) == 1 {
		l := req.Limits[0]
		for {
			e, err := b.singleFor(key, now)
			if err != nil {
				return backend.Grant{}, err
			}
			for {
				old := e.tat.Load()
				if old == dead {
					b.drop(key, e)
					break
				}
				tat, res, err := gcra.DecideOne(old, l, now, req.N, md)
				if err != nil || !res.Allowed || req.N == 0 {
					return backend.Grant{Result: res}, err
				}
				if e.tat.CompareAndSwap(old, tat) {
					return backend.Grant{Result: res, Ticket: gcra.TicketOne(req.N, now+res.Delay, tat)}, nil
				}
			}
		}
	}
	if err := gcra.ValidateLimits(req.Limits); err != nil {
		return backend.Grant{}, err
	}
	for {
		e, err := b.multiFor(key, len(req.Limits), now)
		if err != nil {
			return backend.Grant{}, err
		}
		e.mu.Lock()
		if e.tats == nil {
			e.mu.Unlock()
			b.drop(key, e)
			continue
		}
		res, tk, err := gcra.Decide(e.tats, req.Limits, now, req.N, md)
		e.mu.Unlock()
		return backend.Grant{Result: res, Ticket: tk}, err
	}
}

// Capabilities reports that the backend decides windowed quotas, and takes a ramp's
// changing limits (backend.Capable): a key's state is its TATs, whatever limits the next
// decision brings.
func (b *Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{Windows: true, Ramps: true}
}

// AllowOne takes one permit for key under l if one is free now (backend.Allower).
func (b *Backend) AllowOne(_ context.Context, key string, l gcra.Limit) (bool, error) {
	if b.closed.Load() {
		return false, backend.ErrClosed
	}
	now := b.clock.Nanotime()
	for {
		e, err := b.singleFor(key, now)
		if err != nil {
			return false, err
		}
		for {
			old := e.tat.Load()
			if old == dead {
				b.drop(key, e)
				break
			}
			tat, ok := gcra.AllowOne(old, l, now)
			if !ok {
				return false, nil
			}
			if e.tat.CompareAndSwap(old, tat) {
				return true, nil
			}
		}
	}
}

// Adjust settles a grant (see backend.Backend).
func (b *Backend) Adjust(_ context.Context, key string, limits []gcra.Limit, t gcra.Ticket, newN int64) error {
	if b.closed.Load() {
		return backend.ErrClosed
	}
	now := b.clock.Nanotime()
	hold := b.hold(key, now)
	return b.update(key, len(limits), now, func(tats []int64) error {
		_, err := gcra.Adjust(tats, limits, now, t, newN, hold)
		return err
	})
}

// Penalize holds key back for d (see backend.Backend).
func (b *Backend) Penalize(_ context.Context, key string, limits []gcra.Limit, d time.Duration) error {
	if b.closed.Load() {
		return backend.ErrClosed
	}
	if d <= 0 {
		return nil
	}
	now := b.clock.Nanotime()
	until := gcra.After(now, int64(d))
	fresh := false
	for {
		v, loaded := b.holds.LoadOrStore(key, until)
		if !loaded {
			fresh = true
			break
		}
		if old := v.(int64); old >= until || b.holds.CompareAndSwap(key, old, until) {
			break
		}
	}
	err := b.update(key, len(limits), now, func(tats []int64) error {
		gcra.Penalize(tats, limits, now, until)
		return nil
	})
	if err != nil && fresh {
		// The key could not be held (the backend is full): no hold without its key, so
		// that a flood of penalties on new keys stays within the key cap.
		b.holds.CompareAndDelete(key, until)
	}
	return err
}

// Reset forgets key: its next request is decided as a new key's, and its penalty is lifted
// (backend.Resetter).
func (b *Backend) Reset(_ context.Context, key string) error {
	if b.closed.Load() {
		return backend.ErrClosed
	}
	b.holds.Delete(key)
	for {
		v, ok := b.keys.Load(key)
		if !ok {
			return nil
		}
		switch e := v.(type) {
		case *single:
			old := e.tat.Load()
			if old != dead && !e.tat.CompareAndSwap(old, dead) {
				continue
			}
		case *multi:
			e.mu.Lock()
			e.tats = nil
			e.mu.Unlock()
		}
		b.drop(key, v)
		b.holds.Delete(key) // a penalty set meanwhile goes too
		return nil
	}
}

// Close makes later calls return backend.ErrClosed and waits for a background sweep or
// rebuild in progress to end.
func (b *Backend) Close() error {
	b.closed.Store(true)
	b.wg.Wait()
	return nil
}

// background runs f in a goroutine unless one guarded by flag is running or the backend is
// closed. Close waits for it.
func (b *Backend) background(flag *atomic.Bool, f func()) {
	if b.closed.Load() || !flag.CompareAndSwap(false, true) {
		return
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer flag.Store(false)
		f()
	}()
}

// rebuild makes a fresh read-only copy of the live single-limit entries. The next rebuild
// waits for as many misses as the copy has keys, so the work is amortized.
func (b *Backend) rebuild() {
	m := make(map[string]*single, b.count.Load())
	b.keys.Range(func(k, v any) bool {
		if e, ok := v.(*single); ok && e.tat.Load() != dead {
			m[k.(string)] = e
		}
		return true
	})
	b.snap.Store(&m)
	b.misses.Store(0)
	b.snapLimit.Store(max(int64(len(m)), minSnapMisses))
}

// hold returns the end of key's penalty if it is still in force, and forgets it otherwise.
func (b *Backend) hold(key string, now int64) int64 {
	v, ok := b.holds.Load(key)
	if !ok {
		return 0
	}
	if until := v.(int64); until > now {
		return until
	}
	b.holds.CompareAndDelete(key, v)
	return 0
}

// update applies f to key's state (one TAT per limit) atomically.
func (b *Backend) update(key string, nlimits int, now int64, f func(tats []int64) error) error {
	if nlimits == 1 {
		for {
			e, err := b.singleFor(key, now)
			if err != nil {
				return err
			}
			for {
				old := e.tat.Load()
				if old == dead {
					b.drop(key, e)
					break
				}
				tats := [1]int64{old}
				if err := f(tats[:]); err != nil {
					return err
				}
				if e.tat.CompareAndSwap(old, tats[0]) {
					return nil
				}
			}
		}
	}
	for {
		e, err := b.multiFor(key, nlimits, now)
		if err != nil {
			return err
		}
		e.mu.Lock()
		if e.tats == nil {
			e.mu.Unlock()
			b.drop(key, e)
			continue
		}
		err = f(e.tats)
		e.mu.Unlock()
		return err
	}
}

// singleFor returns key's single-limit entry, creating it (or converting a multi-limit one)
// as needed.
func (b *Backend) singleFor(key string, now int64) (*single, error) {
	if m := b.snap.Load(); m != nil {
		if e := (*m)[key]; e != nil && e.tat.Load() != dead {
			return e, nil
		}
	}
	if b.misses.Add(1) >= b.snapLimit.Load() {
		b.background(&b.rebuilding, b.rebuild)
	}
	for {
		v, ok := b.keys.Load(key)
		if !ok {
			e := &single{}
			v2, err := b.insert(key, e, now)
			if err != nil {
				return nil, err
			}
			v = v2
		}
		if e, ok := v.(*single); ok {
			return e, nil
		}
		// The key's limits changed from several to one: carry the first TAT over.
		m := v.(*multi)
		m.mu.Lock()
		tats := m.tats
		m.tats = nil
		m.mu.Unlock()
		if tats != nil {
			e := &single{}
			e.tat.Store(tats[0])
			if b.keys.CompareAndSwap(key, m, e) {
				return e, nil
			}
		} else {
			b.drop(key, m)
		}
	}
}

// multiFor returns key's multi-limit entry with n limits, creating or converting as needed.
// A key whose number of limits changed keeps the TATs it had for the limits that remain.
func (b *Backend) multiFor(key string, n int, now int64) (*multi, error) {
	for {
		v, ok := b.keys.Load(key)
		if !ok {
			v2, err := b.insert(key, &multi{tats: make([]int64, n)}, now)
			if err != nil {
				return nil, err
			}
			v = v2
		}
		switch e := v.(type) {
		case *multi:
			e.mu.Lock()
			if e.tats != nil && len(e.tats) != n {
				tats := make([]int64, n)
				copy(tats, e.tats)
				e.tats = tats
			}
			e.mu.Unlock()
			return e, nil
		case *single:
			// The key's limits changed from one to several: carry the TAT over.
			old := e.tat.Load()
			if old == dead {
				b.drop(key, e)
				continue
			}
			if !e.tat.CompareAndSwap(old, dead) {
				continue
			}
			m := &multi{tats: make([]int64, n)}
			m.tats[0] = old
			b.keys.CompareAndSwap(key, e, m)
		}
	}
}

// insert stores a new entry for key unless one appeared meanwhile, enforcing the cap. It
// starts a background sweep every SweepEvery; at the cap it makes room by sampling
// (makeRoom), never by sweeping on the caller's goroutine.
func (b *Backend) insert(key string, e any, now int64) (any, error) {
	if last := b.lastSweep.Load(); now-last >= b.sweepEvery && b.lastSweep.CompareAndSwap(last, now) {
		b.background(&b.bgSweep, func() { b.sweepMu.Lock(); defer b.sweepMu.Unlock(); b.sweep() })
	}
	if b.count.Load() >= b.maxKeys && !b.makeRoom(now) && b.count.Load() >= b.maxKeys {
		return nil, backend.ErrTooManyKeys // (unless a sweep running meanwhile made room)
	}
	v, loaded := b.keys.LoadOrStore(key, e)
	if !loaded {
		b.count.Add(1)
	}
	return v, nil
}

// Sweep forgets every idle key (one whose state is in the past) and every expired
// penalty. Inserts start one in the background every SweepEvery; calling it directly is
// safe at any time. Sweeps run one at a time.
func (b *Backend) Sweep() {
	b.sweepMu.Lock()
	defer b.sweepMu.Unlock()
	b.sweep()
}

func (b *Backend) sweep() {
	now := b.clock.Nanotime()
	b.lastSweep.Store(max(b.lastSweep.Load(), now))
	b.keys.Range(func(k, v any) bool {
		b.swept++
		switch e := v.(type) {
		case *single:
			old := e.tat.Load()
			if old != dead && old <= now && e.tat.CompareAndSwap(old, dead) {
				b.evicted.Add(1)
				b.drop(k, v)
			}
		case *multi:
			e.mu.Lock()
			idle := e.tats != nil && gcra.Idle(e.tats, now)
			if idle {
				e.tats = nil
			}
			e.mu.Unlock()
			if idle {
				b.evicted.Add(1)
				b.drop(k, v)
			}
		}
		return true
	})
	b.holds.Range(func(k, v any) bool {
		if v.(int64) <= now {
			b.holds.CompareAndDelete(k, v)
		}
		return true
	})
}

// drop deletes a dead entry from the map and reports whether it did. Whoever deletes it
// counts it: a caller that found it dead may have deleted it before the sweep that killed
// it.
func (b *Backend) drop(k, v any) bool {
	if b.keys.CompareAndDelete(k, v) {
		b.count.Add(-1)
		return true
	}
	return false
}
