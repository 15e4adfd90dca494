package luascript_test

import (
	"context"
	"fmt"
	"maps"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/luascript"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// t0 is the miniredis clock the time-driven tests start from.
var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func run(t *testing.T, c redis.Scripter, s *redis.Script, key string, args ...any) []any {
	t.Helper()
	v, err := s.Run(context.Background(), c, []string{key}, args...).Slice()
	if err != nil {
		t.Fatalf("run %s: %v", key, err)
	}
	return v
}

func num(t *testing.T, v any) float64 {
	t.Helper()
	switch x := v.(type) {
	case int64:
		return float64(x)
	case string:
		f, err := strconv.ParseFloat(x, 64)
		if err != nil {
			t.Fatalf("parse %q: %v", x, err)
		}
		return f
	}
	t.Fatalf("unexpected reply element %T %v", v, v)
	return 0
}

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

// redisNowMS reads the server's clock (TIME) in milliseconds.
func redisNowMS(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}

func hget(t *testing.T, c *redis.Client, key, field string) float64 {
	t.Helper()
	s, err := c.HGet(context.Background(), key, field).Result()
	if err != nil {
		t.Fatalf("HGET %s %s: %v", key, field, err)
	}
	return num(t, s)
}

// TestBucketSeedExample is the article's example: a first call with capacity 100,
// rate 10, cost 1 answers {1, "99"} and sets a TTL of ceil(100/10*1000)+1000 ms.
func TestBucketSeedExample(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		key := redistest.Unique(t)
		got := run(t, tg.Client, luascript.Bucket, key, 100, 10, 1)
		if len(got) != 2 || got[0] != int64(1) || got[1] != "99" {
			t.Fatalf("first call = %#v, want {1, \"99\"}", got)
		}
		pttl, err := tg.Client.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		// miniredis does not age TTLs on its own; a real Redis may have ticked a little.
		if pttl > 11000*time.Millisecond || pttl < 10000*time.Millisecond {
			t.Fatalf("PTTL = %v, want 11s (ceil(100/10*1000)+1000 ms)", pttl)
		}
		if !tg.Real() && pttl != 11000*time.Millisecond {
			t.Fatalf("PTTL = %v, want exactly 11s on miniredis", pttl)
		}
		if tok := hget(t, tg.Client, key, "tokens"); tok != 99 {
			t.Fatalf("stored tokens = %v, want 99", tok)
		}
	})
}

// TestTTLRule checks the shared PEXPIRE rule on all bucket scripts, with a rate that
// makes the ceil matter: ceil(7/3*1000)+1000 = 3334 ms.
func TestTTLRule(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		cases := []struct {
			name string
			s    *redis.Script
			args []any
		}{
			{"bucket", luascript.Bucket, []any{7, 3, 1}},
			{"take", luascript.Take, []any{7, 3, 2, 1, "s1", 1, 0}},
			{"refund (a debt: a refund to no bucket writes nothing)", luascript.Refund, []any{7, 3, -1, "s1", 1, 0}},
		}
		for _, tc := range cases {
			pttl := pttlAfter(t, tg.Client, tc.s, redistest.Unique(t)+tc.name, tc.args...)
			if pttl > 3334*time.Millisecond || pttl < 2500*time.Millisecond || (!tg.Real() && pttl != 3334*time.Millisecond) {
				t.Errorf("%s: PTTL = %v, want 3334ms", tc.name, pttl)
			}
		}
	})
}

// pttlAfter runs s on key with args and returns the key's PTTL then.
func pttlAfter(t *testing.T, c redis.Cmdable, s *redis.Script, key string, args ...any) time.Duration {
	t.Helper()
	run(t, c, s, key, args...)
	pttl, err := c.PTTL(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return pttl
}

// TestTTLBelowZero: a bucket a lease's take or a debt left below zero keeps its deficit
// until it is full again, whichever script writes it next: AllowN's script (bucket)
// too, or the bucket would expire part empty and come back full. Capacity 7, rate 3,
// 14 tokens below zero: ceil(21/3*1000)+1000 = 8000 ms, where a full bucket's is 3334.
func TestTTLBelowZero(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		for _, tc := range []struct {
			name string
			s    *redis.Script
			args []any
		}{
			{"bucket", luascript.Bucket, []any{7, 3, 1}},
			{"take", luascript.Take, []any{7, 3, 2, 1, "s1", 1, 0}},
		} {
			key := redistest.Unique(t) + tc.name
			now, err := tg.Client.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			if err := tg.Client.HSet(ctx, key, "tokens", -14, "ts", now.UnixMilli()).Err(); err != nil {
				t.Fatal(err)
			}
			if pttl := pttlAfter(t, tg.Client, tc.s, key, tc.args...); pttl > 8000*time.Millisecond || pttl < 7500*time.Millisecond {
				t.Errorf("%s: PTTL = %v, want about 8000ms", tc.name, pttl)
			}
		}
	})
}

// TestReplayExact: a replayed take (the same server and seq) answers the grant it
// recorded to the token, across the documented range of bursts (up to 2^53, at a rate
// that keeps the TTL in range), where
// Lua's own number-to-text keeps 14 digits.
func TestReplayExact(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		for _, want := range []int64{123456789012345, 1<<53 - 1} {
			key := redistest.Unique(t) + strconv.FormatInt(want, 10)
			args := []any{int64(1) << 53, 1e6, want, 1, "s1", 7, 0}
			fresh := run(t, tg.Client, luascript.Take, key, args...)
			replay := run(t, tg.Client, luascript.Take, key, args...)
			if fresh[0] != want || replay[0] != fresh[0] || replay[4] != int64(1) {
				t.Errorf("want %d: fresh %v, replay %v; want the grant %d twice, the second a replay (flag 1)", want, fresh, replay, want)
			}
		}
	})
}

