package gossip

// The board of classes across the pool (backend.ClassBoard, docs/priorities.md): each
// key decided at its owner has its board there (hits.Node.BoardOwner), which the members
// post their callers' classes to and read it from, in classes messages (hits.KindClasses)
// of a datagram each. A key decided by shares keeps no headroom, and has no board. A member of an earlier release does not read them: a member sends them
// only to peers whose node meta says they do (classesMeta).

import (
	"bytes"
	"context"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gossip/hits"
	"github.com/sluicehq/sluice/priority"
)

// classesMeta is the node meta of a member that reads classes messages and asks that
// keep part of the burst (hits.KindClasses, hits.KindAskKept). A member of an earlier
// release has none, and is sent neither.
var classesMeta = []byte("sluice-classes")

// readsClasses reports whether the peer n reads classes messages (its meta says so).
func readsClasses(n *memberlist.Node) bool { return bytes.Equal(n.Meta, classesMeta) }

// PostClass records on key's board that a caller of class c (priority.Critical or
// priority.Standard; others are ignored) asked now, for recent (backend.ClassBoard): here
// if this member keeps the board, otherwise in a message to the member that does. It does
// not wait for an answer; a lost message is made good by the limiter's next post, within
// a quarter of recent.
func (b *Backend) PostClass(_ context.Context, key string, c priority.Class, recent time.Duration) error {
	if b.closed.Load() {
		return backend.ErrClosed
	}
	e, ok := hits.PostEntry(key, c, int64(recent))
	if !ok {
		return nil
	}
	now := b.clock.Nanotime()
	s := b.shard(key)
	s.mu.Lock()
	if !s.node.MayRoute(key) {
		s.mu.Unlock()
		return nil // decided by shares: no headroom kept, no board
	}
	owner := s.node.BoardOwner(key)
	var err error
	if owner == "" {
		err = s.node.Post(key, c, int64(recent), now)
	}
	s.mu.Unlock()
	if err != nil || owner == "" {
		return err
	}
	b.sendClasses(owner, e)
	return nil
}

// ClassesPosted returns how long ago priority.Critical and priority.Standard were last
// posted on key's board, each negative if not within the time its post lasts
// (backend.ClassBoard). This member's own board it reads here; another member's as that
// member last told it, and it asks it again (the answer comes within a round trip, for
// the next read: the limiter reads at most every 100 ms a key).
func (b *Backend) ClassesPosted(_ context.Context, key string) (critical, standard time.Duration, err error) {
	if b.closed.Load() {
		return -1, -1, backend.ErrClosed
	}
	now := b.clock.Nanotime()
	s := b.shard(key)
	s.mu.Lock()
	routes := s.node.MayRoute(key)
	owner := s.node.BoardOwner(key)
	c, st := s.node.Posted(key, now)
	s.mu.Unlock()
	if routes && owner != "" {
		b.sendClasses(owner, hits.ClassEntry{Tag: key, Flags: hits.FlagRead})
	}
	return time.Duration(c), time.Duration(st), nil
}

// sendClasses sends one entry to the named peer, if it reads classes messages.
func (b *Backend) sendClasses(name string, e hits.ClassEntry) {
	b.peersMu.Lock()
	n, ok := b.peers[name]
	b.peersMu.Unlock()
	if !ok || !readsClasses(&n) {
		return
	}
	b.sendTo(name, hits.EncodeClasses(b.self, []hits.ClassEntry{e}))
}

// classes applies a classes message from a peer: posts to the boards this member keeps,
// reads of them (answered), and the boards their owners told.
func (b *Backend) classes(msg []byte) {
	from, es, err := hits.DecodeClasses(msg)
	if err != nil {
		b.malformed()
		return
	}
	now := b.clock.Nanotime()
	for i := range es {
		e := &es[i]
		s := b.shard(e.Tag)
		s.mu.Lock()
		replies := s.node.Classes(es[i:i+1], now)
		s.mu.Unlock()
		for _, r := range replies {
			b.sendClasses(from, r)
		}
	}
}
