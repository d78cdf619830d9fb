// Package redis is the Redis store of package store: each record a Redis string
// ("VERSION DATA") read with Redis' clock by one Lua script and written by
// compare-and-set by another, two round trips a batch whatever its records (New). It works
// with one Redis, a Sentinel set's master and a Redis Cluster.
//
// It also turns a redis://, rediss:// or redis-sentinel:// URL into a go-redis client set
// as Sluice wants it (ClientOptions, FailoverOptions, NewClient: no retries, time-outs,
// raw I/O on plain connections), which the strict mode's Redis path uses too. Importing
// it registers the schemes redis, rediss, redis-cluster and redis-sentinel with
// store.Open.
package redis