// TestClockNeverBackwards moves miniredis's clock back, then forward: the stored ts must
// stay at its high-water mark, so the same period is not refilled twice.
func TestClockNeverBackwards(t *testing.T) {
	m, c := redistest.Mini(t)
	key := "clock"
	m.SetTime(t0)
	if got := run(t, c, luascript.Bucket, key, 100, 1, 1); num(t, got[1]) != 99 {
		t.Fatalf("t0: %v", got)
	}
	m.SetTime(t0.Add(-5 * time.Second)) // the clock steps back (failover to a lagging replica)
	if got := run(t, c, luascript.Bucket, key, 100, 1, 1); num(t, got[1]) != 98 {
		t.Fatalf("t0-5s: %v, want 98 (no refill, no negative refill)", got)
	}
	if ts := hget(t, c, key, "ts"); ts != float64(t0.UnixMilli()) {
		t.Fatalf("ts = %v, want %v (never moves backwards)", ts, t0.UnixMilli())
	}
	m.SetTime(t0.Add(time.Second))
	// 1 s since the high-water mark: 98 + 1 - 1 = 98. With ts moved back to t0-5s the
	// script would refill 6 s and answer 99 (capped at 100, minus 1).
	if got := run(t, c, luascript.Bucket, key, 100, 1, 1); num(t, got[1]) != 98 {
		t.Fatalf("t0+1s: %v, want 98", got)
	}
	// Take and refund follow the same rule.
	m.SetTime(t0.Add(-time.Minute))
	if got := run(t, c, luascript.Take, key, 100, 1, 5, 1, "s", 1, 0); got[0] != int64(5) || num(t, got[1]) != 93 {
		t.Fatalf("take with clock back: %v, want 5 granted, 93 left", got)
	}
	if got := run(t, c, luascript.Refund, key, 100, 1, 2, "s", 2, 0); num(t, got[0]) != 95 {
		t.Fatalf("refund with clock back: %v, want 95", got)
	}
	if ts := hget(t, c, key, "ts"); ts != float64(t0.Add(time.Second).UnixMilli()) {
		t.Fatalf("ts = %v, want the high-water mark %v", ts, t0.Add(time.Second).UnixMilli())
	}
}

// TestFutureTimestampReal is the same rule on a real Redis, whose clock cannot be moved:
// a bucket whose stored ts lies in the future (written by a master whose clock ran ahead)
// gets no refill and keeps that ts.
func TestFutureTimestampReal(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		for _, tc := range []struct {
			name string
			s    *redis.Script
			args []any
			left float64
		}{
			{"bucket", luascript.Bucket, []any{100, 10, 1}, 49},
			{"take", luascript.Take, []any{100, 10, 3, 1, "s", 1, 0}, 47},
			{"refund", luascript.Refund, []any{100, 10, 3, "s", 1, 0}, 53},
		} {
			key := redistest.Unique(t) + tc.name
			future := redisNowMS(t, tg.Client) + 60_000
			if err := tg.Client.HSet(ctx, key, "tokens", 50, "ts", future).Err(); err != nil {
				t.Fatal(err)
			}
			got := run(t, tg.Client, tc.s, key, tc.args...)
			left := got[1]
			if tc.name == "refund" {
				left = got[0]
			}
			if num(t, left) != tc.left {
				t.Errorf("%s: answer %v, want %v tokens left (no refill)", tc.name, got, tc.left)
			}
			if ts := hget(t, tg.Client, key, "ts"); ts != float64(future) {
				t.Errorf("%s: ts = %v, want %v kept", tc.name, ts, future)
			}
		}
	})
}

// TestFractionalRefill compares parsed numbers: Redis formats 96.9 as "96.9", miniredis
// as "96.89999999999999".
func TestFractionalRefill(t *testing.T) {
	t.Run("miniredis-clock", func(t *testing.T) {
		m, c := redistest.Mini(t)
		want := []float64{99, 98.3, 97.6, 96.9, 96.2}
		for i, w := range want {
			m.SetTime(t0.Add(time.Duration(i) * 100 * time.Millisecond))
			got := run(t, c, luascript.Bucket, "frac", 100, 3, 1)
			if got[0] != int64(1) || !near(num(t, got[1]), w, 1e-9) {
				t.Fatalf("step %d: %v, want {1, %v}", i, got, w)
			}
		}
		// 0.37 tokens/s for 1.234 s = 0.45658 tokens.
		m.SetTime(t0)
		run(t, c, luascript.Bucket, "frac2", 10, 0.37, 10)
		m.SetTime(t0.Add(1234 * time.Millisecond))
		got := run(t, c, luascript.Bucket, "frac2", 10, 0.37, 1)
		if got[0] != int64(0) || !near(num(t, got[1]), 0.37*1.234, 1e-12) {
			t.Fatalf("rate 0.37: %v, want {0, 0.45658}", got)
		}
	})
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		// Inject a bucket last touched 1234 ms ago by the server's own clock.
		ctx := context.Background()
		key := redistest.Unique(t)
		before := redisNowMS(t, tg.Client)
		if err := tg.Client.HSet(ctx, key, "tokens", "10.5", "ts", before-1234).Err(); err != nil {
			t.Fatal(err)
		}
		got := run(t, tg.Client, luascript.Bucket, key, 100, 0.37, 1)
		after := redisNowMS(t, tg.Client)
		lo := 10.5 + 1.234*0.37 - 1
		hi := 10.5 + float64(after-before+1234)/1000*0.37 - 1
		if v := num(t, got[1]); got[0] != int64(1) || v < lo-1e-9 || v > hi+1e-9 {
			t.Fatalf("got %v, want {1, in [%v, %v]}", got, lo, hi)
		}
	})
}

// TestTake runs the take rules with a refill so slow that it cannot change a result
// within the test, on both servers.
func TestTake(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		if tg.Mini != nil {
			tg.Mini.SetTime(t0)
		}
		const rate = 1e-6
		key := redistest.Unique(t)
		steps := []struct {
			want, min int
			granted   int64
			left      float64
			waitMS    float64 // 0 when granted
		}{
			{4, 1, 4, 6, 0},                          // full bucket of 10: all 4
			{8, 2, 6, 0, 0},                          // partial: 6 >= min 2
			{3, 1, 0, 0, math.Ceil(1 / rate * 1000)}, // nothing: wait for min
			{3, 3, 0, 0, math.Ceil(3 / rate * 1000)},
		}
		for i, s := range steps {
			got := run(t, tg.Client, luascript.Take, key, 10, rate, s.want, s.min, "srv", i+1, 0)
			if len(got) != 7 {
				t.Fatalf("step %d: %v, want 7 elements", i, got)
			}
			flag := int64(luascript.Fresh)
			if i == 0 {
				flag = luascript.First // the bucket held no record of srv
			}
			if got[0] != s.granted || !near(num(t, got[1]), s.left, 1e-3) ||
				!near(num(t, got[2]), s.waitMS, s.waitMS*1e-3) || got[4] != flag {
				t.Fatalf("step %d: take(want %d, min %d) = %v, want granted %d, left %v, wait %vms",
					i, s.want, s.min, got, s.granted, s.left, s.waitMS)
			}
			if now := num(t, got[3]); now < 1e12 {
				t.Fatalf("step %d: now = %v, want Redis TIME in ms", i, now)
			}
		}
	})
}

