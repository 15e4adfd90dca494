package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/storeerr"
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

// CheckEviction is global.Store.CheckEviction: CONFIG GET maxmemory* on the node, or on
// every master of a Cluster.
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
		return fmt.Errorf("%w: check eviction: the client cannot run CONFIG GET", storeerr.ErrInvalidConfig)
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
	return fmt.Errorf("%w%s: maxmemory %d with maxmemory-policy %s; an evicted bucket comes back empty, taking its "+
		"clients' tokens, and a charge-later limit may admit more than its limit: set maxmemory-policy noeviction, or give the limiter a Redis of its own "+
		"with maxmemory 0", ErrEvicting, at, bytes, policy)
}
