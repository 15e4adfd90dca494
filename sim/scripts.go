package sim

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/lua"
)

// callerClockSource is lua.Bucket as it would read if it trusted the caller's clock, the
// mistake the source article warns about: now comes from ARGV[4] (the calling server's
// milliseconds) instead of Redis TIME, and ts = now as in the article. It is derived from
// lua.BucketSource so that nothing else differs; the clock-skew scenario runs it beside the
// real script.
var callerClockSource = mustCallerClock(lua.BucketSource)

var callerClock = redis.NewScript(callerClockSource)

func mustCallerClock(src string) string {
	edits := []struct{ old, new string }{
		{"local t   = redis.call('TIME')", "local t   = nil"},
		{"local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)", "local now = tonumber(ARGV[4])"},
		{"math.max(ts, now))", "now)"},
	}
	for _, e := range edits {
		if strings.Count(src, e.old) != 1 {
			panic(fmt.Sprintf("sim: lua.BucketSource changed; cannot derive the caller-clock variant (%q)", e.old))
		}
		src = strings.Replace(src, e.old, e.new, 1)
	}
	return src
}

// scripts is the interface the simulator's Redis runs bucket scripts through: the real Lua
// on a Redis ([luaScripts], miniredis with its clock set to the virtual instant) or the Go
// model ([model]). now is the virtual instant the command executes at.
type scripts interface {
	Bucket(now time.Time, key string, capacity, rate, cost float64) (allowed int, tokens float64)
	BucketCallerClock(now time.Time, key string, capacity, rate, cost, callerMillis float64) (allowed int, tokens float64)
	Take(now time.Time, key string, capacity, rate float64, want, minimum int, server string, seq uint64) takeReply
	Refund(now time.Time, key string, capacity, rate float64, amount int, server string, seq uint64) (float64, int)
}

var (
	_ scripts = (*model)(nil)
	_ scripts = (*luaScripts)(nil)
)

// evaler runs a script on some Redis: through go-redis (a real Redis, or miniredis over a
// connection) or straight into an embedded miniredis's command dispatcher.
type evaler interface {
	eval(s *redis.Script, keys []string, args ...any) ([]any, error)
}

// clientEval runs scripts through go-redis (Script.Run: EVALSHA, then EVAL on NOSCRIPT).
type clientEval struct {
	ctx context.Context
	c   redis.Scripter
}

func (e clientEval) eval(s *redis.Script, keys []string, args ...any) ([]any, error) {
	return s.Run(e.ctx, e.c, keys, args...).Slice()
}

// luaScripts runs package lua's scripts on a Redis. With mini set, the server's clock
// (TIME and key TTLs) is set to now before each call; a real Redis runs on its own clock
// and now is ignored.
type luaScripts struct {
	ev   evaler
	mini *miniredis.Miniredis
	err  error // first error seen; the simulator reports it and fails the run
}

func (r *luaScripts) setTime(now time.Time) {
	if r.mini != nil {
		r.mini.SetTime(now)
	}
}

func (r *luaScripts) fail(err error) {
	if r.err == nil && err != nil {
		r.err = err
	}
}

func (r *luaScripts) Bucket(now time.Time, key string, capacity, rate, cost float64) (int, float64) {
	r.setTime(now)
	a, t, err := parseBucket(r.ev.eval(lua.Bucket, []string{key}, capacity, rate, cost))
	r.fail(err)
	return a, t
}

func (r *luaScripts) BucketCallerClock(now time.Time, key string, capacity, rate, cost, callerMillis float64) (int, float64) {
	r.setTime(now)
	a, t, err := parseBucket(r.ev.eval(callerClock, []string{key}, capacity, rate, cost, callerMillis))
	r.fail(err)
	return a, t
}

func (r *luaScripts) Take(now time.Time, key string, capacity, rate float64, want, minimum int, server string, seq uint64) takeReply {
	r.setTime(now)
	tr, err := parseTake(r.ev.eval(lua.Take, []string{key}, capacity, rate, want, minimum, server, seq))
	r.fail(err)
	return tr
}

func (r *luaScripts) Refund(now time.Time, key string, capacity, rate float64, amount int, server string, seq uint64) (float64, int) {
	r.setTime(now)
	t, f, err := parseRefund(r.ev.eval(lua.Refund, []string{key}, capacity, rate, amount, server, seq))
	r.fail(err)
	return t, f
}

func parseBucket(v []any, err error) (int, float64, error) {
	if err != nil {
		return 0, 0, fmt.Errorf("sim: bucket script: %w", err)
	}
	if len(v) != 2 {
		return 0, 0, fmt.Errorf("sim: bucket script returned %d values, want 2", len(v))
	}
	a, ok := v[0].(int64)
	t, err := parseFloat(v[1])
	if !ok || err != nil {
		return 0, 0, fmt.Errorf("sim: bucket script returned %v", v)
	}
	return int(a), t, nil
}

func parseTake(v []any, err error) (takeReply, error) {
	if err != nil {
		return takeReply{}, fmt.Errorf("sim: take script: %w", err)
	}
	if len(v) != 5 {
		return takeReply{}, fmt.Errorf("sim: take script returned %d values, want 5", len(v))
	}
	g, ok1 := v[0].(int64)
	t, err := parseFloat(v[1])
	w, ok2 := v[2].(int64)
	n, ok3 := v[3].(int64)
	f, ok4 := v[4].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 || err != nil {
		return takeReply{}, fmt.Errorf("sim: take script returned %v", v)
	}
	return takeReply{Granted: int(g), Tokens: t, WaitMS: w, NowMS: n, Flag: int(f)}, nil
}

func parseRefund(v []any, err error) (float64, int, error) {
	if err != nil {
		return 0, 0, fmt.Errorf("sim: refund script: %w", err)
	}
	if len(v) != 2 {
		return 0, 0, fmt.Errorf("sim: refund script returned %d values, want 2", len(v))
	}
	t, err := parseFloat(v[0])
	f, ok := v[1].(int64)
	if !ok || err != nil {
		return 0, 0, fmt.Errorf("sim: refund script returned %v", v)
	}
	return t, int(f), nil
}

func parseFloat(v any) (float64, error) {
	s, ok := v.(string)
	if !ok {
		return 0, fmt.Errorf("sim: %T %v is not a string", v, v)
	}
	return strconv.ParseFloat(s, 64)
}
