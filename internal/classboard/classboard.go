// Package classboard is a board of classes: when each class whose headroom lower classes
// keep (priority.Critical, priority.Standard) last asked for a key, and how long its post
// counts (docs/priorities.md). The strict mode's compare-and-set back end keeps one per
// key in its store (strict/cas), and the gossip mode's owner of a key one in memory
// (gossip/hits).
package classboard

import "github.com/sluicehq/sluice/priority"

// Classes are the classes a board keeps, in its posts' order.
var Classes = [...]priority.Class{priority.Critical, priority.Standard}

// Index is c's place among Classes; -1 if a board does not keep it.
func Index(c priority.Class) int {
	for i, x := range Classes {
		if x == c {
			return i
		}
	}
	return -1
}

// Post is a class's last post on a board: the time it was made at and how long it lasts
// (0: never posted), on one clock (the store's, or a node's).
type Post struct{ At, Lasts int64 }

// Live reports whether p still counts at now.
func (p Post) Live(now int64) bool { return p.Lasts > 0 && now-p.At < p.Lasts }

// End is when p stops counting.
func (p Post) End() int64 { return p.At + p.Lasts }

// Board is a key's board of classes: the last post of each of Classes.
type Board [len(Classes)]Post

// Ago returns how long before now each class was last posted, -1 where its post does not
// count.
func (b *Board) Ago(now int64) [len(Classes)]int64 {
	var ago [len(Classes)]int64
	for i, p := range b {
		ago[i] = -1
		if p.Live(now) {
			ago[i] = max(now-p.At, 0)
		}
	}
	return ago
}

// Live reports whether a post on b counts at now.
func (b *Board) Live(now int64) bool {
	for _, p := range b {
		if p.Live(now) {
			return true
		}
	}
	return false
}

// Keep returns how long b lasts after now, its latest post's end, and forgets the posts
// over: 0 when none is left.
func (b *Board) Keep(now int64) int64 {
	var keep int64
	for i, p := range b {
		if !p.Live(now) {
			b[i] = Post{}
			continue
		}
		keep = max(keep, p.End()-now)
	}
	return keep
}
