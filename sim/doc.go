// Package sim is Sluice's deterministic simulator: it runs a day of a throttled fleet in
// seconds, so that a mode and its settings can be chosen before production, and so that
// each mode's guarantees are proved in virtual time.
//
// A Scenario (a YAML file, see docs/simulator.md) names the limit, the members and their
// demand, the network and the store, and events at times (joins, leaves, crashes, pauses,
// store outages, partitions, limit changes). Run plays it as a discrete-event simulation
// under each mode, driving the real cores with virtual time (the GCRA core of package gcra,
// the lease allocation and member of lease/allot, the gossip core of gossip/hits and
// the adaptive mode's Controller), and has a referee (package referee) judge every request
// where the API would see it, after its network delay. The same scenario and seed give the same report, to the byte.
package sim
