package global

import "github.com/fleetlimit/fleetlimit/internal/wire"

// DefaultPrefix starts every key the Store writes, unless the Prefix option changes it.
const DefaultPrefix = "fl:"

// MaxKeyLen is the longest user key stored verbatim, in bytes. Longer keys, and keys
// containing '{' or '}', are replaced by a SHA-256 digest (32 hex digits), so a bucket
// key stays short whatever the caller passes and cannot break its hash tag.
const MaxKeyLen = wire.MaxKeyLen

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
	return wire.BucketKey(s.prefix, name, key)
}
