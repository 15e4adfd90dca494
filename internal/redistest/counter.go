package redistest

import (
	"context"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Counter is a go-redis hook counting what a client sends to Redis: round trips (a
// command, or a whole pipeline) and commands, what decisions cost: a Limiter's one-time
// setup (SCRIPT LOAD, PING) is not counted, nor is the handshake go-redis sends through
// the client's hooks on every connection it opens (HELLO, CLIENT SETINFO): how many
// connections a client opens follows its concurrency, not its decisions, and the
// simulator, with which tests compare these counts, has no connections. Add it with the client's AddHook; the zero
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

// setup reports whether cmd readies Redis or a connection rather than serves a
// decision: what a Limiter sends once, at start (redisstore.Store.Warm: SCRIPT LOAD,
// PING), and go-redis's handshake on a new connection (HELLO, AUTH, SELECT, CLIENT
// SETINFO, READONLY).
func setup(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "script", "ping", "hello", "auth", "select", "client", "readonly":
		return true
	}
	return false
}

// ProcessPipelineHook counts one round trip and the pipeline's commands, but for setup
// commands: a pipeline of nothing else (a connection's handshake) is no round trip.
func (c *Counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var n int64
		for _, cmd := range cmds {
			if !setup(cmd) {
				n++
				c.countKeys(cmd)
			}
		}
		if n > 0 {
			c.Trips.Add(1)
			c.Cmds.Add(n)
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
