package hybrid_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/luascript"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// TestFirstRequestsAfterReady: a fresh Limiter, with the default breaker (10 ms) and
// MaxWait (10 ms), over a Redis that has just started (no script cached, no connection
// open) and answers within its timeout: once Ready has returned, the first requests of
// 160 new keys, one after another, are all decided by Redis, none by the policy. Ready
// loaded the scripts and opened the connections first. The requests go one at a time:
// concurrent first requests also queue behind each other's refills, which on a loaded
// 2-core machine (the other packages' tests beside this one) passes the 10 ms MaxWait
// whatever Ready did. (Under -race the client is slowed past those 10 ms budgets: only
// the scripts are checked then.)
func TestFirstRequestsAfterReady(t *testing.T) {
	srv := redistest.StartServer(t)
	opts := redistest.Options(srv.Addr)
	global.Configure(opts)
	c := srv.Client(func(o *redis.Options) { *o = *opts })
	store, err := global.New(c, global.Prefix(prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	l, err := hybrid.New(store, hybrid.Config{FleetSize: 1,
		Limits: []hybrid.Limit{{Name: "api", Rate: 100, Burst: 100, Policy: breaker.FailClosed}}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Ready(ctx); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	ok, err := c.ScriptExists(ctx, luascript.Take.Hash(), luascript.Refund.Hash(), luascript.Heartbeat.Hash(), luascript.Low.Hash()).Result()
	if err != nil || !ok[0] || !ok[1] || !ok[2] || !ok[3] {
		t.Fatalf("scripts cached after Ready: %v, %v", ok, err)
	}
	var fallback []hybrid.Decision
	for k := range 160 { // one after another: each refill its own trip, none queued behind another's
		d, err := l.Allow(context.Background(), "api", "new-"+strconv.Itoa(k))
		if err != nil {
			t.Error(err)
		}
		if d.Source == hybrid.SourceFallback {
			fallback = append(fallback, d)
		}
	}
	st := l.Stats().BreakerStats
	if len(fallback) > 0 && raceEnabled {
		// The race detector slows the client several times over: a request that waits
		// for the trip out and then its own can pass its 10 ms MaxWait, and a call its
		// deadline, on the client's time, not Redis's.
		t.Logf("under -race, %d of 160 first requests went to the policy (breaker: %d timeouts)", len(fallback), st.Timeouts)
	} else if len(fallback) > 0 {
		t.Errorf("%d of 160 first requests went to the policy on a healthy Redis (first: %+v); breaker: %d timeouts, %d starved",
			len(fallback), fallback[0], st.Timeouts, st.Starved)
	}
}

// TestRequireNoEviction: with RequireNoEviction, New refuses a Redis that may evict the
// buckets (ErrInvalidConfig and global.ErrEvicting) and one it cannot check (miniredis
// has no CONFIG), and starts on one that cannot evict.
func TestRequireNoEviction(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client()
	ctx := context.Background()
	cfg := hybrid.Config{FleetSize: 1, RequireNoEviction: true,
		Limits: []hybrid.Limit{{Name: "api", Rate: 100, Burst: 100, Policy: breaker.FailClosed}}}
	for _, tc := range []struct {
		maxmemory, policy string
		evicting          bool
	}{
		{"100mb", "allkeys-lru", true},
		{"100mb", "volatile-ttl", true},
		{"100mb", "noeviction", false},
		{"0", "allkeys-lru", false},
	} {
		if err := c.ConfigSet(ctx, "maxmemory", tc.maxmemory).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.ConfigSet(ctx, "maxmemory-policy", tc.policy).Err(); err != nil {
			t.Fatal(err)
		}
		l, err := hybrid.New(newStore(t, c), cfg)
		if tc.evicting {
			if !errors.Is(err, hybrid.ErrInvalidConfig) || !errors.Is(err, global.ErrEvicting) {
				t.Errorf("maxmemory %s, %s: New = %v; want ErrInvalidConfig and ErrEvicting", tc.maxmemory, tc.policy, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("maxmemory %s, %s: New = %v; want a Limiter", tc.maxmemory, tc.policy, err)
			continue
		}
		_ = l.Close(ctx)
	}
	_, mc := redistest.Mini(t)
	if _, err := hybrid.New(newStore(t, mc), cfg); !errors.Is(err, hybrid.ErrInvalidConfig) || errors.Is(err, global.ErrEvicting) {
		t.Errorf("miniredis (no CONFIG): New = %v; want ErrInvalidConfig, not ErrEvicting (it could not check)", err)
	}
}
