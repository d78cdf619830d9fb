// Package strict is the redis mode, the strict mode of Sluice: every decision is made in Redis, atomically
// per key, by one Lua script with the arithmetic of package gcra and Redis' own clock
// (TIME), so a pool of processes on many machines obeys one limit exactly, whatever their
// clocks say.
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
// What it does:
//
//   - One script (sluice.lua, embedded) decides, settles and penalizes. It runs with
//     EVALSHA, and with EVAL when Redis answers NOSCRIPT (after a restart or SCRIPT FLUSH).
//     Times are exact integer nanoseconds held as (seconds, nanoseconds) pairs, since Lua's
//     doubles cannot hold Unix nanoseconds; a differential test runs random sequences
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
// over-admission of each fail mode.
package strict
