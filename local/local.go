// Package local is the in-process backend, the embedded default of Sluice: exact GCRA
// decisions for many keys in one process, with no coordination.
//
// Keys with one limit are decided lock-free: the key's state is one atomic int64 (its TAT)
// updated by compare-and-swap, so parallel callers never share a lock, not even on the
// same key. Keys with several limits take a per-key mutex. Keys live in a table whose
// lookups take no lock (internal/keytable), its memory that of the keys it holds.
//
// A key whose TAT is in the past is indistinguishable from a new key, so idle keys are
// forgotten without changing any decision. A background sweep forgets them at most once
// per SweepEvery, started by a caller that inserts a key. At the key cap a new key takes
// the place of an idle key found in a small random sample, at a cost independent of the
// number of keys. When the sample holds none, the new key gets backend.ErrTooManyKeys and
// the limiter's fail mode answers it (deny, by default). With WithEvictLive it evicts the
// sampled key least recently used instead. Existing keys are unaffected.
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
	"github.com/sluicehq/sluice/internal/keytable"
)

// Defaults.
const (
	DefaultMaxKeys    = 1 << 20          // keys held at once (about 100 MB of heap when full: docs/local.md)
	DefaultSweepEvery = 10 * time.Second // how often idle keys are forgotten
	minSweepGap       = 50 * time.Millisecond
)

// dead marks a single-limit entry that a sweep removed; a caller that sees it retries on
// a fresh entry.
const dead = math.MinInt64

// state is a key's state: for one limit its TAT, updated by compare-and-swap (dead once
// removed); for several, their TATs under a mutex (m, never nil then).
type state struct {
	tat atomic.Int64
	m   *multi
}

type entry = keytable.Entry[state]

// Backend is the in-process backend. Use New; it is safe for concurrent use.
type Backend struct {
	clock      clock.Clock
	real       *clock.Real // clock, when it is a real one: read without an interface call (now)
	maxKeys    int64
	sweepEvery int64

	keys *keytable.Table[state]

	wg        sync.WaitGroup // background sweeps
	lastSweep atomic.Int64
	sweepMu   sync.Mutex
	swept     int64 // entries sweeps have looked at (under sweepMu): their cost
	bgSweep   atomic.Bool
	evicted   atomic.Int64
	evictLive bool                          // at the cap, evict a live key instead of refusing new ones
	liveEvict atomic.Int64                  // live keys evicted
	holds     *keytable.Table[atomic.Int64] // the end of each key's latest penalty (dead once forgotten)
	closed    atomic.Bool
}

var (
	_ backend.Backend  = (*Backend)(nil)
	_ backend.Allower  = (*Backend)(nil)
	_ backend.Resetter = (*Backend)(nil)
)

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
// a sample of keys, the one least recently used, and of those used as long ago the one
// closest to idle (the earliest TAT): a key in use outlives a flood of keys used once.
// An evicted key starts again with its full burst: over-admission of at most one burst per
// eviction, the price of accepting every new key under a flood. The daemon uses it.
func WithEvictLive() Option { return optionFunc(func(b *Backend) { b.evictLive = true }) }

// WithSweepEvery sets how often idle keys are forgotten (default DefaultSweepEvery).
func WithSweepEvery(d time.Duration) Option {
	return optionFunc(func(b *Backend) { b.sweepEvery = int64(max(d, minSweepGap)) })
}

// New returns an in-process backend.
func New(opts ...Option) *Backend {
	b := &Backend{clock: clock.Default, maxKeys: DefaultMaxKeys, sweepEvery: int64(DefaultSweepEvery), keys: keytable.New[state](), holds: keytable.New[atomic.Int64]()}
	for _, o := range opts {
		o.apply(b)
	}
	b.real, _ = b.clock.(*clock.Real)
	b.lastSweep.Store(b.clock.Nanotime())
	return b
}

// now reads the backend's clock: a real one by a direct call, which the compiler inlines,
// rather than through the interface.
func (b *Backend) now() int64 {
	if b.real != nil {
		return b.real.Nanotime()
	}
	return b.clock.Nanotime()
}

// Len returns the number of keys held.
func (b *Backend) Len() int { return b.keys.Len() }

// Keys returns up to n of the keys held, in no particular order.
func (b *Backend) Keys(n int) []string {
	out := []string{}
	for e := range b.keys.All() {
		if len(out) >= n {
			break
		}
		out = append(out, e.Key())
	}
	return out
}