// TestTakeWaitAndPartial drives the refill with miniredis's clock.
func TestTakeWaitAndPartial(t *testing.T) {
	m, c := redistest.Mini(t)
	m.SetTime(t0)
	key := "take"
	steps := []struct {
		at        time.Duration
		want, min int
		granted   int64
		left      float64
		waitMS    int64
	}{
		{0, 10, 10, 10, 0, 0},
		{0, 5, 1, 0, 0, 500}, // rate 2/s: 1 token in 500 ms
		{250 * time.Millisecond, 5, 1, 0, 0.5, 250},
		{1750 * time.Millisecond, 5, 2, 3, 0.5, 0},      // 3.5 tokens: partial grant of 3
		{2 * time.Millisecond * 1000, 5, 5, 0, 1, 2000}, // 1 token, need 5: 4 more = 2 s
		{10 * time.Second, 20, 10, 10, 0, 0},            // refill capped at capacity 10
		{10250 * time.Millisecond, 5, 0, 0, 0.5, 0},     // min 0: nothing to wait for, never a negative wait
	}
	for i, s := range steps {
		m.SetTime(t0.Add(s.at))
		got := run(t, c, luascript.Take, key, 10, 2, s.want, s.min, "srv", i+1, 0)
		if got[0] != s.granted || !near(num(t, got[1]), s.left, 1e-9) || got[2] != s.waitMS ||
			got[3] != t0.Add(s.at).UnixMilli() {
			t.Fatalf("step %d at %v: take(want %d, min %d) = %v, want {%d, %v, %d, %d}",
				i, s.at, s.want, s.min, got, s.granted, s.left, s.waitMS, t0.Add(s.at).UnixMilli())
		}
	}
}

func TestRefundCap(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		const rate = 1e-6
		key := redistest.Unique(t)
		if got := run(t, tg.Client, luascript.Take, key, 10, rate, 6, 6, "srv", 1, 0); got[0] != int64(6) {
			t.Fatalf("take: %v", got)
		}
		if got := run(t, tg.Client, luascript.Refund, key, 10, rate, 3, "srv", 2, 0); !near(num(t, got[0]), 7, 1e-3) || got[1] != int64(luascript.Fresh) {
			t.Fatalf("refund 3: %v, want 7", got)
		}
		if got := run(t, tg.Client, luascript.Refund, key, 10, rate, 8, "srv", 3, 0); num(t, got[0]) != 10 {
			t.Fatalf("refund 8: %v, want capped at 10", got)
		}
		if tok := hget(t, tg.Client, key, "tokens"); tok != 10 {
			t.Fatalf("stored tokens = %v, want 10", tok)
		}
		// A refund to a bucket that does not exist answers capacity (an expired bucket
		// was full) and writes nothing: a bucket lost while in use must not come back full.
		if got := run(t, tg.Client, luascript.Refund, key+"-none", 10, rate, 4, "srv", 4, 0); num(t, got[0]) != 10 {
			t.Fatalf("refund to a missing bucket: %v, want 10", got)
		}
		if n, err := tg.Client.Exists(context.Background(), key+"-none").Result(); err != nil || n != 0 {
			t.Fatalf("a refund to a missing bucket made it (%d, %v)", n, err)
		}
	})
}

// TestRefundToAFullBucket: a refund to a full bucket answers its capacity and writes
// nothing, not even its record, so a replay of it runs again: it gives its tokens back
// once, when the bucket has room for them, and is a replay from then on.
func TestRefundToAFullBucket(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		const rate = 1e-6 // no refill within the test
		key := redistest.Unique(t)
		if got := run(t, tg.Client, luascript.Take, key, 10, rate, 2, 2, "a", 1, 0); got[0] != int64(2) {
			t.Fatalf("take: %v", got)
		}
		if got := run(t, tg.Client, luascript.Refund, key, 10, rate, 2, "a", 2, 0); num(t, got[0]) != 10 || got[1] != int64(luascript.Fresh) {
			t.Fatalf("refund to a bucket with room: %v, want 10", got)
		}
		before, err := tg.Client.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		ttl, err := tg.Client.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := run(t, tg.Client, luascript.Refund, key, 10, rate, 3, "a", 3, 0); num(t, got[0]) != 10 || got[1] != int64(luascript.Fresh) {
			t.Fatalf("refund to a full bucket: %v, want 10, fresh", got)
		}
		after, err := tg.Client.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(before, after) {
			t.Fatalf("a refund to a full bucket wrote it: %v, then %v", before, after)
		}
		if ttl2, err := tg.Client.PTTL(ctx, key).Result(); err != nil || ttl2 > ttl {
			t.Fatalf("a refund to a full bucket set its TTL: %v, then %v (%v)", ttl, ttl2, err)
		}
		// A debt to a full bucket is charged and recorded.
		if got := run(t, tg.Client, luascript.Refund, key, 10, rate, -1, "a", 4, 0); num(t, got[0]) != 9 {
			t.Fatalf("debt to a full bucket: %v, want 9", got)
		}
		if got := run(t, tg.Client, luascript.Take, key, 10, rate, 4, 4, "a", 5, 0); got[0] != int64(4) || !near(num(t, got[1]), 5, 1e-3) {
			t.Fatalf("take: %v, want 4 granted, 5 left", got)
		}
		// The refund of seq 3 again: the bucket has room now, and gets its 3 tokens once.
		for i, want := range []int64{luascript.Fresh, luascript.Replayed, luascript.Replayed} {
			if got := run(t, tg.Client, luascript.Refund, key, 10, rate, 3, "a", 3, 0); !near(num(t, got[0]), 8, 1e-3) || got[1] != want {
				t.Fatalf("refund of seq 3, call %d: %v, want 8 tokens, flag %d", i, got, want)
			}
		}
		if tok := hget(t, tg.Client, key, "tokens"); !near(tok, 8, 1e-3) {
			t.Fatalf("tokens = %v, want 8", tok)
		}
	})
}

