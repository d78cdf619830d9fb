// Package lease is Sluice's lease mode: members of a limit decide in process, at memory
// speed, on a share of the limit they lease from a store, and touch the store only a few
// times a second each, whatever their request rate.
//
// A Backend (New) is one process's member of every limit it decides: a backend.Backend
// for sluice.WithBackend, with one renewal goroutine owned by Close, which renews every
// lease it holds in one store round trip and hands every share back on Close. The
// allocation (who gets which share, never more than the limit in rate or in burst, a
// crashed member's share quarantined before anyone else gets it) runs in Go in every
// member; a store.Store only keeps the records, read with the store's time and written back by
// compare-and-set: store.Memory in process, the stores of packages store/redis (one
// Redis, Sentinel or Cluster), store/etcd and store/zk, or any store that keeps the
// store.Store contract. Dial opens a member on a store's URL (store.Open's: memory://,
// redis://, etcd://, zk://, ...); New takes a store.Store the program made.
//
// docs/lease.md explains the model, the invariants and why they hold, each store's
// guarantees and costs, and how to choose the settings.
package lease
