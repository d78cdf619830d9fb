// Package keytable is the per-key table of Sluice's modes: a concurrent map from a string
// key to an entry holding that key's state, whose memory follows the keys it holds.
//
// Lookups take no lock and write no shared memory, but for a slot's last-use mark, at
// most once per AgeUnit new keys (see Sample). Inserts and deletes lock one of many
// shards. Each shard is an open-addressed array of slots (part of a key's hash and its
// last use, beside the number of its entry), grown by doubling and shrunk by halving, one
// shard at a time: the table never holds two copies of itself, and its memory is that of
// its entries plus 16 bytes a slot, with 1/4 to 3/4 of the slots full (a shard is halved
// below 1/4 full).
//
// Entries live in chunks of chunkSize, each with its keys' bytes, so that the collector's
// work follows the chunks, not the keys: the slots hold numbers, not pointers, and an
// entry holds no pointer but those of its state. A chunk goes when its last entry is
// deleted (entries are never reused): at worst, one key left in each chunk, the table
// holds chunkSize entries' memory a key.
//
// An entry, once in the table, stays the same entry until it is deleted: callers keep the
// key's state in it (atomics, or a mutex of their own) and update it in place. A lookup
// may return an entry that a concurrent Delete is removing. Callers that need to know mark
// a removed entry's state as dead before deleting it (see the local mode's TAT).
package keytable

