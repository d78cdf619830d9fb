// Package lease is Sluice's lease mode (seeds 001 and 002): members of a limit decide in
// process, at memory speed, on a share of the limit they lease from a store, and touch
// the store only a few times a second each, whatever their request rate.
//
// The package has two pure cores and thin shells around them:
//
//   - State is the allocation of one limit: a small serializable record that a store keeps
//     and changes only through State.Apply (join, renew, release, penalize), so that any
//     store runs the same decision atomically. It never oversubscribes: at every instant
//     the shares counted against the limit sum to at most its rate and at most its burst.
//     A newcomer gets capacity only from what is free; others' shares shrink at their next
//     renewal; a share that shrinks frees nothing until its member has said it switched
//     (or its old lease has ended); an expired member's share stays quarantined for a
//     grace time; a share that grows starts drained, except for the burst the free
//     capacity saved up; a store that restarted empty fences the whole limit until every
//     lease granted before has ended. Policies: Fair (max-min fair shares of reported
//     demand, the default) and Equal (limit / N, with the members agreeing on N).
//   - Member is one member's side of one limit: the lease it holds, the GCRA state at its
//     share (package gcra), its demand, and when it must renew. It stops using a lease at
//     (the time it sent the request that obtained it + TTL - a margin, + Grace in fail
//     mode local) on its own clock.
//
// Store is the interface a store implements (MemStore keeps the records in memory),
// and Backend is the shell a process uses: a backend.Backend for sluice.WithBackend, with
// one renewal goroutine owned by Close. The simulator (package sim) drives the same cores
// over a simulated network.
//
// docs/lease.md explains the model, the invariants and why they hold.
package lease
