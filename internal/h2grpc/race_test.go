//go:build race

package h2grpc

// raceEnabled: under the race detector sync.Pool drops some of what it is given, so the
// allocation bounds allow for the pools' misses.
const raceEnabled = true
