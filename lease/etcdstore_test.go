package lease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/backendtest"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/store"
	etcdstore "github.com/sluicehq/sluice/store/etcd"
	"github.com/sluicehq/sluice/store/storetest"
)

func etcdPrefix() store.Option {
	return store.WithPrefix(fmt.Sprintf("test%d/", prefixes.Add(1)))
}

func TestEtcdStoreConformance(t *testing.T) {
	srv := lease.SharedEtcd(t)
	client := lease.EtcdClient(t, srv.Addr())
	storetest.Run(t, func(t *testing.T) (store.Store, func()) {
		return etcdstore.New(client, etcdPrefix()), func() {
			if err := srv.Wipe(); err != nil {
				t.Fatal(err)
			}
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestConformanceOnEtcd: the lease mode through a real etcd decides as the local backend
// does for one member holding the whole limit (virtual time).
func TestConformanceOnEtcd(t *testing.T) {
	client := lease.EtcdClient(t, lease.SharedEtcd(t).Addr())
	backendtest.Run(t, func(t *testing.T, clk *clock.Virtual) backend.Backend {
		c := lease.DefaultConfig()
		c.TTL = time.Hour
		c.JoinWindow = 0
		st := etcdstore.New(client, etcdPrefix(), store.WithNow(func() int64 { return clk.Now().UnixNano() }))
		b, err := lease.New(st, lease.WithConfig(c), lease.WithClock(clk), lease.WithRenewEvery(10*time.Minute), lease.WithIdleAfter(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		// The store's meta key is made now: a member's first records are not fenced only if
		// the store is older than TTL + Grace, so wait it out in virtual time.
		if _, err := st.Load(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		clk.Advance(c.TTL + c.Grace)
		return b
	})
}
