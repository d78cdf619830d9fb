package sluice

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/fairq"
	"github.com/sluicehq/sluice/internal/keytable"
	"github.com/sluicehq/sluice/priority"
)

// The limiter's side of the classes (package priority, docs/priorities.md).

// fairClass is c's class in a waiting room.
func fairClass(c priority.Class) fairq.Class {
	switch {
	case c > priority.Standard:
		return fairq.Critical
	case c < priority.Standard:
		return fairq.Sheddable
	}
	return fairq.Standard
}

// classOf is the class of a waiting room's class c.
func classOf(c fairq.Class) priority.Class {
	switch c {
	case fairq.Critical:
		return priority.Critical
	case fairq.Sheddable:
		return priority.Sheddable
	}
	return priority.Standard
}

// keeping says what headroom for the higher classes a decision keeps (keepFor).
type keeping uint8

const (
	// keepNone: a place an in-process waiting room takes. The room serves it to its
	// highest class waiting when it comes due, whichever waiter took it: it keeps nothing.
	keepNone keeping = iota
	// keepAll: a decision that does not wait keeps its class's headroom, or is refused.
	keepAll
	// keepPlace: a place in a line every process shares (sluice.FairProcesses), of the
	// room's highest class waiting, keeps that class's headroom for the higher classes
	// seen asking here or in another process, where the burst allows it (on a burst of
	// one permit it keeps nothing, and the place is taken in turn).
	keepPlace
)

// WithHeadroom sets the headroom decisions that do not wait keep for the higher classes
// (default priority.DefaultHeadroom; priority.Headroom{} turns it off: the classes then
// differ only in the waiting room's order).
func WithHeadroom(h priority.Headroom) Option {
	return optionFunc(func(l *Limiter) { l.headroom, l.headroomSet = h, true })
}

// classSeen is when a key's Critical and Standard callers last asked (here, or in another
// process as the backend's board says) and when the limiter first saw the key; and when
// the limiter last read the key's board and posted its Critical and Standard callers on
// it (limiter clock), each plus one: 0 is never.
type classSeen struct {
	critical, standard, born atomic.Int64
	read, postedC, postedS   atomic.Int64
}

// boardEvery is how often a limiter reads a key's board of classes (backend.ClassBoard)
// before a lower class decides on it: a higher class asking in another process is heeded
// this long after it is posted, at most.
const boardEvery = 100 * time.Millisecond

// recentFor is how long a class seen asking for a key counts as recent: the time its
// tightest limit takes to refill its burst, at least a second, at most a minute.
func recentFor(core []gcra.Limit) int64 {
	var tau int64
	for _, c := range core {
		tau = max(tau, c.Tau)
	}
	return min(max(tau, int64(time.Second)), int64(time.Minute))
}

// keepFor returns the limits a decision of class p on key decides under at now: core, or
// core less the headroom for a higher class seen recently, here or (the backend's board)
// in another process. ok is false when the headroom leaves nothing to grant; retry is then
// how long until the higher class is no longer recent. It records the class as seen, and
// posts it on the backend's board now and then.
//
// A place an in-process waiting room takes (keepNone) keeps nothing: the room serves it
// to its highest class waiting, whichever class's waiter took it. Its class is recorded
// all the same. A place in a line every process shares (keepPlace) keeps what the burst
// allows.
func (l *Limiter) keepFor(ctx context.Context, p priority.Class, key string, core []gcra.Limit, now int64, keep keeping, buf *[gcra.MaxLimits]gcra.Limit) (ls []gcra.Limit, ok bool, retry int64) {
	seen := l.seen.Load()
	if seen == nil {
		return core, true, 0
	}
	e := l.classEntry(seen, key, now)
	recent := recentFor(core)
	switch p {
	case priority.Critical:
		e.Val.critical.Store(now + 1)
		l.post(ctx, &e.Val.postedC, key, p, recent, now)
		return core, true, 0
	case priority.Standard:
		e.Val.standard.Store(now + 1)
		l.post(ctx, &e.Val.postedS, key, p, recent, now)
	}
	if keep == keepNone {
		return core, true, 0
	}
	l.readBoard(ctx, &e.Val, key, now)
	var frac float64
	var until int64
	if c := e.Val.critical.Load() - 1; c >= 0 && now-c < recent {
		frac, until = l.headroom.Standard, c+recent
		if p == priority.Sheddable {
			frac = l.headroom.Sheddable
		}
	}
	if s := e.Val.standard.Load() - 1; p == priority.Sheddable && s >= 0 && now-s < recent {
		frac, until = l.headroom.Sheddable, max(until, s+recent)
	}
	if b := e.Val.born.Load() - 1; frac == 0 && p == priority.Sheddable && now-b < recent {
		// The key has not been watched for a whole window yet: a higher class may be about
		// to ask (a critical client's first query beside a sheddable flood that started
		// first). For sheddable work unknown is not absent: its headroom holds until the
		// window has passed. (A standard caller yields on evidence only.)
		frac, until = l.headroom.Sheddable, b+recent
	}
	if frac <= 0 {
		return core, true, 0
	}
	for i, c := range core {
		k, fits := c.Keeping(frac)
		if !fits && keep == keepPlace {
			return core, true, 0 // a burst too small to keep anything: the place is taken in turn
		}
		if !fits {
			return nil, false, max(until-now, 1)
		}
		buf[i] = k
	}
	return buf[:len(core)], true, 0
}

