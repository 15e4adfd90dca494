// Package wire is what fleetlimit puts on the wire to Redis and reads back: the Redis keys
// of buckets and fleets, and the decoding of the scripts' replies (package lua) into plain
// structs. The Redis tier (global) and the simulator both use it, so a key or a reply is
// read one way only.
//
// The key format is a compatibility promise: servers of two versions of the library share
// a bucket only if they build the same key bytes for it (global's TestWireFormat pins
// them). The decoders check the reply's shape and parse its numbers; their errors are
// plain and say what is wrong, for the caller to wrap and classify.
package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxKeyLen is the longest user key that BucketKey stores verbatim, in bytes.
const MaxKeyLen = 64

// digestLen is how many bytes of a long key's SHA-256 go into its bucket key.
const digestLen = 16

// BucketKey returns the Redis key of the bucket of limit name and user key, under prefix:
//
//	<prefix>{<name>:<key>}                       key of at most MaxKeyLen bytes without '{' or '}'
//	<prefix>{<name>#<sha256(key)[:16] in hex>}   any other key
//
// The braces are the Redis Cluster hash tag: it covers the whole bucket (limit and key),
// so the buckets of one limit spread over every master, while everything one bucket needs
// lives in one slot. A long key cannot make the Redis key long, and a key with a brace
// cannot move the tag. Provided name contains neither ':' nor '#' (global.Limit's names
// do not), the byte after the name tells the two forms apart, and no two (name, key)
// pairs share a Redis key.
func BucketKey(prefix, name, key string) string {
	return BucketKeyOfID(prefix, name, KeyID(key))
}

// KeyID returns how a server holds user key in memory: the key itself when BucketKey
// stores it verbatim, else '{' and the digest BucketKey puts in the Redis key (IDLen
// bytes). No verbatim key holds a '{', so two keys share an ID exactly when they share a
// Redis key; an ID is at most MaxKeyLen bytes whatever the key's length. A verbatim key
// is returned as it is (no copy, no allocation).
func KeyID(key string) string {
	if verbatim(key) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	var id [IDLen]byte
	id[0] = '{'
	hex.Encode(id[1:], sum[:digestLen])
	return string(id[:])
}

// IDLen is the length of the ID of a key that is not stored verbatim: '{' and a digest
// of 2 × 16 hex digits.
const IDLen = 1 + 2*digestLen

// verbatim reports whether BucketKey stores key as it is.
func verbatim(key string) bool {
	if len(key) > MaxKeyLen {
		return false
	}
	for i := 0; i < len(key); i++ { // a loop: strings.ContainsAny builds a set per call
		if c := key[i]; c == '{' || c == '}' {
			return false
		}
	}
	return true
}

