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
// Its LRU bookkeeping is github.com/hashicorp/golang-lru/v2/simplelru, one
// per shard under the shard's mutex; docs/hot-path.md in the repository says
// why that and not another cache.
package local
