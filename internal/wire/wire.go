// Package wire holds what the daemon's line protocol and its client must agree on.
package wire

import "unicode/utf8"

// ValidTag reports whether t is a usable tag: not empty, UTF-8, no control characters
// (so no line break can split one query into two). It allocates nothing.
func ValidTag[T string | []byte](t T) bool {
	if len(t) == 0 {
		return false
	}
	for i, r := range string(t) {
		if r < 0x20 || r == 0x7f {
			return false
		}
		// An invalid byte decodes as RuneError too, but not from its own 3-byte encoding.
		if r == utf8.RuneError && !(i+2 < len(t) && t[i] == 0xEF && t[i+1] == 0xBF && t[i+2] == 0xBD) {
			return false
		}
	}
	return true
}