// TestRefundToAFullBucketWrites: a refund to a full bucket writes (its record, and p or
// c, whichever was written 30 s or more before) when p or c needs writing: it writes
// nothing only when neither does.
func TestRefundToAFullBucketWrites(t *testing.T) {
	const capacity, rate = 100, 1
	type take struct {
		at            time.Duration
		want, version int
	}
	for _, tc := range []struct {
		name  string
		takes []take
		// the refund comes at 35 s, on version 2, to a full bucket
		pAt, cAt time.Duration // when the takes last wrote p and c
		stale    string        // of p and c, the one written 30 s or more before
	}{
		// 70 left; at 20 s a new version (p), 90 then, below full (no c); full by 30 s.
		{"c written 35 s before", []take{{0, 30, 1}, {20 * time.Second, 1, 2}}, 20 * time.Second, 0, "c"},
		// 99 left; at 10 s the refill lost to the cap grows the credit (c), not p.
		{"p written 35 s before", []take{{0, 1, 2}, {10 * time.Second, 1, 2}}, 0, 10 * time.Second, "p"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, c := redistest.Mini(t)
			key := "full"
			for i, tk := range tc.takes {
				m.SetTime(t0.Add(tk.at))
				run(t, c, luascript.Take, key, capacity, rate, tk.want, 1, "srv", i+1, tk.version)
			}
			if pAt, cAt := fieldTime(t, c, key, "p"), fieldTime(t, c, key, "c"); pAt != t0.Add(tc.pAt).UnixMilli() || cAt != t0.Add(tc.cAt).UnixMilli() {
				t.Fatalf("before the refund p written at %d, c at %d; want %v and %v after t0", pAt, cAt, tc.pAt, tc.cAt)
			}
			at := t0.Add(35 * time.Second)
			m.SetTime(at)
			if got := run(t, c, luascript.Refund, key, capacity, rate, 1, "srv", 10, 2); num(t, got[0]) != capacity || got[1] != int64(luascript.Fresh) {
				t.Fatalf("refund to a full bucket: %v, want %d, fresh", got, capacity)
			}
			for _, f := range []string{tc.stale, "r:srv"} {
				if w := fieldTime(t, c, key, f); w != at.UnixMilli() {
					t.Errorf("%s written at %d, want %d (by the refund)", f, w, at.UnixMilli())
				}
			}
		})
	}
}

// TestReplay: a replayed take or refund (same server id and seq, as when go-redis
// retries a timed-out EVALSHA) returns the recorded answer and spends nothing; an older
// seq spends nothing; another server's seq is independent.
func TestReplay(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		const rate = 1e-6
		key := redistest.Unique(t)
		first := run(t, tg.Client, luascript.Take, key, 100, rate, 30, 1, "a", 7, 0)
		if first[0] != int64(30) || first[4] != int64(luascript.First) {
			t.Fatalf("first take: %v, want 30 granted, flag 3 (no record of this server yet)", first)
		}
		for i := 0; i < 3; i++ {
			again := run(t, tg.Client, luascript.Take, key, 100, rate, 30, 1, "a", 7, 0)
			if again[0] != first[0] || again[1] != first[1] || again[2] != first[2] ||
				again[3] != first[3] || again[4] != int64(luascript.Replayed) {
				t.Fatalf("replay %d: %v, want the recorded %v with flag 1", i, again, first)
			}
		}
		if tok := hget(t, tg.Client, key, "tokens"); !near(tok, 70, 1e-3) {
			t.Fatalf("tokens after replays = %v, want 70 (spent once)", tok)
		}
		stale := run(t, tg.Client, luascript.Take, key, 100, rate, 30, 1, "a", 6, 0)
		if stale[0] != int64(0) || stale[4] != int64(luascript.Stale) {
			t.Fatalf("stale take: %v, want 0 granted, flag 2", stale)
		}
		// Another server with the same seq is a different caller.
		if other := run(t, tg.Client, luascript.Take, key, 100, rate, 20, 1, "b", 7, 0); other[0] != int64(20) || other[4] != int64(luascript.First) {
			t.Fatalf("server b: %v", other)
		}
		// Refunds keep their own record: a refund with seq 8 does not make take seq 7 stale.
		r := run(t, tg.Client, luascript.Refund, key, 100, rate, 10, "a", 8, 0)
		if !near(num(t, r[0]), 60, 1e-3) || r[1] != int64(luascript.Fresh) {
			t.Fatalf("refund: %v, want 60", r)
		}
		if again := run(t, tg.Client, luascript.Take, key, 100, rate, 30, 1, "a", 7, 0); again[4] != int64(luascript.Replayed) || again[0] != int64(30) {
			t.Fatalf("take replay after a refund: %v", again)
		}
		for i := 0; i < 3; i++ {
			again := run(t, tg.Client, luascript.Refund, key, 100, rate, 10, "a", 8, 0)
			if again[0] != r[0] || again[1] != int64(luascript.Replayed) {
				t.Fatalf("refund replay %d: %v, want %v with flag 1", i, again, r)
			}
		}
		if stale := run(t, tg.Client, luascript.Refund, key, 100, rate, 10, "a", 5, 0); stale[1] != int64(luascript.Stale) {
			t.Fatalf("stale refund: %v", stale)
		}
		if tok := hget(t, tg.Client, key, "tokens"); !near(tok, 60, 1e-3) {
			t.Fatalf("tokens = %v, want 60 (each refund counted once)", tok)
		}
		// The seed script ignores the records and sees the same tokens.
		if got := run(t, tg.Client, luascript.Bucket, key, 100, rate, 1); got[0] != int64(1) || !near(num(t, got[1]), 59, 1e-3) {
			t.Fatalf("bucket on a leased hash: %v, want {1, 59}", got)
		}
	})
}

// TestClaimKeepsItsOwnRecord: a reservation's claim (a take with a floor) records its
// answer apart from the refills' (k:<server>): a claim under a later seq does not make
// a refill sent again under its own seq, whose answer was lost, stale (which the Store
// would send once more under a fresh seq, spending twice); the claim is replayed on its
// own record.
func TestClaimKeepsItsOwnRecord(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		const rate = 1e-6
		key := redistest.Unique(t)
		first := run(t, tg.Client, luascript.Take, key, 100, rate, 30, 1, "a", 7, 0) // its answer lost
		claim := run(t, tg.Client, luascript.Take, key, 100, rate, 10, 10, "a", 8, 0, 100)
		if claim[0] != int64(10) {
			t.Fatalf("claim: %v, want 10 granted", claim)
		}
		again := run(t, tg.Client, luascript.Take, key, 100, rate, 30, 1, "a", 7, 0) // sent again
		if again[4] != int64(luascript.Replayed) || again[0] != first[0] {
			t.Fatalf("refill sent again after a claim: %v, want the replay of %v (flag 1)", again, first)
		}
		if replay := run(t, tg.Client, luascript.Take, key, 100, rate, 10, 10, "a", 8, 0, 100); replay[4] != int64(luascript.Replayed) || replay[0] != int64(10) {
			t.Fatalf("claim replayed: %v, want its recorded 10 (flag 1)", replay)
		}
		if tok := hget(t, tg.Client, key, "tokens"); !near(tok, 60, 1e-3) {
			t.Fatalf("tokens = %v, want 60: the refill and the claim spent once each", tok)
		}
	})
}