// Evicted returns the number of idle keys forgotten so far.
func (b *Backend) Evicted() int64 { return b.evicted.Load() }

// EvictedLive returns the number of live keys evicted to make room (WithEvictLive).
func (b *Backend) EvictedLive() int64 { return b.liveEvict.Load() }

// evictSample is how many keys an eviction looks at.
const evictSample = 8

// makeRoom frees one place at the key cap without scanning the table, and reports whether
// it did. It looks at evictSample keys from a random place, twice at most. It evicts an
// idle key if the sample holds one (an idle key decides as a new one: nothing is lost).
// Otherwise, with WithEvictLive, it evicts the sample's least recently used key, and of
// those used as long ago, the one closest to idle (the earliest TAT: the least state lost),
// but a key used within the last keytable.AgeUnit new keys only from a second sample.
// A key in use thus outlives a flood of new keys used once, which grow old as the flood
// goes on. Its cost is the sample's, whatever the number of keys, so a flood of new keys
// at the cap never waits for a sweep.
func (b *Backend) makeRoom(now int64) bool {
	for try := 0; try < 2; try++ {
		var victim *entry
		var age uint32
		best := int64(math.MaxInt64)
		for e, a := range b.keys.Sample(evictSample) {
			t := entryTAT(e)
			if t == dead {
				continue
			}
			if t <= now { // idle: evict it, nothing is lost
				victim, best = e, t
				break
			}
			if victim == nil || a > age || (a == age && t < best) {
				victim, age, best = e, a, t
			}
		}
		if victim == nil || (best > now && !b.evictLive) {
			continue
		}
		if try == 0 && best > now && age == 0 {
			// Every key of the sample was used within the last keytable.AgeUnit new
			// keys (a flood's newest, and maybe a key in use): look again before
			// evicting one in use, whose TAT, held back, is the earliest.
			continue
		}
		if !kill(victim, best) {
			continue
		}
		b.dropHold(victim.Key()) // a penalty goes with its key
		if !b.drop(victim) {
			continue // deleted meanwhile by a caller that found it dead
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

// kill marks e as removed if its latest TAT is still tat, and reports whether it did.
func kill(e *entry, tat int64) bool {
	if m := e.Val.m; m != nil {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.tats == nil {
			return false
		}
		m.tats = nil
		return true
	}
	return e.Val.tat.CompareAndSwap(tat, dead)
}

// entryTAT returns the latest TAT of an entry (dead if it was removed).
func entryTAT(e *entry) int64 {
	m := e.Val.m
	if m == nil {
		return e.Val.tat.Load()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tats == nil {
		return dead
	}
	t := int64(math.MinInt64 + 1)
	for _, x := range m.tats {
		t = max(t, x)
	}
	return t
}

// Decide decides req for key at the backend clock's now.
func (b *Backend) Decide(_ context.Context, key string, req backend.Request) (backend.Grant, error) {
	if b.closed.Load() {
		return backend.Grant{}, backend.ErrClosed
	}
	now := b.now()
	md := int64(max(req.MaxDelay, 0))
	if len(req.Limits) == 1 {
		l := req.Limits[0]
		for {
			e, err := b.singleFor(key, now)
			if err != nil {
				return backend.Grant{}, err
			}
			for {
				old := e.Val.tat.Load()
				if old == dead {
					b.drop(e)
					break
				}
				tat, res, err := gcra.DecideOne(old, l, now, req.N, md)
				if err != nil || !res.Allowed || req.N == 0 {
					return backend.Grant{Result: res}, err
				}
				if e.Val.tat.CompareAndSwap(old, tat) {
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
		m := e.Val.m
		m.mu.Lock()
		if m.tats == nil {
			m.mu.Unlock()
			b.drop(e)
			continue
		}
		res, tk, err := gcra.Decide(m.tats, req.Limits, now, req.N, md)
		m.mu.Unlock()
		return backend.Grant{Result: res, Ticket: tk}, err
	}
}

// Capabilities reports that the backend decides windowed quotas, and takes a ramp's
// changing limits (backend.Capable): a key's state is its TATs, whatever limits the next
// decision brings.
func (b *Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{Windows: true, Ramps: true, ByValue: true}
}

// AllowOne takes one permit for key under l if one is free now (backend.Allower).
func (b *Backend) AllowOne(ctx context.Context, key string, l gcra.Limit) (bool, error) {
	return b.AllowOneRef(ctx, key, &l)
}

// AllowOneRef is AllowOne with the limit passed by reference, as the limiter calls it:
// copying the limit onto the stack for the call cost a tenth of a decision on a key the
// backend holds (BenchmarkAllow10kKeysParallel).
func (b *Backend) AllowOneRef(_ context.Context, key string, l *gcra.Limit) (bool, error) {
	if b.closed.Load() {
		return false, backend.ErrClosed
	}
	var now int64
	if b.real != nil {
		now = b.real.Nanotime() // b.now written out: the compiler does not inline it
	} else {
		now = b.clock.Nanotime()
	}
	// The usual case, a key it holds under one limit without a window, is decided here
	// with gcra.AllowOne written out (a call would copy the limit, and the compiler does
	// not inline it): the lookup is the only call. Anything else goes the long way.
	if e := b.keys.Load(key); e != nil && e.Val.m == nil && l.Window == 0 {
		for {
			old := e.Val.tat.Load()
			if old == dead {
				break // removed meanwhile: the long way takes a fresh entry
			}
			t := max(old, now)
			if t+l.T-l.Tau > now {
				return false, nil
			}
			if e.Val.tat.CompareAndSwap(old, t+l.T) {
				return true, nil
			}
		}
	}
	return b.allowLongWay(key, l, now)
}

// allowLongWay is AllowOne for a new key, a removed one, a key that had several limits,
// or a windowed quota (out of line: its frame would be AllowOne's cost).
//
//go:noinline
func (b *Backend) allowLongWay(key string, l *gcra.Limit, now int64) (bool, error) {
	for {
		e, err := b.singleFor(key, now)
		if err != nil {
			return false, err
		}
		for {
			old := e.Val.tat.Load()
			if old == dead {
				b.drop(e)
				break
			}
			tat, ok := gcra.AllowOne(old, *l, now)
			if !ok {
				return false, nil
			}
			if e.Val.tat.CompareAndSwap(old, tat) {
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
	var fresh *keytable.Entry[atomic.Int64]
	for {
		e, loaded := b.holds.LoadOrStore(key, func(v *atomic.Int64) { v.Store(until) })
		if !loaded {
			fresh = e
			break
		}
		old := e.Val.Load()
		if old == dead {
			b.holds.Delete(e) // being forgotten: take a fresh entry
			continue
		}
		if old >= until || e.Val.CompareAndSwap(old, until) {
			break
		}
	}
	err := b.update(key, len(limits), now, func(tats []int64) error {
		gcra.Penalize(tats, limits, now, until)
		return nil
	})
	if err != nil && fresh != nil {
		// The key could not be held (the backend is full): no hold without its key, so
		// that a flood of penalties on new keys stays within the key cap.
		b.dropHoldIf(fresh, until)
	}
	return err
}

// Reset forgets key: its next request is decided as a new key's, and its penalty is lifted
// (backend.Resetter).
func (b *Backend) Reset(_ context.Context, key string) error {
	if b.closed.Load() {
		return backend.ErrClosed
	}
	b.dropHold(key)
	for {
		e := b.keys.Load(key)
		if e == nil {
			return nil
		}
		if m := e.Val.m; m != nil {
			m.mu.Lock()
			m.tats = nil
			m.mu.Unlock()
		} else if old := e.Val.tat.Load(); old != dead && !e.Val.tat.CompareAndSwap(old, dead) {
			continue
		}
		b.drop(e)
		b.dropHold(key) // a penalty set meanwhile goes too
		return nil
	}
}

// Close makes later calls return backend.ErrClosed and waits for a background sweep in
// progress to end.
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

// hold returns the end of key's penalty if it is still in force, and forgets it otherwise.
func (b *Backend) hold(key string, now int64) int64 {
	e := b.holds.Load(key)
	if e == nil {
		return 0
	}
	until := e.Val.Load()
	if until > now {
		return until
	}
	if until != dead {
		b.dropHoldIf(e, until)
	}
	return 0
}

// dropHold forgets key's penalty.
func (b *Backend) dropHold(key string) {
	if e := b.holds.Load(key); e != nil {
		e.Val.Store(dead)
		b.holds.Delete(e)
	}
}

// dropHoldIf forgets the penalty of e if it still ends at until.
func (b *Backend) dropHoldIf(e *keytable.Entry[atomic.Int64], until int64) {
	if e.Val.CompareAndSwap(until, dead) {
		b.holds.Delete(e)
	}
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
				old := e.Val.tat.Load()
				if old == dead {
					b.drop(e)
					break
				}
				tats := [1]int64{old}
				if err := f(tats[:]); err != nil {
					return err
				}
				if e.Val.tat.CompareAndSwap(old, tats[0]) {
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
		m := e.Val.m
		m.mu.Lock()
		if m.tats == nil {
			m.mu.Unlock()
			b.drop(e)
			continue
		}
		err = f(m.tats)
		m.mu.Unlock()
		return err
	}
}

// singleFor returns key's single-limit entry, creating it (or converting a multi-limit one)
// as needed.
func (b *Backend) singleFor(key string, now int64) (*entry, error) {
	for {
		e := b.keys.Load(key)
		if e == nil {
			var err error
			if e, err = b.insert(key, nil, now); err != nil {
				return nil, err
			}
		}
		m := e.Val.m
		if m == nil {
			return e, nil
		}
		// The key's limits changed from several to one: carry the first TAT over.
		m.mu.Lock()
		tats := m.tats
		m.tats = nil
		m.mu.Unlock()
		if tats == nil {
			b.drop(e)
			continue
		}
		if e := b.keys.Replace(e, func(s *state) { s.tat.Store(tats[0]) }); e != nil {
			return e, nil
		}
	}
}

// multiFor returns key's multi-limit entry with n limits, creating or converting as needed.
// A key whose number of limits changed keeps the TATs it had for the limits that remain.
func (b *Backend) multiFor(key string, n int, now int64) (*entry, error) {
	for {
		e := b.keys.Load(key)
		if e == nil {
			var err error
			if e, err = b.insert(key, &multi{tats: make([]int64, n)}, now); err != nil {
				return nil, err
			}
		}
		if m := e.Val.m; m != nil {
			m.mu.Lock()
			if m.tats != nil && len(m.tats) != n {
				tats := make([]int64, n)
				copy(tats, m.tats)
				m.tats = tats
			}
			m.mu.Unlock()
			return e, nil
		}
		// The key's limits changed from one to several: carry the TAT over.
		old := e.Val.tat.Load()
		if old == dead {
			b.drop(e)
			continue
		}
		if !e.Val.tat.CompareAndSwap(old, dead) {
			continue
		}
		m := &multi{tats: make([]int64, n)}
		m.tats[0] = old
		b.keys.Replace(e, func(s *state) { s.m = m })
	}
}

// insert stores a new entry for key (several limits: m; one: a TAT of 0) unless one
// appeared meanwhile, enforcing the cap. It starts a background sweep every SweepEvery; at
// the cap it makes room by sampling (makeRoom), never by sweeping on the caller's
// goroutine.
func (b *Backend) insert(key string, m *multi, now int64) (*entry, error) {
	if last := b.lastSweep.Load(); now-last >= b.sweepEvery && b.lastSweep.CompareAndSwap(last, now) {
		b.background(&b.bgSweep, func() { b.sweepMu.Lock(); defer b.sweepMu.Unlock(); b.sweep() })
	}
	if int64(b.keys.Len()) >= b.maxKeys && !b.makeRoom(now) && int64(b.keys.Len()) >= b.maxKeys {
		return nil, backend.ErrTooManyKeys // (unless a sweep running meanwhile made room)
	}
	e, _ := b.keys.LoadOrStore(key, func(s *state) { s.m = m })
	return e, nil
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
	for e := range b.keys.All() {
		b.swept++
		if m := e.Val.m; m != nil {
			m.mu.Lock()
			idle := m.tats != nil && gcra.Idle(m.tats, now)
			if idle {
				m.tats = nil
			}
			m.mu.Unlock()
			if idle {
				b.evicted.Add(1)
				b.drop(e)
			}
			continue
		}
		if old := e.Val.tat.Load(); old != dead && old <= now && e.Val.tat.CompareAndSwap(old, dead) {
			b.evicted.Add(1)
			b.drop(e)
		}
	}
	for e := range b.holds.All() {
		if until := e.Val.Load(); until != dead && until <= now {
			b.dropHoldIf(e, until)
		}
	}
}

// drop deletes a dead entry from the table and reports whether it did.
func (b *Backend) drop(e *entry) bool { return b.keys.Delete(e) }
