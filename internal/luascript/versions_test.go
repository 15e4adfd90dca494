package luascript_test

import (
	"context"
	_ "embed"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/luascript"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// The take and refund scripts of the release before versioned parameters, kept to check
// that a fleet mid-deploy, running both, shares buckets without resetting or doubling them.
var (
	//go:embed testdata/take-v0.lua
	takeV0Source string
	//go:embed testdata/refund-v0.lua
	refundV0Source string

	takeV0   = redis.NewScript(takeV0Source)
	refundV0 = redis.NewScript(refundV0Source)
)

// TestVersions: the parameters of the highest version are in force; a change re-shapes
// the bucket on Redis's clock (refill on the old rate up to now, then at most the new
// capacity) and never adds tokens; a caller with a lower version is answered on the
// bucket's parameters; a refund never re-shapes, and adds nothing of tokens leased
// under other parameters; the TTL follows the parameters in force.
func TestVersions(t *testing.T) {
	m, c := redistest.Mini(t)
	ctx := context.Background()
	type op struct {
		at       time.Duration
		script   string // take or refund
		capacity int
		rate     float64
		n        int // want (take, with min 1) or amount (refund)
		version  int
		granted  int     // take
		tokens   float64 // left after the call
		inForce  int     // the version the call was answered on
		ttl      time.Duration
		pAt      time.Duration // when p last changed: it is written only then
	}
	ops := []op{
		// v0: 100 tokens at 10/s.
		{0, "take", 100, 10, 60, 0, 60, 40, 0, 11 * time.Second, 0},
		// v1, 50 at 100/s, one second on: the bucket refilled to 50 on the old rate, and
		// holds at most 50.
		{time.Second, "take", 50, 100, 1, 1, 1, 49, 1, 1500 * time.Millisecond, time.Second},
		// A server still on v0 is answered on v1: 49 + 0.1 s × 100/s, capped at 50.
		{1100 * time.Millisecond, "take", 100, 10, 10, 0, 10, 40, 1, 1500 * time.Millisecond, time.Second},
		// Its refund, of tokens leased under v0, adds nothing.
		{1100 * time.Millisecond, "refund", 100, 10, 30, 0, 0, 40, 1, 1500 * time.Millisecond, time.Second},
		// v1 again with other parameters (200 at 100/s): the caller's are taken, and the
		// bucket holds what it held; it fills on the new rate from here.
		{1100 * time.Millisecond, "take", 200, 100, 5, 1, 5, 35, 1, 3 * time.Second, 1100 * time.Millisecond},
		{1600 * time.Millisecond, "take", 200, 100, 5, 1, 5, 80, 1, 3 * time.Second, 1100 * time.Millisecond},
		// v2 shrinks the bucket below what it holds: it holds the new capacity.
		{1600 * time.Millisecond, "take", 20, 1, 1, 2, 1, 19, 2, 21 * time.Second, 1600 * time.Millisecond},
		// A lower version's refund cannot grow it back.
		{1600 * time.Millisecond, "refund", 200, 100, 100, 1, 0, 19, 2, 21 * time.Second, 1600 * time.Millisecond},
		// Nor can a higher version's: a refund never re-shapes a bucket.
		{1600 * time.Millisecond, "refund", 1000, 1000, 5, 9, 0, 19, 2, 21 * time.Second, 1600 * time.Millisecond},
		// A refund on the parameters in force counts, capped at the capacity.
		{1600 * time.Millisecond, "refund", 20, 1, 5, 2, 0, 20, 2, 21 * time.Second, 1600 * time.Millisecond},
	}
	key := "versions"
	seq := 0
	for i, o := range ops {
		m.SetTime(t0.Add(o.at))
		seq++
		var got []any
		if o.script == "take" {
			got = run(t, c, luascript.Take, key, o.capacity, o.rate, o.n, 1, "s", seq, o.version)
			if got[0] != int64(o.granted) || num(t, got[1]) != o.tokens || got[5] != int64(o.inForce) {
				t.Fatalf("op %d: take %+v = %v, want granted %d, left %v, version %d", i, o, got, o.granted, o.tokens, o.inForce)
			}
		} else {
			got = run(t, c, luascript.Refund, key, o.capacity, o.rate, o.n, "s", seq, o.version)
			if num(t, got[0]) != o.tokens || got[2] != int64(o.inForce) {
				t.Fatalf("op %d: refund %+v = %v, want left %v, version %d", i, o, got, o.tokens, o.inForce)
			}
		}
		if ttl := m.TTL(key); ttl != o.ttl {
			t.Errorf("op %d: TTL %v, want %v (the parameters in force)", i, ttl, o.ttl)
		}
		p, err := c.HGet(ctx, key, "p").Result()
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(p); len(f) != 4 || f[0] != strconv.Itoa(o.inForce) || f[3] != strconv.FormatInt(t0.Add(o.pAt).UnixMilli(), 10) {
			t.Errorf("op %d: p = %q, want version %d and the time it last changed (%v)", i, p, o.inForce, o.pAt)
		}
	}
}

// TestVersionsRealRedis: the same rules on every Redis the suite reaches, where the
// clock cannot be set: a change never adds tokens, a lower version is answered on the
// higher one's parameters, and p holds them with full precision.
func TestVersionsRealRedis(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		key := redistest.Unique(t)
		const rate = 1e-3 // nothing refills during the test
		run(t, tg.Client, luascript.Take, key, 100, rate, 70, 1, "a", 1, 4)
		// v5 shrinks to 20: the bucket holds min(30, 20).
		if got := run(t, tg.Client, luascript.Take, key, 20, 0.1, 5, 1, "b", 1, 5); got[0] != int64(5) || !near(num(t, got[1]), 15, 1e-3) || got[5] != int64(5) {
			t.Fatalf("v5 take = %v, want 5 granted, 15 left, version 5", got)
		}
		// v4 wants 16: on v5's parameters the bucket holds 15, so it is denied, with
		// the wait of v5's rate.
		got := run(t, tg.Client, luascript.Take, key, 100, rate, 16, 16, "a", 2, 4)
		if got[0] != int64(0) || got[5] != int64(5) || got[2].(int64) < 9000 || got[2].(int64) > 10000 {
			t.Fatalf("v4 take = %v, want 0 granted, a wait of ~10 s (1 token at 0.1/s), version 5", got)
		}
		p, err := tg.Client.HGet(context.Background(), key, "p").Result()
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(p); len(f) != 4 || f[0] != "5" || f[1] != "20" || f[2] != "0.10000000000000001" {
			t.Fatalf("p = %q, want \"5 20 0.10000000000000001 <now>\"", p)
		}
	})
}