// TestRecordsPruned: a hot bucket that never expires keeps at most ~256 records; records
// older than two minutes go when a new server writes its first record.
func TestRecordsPruned(t *testing.T) {
	m, c := redistest.Mini(t)
	ctx := context.Background()
	m.SetTime(t0)
	key := "pruned"
	for i := 0; i < 300; i++ {
		run(t, c, luascript.Take, key, 1000, 1000, 1, 1, "old"+strconv.Itoa(i), 1, 0)
	}
	m.SetTime(t0.Add(100 * time.Second))
	run(t, c, luascript.Refund, key, 1000, 1000, 1, "recent", 1, 0)
	m.SetTime(t0.Add(3 * time.Minute))
	run(t, c, luascript.Take, key, 1000, 1000, 1, 1, "new", 1, 0)
	n, err := c.HLen(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	// tokens, ts, p, c, the recent refund record (80 s old) and the new record survive.
	if n != 6 {
		fields, _ := c.HKeys(ctx, key).Result()
		t.Fatalf("HLEN = %d, want 6; fields %v", n, fields)
	}
	if ok, _ := c.HExists(ctx, key, "r:recent").Result(); !ok {
		t.Fatal("the recent record was pruned")
	}
}

// TestRecordsPrunedEdges: a server's first record, by a take or a refund, prunes the hash
// when it holds more than 256 fields (tokens, ts, p, c and the records: 253 records
// make 257), and drops then the records written more than 120 s before, not those
// written 120 s before exactly.
func TestRecordsPrunedEdges(t *testing.T) {
	const capacity, rate = 1000, 1e-3 // the bucket stays below full: a refund writes
	for _, tc := range []struct {
		name    string
		script  *redis.Script
		records int
		age     time.Duration // of the records, when the new server comes
		pruned  bool
	}{
		{"take, 256 fields", luascript.Take, 252, 3 * time.Minute, false},
		{"take, 257 fields", luascript.Take, 253, 3 * time.Minute, true},
		{"take, records 120 s old", luascript.Take, 253, 120 * time.Second, false},
		{"take, records 120.001 s old", luascript.Take, 253, 120*time.Second + time.Millisecond, true},
		{"refund, 256 fields", luascript.Refund, 252, 3 * time.Minute, false},
		{"refund, 257 fields", luascript.Refund, 253, 3 * time.Minute, true},
		{"refund, records 120 s old", luascript.Refund, 253, 120 * time.Second, false},
		{"refund, records 120.001 s old", luascript.Refund, 253, 120*time.Second + time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, c := redistest.Mini(t)
			ctx := context.Background()
			key := "pruned"
			m.SetTime(t0)
			for i := range tc.records {
				run(t, c, luascript.Take, key, capacity, rate, 1, 1, "old"+strconv.Itoa(i), 1, 0)
			}
			m.SetTime(t0.Add(tc.age))
			args := []any{capacity, rate, 1, 1, "new", 1, 0}
			if tc.script == luascript.Refund {
				args = []any{capacity, rate, 1, "new", 1, 0}
			}
			run(t, c, tc.script, key, args...)
			n, err := c.HLen(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			// pruned: tokens, ts, p, c and the new record; else all of them and the new one
			want := int64(4 + tc.records + 1)
			if tc.pruned {
				want = 5
			}
			if n != want {
				t.Fatalf("HLEN = %d, want %d", n, want)
			}
		})
	}
}

func TestInvalidArguments(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		key := redistest.Unique(t)
		for _, tc := range []struct {
			name string
			s    *redis.Script
			args []any
		}{
			{"take rate 0", luascript.Take, []any{10, 0, 1, 1, "s", 1, 0}},
			{"take rate inf", luascript.Take, []any{10, "inf", 1, 1, "s", 1, 0}},
			{"take capacity 0", luascript.Take, []any{0, 1, 1, 1, "s", 1, 0}},
			{"take min > want", luascript.Take, []any{10, 1, 1, 2, "s", 1, 0}},
			{"take want 0", luascript.Take, []any{10, 1, 0, 0, "s", 1, 0}},
			{"take seq missing", luascript.Take, []any{10, 1, 1, 1, "s", "x", 0}},
			{"refund rate -1", luascript.Refund, []any{10, -1, 1, "s", 1, 0}},
			{"refund debt floor -1", luascript.Refund, []any{10, 1, -1, "s", 1, 0, -1}},
			{"refund debt floor 1.5", luascript.Refund, []any{10, 1, -1, "s", 1, 0, 1.5}},
			{"refund debt -inf", luascript.Refund, []any{10, 1, "-inf", "s", 1, 0}},
			{"take floor -1", luascript.Take, []any{10, 1, 1, 1, "s", 1, 0, -1}},
			{"take floor 1.5", luascript.Take, []any{10, 1, 1, 1, "s", 1, 0, 1.5}},
			{"take floor above the capacity", luascript.Take, []any{10, 1, 1, 1, "s", 1, 0, 11}},
			{"take floor nan", luascript.Take, []any{10, 1, 1, 1, "s", 1, 0, "nan"}},
			{"heartbeat ttl 0", luascript.Heartbeat, []any{"s", 0}},
			// NaN passes every "x < bound" test; Lua's tonumber reads "nan" on real Redis.
			{"take capacity nan", luascript.Take, []any{"nan", 1, 1, 1, "s", 1, 0}},
			{"take want nan", luascript.Take, []any{10, 1, "nan", 1, "s", 1, 0}},
			{"take min nan", luascript.Take, []any{10, 1, 1, "nan", "s", 1, 0}},
			{"take seq nan", luascript.Take, []any{10, 1, 1, 1, "s", "nan", 0}},
			{"take capacity inf", luascript.Take, []any{"inf", 1, 1, 1, "s", 1, 0}},
			{"refund capacity nan", luascript.Refund, []any{"nan", 1, 1, "s", 1, 0}},
			{"refund amount nan", luascript.Refund, []any{10, 1, "nan", "s", 1, 0}},
			{"refund amount inf", luascript.Refund, []any{10, 1, "inf", "s", 1, 0}},
			{"heartbeat ttl nan", luascript.Heartbeat, []any{"s", "nan"}},
			// A fractional want would spend 1.5 tokens and answer 1 (integer reply).
			{"take want 1.5", luascript.Take, []any{10, 1, 1.5, 1, "s", 1, 0}},
			{"take min 0.5", luascript.Take, []any{10, 1, 2, 0.5, "s", 1, 0}},
			// The TTL would not be an integer PEXPIRE accepts: the HSET would stay,
			// without expiry, and the call would fail after writing.
			{"take ttl too long", luascript.Take, []any{100000, 1e-15, 1, 1, "s", 1, 0}},
			{"refund ttl too long", luascript.Refund, []any{100000, 1e-15, 1, "s", 1, 0}},
			// The version is an exact integer a Lua number holds, and must be there.
			{"take version missing", luascript.Take, []any{10, 1, 1, 1, "s", 1}},
			{"take version -1", luascript.Take, []any{10, 1, 1, 1, "s", 1, -1}},
			{"take version 1.5", luascript.Take, []any{10, 1, 1, 1, "s", 1, 1.5}},
			{"take version 2^53", luascript.Take, []any{10, 1, 1, 1, "s", 1, "9007199254740992"}},
			{"take version nan", luascript.Take, []any{10, 1, 1, 1, "s", 1, "nan"}},
			{"refund version missing", luascript.Refund, []any{10, 1, 1, "s", 1}},
			{"refund version inf", luascript.Refund, []any{10, 1, 1, "s", 1, "inf"}},
			{"take seen without its time", luascript.Take, []any{10, 1, 1, 1, "s", 1, 0, 0, 3}},
			{"take seen nan", luascript.Take, []any{10, 1, 1, 1, "s", 1, 0, 0, "nan", 5}},
			{"take seen at -1", luascript.Take, []any{10, 1, 1, 1, "s", 1, 0, 0, 3, -1}},
			{"take seen at 1.5", luascript.Take, []any{10, 1, 1, 1, "s", 1, 0, 0, 3, 1.5}},
		} {
			err := tc.s.Run(context.Background(), tg.Client, []string{key}, tc.args...).Err()
			if err == nil {
				t.Errorf("%s: no error", tc.name)
			}
		}
		if n, _ := tg.Client.Exists(context.Background(), key).Result(); n != 0 {
			t.Fatal("an invalid call wrote the key")
		}
	})
}

