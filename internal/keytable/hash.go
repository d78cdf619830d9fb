package keytable

// The keys' hash: folded multiplication (the two halves of a 128-bit product, xored),
// keyed by random secrets of each table's own, so that keys chosen from outside (a
// daemon's tags) cannot aim at one probe chain. It is the table's own rather than
// hash/maphash's for the keys of up to 16 bytes, the usual kind: two loads and two
// multiplications in one short call, where maphash.String goes three calls deep to the
// runtime's hash (BenchmarkHash: about half the time for a 13-byte key; the hash was 9% of
// the local mode's Allow on 10,000 keys with maphash, 3% with this one).

import (
	"math/bits"
	"math/rand/v2"
)

// hasher holds a table's secrets.
type hasher struct{ k0, k1, k2 uint64 }

func newHasher() hasher {
	// math/rand/v2's generator is seeded from the operating system's randomness.
	return hasher{rand.Uint64(), rand.Uint64(), rand.Uint64() | 1}
}

// mix folds the product of a and b: every bit of either moves every bit of the result.
func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// hash returns the hash of s. Keys of up to 16 bytes are read as two words (overlapping
// below 16, up to 4 bytes read as one), each keyed, multiplied together, and the product
// with the length folded again by a third secret.
func (k hasher) hash(s string) uint64 {
	n := len(s)
	var a, b uint64
	switch {
	case n > 16:
		return k.long(s)
	case n >= 8:
		a, b = r8(s), r8(s[n-8:])
	case n >= 4:
		a, b = uint64(r4(s)), uint64(r4(s[n-4:]))
	case n > 0:
		a = uint64(s[0]) | uint64(s[n>>1])<<8 | uint64(s[n-1])<<16
	}
	return mix(mix(a^k.k0, b^k.k1)^uint64(n), k.k2)
}

// long is hash for keys of more than 16 bytes: each 16 bytes are folded into the running
// hash as a short key's two words are, the last 16 (overlapping the others) as well.
func (k hasher) long(key string) uint64 {
	n := len(key)
	h := k.k2
	for s := key; len(s) > 16; s = s[16:] {
		h = mix(r8(s)^k.k0, r8(s[8:])^k.k1^h)
	}
	last := key[n-16:]
	return mix(mix(r8(last)^k.k0, r8(last[8:])^k.k1^h)^uint64(n), k.k2)
}

// r8 reads the first 8 bytes of s, little-endian (one load, once the compiler merges them).
func r8(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// r4 reads the first 4 bytes of s, little-endian.
func r4(s string) uint32 {
	_ = s[3]
	return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24
}
