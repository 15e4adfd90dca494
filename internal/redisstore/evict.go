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

// nodeWalker runs fn on each node that holds keys of a client of several: every master
// of a Cluster (ForEachMaster), every shard of a Ring (ForEachShard). Each has its own
// memory and its own script cache.
type nodeWalker func(ctx context.Context, fn func(ctx context.Context, client *redis.Client) error) error

// nodesOf returns c's nodeWalker, or nil for a client of one node.
func nodesOf(c redis.Scripter) nodeWalker {
	switch c := c.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster
	case *redis.Ring:
		return c.ForEachShard
	}
	return nil
}

// onEachNode runs fn on every node walk visits, all of them whatever fails, and returns
// their errors joined, with walk's own wrapped under op.
func onEachNode(ctx context.Context, walk nodeWalker, op string, fn func(ctx context.Context, c *redis.Client) error) error {
	var mu sync.Mutex
	var errs []error
	err := walk(ctx, func(ctx context.Context, c *redis.Client) error {
		if err := fn(ctx, c); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
		return nil
	})
	return errors.Join(append(errs, wrap(op, err))...)
}

// CheckEviction is global.Store.CheckEviction: CONFIG GET maxmemory* on the node, or on
// every master of a Cluster and every shard of a Ring.
func (s *Store) CheckEviction(ctx context.Context) error {
	if walk := nodesOf(s.c); walk != nil {
		return onEachNode(ctx, walk, "check eviction", func(ctx context.Context, c *redis.Client) error {
			return checkEviction(ctx, c, c.Options().Addr)
		})
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
