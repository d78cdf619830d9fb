package lease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/backendtest"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/storetest"
	zkstore "github.com/sluicehq/sluice/store/zk"
)

func zkPath() store.Option {
	return store.WithPrefix(fmt.Sprintf("/test/%d", prefixes.Add(1)))
}

// TestZKStoreConformance: the store contract on a real ZooKeeper. A wipe deletes the
// store's znodes (TestZKWipedEnsemble wipes the server itself, which a connection that
// saw its earlier zxids cannot reach again).
func TestZKStoreConformance(t *testing.T) {
	conn := lease.ZKClient(t, lease.SharedZK(t).Addr())
	storetest.Run(t, func(t *testing.T) (store.Store, func()) {
		path := fmt.Sprintf("/test/%d", time.Now().UnixNano())
		return zkstore.New(conn, store.WithPrefix(path)), func() { lease.ZKDelete(t, conn, path) }
	})
}

// TestZKWipedEnsemble: a ZooKeeper restarted with no data. A connection that saw its
// earlier zxids is refused (ZooKeeper will not serve a client a past it has seen beyond):
// the store is unavailable through it, and the members on it run by their fail mode. A
// new connection (a restarted member) finds the store in a new incarnation, begun after
// the wipe: the records it makes are fenced.
func TestZKWipedEnsemble(t *testing.T) {
	srv := lease.SharedZK(t)
	ctx := context.Background()
	old := zkstore.New(lease.ZKClient(t, srv.Addr()), zkPath())
	if _, err := old.Swap(ctx, []store.Write{{ID: "r", Data: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	before, err := old.Load(ctx, []string{"r"})
	if err != nil || before.Records[0].Version == 0 {
		t.Fatalf("%+v %v", before, err)
	}
	if err := srv.Wipe(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	fresh := zkstore.New(lease.ZKClient(t, srv.Addr()), zkPath())
	after, err := fresh.Load(ctx, []string{"r"})
	if err != nil {
		t.Fatal(err)
	}
	if after.Records[0].Version != 0 || after.Since < before.Now || after.Since > after.Now {
		t.Fatalf("after the wipe: record %+v, since %d (before: now %d; after: now %d)", after.Records[0], after.Since, before.Now, after.Now)
	}
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := old.Load(short, []string{"r"}); !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("the old connection read %v, want backend.ErrUnavailable", err)
	}
}

// TestConformanceOnZK: the lease mode through a real ZooKeeper decides as the local
// backend does for one member holding the whole limit (virtual time).
func TestConformanceOnZK(t *testing.T) {
	conn := lease.ZKClient(t, lease.SharedZK(t).Addr())
	backendtest.Run(t, func(t *testing.T, clk *clock.Virtual) backend.Backend {
		c := lease.DefaultConfig()
		c.TTL = time.Hour
		c.JoinWindow = 0
		st := zkstore.New(conn, zkPath(), store.WithNow(func() int64 { return clk.Now().UnixNano() }))
		b, err := lease.New(st, lease.WithConfig(c), lease.WithClock(clk), lease.WithRenewEvery(10*time.Minute), lease.WithIdleAfter(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Load(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		clk.Advance(c.TTL + c.Grace) // past the new store's fence
		return b
	})
}
