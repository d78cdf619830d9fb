// Package keytable is the per-key table of Sluice's modes: a concurrent map from a string
// key to an entry holding that key's state, whose memory follows the keys it holds.
//
// Lookups take no lock and write no shared memory, but for a slot's last-use mark, at
// most once per AgeUnit new keys (see Sample). Inserts and deletes lock one of many
// shards. Each shard is an open-addressed array of slots (part of a key's hash and its
// last use, beside a pointer to its entry), grown by doubling and shrunk by halving, one
// shard at a time: the table never holds two copies of itself, and its memory is that of
// its entries plus 16 bytes a slot, with 1/4 to 3/4 of the slots full (a shard is halved
// below 1/4 full).
//
// An entry, once in the table, stays the same entry until it is deleted: callers keep the
// key's state in it (atomics, or a mutex of their own) and update it in place. A lookup
// may return an entry that a concurrent Delete is removing. Callers that need to know mark
// a removed entry's state as dead before deleting it (see the local mode's TAT).
package keytable

import (
	"iter"
	"math"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// Entry is one key and its state. Its key never changes; Val is the caller's, updated in
// place under the caller's own synchronization.
type Entry[V any] struct {
	key string
	Val V
}

// Key returns the entry's key.
func (e *Entry[V]) Key() string { return e.key }

// AgeUnit is how many new keys make one unit of an entry's age.
const AgeUnit = 16

// Table maps string keys to entries. Make one with New; it is safe for concurrent use.
type Table[V any] struct {
	hasher hasher
	shards []shard[V]
	shift  uint // the hash's top bits pick the shard
	count  atomic.Int64
	adds   atomic.Uint64 // inserts so far
	tick   atomic.Uint32 // adds / AgeUnit: the clock of entries' ages (wraps)
	tomb   *Entry[V]     // marks a deleted slot: probes go past it
}

// shard is the part of the table whose keys' hashes share their top bits.
type shard[V any] struct {
	mu    sync.Mutex                // held by inserts and deletes
	slots atomic.Pointer[[]slot[V]] // nil until its first key
	live  int                       // entries in slots (under mu)
	used  int                       // slots not empty: entries and tombstones (under mu)
	full  int                       // the 64ths of its slots it fills before it moves (see needs)
	_     [24]byte
}

// slot holds an entry, and in meta the top half of its key's hash (high 32 bits) and the
// table's tick at the entry's insert or latest lookup (low 32 bits); an empty slot (nil)
// ends a probe.
type slot[V any] struct {
	meta atomic.Uint64
	e    atomic.Pointer[Entry[V]]
}

// The slot index is the top half of the hash below the shard's bits, which meta keeps, so
// that a resize needs no key's hash again.
func index(h32 uint32, mask uint64) uint64 { return uint64(h32) & mask }

const (
	minSlots = 8
	nShards  = 64
)

// onAlloc, if set (by tests), is called before each allocation of an entry or an array.
var onAlloc func()

func alloc() {
	if onAlloc != nil {
		onAlloc()
	}
}

// New returns an empty table.
func New[V any]() *Table[V] {
	t := &Table[V]{hasher: newHasher(), shards: make([]shard[V], nShards), shift: uint(64 - bits.TrailingZeros(nShards)), tomb: &Entry[V]{}}
	for i := range t.shards {
		t.shards[i].full = minFull + i*(maxFull-minFull)/(nShards-1)
	}
	return t
}

// Len returns the number of entries.
func (t *Table[V]) Len() int { return int(t.count.Load()) }

// hash returns the top half of key's hash, and its shard.
func (t *Table[V]) hash(key string) (uint32, *shard[V]) {
	h := t.hasher.hash(key)
	return uint32(h >> 32), &t.shards[h>>t.shift]
}

// Load returns key's entry, or nil. It marks the entry as used now.
func (t *Table[V]) Load(key string) *Entry[V] {
	h, sh := t.hash(key)
	p := sh.slots.Load()
	if p == nil {
		return nil
	}
	ss := *p
	mask := uint64(len(ss) - 1)
	for i := index(h, mask); ; i = (i + 1) & mask {
		s := &ss[i]
		e := s.e.Load()
		if e == nil {
			return nil
		}
		if m := s.meta.Load(); uint32(m>>32) == h && e != t.tomb && e.key == key {
			if tick := t.tick.Load(); uint32(m) != tick {
				// Compare-and-swap: the slot may hold another key by now.
				s.meta.CompareAndSwap(m, m&^math.MaxUint32|uint64(tick))
			}
			return e
		}
	}
}

// LoadOrStore returns key's entry if it has one (loaded true); otherwise it makes one,
// lets init set its state before any other caller can see it, and stores it. init may
// run on an entry that is then dropped, when the key turns out to have one.
//
// It allocates outside the shard's lock (the entry, and the array a full shard moves to):
// an allocation may have to help the collector mark, in proportion to its size, and
// every other insert into the shard would wait for it.
func (t *Table[V]) LoadOrStore(key string, init func(*V)) (*Entry[V], bool) {
	h, sh := t.hash(key)
	alloc()
	e := &Entry[V]{key: key}
	if init != nil {
		init(&e.Val)
	}
	var spare []slot[V]
	for {
		sh.mu.Lock()
		if old := sh.find(h, key, t.tomb); old != nil {
			sh.mu.Unlock()
			return old, true
		}
		n := sh.needs()
		if n == 0 || len(spare) == n {
			if n != 0 {
				sh.move(spare, t.tomb)
			}
			if t.adds.Add(1)%AgeUnit == 0 {
				t.tick.Add(1)
			}
			t.put(sh, uint64(h)<<32|uint64(t.tick.Load()), e)
			sh.mu.Unlock()
			return e, false
		}
		sh.mu.Unlock()
		alloc()
		spare = make([]slot[V], n) // then look again: another insert may have moved it
	}
}

// Replace replaces old, if it is still its key's entry, with a new entry for the same key
// whose state init sets, and returns the new entry (nil if old was not in the table).
func (t *Table[V]) Replace(old *Entry[V], init func(*V)) *Entry[V] {
	h, sh := t.hash(old.key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s := sh.slotOf(h, old)
	if s == nil {
		return nil
	}
	e := &Entry[V]{key: old.key}
	init(&e.Val)
	s.e.Store(e)
	return e
}

// Delete removes e if it is still its key's entry, and reports whether it did. A shard
// left under 1/4 full moves to an array half as big (then under 1/2), made outside its
// lock as LoadOrStore's are.
func (t *Table[V]) Delete(e *Entry[V]) bool {
	h, sh := t.hash(e.key)
	sh.mu.Lock()
	s := sh.slotOf(h, e)
	if s == nil {
		sh.mu.Unlock()
		return false
	}
	s.e.Store(t.tomb)
	sh.live--
	t.count.Add(-1)
	n := sh.shrinks()
	sh.mu.Unlock()
	for n != 0 {
		alloc()
		spare := make([]slot[V], n)
		sh.mu.Lock()
		if n = sh.shrinks(); n == len(spare) {
			sh.move(spare, t.tomb)
			n = 0
		}
		sh.mu.Unlock()
	}
	return true
}

// shrinks returns the size of the array sh should move to, under 1/4 full, or 0; sh.mu
// is held.
func (sh *shard[V]) shrinks() int {
	if ss := sh.array(); len(ss) > minSlots && sh.live < len(ss)/4 {
		return len(ss) / 2
	}
	return 0
}

// array returns sh's slots (nil before its first key).
func (sh *shard[V]) array() []slot[V] {
	if p := sh.slots.Load(); p != nil {
		return *p
	}
	return nil
}

// find returns key's entry in sh, or nil; sh.mu is held.
func (sh *shard[V]) find(h uint32, key string, tomb *Entry[V]) *Entry[V] {
	ss := sh.array()
	if ss == nil {
		return nil
	}
	mask := uint64(len(ss) - 1)
	for i := index(h, mask); ; i = (i + 1) & mask {
		e := ss[i].e.Load()
		if e == nil {
			return nil
		}
		if e != tomb && uint32(ss[i].meta.Load()>>32) == h && e.key == key {
			return e
		}
	}
}

// slotOf returns the slot holding e, or nil; sh.mu is held.
func (sh *shard[V]) slotOf(h uint32, e *Entry[V]) *slot[V] {
	ss := sh.array()
	if ss == nil {
		return nil
	}
	mask := uint64(len(ss) - 1)
	for i := index(h, mask); ; i = (i + 1) & mask {
		switch ss[i].e.Load() {
		case nil:
			return nil
		case e:
			return &ss[i]
		}
	}
}

// needs returns the size of the array sh must move to before one more entry, or 0 if it
// has room: a shard that would be more than sh.full 64ths full of entries and tombstones
// moves to a fresh array, twice as big if over 1/8 less of its slots would hold entries,
// so that a cleared one has 1/8 of its slots free at least (a table kept at a size by
// deleting a key for each new one moves at most 8 slots a key); sh.mu is held.
func (sh *shard[V]) needs() int {
	ss := sh.array()
	if (sh.used+1)*64 <= len(ss)*sh.full {
		return 0
	}
	n := max(len(ss), minSlots)
	if (sh.live+1)*64 > n*(sh.full-8) {
		n *= 2
	}
	return n
}

// A shard fills minFull to maxFull 64ths of its slots (5/8 to 3/4), each its own, before
// it moves: the shards, filled alike by the hash, would otherwise double at once, a
// sixty-fourth of the table's keys each, all moved and all their arrays made within a few
// thousand new keys (under a flood at a million keys, 32 MB made, and a collection started,
// within one batch of 1,000 queries on each connection). A shard doubles only with more
// than full-8 64ths of its slots holding entries, at least half: doubled, it is over 1/4
// full, the fill it halves at.
const (
	minFull = 40
	maxFull = 48
)

// put stores a new entry in sh, which has room for it (needs is 0); sh.mu is held.
func (t *Table[V]) put(sh *shard[V], meta uint64, e *Entry[V]) {
	ss := sh.array()
	mask := uint64(len(ss) - 1)
	for i := index(uint32(meta>>32), mask); ; i = (i + 1) & mask {
		s := &ss[i]
		old := s.e.Load()
		if old == nil || old == t.tomb {
			s.meta.Store(meta) // before the entry: a reader that sees it sees its hash
			s.e.Store(e)
			if old == nil {
				sh.used++
			}
			sh.live++
			t.count.Add(1)
			return
		}
	}
}

// move moves sh's entries to ss, an empty array whose length is a power of two, leaving
// the tombstones behind; sh.mu is held. Lookups go on in the old array until the new one
// is stored: it holds the same entries.
func (sh *shard[V]) move(ss []slot[V], tomb *Entry[V]) {
	old := sh.array()
	mask := uint64(len(ss) - 1)
	for k := range old {
		e := old[k].e.Load()
		if e == nil || e == tomb {
			continue
		}
		m := old[k].meta.Load() // a lookup's mark may come after: at worst a use is lost
		i := index(uint32(m>>32), mask)
		for ss[i].e.Load() != nil {
			i = (i + 1) & mask
		}
		ss[i].meta.Store(m)
		ss[i].e.Store(e)
	}
	sh.used = sh.live
	sh.slots.Store(&ss)
}

// All yields every entry in the table, each once if it stays in it during the walk;
// entries inserted or deleted meanwhile may be yielded or not. It takes no lock: the
// caller may insert and delete as it goes.
func (t *Table[V]) All() iter.Seq[*Entry[V]] {
	return func(yield func(*Entry[V]) bool) {
		for k := range t.shards {
			ss := t.shards[k].array()
			for i := range ss {
				if e := ss[i].e.Load(); e != nil && e != t.tomb && !yield(e) {
					return
				}
			}
		}
	}
}

// Sample yields up to n entries from a random place in the table, each with its age, at a
// cost independent of the table's size (bar empty stretches: a shard past its first size
// is a quarter full at least). An entry's age is how long ago it was last used (inserted
// or looked up), counted in new keys the table took since, in units of AgeUnit. An
// eviction that takes the oldest of a sample keeps a key in use through a flood of keys
// used once (the sampled least-recently-used rule): the flood's keys grow old as new ones
// come, while the key in use stays young.
func (t *Table[V]) Sample(n int) iter.Seq2[*Entry[V], uint32] {
	return func(yield func(*Entry[V], uint32) bool) {
		if n <= 0 || t.count.Load() == 0 {
			return
		}
		tick := t.tick.Load()
		start := rand.Uint64()
		seen := 0
		for k := range t.shards {
			ss := t.shards[(start+uint64(k))%uint64(len(t.shards))].array()
			if len(ss) == 0 {
				continue
			}
			at := int(start>>32) % len(ss)
			for j := range ss {
				s := &ss[(at+j)%len(ss)]
				e := s.e.Load()
				if e == nil || e == t.tomb {
					continue
				}
				if !yield(e, tick-uint32(s.meta.Load())) {
					return
				}
				if seen++; seen >= n {
					return
				}
			}
		}
	}
}
