package cas

import (
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/testkit/slowlink"
	"github.com/sluicehq/sluice/store"
	etcdstore "github.com/sluicehq/sluice/store/etcd"
)

// TestAcrossDataCentres: four members share 50/s burst=5 on a real etcd for three
// seconds, two beside it and two in a far data centre (through a proxy that delays every
// packet by 20 ms each way: a 40 ms round trip). Judged exactly on the store's time, no
// grant breaks the limit. The far members' shares are logged: a member whose read is
// 40 ms old when its write arrives loses the compare-and-set to near members more often.
func TestAcrossDataCentres(t *testing.T) {
	if testing.Short() {
		t.Skip("real time: not in -short")
	}
	l := gcra.Limit{T: int64(20 * time.Millisecond), Tau: int64(100 * time.Millisecond)}
	srv := sharedEtcd(t)
	link, err := slowlink.Start(srv.Addr(), 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	far := link.Addr()
	path := unique("/wan")
	var members []*Backend
	for i := range 4 {
		addr := srv.Addr()
		if i >= 2 {
			addr = far
		}
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		m := New(etcdstore.New(c, store.WithPrefix(path+"/")), WithTimeout(2*time.Second))
		defer m.Close()
		members = append(members, m)
	}
	var mu sync.Mutex
	var at []int64
	per := make([]int, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := runMembers(t.Log, []*Backend{m}, l, 3*time.Second)
			mu.Lock()
			at = append(at, got...)
			per[i] = len(got)
			mu.Unlock()
		}()
	}
	wg.Wait()
	for i, m := range members {
		s := m.Stats()
		t.Logf("member %d (far: %v): %d grants, %d conflicts in %d writes", i, i >= 2, per[i], s.Conflicts, s.Writes)
	}
	judgeGrants(t, at, l)
}
