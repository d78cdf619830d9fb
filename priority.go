package sluice

import (
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

// WithHeadroom sets the headroom decisions that do not wait keep for the higher classes
// (default priority.DefaultHeadroom; priority.Headroom{} turns it off: the classes then
// differ only in the waiting room's order).
func WithHeadroom(h priority.Headroom) Option {
	return optionFunc(func(l *Limiter) { l.headroom, l.headroomSet = h, true })
}

// classSeen is when a key's Critical and Standard callers last asked and when the limiter
// first saw the key (limiter clock), each plus one: 0 is never.
type classSeen struct{ critical, standard, born atomic.Int64 }

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
// core less the headroom for a higher class seen recently. ok is false when the headroom
// leaves nothing to grant; retry is then how long until the higher class is no longer
// recent. It records the class as seen.
//
// A place the waiting room takes (keep false) keeps nothing: the room serves it to its
// highest class waiting, whichever class's waiter took it. Its class is recorded all the
// same.
func (l *Limiter) keepFor(p priority.Class, key string, core []gcra.Limit, now int64, keep bool, buf *[gcra.MaxLimits]gcra.Limit) (ls []gcra.Limit, ok bool, retry int64) {
	seen := l.seen.Load()
	if seen == nil {
		return core, true, 0
	}
	e := seen.Load(key)
	if e == nil {
		e, _ = seen.LoadOrStore(key, func(c *classSeen) { c.born.Store(now + 1) })
		if seen.Len() > l.maxSeen {
			l.sweepSeen(seen, now)
		}
	}
	switch p {
	case priority.Critical:
		e.Val.critical.Store(now + 1)
		return core, true, 0
	case priority.Standard:
		e.Val.standard.Store(now + 1)
	}
	if !keep {
		return core, true, 0
	}
	recent := recentFor(core)
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
		if !fits {
			return nil, false, max(until-now, 1)
		}
		buf[i] = k
	}
	return buf[:len(core)], true, 0
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
		if !caps.ByValue {
			l.log.Warn("sluice: this backend keeps no headroom for higher priorities in decisions that do not wait; waiting rooms still serve higher classes first",
				"backend", fmt.Sprintf("%T", l.be))
			return
		}
		l.maxSeen = int(min(l.maxPen, int64(1)<<20))
		l.seen.Store(keytable.New[classSeen]())
	})
}
