package redistest

import (
	"context"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Counter is a go-redis hook counting what a client sends to Redis: round trips (a
// command, or a whole pipeline) and commands, what decisions cost: a Limiter's one-time
// setup (SCRIPT LOAD, PING) is not counted. Add it with the client's AddHook; the zero
// Counter is ready to use.
type Counter struct {
	Trips, Cmds atomic.Int64
	// ScriptKeys counts the keys the script calls sent name (EVAL and EVALSHA's numkeys):
	// one script call may act on many keys (luascript.Refund).
	ScriptKeys atomic.Int64
}

// DialHook is go-redis's: dials are not counted.
func (c *Counter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook counts one round trip and one command, but for a setup command.
func (c *Counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !setup(cmd) {
			c.Trips.Add(1)
			c.Cmds.Add(1)
			c.countKeys(cmd)
		}
		return next(ctx, cmd)
	}
}

// setup reports whether cmd is one a Limiter sends once, at start, to ready Redis and
// the client (redisstore.Store.Warm: SCRIPT LOAD, PING), not for a decision: a Counter
// measures what decisions cost.
func setup(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "script", "ping":
		return true
	}
	return false
}

// ProcessPipelineHook counts one round trip and the pipeline's commands.
func (c *Counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.Trips.Add(1)
		c.Cmds.Add(int64(len(cmds)))
		for _, cmd := range cmds {
			c.countKeys(cmd)
		}
		return next(ctx, cmds)
	}
}

// countKeys adds the keys of cmd to ScriptKeys if it calls a script.
func (c *Counter) countKeys(cmd redis.Cmder) {
	switch cmd.Name() {
	case "eval", "evalsha":
		if args := cmd.Args(); len(args) > 2 {
			if n, ok := args[2].(int); ok {
				c.ScriptKeys.Add(int64(n))
			}
		}
	}
}
