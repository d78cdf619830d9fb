package sim

// The classes across processes in the strict mode (docs/priorities.md): each member's
// limiter posts its callers' class on the store's board of classes (backend.ClassBoard)
// and reads it before a lower class decides, so that a lower class's places in the store's
// line keep the headroom of a higher class asking in another member (the limiter's
// keepFor, keepPlace).

import (
	"time"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/priority"
)

// memberClasses is what a member's limiter knows of the classes on the key: each time on
// the one clock, plus one (0: never).
type memberClasses struct {
	uses             bool  // its calls name a class (a member whose calls name none keeps no headroom)
	born             int64 // its first decision on the key
	readAt           int64 // its last read of the board
	postedC, postedS int64 // its last posts of the critical and the standard class
	viewC, viewS     int64 // when the critical and the standard class last asked, as it knows
}

// boardEvery is the limiter's: how often it reads the board before a lower class decides.
const boardEvery = int64(100 * time.Millisecond)

// recentFor is the limiter's: how long a class seen asking stays recent, the time the
// tightest limit takes to refill its burst, at least a second, at most a minute.
func recentFor(core []gcra.Limit) int64 {
	var tau int64
	for _, c := range core {
		tau = max(tau, c.Tau)
	}
	return min(max(tau, int64(time.Second)), int64(time.Minute))
}

// keepMode is the headroom a strict decision keeps (the limiter's keeping).
type keepMode uint8

const (
	keepNone  keepMode = iota // a place of a room that holds one per waiter (strict:waiters): nothing
	keepAll                   // a decision that does not wait (max_wait 0): its class's headroom, or refused
	keepPlace                 // a place of a room shared by process (strict): what the burst allows
)

// classLimits returns the limits the store decides member mi's request under, the request
// sent at sent and arriving now: e.core, or e.core less the headroom the member's class
// keeps for a higher class its limiter knows to be recent. ok is false (keepAll) when the
// headroom leaves nothing: retry says when the higher class stops being recent. On the
// way it posts the member's class on the board (at most every quarter of the time a class
// stays recent) and, for a lower class, reads the board (at most every boardEvery). The
// limiter does each in a round trip of its own just before its decision; the simulator
// does them with the decision, at the store.
func (e *engine) classLimits(mi int32, sent int64, keep keepMode) (ls []gcra.Limit, ok bool, retry int64) {
	m := e.members[mi]
	c := &m.cls
	if !c.uses {
		return e.core, true, 0
	}
	recent := recentFor(e.core)
	if c.born == 0 {
		c.born = sent + 1
	}
	post := func(last *int64, board *int64) {
		if *last == 0 || sent-(*last-1) >= recent/4 {
			*last, *board = sent+1, e.now+1
		}
	}
	class := priority.Class(m.class)
	switch class {
	case priority.Critical:
		post(&c.postedC, &e.board[0])
		return e.core, true, 0
	case priority.Standard:
		post(&c.postedS, &e.board[1])
	}
	if keep == keepNone {
		return e.core, true, 0
	}
	if c.readAt == 0 || sent-(c.readAt-1) >= boardEvery {
		c.readAt = sent + 1
		for i, v := range []*int64{&c.viewC, &c.viewS} {
			if b := e.board[i]; b > 0 && e.now-(b-1) < recent {
				*v = max(*v, b)
			}
		}
	}
	return headroomLimits(e.core, class, c.viewC, c.viewS, c.born, sent, keep, &e.classBuf)
}

// headroomLimits is the limiter's keepFor for a decision of class at now: core, or core
// less the headroom for a higher class seen recently (seenC, seenS: when the critical and
// the standard class last asked; born: the limiter's first decision on the key; each plus
// one, 0 never), in buf. ok is false (keepAll) when the headroom leaves nothing: retry
// says when the higher class stops being recent.
func headroomLimits(core []gcra.Limit, class priority.Class, seenC, seenS, born, now int64, keep keepMode, buf *[gcra.MaxLimits]gcra.Limit) (ls []gcra.Limit, ok bool, retry int64) {
	if keep == keepNone || class == priority.Critical {
		return core, true, 0
	}
	frac, until := headroomFrac(core, class, seenC, seenS, born, now)
	return keptLimits(core, frac, until, now, keep, buf)
}

// headroomFrac is the fraction of the burst a decision of class keeps at now (0: none),
// and until when (headroomLimits).
func headroomFrac(core []gcra.Limit, class priority.Class, seenC, seenS, born, now int64) (frac float64, until int64) {
	recent := recentFor(core)
	h := priority.DefaultHeadroom
	if seenC > 0 && now-(seenC-1) < recent {
		frac, until = h.Standard, seenC-1+recent
		if class == priority.Sheddable {
			frac = h.Sheddable
		}
	}
	if class == priority.Sheddable && seenS > 0 && now-(seenS-1) < recent {
		frac, until = h.Sheddable, max(until, seenS-1+recent)
	}
	if frac == 0 && class == priority.Sheddable && born > 0 && now-(born-1) < recent {
		frac, until = h.Sheddable, born-1+recent // unknown is not absent (docs/priorities.md)
	}
	return frac, until
}

// keptLimits is core keeping frac of each burst (headroomLimits), in buf.
func keptLimits(core []gcra.Limit, frac float64, until, now int64, keep keepMode, buf *[gcra.MaxLimits]gcra.Limit) (ls []gcra.Limit, ok bool, retry int64) {
	if frac <= 0 {
		return core, true, 0
	}
	for i, l := range core {
		k, fits := l.Keeping(frac)
		if !fits && keep == keepPlace {
			return core, true, 0
		}
		if !fits {
			return nil, false, max(until-now, 1)
		}
		buf[i] = k
	}
	return buf[:len(core)], true, 0
}
