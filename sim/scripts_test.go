package sim

import (
	"context"
	"maps"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// TestLuaScriptsMatchModel: the simulator's two ways into a Redis, straight into
// miniredis's dispatcher (directEval, what runs get) and through go-redis (clientEval),
// give the same answers as the Go model, call for call, and leave the same hashes; an
// empty script cache (SCRIPT FLUSH) costs neither an answer. The model itself is held to
// the Lua by luamodel's differential tests; this test holds the simulator's plumbing to
// the model.
func TestLuaScriptsMatchModel(t *testing.T) {
	const a, b, fleet = "fl:{t:a}", "fl:{t:b}", "fl:fleet:{t}"
	tests := []struct {
		at    time.Duration
		flush bool // SCRIPT FLUSH before the call
		call  func(s scripts, now time.Time) any
	}{
		{0, false, func(s scripts, now time.Time) any { return s.Bucket(now, a, 100, 10, 1) }},
		{50 * time.Millisecond, false, func(s scripts, now time.Time) any { return s.Bucket(now, a, 100, 10, 100) }},
		{51 * time.Millisecond, false, func(s scripts, now time.Time) any {
			return s.BucketCallerClock(now, b, 10, 3, 4, 1772366400000+2051)
		}},
		{60 * time.Millisecond, false, func(s scripts, now time.Time) any { return s.Take(now, a, 100, 10, 40, 1, "s1", 7, 0, 0, wire.Seen{}) }},
		{60 * time.Millisecond, false, func(s scripts, now time.Time) any { return s.Take(now, a, 100, 10, 40, 1, "s1", 7, 0, 0, wire.Seen{}) }}, // replay
		{61 * time.Millisecond, true, func(s scripts, now time.Time) any { return s.Take(now, a, 100, 10, 80, 80, "s2", 1, 0, 0, wire.Seen{}) }},
		{62 * time.Millisecond, false, func(s scripts, now time.Time) any { return s.Take(now, a, 100, 10, 5, 5, "s1", 6, 0, 0, wire.Seen{}) }}, // stale
		{70 * time.Millisecond, true, func(s scripts, now time.Time) any { return s.Refund(now, a, 100, 10, 30, "s1", 8, 0, 100, math.NaN()) }},
		{70 * time.Millisecond, false, func(s scripts, now time.Time) any { return s.Refund(now, a, 100, 10, 30, "s1", 8, 0, 100, math.NaN()) }}, // replay
		{80 * time.Millisecond, true, func(s scripts, now time.Time) any { return s.Heartbeat(now, fleet, "s1", 1000) }},
		{90 * time.Millisecond, false, func(s scripts, now time.Time) any { return s.Heartbeat(now, fleet, "s2", 100) }},
		{500 * time.Millisecond, false, func(s scripts, now time.Time) any { return s.Heartbeat(now, fleet, "s1", 1000) }},            // s2 gone
		{time.Hour, false, func(s scripts, now time.Time) any { return s.Take(now, a, 100, 10, 100, 1, "s1", 9, 0, 0, wire.Seen{}) }}, // expired: full
	}
	ctx := context.Background()
	mrD, cD := redistest.Mini(t)
	mrC, cC := redistest.Mini(t)
	mrD.ClockTTL(true)
	mrC.ClockTTL(true)
	d, err := newDirectEval(mrD)
	if err != nil {
		t.Fatal(err)
	}
	direct := &luaScripts{ev: d, mini: mrD}
	client := &luaScripts{ev: clientEval{ctx: ctx, c: cC}, mini: mrC}
	clients := map[string]*redis.Client{"direct": cD, "client": cC}
	model := newModel()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for i, tt := range tests {
		now := t0.Add(tt.at)
		for _, c := range clients {
			if !tt.flush {
				break
			}
			if err := c.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		want := tt.call(model, now)
		for name, s := range map[string]*luaScripts{"direct": direct, "client": client} {
			if got := tt.call(s, now); got != want || s.err != nil {
				t.Fatalf("step %d, %s: %+v (%v), model %+v", i, name, got, s.err, want)
			}
		}
		for _, k := range []string{a, b} {
			want := model.Fields(now, k)
			for name, c := range clients {
				got, err := c.HGetAll(ctx, k).Result()
				if err != nil || (len(got) > 0 || want != nil) && !maps.Equal(got, want) {
					t.Fatalf("step %d, %s: %s holds %v (%v), model %v", i, name, k, got, err, want)
				}
			}
		}
	}
}
