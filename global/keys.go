package global

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// DefaultPrefix starts every key the Store writes, unless the Prefix option changes it.
const DefaultPrefix = "fl:"

// MaxKeyLen is the longest user key stored verbatim, in bytes. Longer keys, and keys
// containing '{' or '}', are replaced by a SHA-256 digest (32 hex digits), so a bucket
// key stays short whatever the caller passes and cannot break its hash tag.
const MaxKeyLen = 64

// Key returns the Redis key of the bucket for limit name (a valid Limit.Name) and user
// key, for inspecting a bucket with redis-cli:
//
//	<prefix>{<name>:<key>}            key of at most MaxKeyLen bytes without '{' or '}'
//	<prefix>{<name>#<sha256(key)[:16] in hex>}   any other key
//
// The braces are the Redis Cluster hash tag: it covers the whole bucket (limit and key),
// so the buckets of one limit spread over every master, while everything one bucket
// needs lives in one slot. Names contain neither ':' nor '#', so the byte after the name
// tells the two forms apart and no two (name, key) pairs share a key.
func (s *Store) Key(name, key string) string {
	return bucketKey(s.prefix, name, key)
}

func bucketKey(prefix, name, key string) string {
	if len(key) <= MaxKeyLen && !strings.ContainsAny(key, "{}") {
		return prefix + "{" + name + ":" + key + "}"
	}
	sum := sha256.Sum256([]byte(key))
	var b [MaxKeyLen + MaxNameLen + 40]byte
	out := append(b[:0], prefix...)
	out = append(out, '{')
	out = append(out, name...)
	out = append(out, '#')
	out = hex.AppendEncode(out, sum[:16])
	out = append(out, '}')
	return string(out)
}

// fleetKey is the sorted set of one fleet's live servers.
func fleetKey(prefix, fleet string) string {
	return prefix + "fleet:{" + fleet + "}"
}
