package luamodel

import (
	"fmt"
	"math"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/luascript"
	"github.com/fleetlimit/fleetlimit/internal/wire"
	"github.com/fleetlimit/fleetlimit/lua"
)

// Scripts is what the model and the real scripts both answer, call for call: a Model, or
// the Lua of package lua on a Redis (Lua). now is the instant the command runs at.
type Scripts interface {
	// Bucket runs luascript.Bucket.
	Bucket(now time.Time, key string, capacity, rate, cost float64) wire.BucketReply
	// BucketCallerClock runs CallerClockSource.
	BucketCallerClock(now time.Time, key string, capacity, rate, cost, callerMillis float64) wire.BucketReply
	// Take runs luascript.Take.
	Take(now time.Time, key string, capacity, rate float64, want, minimum int, server string, seq, version uint64, floor int, seen wire.Seen) wire.TakeReply
	// Refund runs luascript.Refund.
	// A NaN ref is none: the script gets no ARGV[8].
	Refund(now time.Time, key string, capacity, rate float64, amount int, server string, seq, version uint64, floor int, ref float64) wire.RefundReply
	// Heartbeat runs luascript.Heartbeat.
	Heartbeat(now time.Time, key, server string, ttlMS int64) int
	// Low runs luascript.Low: mark ids, unmark unmark.
	Low(now time.Time, key string, memoryMS int64, ids, unmark []string) []string
	// LowRead is the command with which redisstore.Store.LowBatch reads a set that has
	// nothing to write, on key: the marks live after fromMS, in ms.
	LowRead(now time.Time, key string, fromMS int64) []string
}

var (
	_ Scripts = (*Model)(nil)
	_ Scripts = (*Lua)(nil)
)

// callerClockScript runs CallerClockSource.
var callerClockScript = redis.NewScript(CallerClockSource)

// lowReadSource is the command with which redisstore.Store.LowBatch reads a set that
// has nothing to write, as a script for Eval.
const lowReadSource = "return redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf', '(' .. ARGV[1], 'LIMIT', 0, ARGV[2])"

var lowReadScript = redis.NewScript(lowReadSource)

// Lua runs the real scripts of package lua on a Redis, with the Model's methods: it passes
// each script its arguments in the order the script reads them and decodes the reply with
// package wire. A caller can then put either behind Scripts: the simulator runs both, the
// differential tests compare them.
type Lua struct {
	// Eval runs one script on the Redis and returns its reply as go-redis's Cmd.Result
	// gives it (arrays as []any, integers as int64): Script.Run through a client, or
	// anything that answers the same.
	Eval func(s *redis.Script, keys []string, args ...any) (any, error)
	// Mini, when not nil, is the miniredis that Eval reaches: its clock (TIME and, with
	// ClockTTL, key TTLs) is set to each call's now. A real Redis runs on its own clock,
	// and now is ignored.
	Mini *miniredis.Miniredis
	// OnError is called with every error a call meets (a Redis error, or a reply that
	// does not decode); that call answers the zero value. Nil panics instead.
	OnError func(error)
}

// call sends script on key at now and decodes its reply with parse.
func call[T any](l *Lua, now time.Time, script *redis.Script, parse func(any) (T, error), key string, args ...any) T {
	if l.Mini != nil {
		l.Mini.SetTime(now)
	}
	var out T
	v, err := l.Eval(script, []string{key}, args...)
	if err == nil {
		out, err = parse(v)
	}
	if err != nil {
		err = fmt.Errorf("luamodel: script on %s: %w", key, err)
		if l.OnError == nil {
			panic(err)
		}
		l.OnError(err)
	}
	return out
}

// Bucket runs luascript.Bucket.
func (l *Lua) Bucket(now time.Time, key string, capacity, rate, cost float64) wire.BucketReply {
	return call(l, now, luascript.Bucket, wire.ParseBucket, key, capacity, rate, cost)
}

// BucketCallerClock runs CallerClockSource.
func (l *Lua) BucketCallerClock(now time.Time, key string, capacity, rate, cost, callerMillis float64) wire.BucketReply {
	return call(l, now, callerClockScript, wire.ParseBucket, key, capacity, rate, cost, callerMillis)
}

// Take runs luascript.Take.
func (l *Lua) Take(now time.Time, key string, capacity, rate float64, want, minimum int, server string, seq, version uint64, floor int, seen wire.Seen) wire.TakeReply {
	args := append([]any{capacity, rate, want, minimum, server, seq, version, floor}, seen.Args()...)
	return call(l, now, luascript.Take, wire.ParseTake, key, args...)
}

// Refund runs luascript.Refund.
func (l *Lua) Refund(now time.Time, key string, capacity, rate float64, amount int, server string, seq, version uint64, floor int, ref float64) wire.RefundReply {
	if math.IsNaN(ref) {
		return call(l, now, luascript.Refund, wire.ParseRefund, key, capacity, rate, amount, server, seq, version, floor)
	}
	return call(l, now, luascript.Refund, wire.ParseRefund, key, capacity, rate, amount, server, seq, version, floor, ref)
}

// Heartbeat runs luascript.Heartbeat.
func (l *Lua) Heartbeat(now time.Time, key, server string, ttlMS int64) int {
	return call(l, now, luascript.Heartbeat, wire.ParseHeartbeat, key, server, ttlMS)
}

// Low runs luascript.Low.
func (l *Lua) Low(now time.Time, key string, memoryMS int64, ids, unmark []string) []string {
	args := make([]any, 0, 3+len(ids)+len(unmark))
	args = append(args, memoryMS, len(ids), wire.MaxLowReply)
	for _, id := range ids {
		args = append(args, id)
	}
	for _, id := range unmark {
		args = append(args, id)
	}
	return call(l, now, luascript.Low, wire.ParseLow, key, args...)
}

// LowRead runs the command with which redisstore.Store.LowBatch reads a set that has
// nothing to write.
func (l *Lua) LowRead(now time.Time, key string, fromMS int64) []string {
	return call(l, now, lowReadScript, wire.ParseLow, key, fromMS, wire.MaxLowReply)
}

// Source returns the Lua text of a script that Lua runs (luascript.Bucket, luascript.Take,
// luascript.Refund, luascript.Heartbeat, or the caller-clock variant), for an Eval that loads scripts
// itself; ok is false for any other script.
func Source(s *redis.Script) (src string, ok bool) {
	switch s {
	case luascript.Bucket:
		return lua.BucketSource, true
	case luascript.Take:
		return luascript.TakeSource, true
	case luascript.Refund:
		return luascript.RefundSource, true
	case luascript.Heartbeat:
		return luascript.HeartbeatSource, true
	case luascript.Low:
		return luascript.LowSource, true
	case callerClockScript:
		return CallerClockSource, true
	case lowReadScript:
		return lowReadSource, true
	}
	return "", false
}
