package hits

// The board of classes: which classes (package priority) asked for a tag recently, across
// the pool (docs/priorities.md, "The gossip mode's board of classes"). A tag's board is
// kept at its owner, the node the rendezvous over the membership picks for it (Route's,
// whether or not the tag is decided there): the nodes post their callers' classes to it
// and read it from it, so that one node's lower classes keep the headroom of a higher
// class asking at another. The decisions do not read it: a caller decides under the
// limits the board tells it to keep (DecideKept).

import (
	"github.com/sluicehq/sluice/internal/classboard"
	"github.com/sluicehq/sluice/priority"
)

// BoardOwner returns the node that keeps key's board of classes: its owner by the
// rendezvous over this node and every peer held, decided there or not; "" for this node.
func (n *Node) BoardOwner(key string) string {
	hk := strHash(key)
	if t := n.tags[key]; t != nil {
		hk = t.hk
	}
	if o := n.pick(hk); o >= 0 {
		return n.peers[o].name
	}
	return ""
}

// MayRoute reports whether key may be decided at an owner, as far as the node knows: its
// policy is Owner, or Auto and its limits route it (Route) or are not known here (a key
// forwarded to its owner from here is not held here). Only such a key keeps headroom for
// the higher classes (DecideKept): its board need not be posted to or read otherwise.
func (n *Node) MayRoute(key string) bool {
	t := n.tags[key]
	p := n.policyOf(key)
	if t != nil {
		p = t.policy
	}
	switch p {
	case Owner:
		return true
	case Auto:
		return t == nil || t.k == 0 || n.routes(p, t.lim[:t.k])
	}
	return false
}

// Post records on key's board that a caller of class c (priority.Critical or
// priority.Standard; others are ignored) asked at now, for lasts: a caller of this node's,
// or of a peer's that posted it here (Flags of a ClassEntry). ErrTooManyTags: the node
// holds as many tags as it may.
func (n *Node) Post(key string, c priority.Class, lasts, now int64) error {
	i := classboard.Index(c)
	if i < 0 || lasts <= 0 {
		return nil
	}
	t, err := n.get(key, now)
	if err != nil {
		return err
	}
	t.used = now
	if t.board == nil {
		t.board = &classboard.Board{}
	}
	if p := t.board[i]; !p.Live(now) || now+lasts > p.End() {
		t.board[i] = classboard.Post{At: now, Lasts: lasts}
	}
	return nil
}

// Posted returns how long before now priority.Critical and priority.Standard were last
// posted on key's board as this node knows it, each -1 if not within the time its post
// lasts: the board itself at its owner, elsewhere what the owner last told (Learn).
func (n *Node) Posted(key string, now int64) (critical, standard int64) {
	if t := n.tags[key]; t != nil && t.board != nil {
		ago := t.board.Ago(now)
		return ago[0], ago[1]
	}
	return -1, -1
}

// Board returns key's board at now as an entry of a reply to a read (FlagBoard, and a
// class's flag for each live post): what a peer learns with Learn.
func (n *Node) Board(key string, now int64) ClassEntry {
	e := ClassEntry{Tag: key, Flags: FlagBoard}
	if t := n.tags[key]; t != nil && t.board != nil {
		for i, p := range t.board {
			if p.Live(now) {
				e.Flags |= 1 << i
				e.Ago[i], e.Lasts[i] = max(now-p.At, 0), p.Lasts
			}
		}
	}
	return e
}

// Learn takes what key's owner told of its board (an entry of Board's), received at now:
// Posted answers it until it is over or the owner tells again. A board the node holds no
// tag for, and which tells no class, is not kept.
func (n *Node) Learn(e *ClassEntry, now int64) {
	t := n.tags[e.Tag]
	if t == nil {
		if e.Flags&flagClasses == 0 {
			return
		}
		var err error
		if t, err = n.get(e.Tag, now); err != nil {
			return
		}
	}
	t.used = now
	var b classboard.Board
	for i := range b {
		if e.Flags&(1<<i) != 0 && e.Lasts[i] > e.Ago[i] {
			b[i] = classboard.Post{At: now - e.Ago[i], Lasts: e.Lasts[i]}
		}
	}
	if b == (classboard.Board{}) {
		t.board = nil
		return
	}
	t.board = &b
}

// boardLive reports whether t's board holds a post that counts at now: the tag is not
// idle while it does.
func (t *tag) boardLive(now int64) bool { return t.board != nil && t.board.Live(now) }

// Flags of a ClassEntry.
const (
	FlagCritical = 1 << 0 // a post of priority.Critical (or, with FlagBoard, a live one)
	FlagStandard = 1 << 1 // a post of priority.Standard (or, with FlagBoard, a live one)
	FlagRead     = 1 << 2 // the sender asks the owner for the board (a reply of FlagBoard)
	FlagBoard    = 1 << 3 // the owner's board, in reply to a read
	flagClasses  = FlagCritical | FlagStandard
	flagsKnown   = flagClasses | FlagRead | FlagBoard
)

// ClassEntry is one tag in a classes message: posts to its board's owner, a read of it,
// or the owner's reply.
type ClassEntry struct {
	Tag   string
	Flags byte
	// Ago and Lasts, for each class whose flag is set (classboard.Classes' order): how long
	// before the message the class was posted, and how long its post lasts from then,
	// nanoseconds. A post is made as it is sent: Ago 0.
	Ago, Lasts [len(classboard.Classes)]int64
}

// PostEntry returns the entry that posts class c (priority.Critical or
// priority.Standard) for key, lasting lasts, to its board's owner; ok is false for a
// class the board does not keep.
func PostEntry(key string, c priority.Class, lasts int64) (e ClassEntry, ok bool) {
	i := classboard.Index(c)
	if i < 0 || lasts <= 0 {
		return ClassEntry{}, false
	}
	e = ClassEntry{Tag: key, Flags: 1 << i}
	e.Lasts[i] = lasts
	return e, true
}

// Classes applies a classes message's entries from peer from at now, and returns the
// replies to send it back (the board of each tag it read). Posts are recorded; boards are
// learned (Learn).
func (n *Node) Classes(entries []ClassEntry, now int64) (replies []ClassEntry) {
	for i := range entries {
		e := &entries[i]
		if e.Flags&FlagBoard != 0 {
			n.Learn(e, now)
			continue
		}
		for k, c := range classboard.Classes {
			if e.Flags&(1<<k) != 0 {
				if err := n.Post(e.Tag, c, e.Lasts[k]-e.Ago[k], now); err != nil {
					n.stats.Dropped++
				}
			}
		}
		if e.Flags&FlagRead != 0 {
			replies = append(replies, n.Board(e.Tag, now))
		}
	}
	return replies
}