// TestPreviousRelease: servers of the release before versions and of this one take from
// and refund to the same buckets. Neither resets a bucket full nor doubles its tokens: a
// bucket holds its capacity minus what both took. The previous release's record pruning
// keeps p while the bucket is in use; a p it dropped is the same as a bucket without one.
func TestPreviousRelease(t *testing.T) {
	m, c := redistest.Mini(t)
	ctx := context.Background()
	m.SetTime(t0)
	key := "mixed"
	const capacity, rate = 100, 1e-3
	steps := []struct {
		s      *redis.Script
		want   int
		tokens float64
	}{
		{takeV0, 30, 70}, {luascript.Take, 30, 40}, {takeV0, 30, 10}, {luascript.Take, 10, 0},
	}
	for i, st := range steps {
		got := run(t, c, st.s, key, capacity, rate, st.want, 1, "s"+strconv.Itoa(i%2), i+1, 0)
		if got[0] != int64(st.want) || num(t, got[1]) != st.tokens {
			t.Fatalf("step %d: %v, want %d granted and %v left", i, got, st.want, st.tokens)
		}
	}
	run(t, c, refundV0, key, capacity, rate, 25, "s0", 10)
	if got := run(t, c, luascript.Refund, key, capacity, rate, 25, "s1", 10, 0); num(t, got[0]) != 50 {
		t.Fatalf("refunds of both releases left %v, want 50", got[0])
	}

	// Fill the hash past 256 records; then a previous-release server's first record
	// prunes those older than 120 s. p, written by this release 110 s before, survives.
	for i := 0; i < 300; i++ {
		run(t, c, takeV0, key, capacity, rate, 1, 1, "old"+strconv.Itoa(i), 1)
	}
	m.SetTime(t0.Add(20 * time.Second))
	run(t, c, luascript.Take, key, capacity, rate, 1, 1, "s1", 20, 7)
	m.SetTime(t0.Add(130 * time.Second))
	run(t, c, takeV0, key, capacity, rate, 1, 1, "late", 1)
	if ok, _ := c.HExists(ctx, key, "t:old0").Result(); ok {
		t.Fatal("the old records were not pruned")
	}
	if p, err := c.HGet(ctx, key, "p").Result(); err != nil || !strings.HasPrefix(p, "7 ") {
		t.Fatalf("p = %q, %v after the previous release pruned the hash; want it kept", p, err)
	}
}

