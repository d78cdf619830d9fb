// Package rkey writes the Redis key names Sluice's Redis-backed modes use.
package rkey

import "strings"

// Tag returns key as a Redis Cluster hash tag, braces included: all of one key's Redis
// keys share a slot, and keys spread over slots. '\' and '}' in the key are escaped (as
// \\ and \]) and an empty key is written \0, so the tag is never empty nor cut short, and
// distinct keys never share a tag.
func Tag(key string) string { return Name("", key) }

// Name returns prefix followed by key's Tag, in one allocation when key needs no escape
// (the common case: a name is made for every call of the Redis mode).
func Name(prefix, key string) string {
	if key == "" {
		return prefix + `{\0}`
	}
	if !strings.ContainsAny(key, `\}`) {
		return prefix + "{" + key + "}"
	}
	var sb strings.Builder
	sb.Grow(len(prefix) + len(key) + 4)
	sb.WriteString(prefix)
	sb.WriteByte('{')
	for i := 0; i < len(key); i++ {
		switch key[i] {
		case '\\':
			sb.WriteString(`\\`)
		case '}':
			sb.WriteString(`\]`)
		default:
			sb.WriteByte(key[i])
		}
	}
	sb.WriteByte('}')
	return sb.String()
}
