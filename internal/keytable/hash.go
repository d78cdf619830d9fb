package keytable

// The keys' hash: hash/maphash, keyed by a seed of each table's own, so that keys chosen
// from outside (a daemon's tags) cannot aim at one probe chain.

import "hash/maphash"

// hasher holds a table's hash seed.
type hasher struct{ seed maphash.Seed }

func newHasher() hasher { return hasher{maphash.MakeSeed()} }

// hash returns the hash of s.
func (k hasher) hash(s string) uint64 { return maphash.String(k.seed, s) }
