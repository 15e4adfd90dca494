package sim

import (
	"context"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/luamodel"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// scripts is the interface the simulator's Redis runs scripts through: the real Lua on a
// Redis ([luaScripts], miniredis with its clock set to the virtual instant) or the Go model
// of them (luamodel.Model), which luamodel's differential tests hold to the Lua. now is
// the virtual instant the command executes at.
type scripts = luamodel.Scripts

// takeReply is luascript.Take's answer.
type takeReply = wire.TakeReply

var _ scripts = (*luaScripts)(nil)

// newModel returns an empty Go model of the scripts.
func newModel() *luamodel.Model { return luamodel.New() }

// evaler runs a script on some Redis: through go-redis (a real Redis, or miniredis over a
// connection) or straight into an embedded miniredis's command dispatcher. It returns the
// reply as go-redis's Cmd.Result does: arrays as []any, integers as int64, strings.
type evaler interface {
	eval(s *redis.Script, keys []string, args ...any) (any, error)
}

// clientEval runs scripts through go-redis (Script.Run: EVALSHA, then EVAL on NOSCRIPT).
type clientEval struct {
	ctx context.Context
	c   redis.Scripter
}

func (e clientEval) eval(s *redis.Script, keys []string, args ...any) (any, error) {
	return s.Run(e.ctx, e.c, keys, args...).Result()
}

// luaScripts runs package lua's scripts on a Redis through ev (luamodel.Lua does the
// calling and decoding). With mini set, the server's clock (TIME and key TTLs) is set to
// now before each call; a real Redis runs on its own clock and now is ignored.
type luaScripts struct {
	ev   evaler
	mini *miniredis.Miniredis
	err  error // first error seen; the simulator reports it and fails the run
}

func (r *luaScripts) lua() *luamodel.Lua {
	return &luamodel.Lua{Eval: r.ev.eval, Mini: r.mini, OnError: r.fail}
}

func (r *luaScripts) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

func (r *luaScripts) Bucket(now time.Time, key string, capacity, rate, cost float64) wire.BucketReply {
	return r.lua().Bucket(now, key, capacity, rate, cost)
}

func (r *luaScripts) BucketCallerClock(now time.Time, key string, capacity, rate, cost, callerMillis float64) wire.BucketReply {
	return r.lua().BucketCallerClock(now, key, capacity, rate, cost, callerMillis)
}

func (r *luaScripts) Take(now time.Time, key string, capacity, rate float64, want, minimum int, server string, seq, version uint64, floor int, seen wire.Seen) takeReply {
	return r.lua().Take(now, key, capacity, rate, want, minimum, server, seq, version, floor, seen)
}

func (r *luaScripts) Refund(now time.Time, key string, capacity, rate float64, amount int, server string, seq, version uint64, floor int, ref float64) wire.RefundReply {
	return r.lua().Refund(now, key, capacity, rate, amount, server, seq, version, floor, ref)
}

func (r *luaScripts) Heartbeat(now time.Time, key, server string, ttlMS int64) int {
	return r.lua().Heartbeat(now, key, server, ttlMS)
}

func (r *luaScripts) Low(now time.Time, key string, memoryMS int64, ids, unmark []string) []string {
	return r.lua().Low(now, key, memoryMS, ids, unmark)
}

func (r *luaScripts) LowRead(now time.Time, key string, fromMS int64) []string {
	return r.lua().LowRead(now, key, fromMS)
}
