package redisstore

import (
	"fmt"

	"github.com/fleetlimit/fleetlimit/internal/storeerr"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// DefaultPrefix starts every key the Store writes, unless the Prefix option changes it.
const DefaultPrefix = "fl:"

// MaxKeyLen is the longest user key stored verbatim, in bytes. Longer keys, and keys
// containing '{' or '}', are replaced by a SHA-256 digest (32 hex digits), so a bucket
// key stays short whatever the caller passes and cannot break its hash tag.
const MaxKeyLen = wire.MaxKeyLen

// Key is global.Store.Key: the Redis key of the bucket of limit name and user key.
func (s *Store) Key(name, key string) string {
	return wire.BucketKey(s.prefix, name, key)
}

// KeyID is a user key in the form a server keeps it in memory: the key itself when Key
// stores it verbatim, else '{' and the digest Key puts in the Redis key (33 bytes). An ID
// is at most MaxKeyLen bytes whatever the key's length, and two keys share an ID exactly
// when they share a bucket. TakeRequest.ID and RefundRequest.ID name a bucket by it; hybrid.Limiter holds every key it keeps (its lease, the refill in flight, a queued
// refund) as its ID.
type KeyID string

// IDOf returns key's KeyID. A key stored verbatim comes back as it is, without a copy.
func IDOf(key string) KeyID { return KeyID(wire.KeyID(key)) }

// bucket returns the Redis key of the bucket of limit name and id, or an error wrapping
// ErrInvalidLimit when id is not a KeyID.
func (s *Store) bucket(name string, id KeyID) (string, error) {
	if !wire.ValidID(string(id)) {
		return "", fmt.Errorf("%w: key ID %q is not one IDOf returns", storeerr.ErrInvalidLimit, id)
	}
	return wire.BucketKeyOfID(s.prefix, name, string(id)), nil
}

// requestBucket is bucket for a request that names its key by id, if set, or by key.
func (s *Store) requestBucket(name, key string, id KeyID) (string, error) {
	if id == "" {
		return wire.BucketKey(s.prefix, name, key), nil
	}
	return s.bucket(name, id)
}