func TestHeartbeat(t *testing.T) {
	t.Run("miniredis-clock", func(t *testing.T) {
		m, c := redistest.Mini(t)
		ctx := context.Background()
		m.SetTime(t0)
		beat := func(id string, ttl int) int64 {
			t.Helper()
			v, err := luascript.Heartbeat.Run(ctx, c, []string{"fleet"}, id, ttl).Int64()
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		if n := beat("a", 1000); n != 1 {
			t.Fatalf("a: %d", n)
		}
		if n := beat("b", 3000); n != 2 {
			t.Fatalf("b: %d", n)
		}
		if n := beat("a", 1000); n != 2 {
			t.Fatalf("a again: %d (a member counts once)", n)
		}
		if pttl, _ := c.PTTL(ctx, "fleet").Result(); pttl != 3*time.Second {
			t.Fatalf("PTTL = %v, want 3s (the longest heartbeat; a shorter one does not cut it)", pttl)
		}
		m.SetTime(t0.Add(1500 * time.Millisecond))
		if n := beat("c", 1000); n != 2 {
			t.Fatalf("after a expired: %d, want 2 (b, c)", n)
		}
		m.SetTime(t0.Add(10 * time.Second))
		if n := beat("c", 1000); n != 1 {
			t.Fatalf("after b expired: %d, want 1", n)
		}
	})
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		key := redistest.Unique(t)
		for i, id := range []string{"x", "y", "z", "x"} {
			n, err := luascript.Heartbeat.Run(ctx, tg.Client, []string{key}, id, 60_000).Int64()
			if err != nil {
				t.Fatal(err)
			}
			if want := int64(min(i+1, 3)); n != want {
				t.Fatalf("beat %d (%s): %d live, want %d", i, id, n, want)
			}
		}
		if pttl, _ := tg.Client.PTTL(ctx, key).Result(); pttl <= 50*time.Second || pttl > time.Minute {
			t.Fatalf("PTTL = %v, want about 60s", pttl)
		}
	})
}

// TestFractionalMemory: the low-key marks and the heartbeats last a whole number of
// milliseconds, a fractional memory or ttl rounded up: the member's score and the key's
// TTL are now + 1501 ms for 1500.5, and the member counts 1500 ms later.
func TestFractionalMemory(t *testing.T) {
	for _, tc := range []struct {
		name   string
		s      *redis.Script
		args   []any // the mark or the beat of "m"
		recall []any // a call 1500 ms later that answers the members in force
		want   any
	}{
		{"low", luascript.Low, []any{"1500.5", 1, 10, "m"}, []any{1, 0, 10}, []any{"m"}},
		{"heartbeat", luascript.Heartbeat, []any{"m", "1500.5"}, []any{"other", 1}, int64(2)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, c := redistest.Mini(t)
			m.ClockTTL(true) // keys expire on the clock the test sets
			ctx := context.Background()
			m.SetTime(t0)
			key := "set"
			if err := tc.s.Run(ctx, c, []string{key}, tc.args...).Err(); err != nil {
				t.Fatal(err)
			}
			if score, err := c.ZScore(ctx, key, "m").Result(); err != nil || score != float64(t0.UnixMilli()+1501) {
				t.Errorf("score %v (%v), want now + 1501 ms", score, err)
			}
			if pttl, err := c.PTTL(ctx, key).Result(); err != nil || pttl != 1501*time.Millisecond {
				t.Errorf("PTTL %v (%v), want 1501ms", pttl, err)
			}
			m.SetTime(t0.Add(1500 * time.Millisecond))
			got, err := tc.s.Run(ctx, c, []string{key}, tc.recall...).Result()
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("1500 ms later: %#v (%v), want %#v", got, err, tc.want)
			}
		})
	}
}

// TestLowDropsPassedMarks: a low-key call drops the marks whose time has passed, the one
// that ends at Redis's now included, so that no read by an earlier clock finds it; it
// keeps the later ones, and answers them.
func TestLowDropsPassedMarks(t *testing.T) {
	m, c := redistest.Mini(t)
	ctx := context.Background()
	key := "low"
	m.SetTime(t0)
	lowCall(t, c, key, 1000, 10, "ends-now")
	m.SetTime(t0.Add(time.Millisecond))
	lowCall(t, c, key, 1000, 10, "ends-later")
	m.SetTime(t0.Add(time.Second))
	if got := lowCall(t, c, key, 1000, 10); !reflect.DeepEqual(got, []any{"ends-later"}) {
		t.Errorf("marks answered %v, want [ends-later]", got)
	}
	// read as redisstore.Store.LowBatch reads a set, by a clock 1 ms behind Redis's
	behind := strconv.FormatInt(t0.Add(time.Second-time.Millisecond).UnixMilli(), 10)
	if set, err := c.ZRevRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf", Min: "(" + behind}).Result(); err != nil || !reflect.DeepEqual(set, []string{"ends-later"}) {
		t.Errorf("a read by a clock 1 ms behind finds %v (%v), want [ends-later]", set, err)
	}
}

