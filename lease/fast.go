package lease

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/lease/allot"
)

// fastShare is a record's lock-free fast path (Backend.AllowOne): single permits granted on
// the member's share (allot.FastShare) with one compare-and-swap, as the local mode
// grants them, and counted. Whoever takes the record's lock shuts it first and hands what
// it granted to the member (allot.Member.Granted); unlocking opens it again. Its other
// fields never change: a share that changes gets a new fastShare, so that a grant decided
// on the old one cannot land on the new one.
type fastShare struct {
	t, tau int64 // the share as a limit (allot.FastShare.Limit, which has no window)
	end    int64 // the lease may be used while now < end
	base   int64 // the TAT that offset 0 stands for
	// word packs the bucket's TAT (its offset from base, fastTatShift bits up), how many
	// permits were granted since it opened (fastCountBits bits above bit 0), and, in bit 0,
	// whether the last of them found its bucket full, or full but for fastSlack: its call
	// is then counted at the TAT less T, at most fastSlack late, and its clock reading is
	// not stored (a second atomic write, on the word's cache line). fastShut while the
	// lock holds the member.
	word atomic.Uint64
	// first and last are the now of the first grant and of the last that did not find its
	// bucket full (bit 0), each written before the compare-and-swap that granted it (a
	// call whose swap then failed may have written it too: it called, at most a moment
	// before).
	first, last atomic.Int64
}

const (
	fastFull      = 1 // bit 0 of word
	fastCountBits = 20
	fastCountMax  = 1<<fastCountBits - 2 // then the lock counts them (a count of all ones would make fastShut)
	fastTatShift  = 1 + fastCountBits
	fastTatMax    = 1<<(64-fastTatShift) - 1 // 2.4 hours of nanoseconds past base
	fastShut      = math.MaxUint64
	// fastSlack: a grant this close to a full bucket counts as made on a full one. Two
	// goroutines that take permits together read the clock a few nanoseconds apart, and
	// the later grant finds the earlier one's TAT just past its own reading; storing each
	// such reading doubled the atomic writes in parallel.
	fastSlack = int64(time.Microsecond)
)

// allow grants one permit at now if the share holds one. false means that the caller takes
// the lock and decides there: the share refuses (the member counts a refusal, and may
// borrow instead), the lease ended, the path is shut, or its count or offset is full.
func (f *fastShare) allow(now int64) bool {
	if now >= f.end {
		return false
	}
	for {
		w := f.word.Load()
		n := w >> 1 & (1<<fastCountBits - 1)
		if w == fastShut || n >= fastCountMax {
			return false
		}
		// gcra.AllowOne on a limit without a window, inlined (a call passes the limit by
		// value): the permit is due when the bucket's TAT, or now if later, less the
		// tolerance, is at most now - T.
		old := f.base + int64(w>>fastTatShift)
		t := max(old, now)
		off := t + f.t - f.base
		if t+f.t-f.tau > now || off > fastTatMax {
			return false
		}
		nw := uint64(off)<<fastTatShift | (n+1)<<1
		if old-now <= fastSlack {
			nw |= fastFull // granted at tat - T, or at most fastSlack before: now need not be stored
		} else {
			f.last.Store(now)
		}
		if n == 0 {
			f.first.Store(now)
		}
		if f.word.CompareAndSwap(w, nw) {
			return true
		}
	}
}

// shut closes the path (the record's lock is held) and returns what it granted since it
// opened.
func (f *fastShare) shut() allot.FastGrants {
	w := f.word.Swap(fastShut)
	n := int64(w >> 1 & (1<<fastCountBits - 1))
	if w == fastShut || n == 0 {
		return allot.FastGrants{}
	}
	g := allot.FastGrants{N: n, Tat: f.base + int64(w>>fastTatShift), First: f.first.Load(), Last: f.last.Load()}
	if w&fastFull != 0 {
		g.Last = g.Tat - f.t
	}
	g.First = min(g.First, g.Last)
	return g
}

// lock takes r's lock, and hands what the fast path granted meanwhile to the member.
func (r *rec) lock() {
	r.mu.Lock()
	if f := r.fast.Load(); f != nil {
		if g := f.shut(); g.N > 0 {
			r.m.Granted(g)
		}
	}
}

// unlock opens the fast path on the member's share, if it has one, and releases r's lock.
func (r *rec) unlock() {
	r.openFast()
	r.mu.Unlock()
}

// openFast opens the fast path on the member's share (r's lock is held, the path shut).
func (r *rec) openFast() {
	fs, ok := r.m.Fast()
	f := r.fast.Load()
	switch {
	case !ok:
		if f != nil {
			r.fast.Store(nil)
		}
	case f != nil && f.t == fs.Limit.T && f.tau == fs.Limit.Tau && f.end == fs.End && fs.Tat >= f.base && fs.Tat-f.base <= fastTatMax:
		// The same share: a grant decided on it while it was shut is as good now, if it
		// finds the same word.
		f.word.Store(uint64(fs.Tat-f.base) << fastTatShift)
	default:
		r.fast.Store(&fastShare{t: fs.Limit.T, tau: fs.Limit.Tau, end: fs.End, base: fs.Tat})
	}
}
