package cli

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/store"
	_ "github.com/sluicehq/sluice/store/all"
)

// storeTimeout bounds each command a store's client sends.
const storeTimeout = 500 * time.Millisecond

// openStore opens the store a URL names (store.Open: memory://, redis://, rediss://,
// redis-cluster://, redis-sentinel://, etcd://, zk://), its records under prefix. For ""
// and memory:// it returns a nil store: the caller makes a store.Memory on its own clock.
// The returned func closes the client.
func openStore(raw, prefix string) (store.Store, func(), error) {
	if raw == "" || raw == "memory://" {
		return nil, func() {}, nil
	}
	h, err := store.Open(context.Background(), raw, store.WithPrefix(prefix), store.WithTimeout(storeTimeout))
	if err != nil {
		return nil, nil, usagef("store: %v", err)
	}
	return h, func() { h.Close() }, nil
}