// lowCall runs luascript.Low on key with memory ms and most, marking ids, and returns
// its answer.
func lowCall(t *testing.T, c *redis.Client, key string, memory, most int, ids ...string) []any {
	t.Helper()
	args := []any{memory, len(ids), most}
	for _, id := range ids {
		args = append(args, id)
	}
	return run(t, c, luascript.Low, key, args...)
}

// TestExponentForms: a bucket whose tokens were stored as "1e-06" (Go's and Redis 7.2's
// shortest form of a tiny number) must read as 1e-06, not as a missing value (a full
// bucket). miniredis's Lua returns nil from tonumber("1e-06") (yuin/gopher-lua#472);
// the scripts parse around it. Arguments in exponent form work too.
func TestExponentForms(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		for _, tc := range []struct {
			name string
			s    *redis.Script
			args []any
			want func(got []any) bool
		}{
			{"bucket", luascript.Bucket, []any{"1e+01", "1e-09", 1}, func(g []any) bool { return g[0] == int64(0) && num(t, g[1]) < 1e-3 }},
			{"take", luascript.Take, []any{10, "1e-9", 1, 1, "s", 1, 0}, func(g []any) bool { return g[0] == int64(0) && num(t, g[1]) < 1e-3 }},
			{"refund", luascript.Refund, []any{10, "1e-9", 2, "s", 1, 0}, func(g []any) bool { return near(num(t, g[0]), 2, 1e-3) }},
		} {
			key := redistest.Unique(t) + tc.name
			if err := tg.Client.HSet(ctx, key, "tokens", "1e-06", "ts", redisNowMS(t, tg.Client)).Err(); err != nil {
				t.Fatal(err)
			}
			if got := run(t, tg.Client, tc.s, key, tc.args...); !tc.want(got) {
				t.Errorf("%s on tokens \"1e-06\": %v", tc.name, got)
			}
		}
		if n, err := luascript.Heartbeat.Run(ctx, tg.Client, []string{redistest.Unique(t)}, "s", "6e4").Int64(); err != nil || n != 1 {
			t.Errorf("heartbeat with ttl \"6e4\": %d %v", n, err)
		}
	})
}

// TestTakeSeen: a take that finds no bucket starts it empty (or at the level its caller
// saw, if below zero), if the caller saw it within capacity/rate + 500 ms (less than any
// bucket's TTL: it was lost, not expired), refilling from now; otherwise, or with nothing seen,
// full. On a bucket that exists what was seen changes nothing.
func TestTakeSeen(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		for _, tc := range []struct {
			name     string
			exists   bool
			seen     []any // level, and how long before the take it was seen, in ms
			granted  int64
			leftNear float64
		}{
			{"none seen: full", false, nil, 5, 5},
			{"seen empty just now", false, []any{0, 0}, 0, 0},
			{"seen 2, 300 ms ago", false, []any{2, 300}, 0, 0},
			{"seen 1, 1450 ms ago", false, []any{1, 1450}, 0, 0},
			{"seen 1, 1550 ms ago: may have expired", false, []any{1, 1550}, 5, 5},
			{"seen long ago: full", false, []any{0, 60000}, 5, 5},
			{"seen below zero", false, []any{-3, 100}, 0, -3},
			{"seen above capacity", false, []any{12, 100}, 0, 0},
			{"the bucket exists", true, []any{0, 0}, 5, 5},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if tg.Mini != nil {
					tg.Mini.SetTime(t0)
				}
				key := redistest.Unique(t)
				if tc.exists {
					run(t, tg.Client, luascript.Take, key, 10, 10, 1, 1, "other", 1, 0)
					run(t, tg.Client, luascript.Refund, key, 10, 10, 1, "other", 2, 0)
				}
				args := []any{10, 10, 5, 1, "srv", 1, 0, 0}
				if tc.seen != nil { // level, and Redis's clock age ms before now
					nowMS := t0.UnixMilli()
					if tg.Mini == nil {
						nowMS = redisNowMS(t, tg.Client)
					}
					args = append(args, tc.seen[0], nowMS-int64(tc.seen[1].(int)))
				}
				got := run(t, tg.Client, luascript.Take, key, args...)
				// real Redis's clock moves between the calls: allow a token
				if got[0] != tc.granted && !(tg.Mini == nil && math.Abs(float64(got[0].(int64)-tc.granted)) <= 1) {
					t.Fatalf("take = %v, want %d granted", got, tc.granted)
				}
				if left := num(t, got[1]); !near(left, tc.leftNear, 1.01) {
					t.Fatalf("take = %v, want about %v left", got, tc.leftNear)
				}
			})
		}
	})
}

// TestTakeSeenWindowEdge: the window in which a missing bucket counts as lost, not
// expired, is capacity/rate + 500 ms, its end excluded: seen 1499 ms before, a bucket of
// 10 at 10/s starts empty; seen 1500 ms before, it may have expired, and starts full.
func TestTakeSeenWindowEdge(t *testing.T) {
	for _, tc := range []struct {
		name    string
		age     time.Duration // from the level seen to the take
		granted int64
	}{
		{"1 ms inside", 1499 * time.Millisecond, 0},
		{"at the end", 1500 * time.Millisecond, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, c := redistest.Mini(t)
			m.SetTime(t0)
			got := run(t, c, luascript.Take, "lost", 10, 10, 5, 1, "srv", 1, 0, 0, 1, t0.Add(-tc.age).UnixMilli())
			if got[0] != tc.granted {
				t.Fatalf("take = %v, want %d granted", got, tc.granted)
			}
		})
	}
}

