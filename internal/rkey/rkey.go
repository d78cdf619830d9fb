// Package rkey writes the Redis key names Sluice's Redis-backed modes use.
package rkey

import "strings"

// Tag returns key as a Redis Cluster hash tag, braces included: all of one key's Redis
// keys share a slot, and keys spread over slots. '\' and '}' in the key are escaped (as
// \\ and \]) and an empty key is written \0, so the tag is never empty nor cut short, and
// distinct keys never share a tag.
func Tag(key string) string { return Name("", key) }

// Name returns prefix followed by key's Tag, in one allocation when key needs no escape
// (the common case).
func Name(prefix, key string) string {
	if key != "" && !strings.ContainsAny(key, `\}`) {
		return prefix + "{" + key + "}"
	}
	return string(AppendName(make([]byte, 0, len(prefix)+2*len(key)+4), prefix, key))
}

// AppendName appends Name(prefix, key) to dst: a name written into a buffer of the
// caller's, with no string made for it.
func AppendName(dst []byte, prefix, key string) []byte {
	dst = append(dst, prefix...)
	if key == "" {
		return append(dst, `{\0}`...)
	}
	dst = append(dst, '{')
	if !strings.ContainsAny(key, `\}`) {
		dst = append(dst, key...)
		return append(dst, '}')
	}
	for i := 0; i < len(key); i++ {
		switch key[i] {
		case '\\':
			dst = append(dst, `\\`...)
		case '}':
			dst = append(dst, `\]`...)
		default:
			dst = append(dst, key[i])
		}
	}
	return append(dst, '}')
}
