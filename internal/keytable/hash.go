package keytable

// The keys' hash: the string hash Go's runtime falls back to where the CPU has no AES
// instructions (runtime/hash64.go, after wyhash: https://github.com/wangyi-fudan/wyhash),
// written with plain loads. The call through hash/maphash to the runtime's AES hash took a
// quarter of a lookup on short keys; this one is inlined into it. Each table draws its own
// keys, so that keys chosen from outside (a daemon's tags) cannot aim at one probe chain.

import (
	"math/bits"
	"math/rand/v2"
)

const m5 = 0x1d8e4e27c47d124f

// hasher holds a table's random hash keys.
type hasher struct{ k0, k1 uint64 }

func newHasher() hasher { return hasher{rand.Uint64(), rand.Uint64()} }

// hash returns the hash of s.
func (k hasher) hash(s string) uint64 {
	n := uint64(len(s))
	seed := k.k0
	var a, b uint64
	switch {
	case n == 0:
		return mix(m5, seed)
	case n < 4:
		a = uint64(s[0]) | uint64(s[n>>1])<<8 | uint64(s[n-1])<<16
	case n < 8:
		a, b = r4(s), r4(s[n-4:])
	case n <= 16:
		a, b = r8(s), r8(s[n-8:])
	default:
		p := s
		for len(p) > 16 {
			seed = mix(r8(p)^k.k1, r8(p[8:])^seed)
			p = p[16:]
		}
		a, b = r8(s[n-16:]), r8(s[n-8:])
	}
	return mix(m5^n, mix(a^k.k1, b^seed))
}

func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// r4 and r8 read 4 and 8 bytes little-endian (the compiler makes each one load).
func r4(s string) uint64 {
	_ = s[3]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24
}

func r8(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}