import (
	"iter"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Entry is one key and its state. Its key never changes; Val is the caller's, updated in
// place under the caller's own synchronization.
type Entry[V any] struct {
	gen uint32 // its chunk's gen (see slot), set with the chunk
	pos uint32 // its place in its chunk's entries
	off uint32 // where its key starts in its chunk's keys (or more, plus inMore)
	n   uint32 // its key's length
	Val V
}

// Key returns the entry's key.
func (e *Entry[V]) Key() string { return e.chunk().key(e) }

// chunk returns the chunk e is in: e is its entries' pos-th.
func (e *Entry[V]) chunk() *chunk[V] {
	var c *chunk[V]
	return (*chunk[V])(unsafe.Add(unsafe.Pointer(e), -int(unsafe.Offsetof(c.ents))-int(e.pos)*int(unsafe.Sizeof(*e))))
}

// chunkSize is how many entries a chunk holds.
const chunkSize = 32

// chunk holds up to chunkSize entries, made one after another, and their keys' bytes:
// in its own room, and past it in more (made with the chunk, for keys longer on average
// than chunkKeys/chunkSize). Its more, num and its entries' gen and place are set before
// it is published and never change; an entry's key, before the entry is. Its one pointer
// comes first: with a state free of pointers, the collector visits a chunk's first word
// only.
type chunk[V any] struct {
	more      []byte              // keys past the chunk's own room (nil: none)
	num       uint32              // its number in its shard's directory
	ents      [chunkSize]Entry[V] // an entry finds its chunk from its place
	keys      [chunkKeys]byte     // the entries' keys, one after another, then in more
	used      int                 // entries made (under the shard's mu)
	keyed     int                 // bytes of keys used (under the shard's mu)
	moreKeyed int                 // bytes of more used (under the shard's mu)
	live      int                 // entries in the table (under the shard's mu)
}

// chunkKeys is the room for keys in a chunk itself: chunkSize keys of 24 bytes (a daemon's
// keys are its rule's name and the tag).
const chunkKeys = chunkSize * 24

// inMore marks an entry's off as an offset in its chunk's more.
const inMore = 1 << 31

// key returns e's key; e is in c.
func (c *chunk[V]) key(e *Entry[V]) string {
	switch {
	case e.n == 0:
		return ""
	case e.off < inMore:
		return unsafe.String(&c.keys[e.off], e.n)
	}
	return unsafe.String(&c.more[e.off-inMore], e.n)
}

// fits reports whether c has room for one more entry with a key of n bytes.
func (c *chunk[V]) fits(n int) bool {
	return c != nil && c.used < chunkSize && (chunkKeys-c.keyed >= n || len(c.more)-c.moreKeyed >= n)
}

// moreRoom returns how much room past its own the chunk that follows last needs, for a
// key of n bytes: room for chunkSize keys a quarter longer than last's on average, if
// its own is not, and for the key.
func moreRoom[V any](last *chunk[V], n int) int {
	m := 0
	if last != nil && last.used > 0 {
		avg := (last.keyed+last.moreKeyed+last.used-1)/last.used*5/4 + 1
		m = max(chunkSize*avg-chunkKeys, 0)
	}
	if n > chunkKeys {
		m = max(m, n)
	}
	return m
}

// AgeUnit is how many new keys make one unit of an entry's age.
const AgeUnit = 16

// Table maps string keys to entries. Make one with New; it is safe for concurrent use.
type Table[V any] struct {
	hasher hasher
	shards [nShards]shard[V] // the hash's top bits pick the shard
	count  atomic.Int64
	adds   atomic.Uint64 // inserts so far
	tick   atomic.Uint32 // adds / AgeUnit: the clock of entries' ages (wraps)
}

// shard is the part of the table whose keys' hashes share their top bits.
type shard[V any] struct {
	mu    sync.Mutex                                 // held by inserts and deletes
	slots atomic.Pointer[[]slot]                     // nil until its first key
	dir   atomic.Pointer[[]atomic.Pointer[chunk[V]]] // its chunks by number (nil: none)
	live  int                                        // entries in slots (under mu)
	used  int                                        // slots not empty: entries and tombstones (under mu)
	cur   *chunk[V]                                  // the chunk new entries go to (under mu)
	free  []uint32                                   // numbers of the directory not in use, with room for all (under mu)
	gen   uint32                                     // chunks made (under mu; wraps, skipping 0)
	_     [52]byte                                   // to 128 bytes: two cache lines of its own
}

// slot holds the number of an entry (x), and in meta the top half of its key's hash (high
// 32 bits) and the table's tick at the entry's insert or latest lookup (low 32 bits); an
// empty slot ends a probe. An entry's number is its chunk's gen (high 32 bits), its chunk's
// number in the directory (next 24) and its place in the chunk (low 8): a number is never
// used again but by a chunk 2^32 chunks later in its shard.
type slot struct {
	meta atomic.Uint64
	x    atomic.Uint64
}

// A slot's x, but for an entry's number (at least 1<<32: a chunk's gen is never 0).
const (
	empty = 0
	tomb  = 1 // a deleted entry's slot: probes go past it
)

// The slot index is the top half of the hash below the shard's bits, which meta keeps, so
// that a resize needs no key's hash again.
func index(h32 uint32, mask uint64) uint64 { return uint64(h32) & mask }

const (
	minSlots = 8
	minDir   = 4
	maxDir   = 1 << 24 // chunks a shard can number
	nShards  = 64
	// shardShift leaves a hash's top bits, a shard's number.
	shardShift = 64 - 6
)

// onAlloc, if set (by tests), is called before each allocation of a chunk or an array.
var onAlloc func()

func alloc() {
	if onAlloc != nil {
		onAlloc()
	}
}

// New returns an empty table.
func New[V any]() *Table[V] {
	return &Table[V]{hasher: newHasher()}
}

// Len returns the number of entries.
func (t *Table[V]) Len() int { return int(t.count.Load()) }

// hash returns the top half of key's hash, and its shard.
func (t *Table[V]) hash(key string) (uint32, *shard[V]) {
	h := t.hasher.hash(key)
	return uint32(h >> 32), &t.shards[h>>shardShift]
}

// number returns e's number; e is in c.
func (c *chunk[V]) number(e *Entry[V]) uint64 {
	return uint64(e.gen)<<32 | uint64(c.num)<<8 | uint64(e.pos)
}

// entry returns the entry numbered x and its chunk, or nil if its chunk is gone (all its
// entries deleted). It takes no lock.
func (sh *shard[V]) entry(x uint64) (*chunk[V], *Entry[V]) {
	var dir []atomic.Pointer[chunk[V]]
	if d := sh.dir.Load(); d != nil {
		dir = *d
	}
	return entryIn(dir, x)
}

// entryIn is entry in dir, a shard's directory.
func entryIn[V any](dir []atomic.Pointer[chunk[V]], x uint64) (*chunk[V], *Entry[V]) {
	if num := uint32(x) >> 8; int(num) < len(dir) {
		if c := dir[num].Load(); c != nil {
			if e := &c.ents[x%chunkSize]; e.gen == uint32(x>>32) {
				return c, e
			}
		}
	}
	return nil, nil
}

// Load returns key's entry, or nil. It marks the entry as used now.
func (t *Table[V]) Load(key string) *Entry[V] {
	h, sh := t.hash(key)
	p := sh.slots.Load()
	if p == nil {
		return nil
	}
	ss := *p
	// The directory read before the slots' numbers: a chunk made since holds keys stored
	// since, which a lookup may miss.
	var dir []atomic.Pointer[chunk[V]]
	if d := sh.dir.Load(); d != nil {
		dir = *d
	}
	mask := uint64(len(ss) - 1)
	for i := index(h, mask); ; i = (i + 1) & mask {
		s := &ss[i]
		x := s.x.Load()
		if x == empty {
			return nil
		}
		m := s.meta.Load()
		if uint32(m>>32) != h || x == tomb {
			continue
		}
		if c, e := entryIn(dir, x); e != nil && c.key(e) == key {
			if tick := t.tick.Load(); uint32(m) != tick {
				// Compare-and-swap: the slot may hold another key by now.
				s.meta.CompareAndSwap(m, m&^math.MaxUint32|uint64(tick))
			}
			return e
		}
	}
}

// LoadOrStore returns key's entry if it has one (loaded true); otherwise it makes one,
// lets init set its state before any other caller can see it, and stores it. init runs
// under the shard's lock: it must be short, and must not use the table.
//
// It allocates outside the shard's lock (a chunk, and the array a full shard moves to):
// an allocation may have to help the collector mark, in proportion to its size, and
// every other insert into the shard would wait for it.
func (t *Table[V]) LoadOrStore(key string, init func(*V)) (*Entry[V], bool) {
	h, sh := t.hash(key)
	var sp spare[V]
	for {
		sh.mu.Lock()
		if old := sh.find(h, key); old != nil {
			sh.mu.Unlock()
			return old, true
		}
		w := sh.wants(len(key), true)
		if !sp.meets(w) {
			sh.mu.Unlock()
			sp.make(w) // then look again: another insert may have made room, or taken it
			continue
		}
		sh.install(&sp, w)
		c, e := sh.add(key)
		if init != nil {
			init(&e.Val)
		}
		if t.adds.Add(1)%AgeUnit == 0 {
			t.tick.Add(1)
		}
		t.put(sh, uint64(h)<<32|uint64(t.tick.Load()), c.number(e))
		sh.mu.Unlock()
		return e, false
	}
}

// Replace replaces old, if it is still its key's entry, with a new entry for the same key
// whose state init sets (under the shard's lock, as LoadOrStore's), and returns the new
// entry (nil if old was not in the table).
func (t *Table[V]) Replace(old *Entry[V], init func(*V)) *Entry[V] {
	oc := old.chunk()
	key := oc.key(old)
	h, sh := t.hash(key)
	var sp spare[V]
	for {
		sh.mu.Lock()
		s := sh.slotOf(h, oc.number(old))
		if s == nil {
			sh.mu.Unlock()
			return nil
		}
		w := sh.wants(len(key), false)
		if !sp.meets(w) {
			sh.mu.Unlock()
			sp.make(w)
			continue
		}
		sh.install(&sp, w)
		c, e := sh.add(key)
		init(&e.Val)
		s.x.Store(c.number(e))
		sh.release(oc)
		sh.mu.Unlock()
		return e
	}
}

// Delete removes e if it is still its key's entry, and reports whether it did. A shard
// left under 1/4 full moves to an array half as big (then under 1/2), made outside its
// lock as LoadOrStore's are.
func (t *Table[V]) Delete(e *Entry[V]) bool {
	c := e.chunk()
	h, sh := t.hash(c.key(e))
	sh.mu.Lock()
	s := sh.slotOf(h, c.number(e))
	if s == nil {
		sh.mu.Unlock()
		return false
	}
	s.x.Store(tomb)
	sh.live--
	t.count.Add(-1)
	sh.release(c)
	n := sh.shrinks()
	sh.mu.Unlock()
	for n != 0 {
		alloc()
		spare := make([]slot, n)
		sh.mu.Lock()
		if n = sh.shrinks(); n == len(spare) {
			sh.move(spare)
			n = 0
		}
		sh.mu.Unlock()
	}
	return true
}

// add makes an entry for key in sh's current chunk, which has room for it; sh.mu is held.
func (sh *shard[V]) add(key string) (*chunk[V], *Entry[V]) {
	c := sh.cur
	e := &c.ents[c.used]
	e.n = uint32(len(key))
	if chunkKeys-c.keyed >= len(key) {
		e.off = uint32(c.keyed)
		c.keyed += copy(c.keys[c.keyed:], key)
	} else {
		e.off = inMore + uint32(c.moreKeyed)
		c.moreKeyed += copy(c.more[c.moreKeyed:], key)
	}
	c.used++
	c.live++
	return c, e
}

// release counts one entry of c out of the table, and lets c go with its last, unless new
// entries still go to it; sh.mu is held. Callers holding one of its entries keep it (it
// is never reused).
func (sh *shard[V]) release(c *chunk[V]) {
	if c.live--; c.live == 0 && c != sh.cur {
		sh.retire(c)
	}
}

// retire takes c out of sh's directory; sh.mu is held.
func (sh *shard[V]) retire(c *chunk[V]) {
	(*sh.dir.Load())[c.num].Store(nil)
	sh.free = append(sh.free, c.num) // within its capacity: a number for each
}

// want is what a shard needs before one more entry: a new array of slots (its size, or
// 0), a new chunk (with more room for keys: its size) and a bigger directory for it (its
// size, or 0).
type want struct {
	slots, more, dir int
	chunk            bool
}

// wants returns what sh needs before one more entry with a key of n bytes, in a new slot
// if slot; sh.mu is held.
func (sh *shard[V]) wants(n int, slot bool) want {
	var w want
	if slot {
		w.slots = sh.needs()
	}
	if !sh.cur.fits(n) {
		w.chunk, w.more = true, moreRoom(sh.cur, n)
		if len(sh.free) == 0 {
			d := sh.dir.Load()
			if d == nil {
				w.dir = minDir
			} else if w.dir = 2 * len(*d); w.dir > maxDir {
				panic("keytable: a shard of more than 2^24 chunks")
			}
		}
	}
	return w
}

// spare is what LoadOrStore and Replace made outside the shard's lock.
type spare[V any] struct {
	slots []slot
	chunk *chunk[V]
	dir   []atomic.Pointer[chunk[V]]
	free  []uint32
}

// meets reports whether sp holds what w wants.
func (sp *spare[V]) meets(w want) bool {
	return (w.slots == 0 || len(sp.slots) == w.slots) &&
		(!w.chunk || sp.chunk != nil && len(sp.chunk.more) >= w.more) &&
		(w.dir == 0 || len(sp.dir) == w.dir)
}

// make makes what sp lacks of w; the shard's lock is not held.
func (sp *spare[V]) make(w want) {
	if w.slots != 0 && len(sp.slots) != w.slots {
		alloc()
		sp.slots = make([]slot, w.slots)
	}
	if w.chunk && (sp.chunk == nil || len(sp.chunk.more) < w.more) {
		alloc()
		sp.chunk = new(chunk[V])
		if w.more > 0 {
			sp.chunk.more = make([]byte, w.more)
		}
	}
	if w.dir != 0 && len(sp.dir) != w.dir {
		alloc()
		sp.dir, sp.free = make([]atomic.Pointer[chunk[V]], w.dir), make([]uint32, 0, w.dir)
	}
}

// install puts in place what w wants, from sp, which meets it; sh.mu is held.
func (sh *shard[V]) install(sp *spare[V], w want) {
	if w.slots != 0 {
		sh.move(sp.slots)
		sp.slots = nil
	}
	if w.dir != 0 {
		var old []atomic.Pointer[chunk[V]]
		if d := sh.dir.Load(); d != nil {
			old = *d
		}
		for i := range old {
			sp.dir[i].Store(old[i].Load())
		}
		sp.free = append(sp.free, sh.free...)
		for i := len(sp.dir) - 1; i >= len(old); i-- {
			sp.free = append(sp.free, uint32(i)) // the lowest numbers first
		}
		d := sp.dir
		sh.dir.Store(&d)
		sh.free = sp.free
		sp.dir, sp.free = nil, nil
	}
	if w.chunk {
		c := sp.chunk
		sp.chunk = nil
		if sh.gen++; sh.gen == 0 {
			sh.gen++
		}
		for i := range c.ents {
			c.ents[i].gen, c.ents[i].pos = sh.gen, uint32(i)
		}
		c.num = sh.free[len(sh.free)-1]
		sh.free = sh.free[:len(sh.free)-1]
		if last := sh.cur; last != nil && last.live == 0 {
			sh.retire(last)
		}
		sh.cur = c
		(*sh.dir.Load())[c.num].Store(c)
	}
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
func (sh *shard[V]) array() []slot {
	if p := sh.slots.Load(); p != nil {
		return *p
	}
	return nil
}

// find returns key's entry in sh, or nil; sh.mu is held.
func (sh *shard[V]) find(h uint32, key string) *Entry[V] {
	ss := sh.array()
	if ss == nil {
		return nil
	}
	mask := uint64(len(ss) - 1)
	for i := index(h, mask); ; i = (i + 1) & mask {
		x := ss[i].x.Load()
		if x == empty {
			return nil
		}
		if x == tomb || uint32(ss[i].meta.Load()>>32) != h {
			continue
		}
		if c, e := sh.entry(x); e != nil && c.key(e) == key {
			return e
		}
	}
}

// slotOf returns the slot holding the entry numbered x, or nil; sh.mu is held.
func (sh *shard[V]) slotOf(h uint32, x uint64) *slot {
	ss := sh.array()
	if ss == nil {
		return nil
	}
	mask := uint64(len(ss) - 1)
	for i := index(h, mask); ; i = (i + 1) & mask {
		switch ss[i].x.Load() {
		case empty:
			return nil
		case x:
			return &ss[i]
		}
	}
}

// needs returns the size of the array sh must move to before one more entry, or 0 if it
// has room: a shard that would be more than 3/4 full of entries and tombstones moves to a
// fresh array, twice as big if over 5/8 of its slots would hold entries, so that a
// cleared one has 1/8 of its slots free at least (a table kept at a size by deleting a key
// for each new one moves at most 8 slots a key); sh.mu is held.
func (sh *shard[V]) needs() int {
	ss := sh.array()
	if (sh.used+1)*4 <= len(ss)*3 {
		return 0
	}
	n := max(len(ss), minSlots)
	if (sh.live+1)*8 > n*5 {
		n *= 2
	}
	return n
}

// put stores the number x of a new entry in sh, which has room for it (needs is 0); sh.mu
// is held.
func (t *Table[V]) put(sh *shard[V], meta uint64, x uint64) {
	ss := sh.array()
	mask := uint64(len(ss) - 1)
	for i := index(uint32(meta>>32), mask); ; i = (i + 1) & mask {
		s := &ss[i]
		old := s.x.Load()
		if old == empty || old == tomb {
			s.meta.Store(meta) // before the entry: a reader that sees it sees its hash
			s.x.Store(x)
			if old == empty {
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
func (sh *shard[V]) move(ss []slot) {
	old := sh.array()
	mask := uint64(len(ss) - 1)
	for k := range old {
		x := old[k].x.Load()
		if x == empty || x == tomb {
			continue
		}
		m := old[k].meta.Load() // a lookup's mark may come after: at worst a use is lost
		i := index(uint32(m>>32), mask)
		for ss[i].x.Load() != empty {
			i = (i + 1) & mask
		}
		ss[i].meta.Store(m)
		ss[i].x.Store(x)
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
			sh := &t.shards[k]
			ss := sh.array()
			for i := range ss {
				if x := ss[i].x.Load(); x != empty && x != tomb {
					if _, e := sh.entry(x); e != nil && !yield(e) {
						return
					}
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
			sh := &t.shards[(start+uint64(k))%uint64(len(t.shards))]
			ss := sh.array()
			if len(ss) == 0 {
				continue
			}
			at := int(start>>32) % len(ss)
			for j := range ss {
				s := &ss[(at+j)%len(ss)]
				x := s.x.Load()
				if x == empty || x == tomb {
					continue
				}
				m := s.meta.Load()
				_, e := sh.entry(x)
				if e == nil {
					continue
				}
				if !yield(e, tick-uint32(m)) {
					return
				}
				if seen++; seen >= n {
					return
				}
			}
		}
	}
}
