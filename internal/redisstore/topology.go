package redisstore

import (
	"context"
	"runtime"
	"sync"
	"weak"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/storeerr"
)

// hooked holds the Cluster clients hookOnce has hooked, weakly: a client dropped leaves
// it once the collector has freed it (runtime.AddCleanup).
var hooked sync.Map // weak.Pointer[redis.ClusterClient] → struct{}

// hookOnce adds reloadOnFailure to cc unless a Store made on cc before has, and reports
// whether it did. go-redis keeps a client's hooks for its life and runs every one on
// every command: a program that makes a Store per prefix or tenant, or again on each
// configuration reload, on one client would stack a hook per Store, each command
// passing through all of them and each failure reloading the map once per hook.
func hookOnce(cc *redis.ClusterClient) bool {
	k := weak.Make(cc)
	if _, loaded := hooked.LoadOrStore(k, struct{}{}); loaded {
		return false
	}
	runtime.AddCleanup(cc, func(k weak.Pointer[redis.ClusterClient]) { hooked.Delete(k) }, k)
	cc.AddHook(reloadOnFailure{cc})
	return true
}

// reloadOnFailure is the hook New adds to a *redis.ClusterClient (once, hookOnce): a call that fails
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