// TestRefundMany: a refund call of several keys answers, and leaves each bucket, as the
// same refunds called one at a time in that order (a key given twice sees its first
// refund); a call with one invalid key's arguments, or a count of arguments that is not
// eight a key (six or seven for the last), refunds nothing.
func TestRefundMany(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		const rate = 1e-6 // nothing refills between the calls compared
		base := redistest.Unique(t)
		type refund struct {
			key  string
			args []any // ARGV, eight of them, '' where an optional one is left out
		}
		refunds := []refund{
			{"a", []any{10, rate, 3, "srv", 2, 0, "", ""}},
			{"b", []any{20, rate, 50, "srv", 3, 0, "", ""}},      // capped at the capacity
			{"c", []any{10, rate, -4, "srv", 4, 0, 2, 5e-6}},     // a debt, floor 2, with a reference
			{"missing", []any{10, rate, 4, "srv", 5, 0, "", ""}}, // no bucket: nothing written
			{"a", []any{10, rate, 2, "srv", 6, 0, "", ""}},       // again, after its first
			{"b", []any{20, rate, 1, "srv", 3, 0, "", ""}},       // a replay of its first
			{"a", []any{10, rate, 1, "srv", 1, 0}},               // stale, its optional ones left out
		}
		prepare := func(prefix string) {
			for k, capacity := range map[string]int{"a": 10, "b": 20, "c": 10} {
				run(t, tg.Client, luascript.Take, prefix+k, capacity, rate, 6, 6, "srv", 1, 0)
			}
		}
		one, many := base+":one:", base+":many:"
		start := time.Now() // the one-at-a-time buckets' TTLs run from at most this long before the others'
		prepare(one)
		prepare(many)
		var want []any
		for _, r := range refunds {
			args := r.args
			if len(args) == 8 && args[6] == "" {
				args = args[:6]
			}
			want = append(want, run(t, tg.Client, luascript.Refund, one+r.key, args...)...)
		}
		keys, args := make([]string, len(refunds)), []any{}
		for i, r := range refunds {
			keys[i] = many + r.key
			args = append(args, r.args...)
		}
		got, err := luascript.Refund.Run(ctx, tg.Client, keys, args...).Slice()
		if err != nil {
			t.Fatalf("refund of %d keys: %v", len(keys), err)
		}
		if len(got) != len(want) {
			t.Fatalf("refund of %d keys answered %d values, want %d: %v", len(keys), len(got), len(want), got)
		}
		for i := 0; i < len(want); i += 3 {
			if !near(num(t, got[i]), num(t, want[i]), 1e-3) || got[i+1] != want[i+1] || got[i+2] != want[i+2] {
				t.Errorf("key %d (%s): %v, one at a time %v", i/3, refunds[i/3].key, got[i:i+3], want[i:i+3])
			}
		}
		for _, k := range []string{"a", "b", "c", "missing"} {
			w, _ := tg.Client.HGetAll(ctx, one+k).Result()
			g, _ := tg.Client.HGetAll(ctx, many+k).Result()
			if len(w) != len(g) {
				t.Errorf("bucket %s: fields %v, one at a time %v", k, g, w)
				continue
			}
			for _, f := range []string{"tokens", "r:srv", "d:srv", "c", "p"} {
				if (w[f] == "") != (g[f] == "") || w[f] != "" && !near(num(t, firstWord(g[f])), num(t, firstWord(w[f])), 1e-3) {
					t.Errorf("bucket %s field %s: %q, one at a time %q", k, f, g[f], w[f])
				}
			}
			read := time.Now()
			wt, _ := tg.Client.PTTL(ctx, one+k).Result()
			gt, _ := tg.Client.PTTL(ctx, many+k).Result()
			apart := time.Since(read) // gt is read up to that much after wt: that much shorter
			// Both are the same rule's TTL, set at most the time since start apart, read
			// apart, and each rounded by PTTL to a millisecond.
			if d, most := gt-wt, time.Since(start)+time.Millisecond; d > most || d < -apart-time.Millisecond {
				t.Errorf("bucket %s: TTL %v, one at a time %v (set at most %v apart, read %v apart)", k, gt, wt, most, apart)
			}
		}

		// A key Redis refuses (a string, not a hash) is answered refused, with Redis's
		// error and nothing written, and the keys around it are refunded; alone, the same.
		if err := tg.Client.Set(ctx, many+"string", "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
		aBefore, _ := tg.Client.HGet(ctx, many+"a", "tokens").Float64()
		got, err = luascript.Refund.Run(ctx, tg.Client, []string{many + "a", many + "string", many + "b"},
			10, rate, 1, "srv", 200, 0, "", "", 10, rate, 1, "srv", 201, 0, "", "", 20, rate, 1, "srv", 202, 0).Slice()
		if err != nil || len(got) != 9 || got[4] != int64(luascript.Refused) || got[5] != int64(0) ||
			!strings.HasPrefix(fmt.Sprint(got[3]), "WRONGTYPE") || got[1] != int64(luascript.Fresh) || got[7] != int64(luascript.Fresh) {
			t.Fatalf("a call with a key that is not a hash: %v, %v", got, err)
		}
		if a, _ := tg.Client.HGet(ctx, many+"a", "tokens").Float64(); !near(a, aBefore+1, 1e-3) {
			t.Errorf("the key before the refused one holds %v, want %v", a, aBefore+1)
		}
		if v, _ := tg.Client.Get(ctx, many+"string").Result(); v != "x" {
			t.Errorf("the refused key holds %q", v)
		}
		if got := run(t, tg.Client, luascript.Refund, many+"string", 10, rate, 1, "srv", 203, 0); got[1] != int64(luascript.Refused) {
			t.Errorf("a refund of one key that is not a hash: %v", got)
		}

		// Nothing is refunded by a call with an invalid key's arguments, or with a count
		// of arguments that does not fit its keys.
		before := map[string]map[string]string{}
		for _, k := range []string{"a", "b", "c"} {
			before[k], _ = tg.Client.HGetAll(ctx, many+k).Result()
		}
		valid := []any{10, rate, 1, "srv", 100, 0, "", ""}
		for _, tc := range []struct {
			name string
			keys []string
			args []any
		}{
			{"the second key's amount nan", []string{many + "a", many + "b", many + "c"},
				append(append(append([]any{}, valid...), 20, rate, "nan", "srv", 101, 0, "", ""), valid...)},
			{"the last key's version missing", []string{many + "a", many + "c"}, append(append([]any{}, valid...), 10, rate, 1, "srv", 102)},
			{"a key's arguments too few", []string{many + "a", many + "c"}, append(append([]any{}, valid[:7]...), valid...)},
			{"arguments for a key more", []string{many + "a"}, append(append([]any{}, valid...), valid...)},
			{"no key", []string{}, valid},
		} {
			if err := luascript.Refund.Run(ctx, tg.Client, tc.keys, tc.args...).Err(); err == nil {
				t.Errorf("%s: no error", tc.name)
			}
		}
		for _, k := range []string{"a", "b", "c"} {
			if after, _ := tg.Client.HGetAll(ctx, many+k).Result(); !maps.Equal(before[k], after) {
				t.Errorf("bucket %s: an invalid call changed it: %v, was %v", k, after, before[k])
			}
		}
	})
}

// firstWord is s up to its first space: a record's or a field's first number.
func firstWord(s string) string {
	w, _, _ := strings.Cut(s, " ")
	return w
}
