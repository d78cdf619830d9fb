// Package strict is Sluice's strict mode: every permit is decided in a store, on the
// store's clock, so a pool of processes on many machines obeys one limit exactly, whatever
// their clocks say. Dial and Open take the store's URL, which chooses one of two paths:
//
//   - Redis (redis://, rediss://, redis-sentinel://): one Lua script with the arithmetic
//     of package gcra and Redis' own clock (TIME) decides every call, atomically per key.
//     This is the package's Backend; New makes one from a go-redis client.
//   - etcd (etcd://), ZooKeeper (zk://) and memory://: the compare-and-set path of package
//     strict/cas, on each key's state read with the store's time. etcd:// and zk:// need
//     their store's package linked: import _ "github.com/sluicehq/sluice/store/etcd" (or
//     store/zk, or store/all for every store).
//
// The backend plugs into a sluice.Limiter:
//
//	b, err := strict.Dial(ctx, "redis://127.0.0.1:6379")
//	...
//	defer b.Close()
//	l, err := sluice.New(sluice.MustParse("100/s burst=20"), sluice.WithBackend(b))
//
// or takes a go-redis client the program already has (single, Sentinel or Cluster):
// strict.New(client, opts...).
//
// What the Redis path does:
//
//   - One script (sluice.lua, embedded) decides, settles and penalizes. It runs with
//     EVALSHA, and with EVAL when Redis answers NOSCRIPT (after a restart or SCRIPT FLUSH).
//     Times are exact integer nanoseconds held as (seconds, nanoseconds) pairs, since Lua's
//     doubles cannot hold Unix nanoseconds. A differential test runs random sequences
//     through the script and the Go core (2,500 by default, 20,000 under make fuzz) and
//     demands identical decisions.
//   - A key's state is one Redis string at PREFIX + "v1:{KEY}", versioned and hash-tagged
//     for Redis Cluster, with a TTL that ends when the key is idle, but not before a
//     second after its last write.
//   - Concurrent calls from one process are coalesced into batches: one script call
//     decides a batch's calls on every key (one Redis) or on one key (Redis Cluster and
//     other sharding clients), reading and writing each key once, each key's calls in
//     arrival order.
//   - Every call returns within the time-out (WithTimeout, 100ms by default), even while
//     Redis is down. A failure opens a breaker: calls are then answered at once with
//     backend.ErrUnavailable (the limiter's fail mode, closed or open, decides) or, with
//     WithFailLocal, by a local GCRA at a share of the limit whose grants are charged back
//     to Redis when it returns. One prober goroutine watches for Redis' return.
//
// docs/strict.md describes the design, the clock, failover and the worst-case
// over-admission of each fail mode on Redis; docs/consensus.md the compare-and-set path
// and each store's guarantee.
package strict
