// Package allot holds the lease mode's two pure cores, which package lease runs in every
// member's process and package sim drives over a simulated network:
//
//   - State is the allocation of one limit: a small record (MarshalState: a compact binary
//     form) that a store keeps and that changes only through State.Apply (join, renew,
//     release, penalize). It never oversubscribes: at every instant the shares counted
//     against the limit sum to at most its rate and at most its burst. A newcomer gets
//     capacity only from what is free; others' shares shrink at their next renewal; a share
//     that shrinks frees nothing until its member has said it switched (or its old lease
//     has ended); an expired member's share stays quarantined for a grace time; a share
//     that grows starts drained, except for the burst the free capacity saved up; a record
//     that may have lost leases still in use is fenced until they have all ended. Policies:
//     Fair (max-min fair shares of reported demand, the default) and Equal (limit / N, with
//     the members agreeing on N).
//   - Member is one member's side of one limit: its registration (an explicit phase), the
//     lease it holds, the GCRA state at its share (package gcra), its demand, and when it
//     must talk to the store. It stops using a lease at (the time it sent the request that
//     obtained it + TTL - a margin, + Grace in fail mode local) on its own clock.
//
// Both take now and return decisions and messages; neither does I/O, starts a goroutine or
// reads a clock. docs/lease.md explains the model, the invariants and why they hold.
package allot
