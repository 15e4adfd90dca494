package hybrid_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/hybrid/hybridtest"
	"github.com/fleetlimit/fleetlimit/internal/metricstest"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// TestLimitStatsAgreeWithDecisions: every decision a caller got is counted once, under
// its limit, outcome, source and reason, through leases, pre-check denials, an outage
// under each policy and back; and the leased tokens a limit holds are what Redis misses.
func TestLimitStatsAgreeWithDecisions(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		s := newStore(t, tg.Client)
		var now time.Time = time.Now()
		var mu sync.Mutex
		clock := clockAt(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
		var seen hybridtest.Tally
		l, err := hybrid.New(s, hybrid.Config{
			FleetSize:  2,
			Clock:      clock,
			Breaker:    slowBreaker(t),
			OnDecision: seen.Record,
			Limits: []hybrid.Limit{
				{Name: "api", Rate: 0.001, Burst: 100, Policy: breaker.FailOpen, MaxWait: time.Second},
				{Name: "tight", Rate: 0.001, Burst: 10, PreBurst: 3, PreRate: 0.001, Policy: breaker.FailClosed, MaxWait: time.Second},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		allowedAPI := 0
		for i := range 40 {
			d, err := l.Allow(ctx, "api", "k")
			if err != nil {
				t.Fatal(err)
			}
			if d.Limit != "api" || d.Quota != 100 || d.Window != 100000*time.Second {
				t.Fatalf("decision %d %+v: want limit api, quota 100, window 100000s", i, d)
			}
			if d.Allowed {
				allowedAPI++
			}
		}
		for range 8 {
			if _, err := l.AllowN(ctx, "tight", "k", 1); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.AllowN(ctx, "tight", "k", 11); err != nil { // above the burst
			t.Fatal(err)
		}

		st := l.Stats()
		api := st.Limits[0]
		if api.Name != "api" || api.Rate != 0.001 || api.Burst != 100 {
			t.Fatalf("limit stats %+v", api)
		}
		// The bucket started full; nothing refilled (0.001/s, frozen clock). What Redis
		// lost is what this server admitted plus what it holds.
		if api.Held != api.Granted-int64(allowedAPI) || api.Held <= 0 || metricstest.Allowed(api) != int64(allowedAPI) {
			t.Fatalf("api: held %d, granted %d, admitted %d (counted %d)", api.Held, api.Granted, allowedAPI, metricstest.Allowed(api))
		}
		if g, err := redisstore.Of(s).Take(ctx, redisstore.Limit(mustLimit(t, "api", 0.001, 100)), "k", 100, 1); err != nil || g.Granted != 100-int(api.Granted) {
			t.Fatalf("Redis still holds %d (%v), want %d", g.Granted, err, 100-api.Granted)
		}

		// An outage: fail-open admits, fail-closed denies, both counted as fallback.
		if tg.Mini == nil {
			t.Log("outage part runs on miniredis only")
		} else {
			tg.Mini.SetError("ERR injected outage")
			for _, k := range []string{"a", "b", "c"} {
				if _, err := l.Allow(ctx, "api", k); err != nil {
					t.Fatal(err)
				}
				if _, err := l.Allow(ctx, "tight", k); err != nil {
					t.Fatal(err)
				}
			}
			tg.Mini.SetError("")
		}

		// Close refunds what the leases hold.
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
		st = l.Stats()
		for _, ls := range st.Limits {
			got := map[hybridtest.Outcome]int64{}
			for _, d := range ls.Decisions {
				got[hybridtest.Outcome{Limit: ls.Name, Allowed: d.Allowed, Source: d.Source, Reason: d.Reason}] = d.Count
			}
			want := map[hybridtest.Outcome]int64{}
			for k, n := range seen.Counts() {
				if k.Limit == ls.Name {
					want[k] = n
				}
			}
			if len(got) != len(want) {
				t.Errorf("%s: counted %v, OnDecision heard %v", ls.Name, got, want)
			}
			for k, n := range want {
				if got[k] != n {
					t.Errorf("%s: %v counted %d times, OnDecision heard it %d times", ls.Name, k, got[k], n)
				}
			}
			if ls.Held != 0 || ls.Refunded+ls.RefundsLost+metricstest.Allowed(ls)-fallbackAllowed(ls) != ls.Granted {
				t.Errorf("%s after Close: %+v; want nothing held, every granted token spent or refunded", ls.Name, ls)
			}
		}
		tight := st.Limits[1]
		for _, want := range []hybrid.DecisionCount{
			{Allowed: false, Source: hybrid.SourcePreCheck, Reason: hybrid.ReasonPreCheck},
			{Allowed: false, Source: hybrid.SourceLease, Reason: hybrid.ReasonExceedsBurst},
		} {
			if count(tight, want) == 0 {
				t.Errorf("tight: no %v in %+v", want, tight.Decisions)
			}
		}
		if tg.Mini != nil {
			if n := count(st.Limits[0], hybrid.DecisionCount{Allowed: true, Source: hybrid.SourceFallback, Reason: hybrid.ReasonUnavailable}); n != 3 {
				t.Errorf("api: %d admitted by fail-open, want 3: %+v", n, st.Limits[0].Decisions)
			}
			if n := count(tight, hybrid.DecisionCount{Allowed: false, Source: hybrid.SourceFallback, Reason: hybrid.ReasonUnavailable}); n != 3 {
				t.Errorf("tight: %d denied by fail-closed, want 3: %+v", n, tight.Decisions)
			}
		}
		if st.Lease+st.Global+st.PreCheck+st.Fallback+st.Canceled != metricstest.Allowed(st.Limits[0])+metricstest.Denied(st.Limits[0])+metricstest.Allowed(tight)+metricstest.Denied(tight) {
			t.Errorf("totals %+v do not add up to the limits' decisions", st)
		}
	})
}

func count(ls hybrid.LimitStats, k hybrid.DecisionCount) int64 {
	for _, d := range ls.Decisions {
		if d.Allowed == k.Allowed && d.Source == k.Source && d.Reason == k.Reason {
			return d.Count
		}
	}
	return 0
}

// fallbackAllowed counts the admissions that spent no leased token.
func fallbackAllowed(ls hybrid.LimitStats) int64 {
	var n int64
	for _, d := range ls.Decisions {
		if d.Allowed && d.Source == hybrid.SourceFallback {
			n += d.Count
		}
	}
	return n
}

func mustLimit(t *testing.T, name string, rate float64, burst int) global.Limit {
	t.Helper()
	lim, err := global.NewLimit(name, rate, burst)
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

// syncBuffer is a bytes.Buffer safe for the Limiter's goroutine and the test's.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// lines returns the log records written so far, decoded.
func (b *syncBuffer) lines(t *testing.T) []map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(b.b.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func (b *syncBuffer) has(t *testing.T, msg string) bool {
	for _, m := range b.lines(t) {
		if strings.Contains(m["msg"].(string), msg) {
			return true
		}
	}
	return false
}

// TestLoggerHearsTheRareEvents: the breaker opening and closing, a script Redis refuses
// and a fleet size change each give a log line; requests give none.
func TestLoggerHearsTheRareEvents(t *testing.T) {
	m, c := redistest.Mini(t)
	s := newStore(t, c)
	var logs syncBuffer
	brk, err := breaker.New(breaker.Settings{Timeout: 2 * time.Second, FailureThreshold: 1, OpenTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	l := newLimiter(t, s, hybrid.Config{
		FleetSize: 3,
		Fleet:     "logfleet",
		Breaker:   brk,
		Logger:    slog.New(slog.NewJSONHandler(&logs, nil)),
		Limits:    []hybrid.Limit{{Name: "api", Rate: 1000, Burst: 1000, Policy: breaker.FailOpen, MaxWait: time.Second}},
	})
	ctx := context.Background()
	for range 100 {
		if _, err := l.Allow(ctx, "api", "k"); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the fleet size line (3 configured, 1 live)", func() bool { return logs.has(t, "live fleet size changed") })

	m.Close() // connections refused: the breaker counts those
	waitFor(t, "the breaker to open", func() bool {
		_, _ = l.Allow(ctx, "api", "cold-"+time.Now().String())
		return logs.has(t, "Redis breaker open")
	})
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the breaker to close", func() bool {
		_, _ = l.Allow(ctx, "api", "cold-"+time.Now().String())
		return logs.has(t, "Redis breaker closed")
	})

	// A bucket key that is not a hash: Redis answers WRONGTYPE, which waiting will
	// not cure.
	m.Set(s.Key("api", "wrongtype"), "x")
	waitFor(t, "the refused-script line", func() bool {
		_, _ = l.Allow(ctx, "api", "wrongtype")
		return logs.has(t, "Redis refused a script")
	})
	if !logs.has(t, "could not check Redis's eviction policy") {
		t.Error("miniredis has no CONFIG: no line says the eviction policy could not be checked")
	}
	lines := logs.lines(t)
	if len(lines) > 12 {
		t.Errorf("%d log lines for a few events: %v", len(lines), lines)
	}
	for _, m := range lines {
		if m["msg"] == "fleetlimit: Redis breaker open" && m["level"] != "WARN" {
			t.Errorf("breaker open logged at %v", m["level"])
		}
	}
	t.Logf("%d lines: %v", len(lines), lines)
}

// TestLoggerHearsARedisWithoutBitfield: a Windowed limit on a Redis that has no BITFIELD
// (a bare miniredis, a proxy that refuses it) sends the requests that must ask to the
// limit's policy, and the log says why.
func TestLoggerHearsARedisWithoutBitfield(t *testing.T) {
	m := miniredis.RunT(t) // no BITFIELD
	c := redis.NewClient(redistest.Options(m.Addr()))
	t.Cleanup(func() { _ = c.Close() })
	var logs syncBuffer
	l := newLimiter(t, newStore(t, c), hybrid.Config{
		FleetSize: 1,
		Logger:    slog.New(slog.NewJSONHandler(&logs, nil)),
		Limits: []hybrid.Limit{{Name: "api", Rate: 10, Burst: 10, Policy: breaker.FailClosed, MaxWait: time.Second,
			Mode: hybrid.Windowed(20 * time.Millisecond)}},
	})
	d, err := l.Allow(context.Background(), "api", "k")
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Source != hybrid.SourceFallback {
		t.Errorf("a request that asks a Redis without BITFIELD: %+v, want the policy's denial", d)
	}
	waitFor(t, "the refused-script line", func() bool { return logs.has(t, "Redis refused a script") })
}

// TestLoggerWarnsOfEviction: a Redis whose memory limit would evict keys (buckets have
// TTLs, so volatile-* policies count) is reported at start with the fix.
func TestLoggerWarnsOfEviction(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client()
	ctx := context.Background()
	if err := c.ConfigSet(ctx, "maxmemory", "100mb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigSet(ctx, "maxmemory-policy", "volatile-lru").Err(); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	newLimiter(t, newStore(t, c), hybrid.Config{
		FleetSize: 1,
		Logger:    slog.New(slog.NewJSONHandler(&logs, nil)),
		Limits:    []hybrid.Limit{{Name: "api", Rate: 10, Burst: 10, Policy: breaker.FailClosed}},
	})
	waitFor(t, "the eviction line", func() bool { return logs.has(t, "Redis may evict the rate-limit buckets") })
	for _, m := range logs.lines(t) {
		if strings.Contains(m["msg"].(string), "may evict") {
			if m["level"] != "ERROR" || !strings.Contains(m["error"].(string), "noeviction") {
				t.Errorf("eviction line %v: want ERROR naming the fix", m)
			}
		}
	}
}

// TestLostBucketIsDetected: a bucket deleted from Redis while this server takes from it
// (as eviction or FLUSHALL would) is counted and logged when the next refill finds no
// record of this server, and comes back empty, not full (luascript's TestTakeSeen: it
// refills from then on); a bucket merely taken from again is not counted. Each line
// counts the buckets lost since the last and names their limits: a limit removed by
// Reconfigure takes nothing off the count, and a later loss of another is its own.
func TestLostBucketIsDetected(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		s := newStore(t, tg.Client)
		var logs syncBuffer
		now := time.Now()
		var mu sync.Mutex
		// Batches of one token (a tiny refill interval): every request refills.
		api := hybrid.Limit{Name: "api", Rate: 1, Burst: 100, Policy: breaker.FailClosed,
			MaxWait: time.Second, Lease: hybrid.LeaseTuning{RefillInterval: time.Nanosecond, LowWatermark: -1}}
		l := newLimiter(t, s, hybrid.Config{
			FleetSize:   1,
			Clock:       clockAt(func() time.Time { mu.Lock(); defer mu.Unlock(); return now }),
			Logger:      slog.New(slog.NewJSONHandler(&logs, nil)),
			Limits:      []hybrid.Limit{api},
			LogInterval: time.Nanosecond,
		})
		ctx := context.Background()
		allow := func() {
			t.Helper()
			if d, err := l.Allow(ctx, "api", "k"); err != nil || !d.Allowed {
				t.Fatalf("Allow = %+v, %v", d, err)
			}
		}
		for range 3 {
			allow()
		}
		st := l.Stats().Limits[0]
		if st.Takes < 2 || st.LostBuckets != 0 {
			t.Fatalf("before the loss: %d takes, %d lost buckets; want at least 2 takes and none lost", st.Takes, st.LostBuckets)
		}
		if err := tg.Client.Del(ctx, s.Key("api", "k")).Err(); err != nil {
			t.Fatal(err)
		}
		if d, err := l.Allow(ctx, "api", "k"); err != nil || d.Allowed {
			t.Fatalf("after the bucket was deleted: Allow = %+v, %v; want refused from a bucket re-created empty", d, err)
		}
		if got := l.Stats().Limits[0].LostBuckets; got != 1 {
			t.Fatalf("after the bucket was deleted: %d lost buckets, want 1", got)
		}

		waitFor(t, "the lost-bucket line", func() bool { return logs.has(t, "Redis lost rate-limit buckets") })

		other := api
		other.Name = "other"
		mu.Lock()
		now = now.Add(2 * time.Second) // api's refused key paced past
		mu.Unlock()
		if err := l.Reconfigure([]hybrid.Limit{api, other}); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if d, err := l.Allow(ctx, "other", "k"); err != nil || !d.Allowed {
				t.Fatalf("other: Allow = %+v, %v", d, err)
			}
		}
		if err := l.Reconfigure([]hybrid.Limit{other}); err != nil { // api, its lost bucket counted, goes
			t.Fatal(err)
		}
		if err := tg.Client.Del(ctx, s.Key("other", "k")).Err(); err != nil {
			t.Fatal(err)
		}
		if d, err := l.Allow(ctx, "other", "k"); err != nil || d.Allowed {
			t.Fatalf("other, after its bucket was deleted: Allow = %+v, %v; want refused", d, err)
		}
		waitFor(t, "other's lost-bucket line", func() bool {
			return slices.ContainsFunc(logs.lines(t), func(m map[string]any) bool { return fmt.Sprint(m["limits"]) == "[other]" })
		})
		var got []string
		for _, m := range logs.lines(t) {
			if strings.Contains(m["msg"].(string), "lost rate-limit buckets") {
				got = append(got, fmt.Sprint(m["buckets"], m["limits"]))
			}
		}
		if want := []string{"1 [api]", "1 [other]"}; !slices.Equal(got, want) {
			t.Errorf("lost-bucket lines (buckets, limits) %q, want %q", got, want)
		}
	})
}
