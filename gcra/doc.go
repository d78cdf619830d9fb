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
//
// # Fixed windows
//
// A Limit with Window > 0 is instead a quota of Burst permits in each fixed window of
// Window nanoseconds. The windows fall on whole multiples of Window in Unix time, so a
// daily quota resets at 00:00 UTC. Origin places them for a caller whose now is not Unix
// time. Its T is floor(Window/Burst), and the key's state is still one int64: a window
// ending at E with u permits counted in it is E + u*T. So a key with permits counted in
// its window has a state beyond now, and Idle holds as for GCRA. Decide takes weights,
// and reserves into the first later window with room, usable from its start. Adjust
// counts a charge in the window up to its count, and refunds while the grant's window
// lasts. Penalize, when every limit of the key is a window, counts the window of the
// penalty's end full. Level, AtLevel and Debt are for GCRA limits only.
package gcra
