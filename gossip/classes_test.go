package gossip

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/priority"
)

// TestOlderOwnerIsSentNoClasses: a member posts its callers' classes to a key's owner and
// forwards it the requests that keep part of the burst with what they keep, only where
// the owner's node meta says it reads them. An owner of an earlier release (no meta) is
// sent no post, and decides the kept requests under the key's whole limits, as before.
// Step 1, the owner reads classes: the critical post reaches its board, and 6 of 10 kept
// decisions (40% of a burst of 10 kept) are granted; step 2, the owner as an earlier
// release: no post, and 10 of 10 granted (on another key, each asked on a full burst).
func TestOlderOwnerIsSentNoClasses(t *testing.T) {
	if testing.Short() {
		t.Skip("real time")
	}
	a, b := pair(t, nil, nil)
	core := []gcra.Limit{{T: sec / 10, Tau: sec}} // 10/s burst 10
	kept, _ := core[0].Keeping(0.4)
	posted := func(key string) bool {
		s := a.shard(key)
		s.mu.Lock()
		defer s.mu.Unlock()
		c, _ := s.node.Posted(key, a.clock.Nanotime())
		return c >= 0
	}
	ctx := context.Background()
	granted := func(key string) int {
		n := 0
		for range 10 {
			g, err := b.Decide(ctx, key, backend.Request{Limits: []gcra.Limit{kept}, Core: core, N: 1})
			if err != nil {
				t.Fatal(err)
			}
			if g.Allowed {
				n++
			}
		}
		return n
	}
	k1 := keyOwnedBy(b, a, core, "")
	if err := b.PostClass(ctx, k1, priority.Critical, time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "step 1: the post at the owner", func() bool { return posted(k1) })
	if n := granted(k1); n != 6 {
		t.Errorf("step 1: %d of 10 kept decisions granted at an owner that reads classes, want 6", n)
	}

	b.peersMu.Lock()
	n := b.peers[a.Name()]
	n.Meta = nil // as an earlier release's
	b.peers[a.Name()] = n
	b.peersMu.Unlock()
	k2 := keyOwnedBy(b, a, core, k1)
	if err := b.PostClass(ctx, k2, priority.Critical, time.Second); err != nil {
		t.Fatal(err)
	}
	if n := granted(k2); n != 10 {
		t.Errorf("step 2: %d of 10 kept decisions granted at an earlier release's owner, want 10 (decided under the whole limit)", n)
	}
	if posted(k2) {
		t.Error("step 2: an earlier release's owner was sent a post")
	}
}
