package lease

import (
	"fmt"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/sluicehq/sluice/store"
	zkstore "github.com/sluicehq/sluice/store/zk"
)

// zkRemote is a real ZooKeeper for the differential test. A wipe deletes the store's
// znodes, its clock with them (what an ensemble rebuilt from nothing shows the store); a
// record cannot be put back with its old zxid, so no failover is played.
type zkRemote struct {
	t    *testing.T
	conn *zk.Conn
	root string
}

func (r *zkRemote) open(seed uint64, now func() int64) store.Store {
	r.root = fmt.Sprintf("/diff/%d", seed)
	r.wipe()
	return zkstore.New(r.conn, store.WithPrefix(r.root), store.WithNow(now))
}

func (r *zkRemote) wipe() { zkDeleteTree(r.t, r.conn, r.root) }

func (r *zkRemote) save(string)        {}
func (r *zkRemote) rewind(string) bool { return false }

// TestDifferentialZKAndMemStore: the differential test (TestDifferentialRedisAndMemStore)
// against a real ZooKeeper, on the test's virtual clock (fewer sequences: a write is a disk
// write).
func TestDifferentialZKAndMemStore(t *testing.T) {
	runDifferential(t, &zkRemote{t: t, conn: zkClient(t, sharedZK(t).Addr())}, 20)
}
