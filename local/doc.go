// Package local is the in-process tier of fleetlimit: per-key token buckets
// (golang.org/x/time/rate) with bounded memory.
//
// A Limiter holds one bucket per key, in a bounded map: a hard cap on keys
// with least recently used eviction per shard, idle expiry checked on access
// with the caller's instant, and no goroutines. The hybrid limiter uses one
// as the conservative fallback when Redis is unavailable (FailLocal), sized
// to this server's share of the fleet-wide limit: rate/servers per key, with
// a burst of max(⌈burst/servers⌉, largest cost). Time is a parameter
// (AllowN(now, key, n)), so the
// simulator drives the same code in virtual time, and a clock that steps
// back never creates tokens.
package local