// classEntry returns what the limiter knows of key's classes, made at now if new.
func (l *Limiter) classEntry(seen *keytable.Table[classSeen], key string, now int64) *keytable.Entry[classSeen] {
	e := seen.Load(key)
	if e == nil {
		e, _ = seen.LoadOrStore(key, func(c *classSeen) { c.born.Store(now + 1) })
		if seen.Len() > l.maxSeen {
			l.sweepSeen(seen, now)
		}
	}
	return e
}

// keepsNothing reports whether Allow's call on key keeps no headroom, so that it may take
// the backend's fast path (backend.Allower), which keeps none: a standard call while no
// call in the process named a class; or, once one did, a standard call on a key no
// critical caller asked for recently, on a backend with no board of classes to read or
// post, as keepFor finds it (which records the call). Every standard call of a process whose
// calls name classes went the long way, on any key: seven to nine times as long in the
// lease mode (BenchmarkLeaseAllowOneKey, impl=sluice-lease-classed).
func (l *Limiter) keepsNothing(ctx context.Context, key string, core []gcra.Limit) bool {
	if priority.Of(ctx) != priority.Standard {
		return false
	}
	if l.seen.Load() == nil {
		return true
	}
	if l.board != nil {
		return false
	}
	var buf [gcra.MaxLimits]gcra.Limit
	ls, ok, _ := l.keepFor(ctx, priority.Standard, key, core, l.clock.Nanotime(), keepAll, &buf)
	return ok && &ls[0] == &core[0] // keepFor kept nothing
}

// post posts class p's ask for key on the backend's board (backend.ClassBoard), unless it
// did within a quarter of the time a class stays recent; last is when it did.
func (l *Limiter) post(ctx context.Context, last *atomic.Int64, key string, p priority.Class, recent, now int64) {
	if l.board == nil {
		return
	}
	old := last.Load()
	if (old > 0 && now-(old-1) < recent/4) || !last.CompareAndSwap(old, now+1) {
		return
	}
	_ = l.board.PostClass(ctx, key, p, time.Duration(recent)) // an error leaves the board as it was
}

// readBoard reads which classes another process posted for key on the backend's board,
// unless it did within boardEvery, into e.
func (l *Limiter) readBoard(ctx context.Context, e *classSeen, key string, now int64) {
	if l.board == nil {
		return
	}
	old := e.read.Load()
	if (old > 0 && now-(old-1) < int64(boardEvery)) || !e.read.CompareAndSwap(old, now+1) {
		return
	}
	c, s, err := l.board.ClassesPosted(ctx, key)
	if err != nil {
		return // what was known stands
	}
	for _, x := range []struct {
		ago time.Duration
		at  *atomic.Int64
	}{{c, &e.critical}, {s, &e.standard}} {
		if x.ago < 0 {
			continue
		}
		t := now - int64(x.ago) + 1
		for old := x.at.Load(); old < t && !x.at.CompareAndSwap(old, t); old = x.at.Load() {
		}
	}
}

// sweepSeen forgets the keys no class asked for within a minute (the longest a class
// stays recent), and past the cap the first ones met until a tenth of it is free.
func (l *Limiter) sweepSeen(seen *keytable.Table[classSeen], now int64) {
	if !l.seenMu.TryLock() {
		return
	}
	defer l.seenMu.Unlock()
	keep := l.maxSeen - l.maxSeen/10
	for e := range seen.All() {
		last := max(e.Val.critical.Load(), e.Val.standard.Load(), e.Val.born.Load()) - 1
		if now-last > int64(time.Minute) || seen.Len() > keep {
			seen.Delete(e)
		}
	}
}

// prioritize readies the limiter for classes the first time a call carries one: the table
// of the classes seen, and a warning when the backend cannot keep headroom.
func (l *Limiter) prioritize() {
	l.seenOnce.Do(func() {
		caps := backend.CapabilitiesOf(l.be)
		if caps.Classes {
			l.classesOut.Store(true) // the backend keeps the headroom itself, from each call's class
			return
		}
		if !caps.ByValue {
			l.log.Warn("sluice: this backend keeps no headroom for higher priorities in decisions that do not wait; waiting rooms still serve higher classes first",
				"backend", fmt.Sprintf("%T", l.be))
			return
		}
		l.maxSeen = int(min(l.maxPen, int64(1)<<20))
		l.board, _ = l.be.(backend.ClassBoard)
		l.seen.Store(keytable.New[classSeen]())
	})
}
