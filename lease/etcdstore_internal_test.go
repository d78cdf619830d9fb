package lease

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluicehq/sluice/store"
	etcdstore "github.com/sluicehq/sluice/store/etcd"
)

// etcdRemote is a real etcd for the differential test. A wipe deletes the store's keys,
// its meta key with them (what a cluster rebuilt from nothing shows the store); a record
// cannot be put back with its old revision, so no failover is played.
type etcdRemote struct {
	t      *testing.T
	client *clientv3.Client
	prefix string
}

func (r *etcdRemote) open(seed uint64, now func() int64) store.Store {
	r.prefix = fmt.Sprintf("diff%d/", seed)
	r.wipe()
	return etcdstore.New(r.client, store.WithPrefix(r.prefix), store.WithNow(now))
}

func (r *etcdRemote) wipe() {
	if _, err := r.client.Delete(context.Background(), r.prefix, clientv3.WithPrefix()); err != nil {
		r.t.Fatal(err)
	}
}

func (r *etcdRemote) save(string)        {}
func (r *etcdRemote) rewind(string) bool { return false }

// TestDifferentialEtcdAndMemStore: the differential test (TestDifferentialRedisAndMemStore)
// against a real etcd, on the test's virtual clock (fewer sequences: a write is a disk
// write).
func TestDifferentialEtcdAndMemStore(t *testing.T) {
	runDifferential(t, &etcdRemote{t: t, client: etcdClient(t, sharedEtcd(t).Addr())}, 30)
}

// TestEtcdRecordTimeNeverGoesBack: a record written by a member whose clock is ahead is
// timed, for a member whose clock is behind, no earlier than its writer timed it (the
// store's time is monotonic per record), and an unreadable record is store.ErrBadRecord.
func TestEtcdRecordTimeNeverGoesBack(t *testing.T) {
	ctx := context.Background()
	client := etcdClient(t, sharedEtcd(t).Addr())
	prefix := fmt.Sprintf("skew%d/", time.Now().UnixNano())
	ahead := etcdstore.New(client, store.WithPrefix(prefix), store.WithNow(func() int64 { return 1000e9 }))
	behind := etcdstore.New(client, store.WithPrefix(prefix), store.WithNow(func() int64 { return 999e9 }))
	snap, err := ahead.Load(ctx, []string{"r"})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Now != 1000e9 || snap.Since != 1000e9 {
		t.Fatalf("the first load read now %d since %d", snap.Now, snap.Since)
	}
	if v, err := ahead.Swap(ctx, []store.Write{{ID: "r", Data: []byte("x")}}); err != nil || v[0] == 0 {
		t.Fatalf("write: %v %v", v, err)
	}
	snap, err = behind.Load(ctx, []string{"r", "missing"})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Now != 999e9 || snap.Records[0].Now != 1000e9 || snap.Records[1].Now != 0 {
		t.Fatalf("the member behind read now %d, the record at %d, the missing one at %d: want 999 s, 1000 s, 0",
			snap.Now, snap.Records[0].Now, snap.Records[1].Now)
	}
	if _, err := client.Put(ctx, prefix+"bad", "abc"); err != nil {
		t.Fatal(err)
	}
	if _, err := behind.Load(ctx, []string{"bad"}); !errors.Is(err, store.ErrBadRecord) {
		t.Fatalf("a 3-byte record read as %v, want store.ErrBadRecord", err)
	}
}

// TestEtcdLargeBatches: batches above one transaction's operations read at one revision
// and write every record.
func TestEtcdLargeBatches(t *testing.T) {
	ctx := context.Background()
	client := etcdClient(t, sharedEtcd(t).Addr())
	s := etcdstore.New(client, store.WithPrefix(fmt.Sprintf("large%d/", time.Now().UnixNano())))
	var ws []store.Write
	var ids []string
	for i := range 250 {
		ids = append(ids, fmt.Sprint("r", i))
		ws = append(ws, store.Write{ID: ids[i], Data: []byte(fmt.Sprint(i))})
	}
	vs, err := s.Swap(ctx, ws)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range vs {
		if v == 0 {
			t.Fatalf("write %d refused", i)
		}
	}
	snap, err := s.Load(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range snap.Records {
		if string(r.Data) != fmt.Sprint(i) || r.Version != vs[i] {
			t.Fatalf("record %d read %q version %d, want %d version %d", i, r.Data, r.Version, i, vs[i])
		}
	}
}
