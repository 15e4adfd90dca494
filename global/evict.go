package global

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"
)

// ErrEvicting is wrapped by CheckEviction's error when Redis may evict the buckets.
var ErrEvicting = errors.New("global: Redis may evict rate-limit buckets")

// configGetter is the part of a go-redis client CheckEviction needs.
type configGetter interface {
	ConfigGet(ctx context.Context, parameter string) *redis.MapStringStringCmd
}

// masterWalker is implemented by *redis.ClusterClient: each master has its own memory.
type masterWalker interface {
	ForEachMaster(ctx context.Context, fn func(ctx context.Context, client *redis.Client) error) error
}

// CheckEviction asks Redis (CONFIG GET; every master of a Cluster) whether it may evict
// keys: a maxmemory limit with any policy but noeviction. The buckets carry TTLs, so the
// volatile-* policies evict them as readily as allkeys-*; an evicted bucket comes back
// full, silently, and every failure policy then admits more than its limit. It returns
// nil when nothing can be evicted, an error wrapping ErrEvicting that names the fix when
// buckets can be, and another error (classified as the Store's are) when Redis does not
// answer or refuses CONFIG, as managed services often do: then the operator must check.
//
// The fix: maxmemory-policy noeviction (a write over the limit then fails with OOM,
// which the breaker counts and the limit's failure policy handles, in the open), or a
// Redis for the limiter alone with maxmemory 0, sized by docs/operations.md.
func (s *Store) CheckEviction(ctx context.Context) error {
	if w, ok := s.c.(masterWalker); ok {
		var mu sync.Mutex
		var errs []error
		err := w.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			if err := checkEviction(ctx, c, c.Options().Addr); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
			return nil
		})
		return errors.Join(append(errs, wrap("check eviction", err))...)
	}
	c, ok := s.c.(configGetter)
	if !ok {
		return fmt.Errorf("%w: check eviction: the client cannot run CONFIG GET", ErrInvalidConfig)
	}
	return checkEviction(ctx, c, "")
}

// checkEviction checks one server; node names it in the error, if not "".
func checkEviction(ctx context.Context, c configGetter, node string) error {
	at := ""
	if node != "" {
		at = " on " + node
	}
	cfg, err := c.ConfigGet(ctx, "maxmemory*").Result()
	if err != nil {
		return wrap("check eviction"+at, err)
	}
	policy, okPolicy := cfg["maxmemory-policy"]
	limit, okLimit := cfg["maxmemory"]
	if !okPolicy || !okLimit {
		return unexpected("check eviction"+at, "CONFIG GET maxmemory* without maxmemory and maxmemory-policy")
	}
	bytes, err := strconv.ParseInt(limit, 10, 64)
	if err != nil {
		return unexpected("check eviction"+at, "maxmemory "+strconv.Quote(limit))
	}
	if bytes == 0 || policy == "noeviction" {
		return nil
	}
	return fmt.Errorf("%w%s: maxmemory %d with maxmemory-policy %s; an evicted bucket comes back full and "+
		"the fleet admits more than its limit: set maxmemory-policy noeviction, or give the limiter a Redis of its own "+
		"with maxmemory 0", ErrEvicting, at, bytes, policy)
}
