package strict

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/strict/cas"
)

// TestDialChoosesThePath: one Dial for every store URL. A Redis URL gets the decision
// script (a *Backend). memory:// gets the compare-and-set path, which refuses the options
// of the Redis path alone. A scheme whose store is not linked says which package to
// import. Each backend decides.
func TestDialChoosesThePath(t *testing.T) {
	ctx := context.Background()
	l := gcra.Limit{T: int64(100 * time.Millisecond), Tau: int64(time.Second)}
	decide := func(b backend.Backend) {
		t.Helper()
		g, err := b.Decide(ctx, "k", backend.Request{Limits: []gcra.Limit{l}, N: 1})
		if err != nil || !g.Allowed {
			t.Errorf("%T: decide: %+v, %v", b, g, err)
		}
	}
	b, err := Dial(ctx, shared.URL(), WithPrefix(prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := b.(*Backend); !ok {
		t.Errorf("Dial(redis://): a %T, want a *Backend", b)
	}
	decide(b)
	b.Close()

	b, err = Dial(ctx, "memory://")
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := b.(interface{ Stats() cas.Stats }); !ok {
		t.Errorf("Dial(memory://): a %T, want the compare-and-set path", b)
	} else {
		decide(b)
		if c.Stats().Writes == 0 {
			t.Error("Dial(memory://): the grant wrote no record")
		}
	}
	b.Close()

	for _, o := range []Option{WithPipelines(4, 0), WithProbeEvery(time.Second), WithFailLocal(0.5), WithReplicaAcks(1, 0)} {
		if _, err := Dial(ctx, "memory://", o); err == nil || !strings.Contains(err.Error(), "applies to Redis only") {
			t.Errorf("an option of the Redis path on memory://: %v, want a refusal", err)
		}
	}
	if _, err := Dial(ctx, "etcd://127.0.0.1:1"); !errors.Is(err, store.ErrBadURL) || !strings.Contains(err.Error(), "store/etcd") {
		t.Errorf("etcd:// with its store not linked: %v, want an ErrBadURL naming store/etcd", err)
	}
}
