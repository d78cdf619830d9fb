package strict

import (
	"context"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/store"
	redisstore "github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/strict/cas"
)

// Dial opens the strict mode on the store url names and checks that it answers. The
// strict mode decides every permit in the store, on the store's clock, with one of two
// implementations that the URL chooses:
//
//   - redis://, rediss:// and redis-sentinel:// (one Redis, or the master a Sentinel set
//     names): the decision script, one Lua call per batch on Redis' clock; it returns a
//     *Backend. Every Option applies.
//   - etcd://, zk:// and any other scheme store.Open knows (memory:// included): the
//     compare-and-set path of package strict/cas, on the record of each key read with the
//     store's time (a cas.Backend that closes the store's client). WithPrefix and
//     WithTimeout apply; the time-out bounds a round of the store (default
//     cas.DefaultTimeout). The options of the Redis path alone (WithPipelines,
//     WithProbeEvery, WithFailLocal, WithReplicaAcks) are refused.
//
// etcd:// and zk:// need their store's package linked (import _
// "github.com/sluicehq/sluice/store/etcd", or store/all for every store). The backend owns
// its client: Close closes it. docs/strict.md and docs/consensus.md state each path's
// guarantee.
func Dial(ctx context.Context, url string, opts ...Option) (backend.Backend, error) {
	if isRedisURL(url) {
		return dialRedis(ctx, url, opts...)
	}
	b, err := openCAS(ctx, url, opts)
	if err != nil {
		return nil, err
	}
	if err := b.Ping(ctx); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// Open is Dial without the first check: the backend starts even while its store is down,
// and answers by its fail mode until the store returns (the daemon's choice: it serves,
// and reports not ready). It fails only on a bad URL or options the URL's path refuses.
func Open(url string, opts ...Option) (backend.Backend, error) {
	if isRedisURL(url) {
		return openRedis(url, opts...)
	}
	b, err := openCAS(context.Background(), url, opts)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// isRedisURL reports whether url names a Redis that the decision script serves (redis://,
// rediss://, redis-sentinel://): the strict mode's Redis path. A Redis Cluster
// (redis-cluster://) is reached through a client the caller makes (New).
func isRedisURL(url string) bool {
	scheme, _, _ := strings.Cut(url, "://")
	return scheme == "redis" || scheme == "rediss" || scheme == redisstore.SentinelScheme
}

// DefaultStorePrefix is the prefix of the records of the compare-and-set path in a store
// that Dial opens, unless WithPrefix sets another (for ZooKeeper, its colons made
// slashes: /sluice/strict).
const DefaultStorePrefix = "sluice:strict:"

// openCAS opens the store url names and the compare-and-set backend on it.
func openCAS(ctx context.Context, url string, opts []Option) (*closingCAS, error) {
	probe := &Backend{}
	for _, o := range opts {
		o.apply(probe)
	}
	switch {
	case probe.pipelines != 0 || probe.maxBatch != 0:
		return nil, fmt.Errorf("sluice strict: WithPipelines applies to Redis only, not to %s", url)
	case probe.probeEvery != 0:
		return nil, fmt.Errorf("sluice strict: WithProbeEvery applies to Redis only, not to %s", url)
	case probe.share != 0:
		return nil, fmt.Errorf("sluice strict: WithFailLocal applies to Redis only, not to %s (the compare-and-set path fails closed or open)", url)
	case probe.acks != 0:
		return nil, fmt.Errorf("sluice strict: WithReplicaAcks applies to Redis only, not to %s", url)
	}
	prefix := probe.prefix
	if prefix == "" {
		prefix = DefaultStorePrefix
	}
	timeout := probe.timeout // 0 unless WithTimeout set it
	if timeout == 0 {
		timeout = cas.DefaultTimeout
	}
	h, err := store.Open(ctx, url, store.WithPrefix(prefix), store.WithTimeout(timeout))
	if err != nil {
		return nil, err
	}
	return &closingCAS{cas.New(h, cas.WithTimeout(timeout)), h}, nil
}

// closingCAS closes the store's client after the backend on it.
type closingCAS struct {
	*cas.Backend
	h store.Handle
}

func (c *closingCAS) Close() error {
	err := c.Backend.Close()
	c.h.Close()
	return err
}
