// Package local is the in-process tier of fleetlimit: per-key token buckets
// (golang.org/x/time/rate) with bounded memory, and the bounded keyed Store
// they live in.
//
// A Limiter holds one bucket per key. It is used twice by the hybrid
// limiter: as the pre-check that denies a request without asking Redis,
// and as the conservative fallback when Redis is unavailable, sized by
// FallbackLimit. Time is a parameter (AllowN(now, key, n)), so the
// simulator drives the same code in virtual time, and a clock that steps
// back never creates tokens.
//
// A Store is the bounded map underneath: a hard cap on keys with least
// recently used eviction, idle expiry checked on access with the caller's
// instant, an eviction callback run outside the locks, and no goroutines.
// The hybrid tier keeps its per-key lease state in one, and returns leased
// tokens when a key is evicted.
//
// # Why simplelru
//
// The LRU bookkeeping is github.com/hashicorp/golang-lru/v2/simplelru, one
// per shard, each under its own mutex. It was compared with
// github.com/maypok86/otter/v2 (v2.4.0) and golang-lru's expirable LRU:
//
//   - Time. simplelru reads no clock; this package passes the request's
//     instant. otter takes one Clock per cache (NowNano), not an instant
//     per call, so many servers of a simulator sharing a process, or a
//     per-key clock that must not run backwards, do not fit; expirable reads
//     time.Now.
//   - Goroutines. simplelru starts none. otter runs deletion callbacks and
//     maintenance on an Executor (goroutines by default) and a periodic
//     clean-up goroutine when expiry is on; a same-goroutine Executor runs
//     callbacks under its locks. expirable starts a goroutine Close cannot
//     stop.
//   - Callbacks outside locks. With simplelru the Store evicts explicitly
//     under its shard lock and calls OnEvict after unlocking.
//   - Cap and order. simplelru is an exact LRU with an exact cap. otter is
//     W-TinyLFU, whose admission policy may refuse a new key, and its size
//     bound is enforced by asynchronous maintenance.
//   - Cost. A hit is a map lookup and a list move: no allocation. A new key
//     costs the list element, the Store's entry and a copy of the key.
//     otter's reads are lock-free and scale better on many cores, but the
//     Store must hold a lock across the whole per-key decision anyway (the
//     rate.Limiter call and the per-key clock), which otter's Compute could
//     do only under its hash-bucket lock, with the same restrictions.
//
// simplelru is not safe for concurrent use by itself; sharding by a hash of
// the key (hash/maphash) gives parallel goroutines separate locks.
package local
