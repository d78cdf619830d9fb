// Package gcra is the pure core of Sluice: the Generic Cell Rate Algorithm over integer
// nanoseconds, with weights, bursts, several limits per key, bounded reservations,
// cancellation, settlement and penalties.
//
// Nothing in this package reads a clock, starts a goroutine or touches a socket. Every
// function takes the current time as an argument and returns a decision and the new state,
// so the same arithmetic serves the in-process limiter, the Redis script (which mirrors it
// and is tested against it), the simulator and the tests, where it is exact.
//
// # The model
//
// A limit is an emission interval T (the time one permit takes to be earned back) and a
// tolerance Tau = Burst*T. A key's state is its theoretical arrival time (TAT) per limit. A
// request for n permits at time now is conforming once
//
//	now >= max(TAT, now) + n*T - Tau
//
// which grants, for every window of length w, at most Burst + floor(w/T) permits: the
// conformance that the rest of Sluice promises and that the referee checks.
package gcra
