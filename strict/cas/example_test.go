package cas_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/strict/cas"
)

// The strict mode's compare-and-set path on a store: here one in memory;
// etcdstore.New(client) or zkstore.New(conn) (packages store/etcd, store/zk), or
// strict.Dial with an etcd:// or zk:// URL, share the limit across processes and data
// centres.
func Example() {
	b := cas.New(store.NewMemory(nil))
	defer b.Close()
	l, err := sluice.New(sluice.MustParse("1/min burst=2"), sluice.WithBackend(b), sluice.WithMargin(0))
	if err != nil {
		panic(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for range 3 {
		fmt.Println(l.Allow(ctx, "api"))
	}
	// Output:
	// true
	// true
	// false
}