// ValidID reports whether id is a KeyID of some key.
func ValidID(id string) bool {
	if verbatim(id) {
		return true
	}
	if len(id) != IDLen || id[0] != '{' {
		return false
	}
	for _, c := range []byte(id[1:]) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// BucketKeyOfID returns BucketKey(prefix, name, key) given KeyID(key), a valid ID.
func BucketKeyOfID(prefix, name, id string) string {
	sep, rest := byte(':'), id
	if !verbatim(id) {
		sep, rest = '#', id[1:]
	}
	var b strings.Builder
	b.Grow(len(prefix) + len(name) + len(rest) + 3)
	b.WriteString(prefix)
	b.WriteByte('{')
	b.WriteString(name)
	b.WriteByte(sep)
	b.WriteString(rest)
	b.WriteByte('}')
	return b.String()
}

// FleetKey returns the Redis key of the sorted set of one fleet's live servers
// (luascript.Heartbeat): <prefix>fleet:{<fleet>}.
func FleetKey(prefix, fleet string) string {
	return prefix + "fleet:{" + fleet + "}"
}

// RepsKey returns the Redis key of the fleet's record of representations: a sorted set
// of the limits' representations (how each server counts a limit's keys), each member
// live until its score (luascript.Low's script): <prefix>reps.
func RepsKey(prefix string) string { return prefix + "reps" }

// LowKey returns the Redis key of the sorted set of shard i of shards of one limit's low
// keys (luascript.Low): <prefix>low:{<ShardTag>}, with one shard <prefix>low:{<limit>}.
func LowKey(prefix, limit string, shards, i int) string {
	return prefix + "low:{" + ShardTag(limit, shards, i) + "}"
}

// MaxLowReply is the most key IDs a read of a set of low keys returns, the latest
// marks first (luascript.Low, redisstore.Store.LowBatch).
const MaxLowReply = 10_000

// MaxLowWrite is the most marks and unmarks one run of luascript.Low writes
// (redisstore.Store.LowBatch splits more into runs of it): each costs Redis about 3 µs,
// so a run keeps other clients waiting for at most about 1.5 ms.
const MaxLowWrite = 512

// LowRuns is how many runs of luascript.Low write keys marks and unmarks of one set:
// one for every MaxLowWrite of them, and one to read a set with none.
func LowRuns(keys int) int { return max(1, (keys+MaxLowWrite-1)/MaxLowWrite) }

// LowShards is how many sets a charge-later limit's low keys are marked in on a Redis
// Cluster, each under a tag of its own (ShardTag), a key in the set of LowShard: one set
// a master on 10 masters, so that the servers' exchanges with the sets spread over them
// instead of loading the one that holds the limit's slot. On one Redis, one set. Servers
// that mark a limit's keys in other sets than each other do not read each other's marks:
// each then learns a key low from its own answers alone, as a server whose exchange
// failed does, within the kind's bound.
const LowShards = 10

// LowShard is the set of key id among shards (at least 1) of a limit's low keys: its
// hash with salt 2+WindowRows, modulo shards.
func LowShard(id string, shards int) int {
	if shards <= 1 {
		return 0
	}
	return int(WindowHash(id, 2+WindowRows) % uint64(shards))
}

// BucketReply is luascript.Bucket's answer: {allowed (1 or 0), tostring(tokens)}.
type BucketReply struct {
	// Allowed reports whether the cost was spent.
	Allowed bool
	// Tokens is what the bucket holds after the decision.
	Tokens float64
}

// Seen is what a caller of luascript.Take last heard of a bucket: its level (the
// tokens a take left) and Redis's clock then (the take's answer's now, Unix ms). A take
// that finds the bucket gone although its caller saw it within capacity/rate + 500 ms on
// Redis's clock (less than any bucket's TTL) knows Redis lost it, and starts it empty
// (or at Level, if below zero) instead of full. Known false: the caller heard nothing.
type Seen struct {
	Known bool
	Level float64
	AtMS  int64
}

// Args returns luascript.Take's ARGV[9] and ARGV[10] for s: none when nothing is known.
func (s Seen) Args() []any {
	if !s.Known {
		return nil
	}
	return []any{s.Level, max(s.AtMS, 0)}
}

// TakeReply is luascript.Take's answer: {granted, tostring(tokens), wait ms, now ms, flag,
// version, tostring(credit)}.
type TakeReply struct {
	// Granted is the number of tokens taken: want, fewer (at least min), or 0.
	Granted int
	// Tokens is what the bucket holds after the take.
	Tokens float64
	// WaitMS is 0 when tokens were granted, else the milliseconds until min tokens are
	// there. A value past 2^63 comes back from Redis as garbage, possibly negative:
	// convert it with tokenbucket.FromMillis, which reads that as never.
	WaitMS int64
	// NowMS is Redis's clock (TIME) at the decision, in milliseconds since 1970.
	NowMS int64
	// Flag is luascript.Fresh, luascript.Replayed, luascript.Stale or luascript.First.
	Flag int
	// Version is the version of the bucket's parameters in force: the caller's, or a
	// higher one another server set.
	Version uint64
	// Credit is the refill the bucket has lost to its cap, cumulative (luascript.Refund
	// forgives debts against what it grows).
	Credit float64
}

// RefundReply is luascript.Refund's answer: {tostring(tokens), flag, version}.
type RefundReply struct {
	// Tokens is what the bucket holds after the refund.
	Tokens float64
	// Flag is luascript.Fresh, luascript.Replayed, luascript.Stale or RefundRefused.
	Flag int
	// Version is as TakeReply's.
	Version uint64
	// Refused is Redis's error for a key it refused (Flag RefundRefused).
	Refused string
}

// RefundRefused is the flag of a key luascript.Refund's call could not refund: Redis
// refused it (it is not a hash: WRONGTYPE; a write refused: OOM, READONLY), and the
// key's first value is Redis's error instead of its tokens. luascript.Refused.
const RefundRefused = 4

// ParseBucket decodes luascript.Bucket's reply, as go-redis or RESP gives it ([]any of int64
// and string).
func ParseBucket(reply any) (BucketReply, error) {
	v, err := array(reply, 2, "{integer, string}")
	if err != nil {
		return BucketReply{}, err
	}
	allowed, ok := v[0].(int64)
	tokens, err := number(v[1])
	if !ok || err != nil {
		return BucketReply{}, shape("{integer, string}", err)
	}
	return BucketReply{Allowed: allowed == 1, Tokens: tokens}, nil
}

// ParseTake decodes luascript.Take's reply.
func ParseTake(reply any) (TakeReply, error) {
	const want = "{integer, string, integer, integer, integer, integer, string}"
	v, err := array(reply, 7, want)
	if err != nil {
		return TakeReply{}, err
	}
	granted, ok1 := v[0].(int64)
	tokens, err := number(v[1])
	wait, ok2 := v[2].(int64)
	now, ok3 := v[3].(int64)
	flag, ok4 := v[4].(int64)
	version, ok5 := v[5].(int64)
	var credit float64
	if err == nil {
		credit, err = number(v[6])
	}
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || version < 0 || err != nil {
		return TakeReply{}, shape(want, err)
	}
	return TakeReply{Granted: int(granted), Tokens: tokens, WaitMS: wait, NowMS: now, Flag: int(flag), Version: uint64(version), Credit: credit}, nil
}

// ParseRefund decodes luascript.Refund's reply to a call of one key.
func ParseRefund(reply any) (RefundReply, error) {
	const want = "{string, integer, integer}"
	v, err := array(reply, 3, want)
	if err != nil {
		return RefundReply{}, err
	}
	return refundReply(v)
}

// ParseRefunds decodes luascript.Refund's reply to a call of len(out) keys into out, in
// the order of the call's keys.
func ParseRefunds(reply any, out []RefundReply) error {
	v, err := array(reply, 3*len(out), "3 values a key")
	if err != nil {
		return err
	}
	for i := range out {
		if out[i], err = refundReply(v[3*i : 3*i+3]); err != nil {
			return fmt.Errorf("key %d: %w", i+1, err)
		}
	}
	return nil
}

// refundReply decodes one key's three values of luascript.Refund's reply.
func refundReply(v []any) (RefundReply, error) {
	const want = "{string, integer, integer}"
	if flag, ok := v[1].(int64); ok && flag == RefundRefused {
		if msg, ok := v[0].(string); ok {
			return RefundReply{Flag: RefundRefused, Refused: msg}, nil
		}
		return RefundReply{}, shape(want, nil)
	}
	tokens, err := number(v[0])
	flag, ok1 := v[1].(int64)
	version, ok2 := v[2].(int64)
	if !ok1 || !ok2 || version < 0 || err != nil {
		return RefundReply{}, shape(want, err)
	}
	return RefundReply{Tokens: tokens, Flag: int(flag), Version: uint64(version)}, nil
}

// ParseHeartbeat decodes luascript.Heartbeat's reply: the number of live servers, at least 1
// (the caller is one).
func ParseHeartbeat(reply any) (int, error) {
	n, ok := reply.(int64)
	if !ok {
		return 0, fmt.Errorf("want an integer, got %T", reply)
	}
	if n < 1 {
		return 0, fmt.Errorf("%d live servers, want at least 1", n)
	}
	return int(n), nil
}

// ParseLow decodes luascript.Low's reply: the key IDs marked low.
func ParseLow(reply any) ([]string, error) {
	a, ok := reply.([]any)
	if !ok {
		return nil, fmt.Errorf("want an array, got %T", reply)
	}
	ids := make([]string, len(a))
	for i, v := range a {
		if ids[i], ok = v.(string); !ok {
			return nil, fmt.Errorf("element %d: want a string, got %T", i, v)
		}
	}
	return ids, nil
}

// array checks that reply is an array of n values.
func array(reply any, n int, want string) ([]any, error) {
	v, ok := reply.([]any)
	if !ok {
		return nil, fmt.Errorf("want %s, got %T", want, reply)
	}
	if len(v) != n {
		return nil, fmt.Errorf("want %d values, got %d", n, len(v))
	}
	return v, nil
}

// shape reports values of the wrong type, or a token count that is not a number.
func shape(want string, err error) error {
	if err != nil {
		return err
	}
	return errors.New("want " + want)
}

// number parses a number the scripts return as a string (tostring). Real Redis and
// miniredis format it differently (%.14g, Go's shortest form), so only the parsed value
// means anything.
func number(v any) (float64, error) {
	s, ok := v.(string)
	if !ok {
		return 0, fmt.Errorf("tokens: want a string, got %T", v)
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("tokens %.20q not a number", s)
	}
	return f, nil
}
