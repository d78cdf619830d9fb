package cas

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/store"
	etcdstore "github.com/sluicehq/sluice/store/etcd"
	zkstore "github.com/sluicehq/sluice/store/zk"
)

// TestStoreKilledAndRestarted: a member takes permits of 50/s burst=5 through a real etcd
// and a real ZooKeeper, the server is killed (calls fail with ErrUnavailable, within the
// time-out) and restarted with its data (calls decide again); every grant, before and
// after, conforms exactly to the limit on the store's time: the state survived, and time
// did not go back.
func TestStoreKilledAndRestarted(t *testing.T) {
	if testing.Short() {
		t.Skip("real time: not in -short")
	}
	l := gcra.Limit{T: int64(20 * time.Millisecond), Tau: int64(100 * time.Millisecond)}
	req := backend.Request{Limits: []gcra.Limit{l}, N: 1}
	for _, name := range []string{"etcd", "zk"} {
		t.Run(name, func(t *testing.T) {
			var st store.Store
			var kill func()
			var restart func() error
			path := unique("/restart")
			if name == "etcd" {
				srv := sharedEtcd(t)
				st, kill, restart = etcdstore.New(etcdClient(t), store.WithPrefix(path+"/")), srv.Kill, srv.Restart
			} else {
				srv := sharedZK(t)
				st, kill, restart = zkstore.New(zkConn(t), store.WithPrefix(path)), srv.Kill, srv.Restart
			}
			b := New(st, WithTimeout(time.Second))
			defer b.Close()
			at := runMembers(t.Log, []*Backend{b}, l, 500*time.Millisecond)
			kill()
			start := time.Now()
			if _, err := b.Decide(context.Background(), "shared", req); !errors.Is(err, backend.ErrUnavailable) {
				t.Errorf("with the server killed: got %v, want ErrUnavailable", err)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("the call with the server killed took %v (time-out 1 s)", d)
			}
			if err := restart(); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				_, err := b.Decide(context.Background(), "shared", backend.Request{Limits: []gcra.Limit{l}, N: 0})
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no answer 30 s after the restart: %v", err)
				}
			}
			at = append(at, runMembers(t.Log, []*Backend{b}, l, 500*time.Millisecond)...)
			if v := violations(at, l); v != 0 {
				t.Errorf("%d of %d grants break the limit on the store's time", v, len(at))
			}
			t.Logf("%d grants, before and after the restart", len(at))
		})
	}
}