// TestPreviousReleaseKeepsPAndC: this release writes p and c only when they change or
// are 30 s old, yet a bucket it takes from often keeps both through the previous
// release's pruning (fields whose last number is a time 120 s old), even when neither
// changes: parameters that stand, a credit that does not grow (a bucket below full).
func TestPreviousReleaseKeepsPAndC(t *testing.T) {
	m, c := redistest.Mini(t)
	ctx := context.Background()
	key := "steady"
	const capacity, rate = 1000, 1e-3
	m.SetTime(t0)
	seq := 1
	take := func(at time.Duration) {
		m.SetTime(t0.Add(at))
		seq++
		run(t, c, luascript.Take, key, capacity, rate, 1, 1, "s1", seq, 3)
	}
	take(0)
	for i := 0; i < 300; i++ {
		run(t, c, takeV0, key, capacity, rate, 1, 1, "old"+strconv.Itoa(i), 1)
	}
	for at := 25 * time.Second; at <= 100*time.Second; at += 25 * time.Second {
		take(at)
	}
	before, err := c.HMGet(ctx, key, "p", "c").Result()
	if err != nil {
		t.Fatal(err)
	}
	m.SetTime(t0.Add(130 * time.Second))
	run(t, c, takeV0, key, capacity, rate, 1, 1, "late", 1)
	if ok, _ := c.HExists(ctx, key, "t:old0").Result(); ok {
		t.Fatal("the old records were not pruned")
	}
	after, err := c.HMGet(ctx, key, "p", "c").Result()
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range []string{"p", "c"} {
		if after[i] == nil || after[i] != before[i] {
			t.Errorf("%s = %v after the previous release pruned the hash, %v before; want it kept", f, after[i], before[i])
		}
	}
	if p, _ := after[0].(string); !strings.HasPrefix(p, "3 ") || !strings.HasSuffix(p, strconv.FormatInt(t0.Add(100*time.Second).UnixMilli(), 10)) {
		t.Errorf("p = %q, want version 3, written again at 100 s (30 s or more after 50 s)", p)
	}
}

// TestPAndCWrittenAgainAt30s: a take or a refund writes p and c again, though their
// values stand, once they were written 30 s or more before (the previous release prunes
// fields whose last number is 120 s old); written less than 30 s before, it leaves them.
func TestPAndCWrittenAgainAt30s(t *testing.T) {
	const capacity, rate = 1000, 1e-3 // the bucket stays below full: the credit stands
	for _, tc := range []struct {
		name    string
		script  *redis.Script
		after   time.Duration // since p and c were written
		written bool
	}{
		{"take, 1 ms before 30 s", luascript.Take, 30*time.Second - time.Millisecond, false},
		{"take at 30 s", luascript.Take, 30 * time.Second, true},
		{"refund, 1 ms before 30 s", luascript.Refund, 30*time.Second - time.Millisecond, false},
		{"refund at 30 s", luascript.Refund, 30 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, c := redistest.Mini(t)
			key := "steady"
			m.SetTime(t0)
			run(t, c, luascript.Take, key, capacity, rate, 10, 1, "s", 1, 3)
			m.SetTime(t0.Add(tc.after))
			args := []any{capacity, rate, 1, 1, "s", 2, 3} // take: want 1, min 1
			if tc.script == luascript.Refund {
				args = []any{capacity, rate, 1, "s", 2, 3} // refund of 1
			}
			run(t, c, tc.script, key, args...)
			want := t0
			if tc.written {
				want = t0.Add(tc.after)
			}
			for _, f := range []string{"p", "c"} {
				if at := fieldTime(t, c, key, f); at != want.UnixMilli() {
					t.Errorf("%s written at %d, want %d (%v after t0)", f, at, want.UnixMilli(), want.Sub(t0))
				}
			}
		})
	}
}

// fieldTime is the last number of the field f of key: the time it was written, in ms.
func fieldTime(t *testing.T, c *redis.Client, key, f string) int64 {
	t.Helper()
	v, err := c.HGet(context.Background(), key, f).Result()
	if err != nil {
		t.Fatalf("HGET %s %s: %v", key, f, err)
	}
	w := strings.Fields(v)
	at, err := strconv.ParseInt(w[len(w)-1], 10, 64)
	if err != nil {
		t.Fatalf("%s = %q: %v", f, v, err)
	}
	return at
}
