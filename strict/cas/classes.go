package cas

// The board of classes: which classes (package priority) asked for a key recently, across
// the processes that share its line in the store (backend.ClassBoard, docs/priorities.md).
// It is one record per key beside the key's state, read and written in the backend's
// rounds like the state; the GCRA decisions do not read it.

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/internal/classboard"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/rkey"
	"github.com/sluicehq/sluice/priority"
)

var _ backend.ClassBoard = (*Backend)(nil)

// board is a key's board of classes, as its record holds it.
type board = classboard.Board

// boardID returns the name of key's board of classes in the store: the prefix, "classes:"
// and the key as a hash tag (the slot of the key's state in a Redis Cluster). It is
// never a state's name (RecordID), whose tag follows the prefix at once.
func (b *Backend) boardID(key string) string { return rkey.Name(b.prefix+"classes:", key) }

// PostClass records on the board that a caller of class c (priority.Critical or
// priority.Standard; others are ignored) asked for key now, for recent
// (backend.ClassBoard). It does not wait: the post rides on the backend's next round to
// start (the caller's decision that follows, when the limiter posts), which reads the
// board with its other records and, unless another post of c lasts three quarters of
// recent still, writes it by compare-and-set with its other writes. So a process's
// higher class adds no round trip of the store to its decisions. An error of that round
// is the round's calls', not the post's, which is lost: the limiter posts again within a
// quarter of recent. The board's record lasts as long as its latest post
// (store.Write.Keep); a read that finds every post over deletes it.
func (b *Backend) PostClass(_ context.Context, key string, c priority.Class, recent time.Duration) error {
	if c != priority.Critical && c != priority.Standard {
		return nil
	}
	if b.closed.Load() {
		return backend.ErrClosed
	}
	d := int64(max(recent, time.Millisecond))
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, o := range b.posts {
		if o.key == key && o.class == c {
			o.d = max(o.d, d)
			return nil
		}
	}
	b.posts = append(b.posts, &op{kind: opPost, key: key, class: c, d: d})
	return nil
}

// takePosts returns the posts waiting for a round, and forgets them. b.mu is held.
func (b *Backend) takePosts() []*op {
	ps := b.posts
	b.posts = nil
	return ps
}

// ClassesPosted returns how long ago priority.Critical and priority.Standard were last
// posted for key, on the store's time, each negative if not within the time its post
// lasts (backend.ClassBoard): a read of the board in the backend's next round, with the
// calls that come meanwhile.
func (b *Backend) ClassesPosted(ctx context.Context, key string) (critical, standard time.Duration, err error) {
	o := &op{kind: opRead, key: key}
	if _, err := b.do(ctx, o); err != nil {
		return -1, -1, err
	}
	return time.Duration(o.ago[0]), time.Duration(o.ago[1]), nil
}

// applyBoard applies o, a post or a read, to bd at now, sets o's outcome, and reports
// whether bd is to be written back.
func applyBoard(bd *board, o *op, now int64) bool {
	o.grant, o.err = backend.Grant{}, nil
	switch o.kind {
	case opPost:
		i := classboard.Index(o.class)
		if i < 0 {
			return false
		}
		if p := bd[i]; p.Live(now) && p.End()-now >= o.d-o.d/4 {
			return false // another process's post stands for this one
		}
		bd[i] = classboard.Post{At: now, Lasts: o.d}
		return true
	case opRead:
		o.ago = bd.Ago(now)
	}
	return false
}
