//go:build race

package strict

// raceEnabled: the race detector slows allocation and garbage collection by up to
// seconds on 2 cores, so latency bounds allow for it.
const raceEnabled = true
