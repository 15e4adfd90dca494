package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/storeerr"
)

// reloadOnFailure is the hook New adds to a *redis.ClusterClient: a call that fails
// with an unavailable error (a refused dial, a reset or timeout, CLUSTERDOWN) asks the
// client to reload its slot map in the background.
//
// go-redis reloads the map on MOVED and READONLY replies and otherwise every
// ClusterStateReloadInterval (60 s by default). When a master dies, nothing answers
// MOVED: its replica takes the slots over, but the client keeps dialling the dead
// address until the interval passes, so a limiter would stay on its failure policy for
// up to a minute after the failover. The reload is coalesced by go-redis (one at a
// time, then 200 ms apart), so a burst of failures costs a few CLUSTER SLOTS calls, and
// a healthy cluster none.
type reloadOnFailure struct{ c *redis.ClusterClient }

func (h reloadOnFailure) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h reloadOnFailure) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if storeerr.IsUnavailable(err) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}

func (h reloadOnFailure) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if storeerr.IsUnavailable(cmd.Err()) {
				h.c.ReloadState(ctx)
				break
			}
		}
		return err
	}
}
