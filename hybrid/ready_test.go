package hybrid_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
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
// open): once Ready has returned, the first requests of 160 new keys, one after another,
// cost what later ones do. Ready loaded the scripts, so no request's refill is sent as
// EVAL after a NOSCRIPT; and it opened the connections, so none dials, save to replace a
// connection a timed-out call closed. A request may go to the policy only for a MaxWait
// run out (its wait for the trip out plus its own call past 10 ms), or for the breaker
// that five such calls in a row opened: a stall of the shared machine (the other
// packages' tests beside this one on 2 cores), which no Ready prevents, and which is
// logged. The requests go one at a time: concurrent first requests
// also queue behind each other's refills.
func TestFirstRequestsAfterReady(t *testing.T) {
	srv := redistest.StartServer(t)
	opts := redistest.Options(srv.Addr)
	global.Configure(opts)
	c := srv.Client(func(o *redis.Options) { *o = *opts })
	after := &afterReady{}
	c.AddHook(after)
	ctx, l := readyLimiter(t, c, global.Prefix(prefix(t)))
	after.armed.Store(true) // from here on, a dial is one Ready did not make
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
	slow := st.Timeouts + st.Starved
	if n := after.evals.Load(); n > 0 {
		t.Errorf("%d scripts sent as EVAL after Ready: it did not load them", n)
	}
	if n := after.dials.Load(); n > slow {
		t.Errorf("%d connections dialled after Ready, %d calls timed out: it did not open them", n, slow)
	}
	if len(fallback) == 0 {
		return
	}
	t.Logf("%d of 160 first requests went to the policy (first: %+v); breaker: %d timeouts, %d starved",
		len(fallback), fallback[0], st.Timeouts, st.Starved)
	for _, d := range fallback {
		// Five calls in a row past 10 ms open the default breaker: the same stall, longer.
		if d.Reason != hybrid.ReasonTimeout && !(d.Reason == hybrid.ReasonBreakerOpen && st.Timeouts >= 5) {
			t.Errorf("a first request went to the policy for %v, not a MaxWait run out: %+v", d.Reason, d)
		}
	}
}

// afterReady is a go-redis hook that counts, once armed, the connections dialled and the
// scripts sent as EVAL (the client's answer to NOSCRIPT).
type afterReady struct {
	armed        atomic.Bool
	dials, evals atomic.Int64
}

func (h *afterReady) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if h.armed.Load() {
			h.dials.Add(1)
		}
		return next(ctx, network, addr)
	}
}

func (h *afterReady) count(cmds ...redis.Cmder) {
	if !h.armed.Load() {
		return
	}
	for _, c := range cmds {
		if c.Name() == "eval" {
			h.evals.Add(1)
		}
	}
}

func (h *afterReady) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}

func (h *afterReady) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.count(cmds...)
		return next(ctx, cmds)
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

// TestReadyLoadsEveryRingShard: on a Ring, Ready loads the scripts into every shard's
// cache, each its own: a command without a key would reach one shard at random.
func TestReadyLoadsEveryRingShard(t *testing.T) {
	a, b := redistest.StartServer(t), redistest.StartServer(t)
	shards := []*redis.Client{a.Client(), b.Client()}
	ring := redis.NewRing(&redis.RingOptions{MaxRetries: -1,
		Addrs: map[string]string{"a": shards[0].Options().Addr, "b": shards[1].Options().Addr}})
	t.Cleanup(func() { ring.Close() })
	ctx, _ := readyLimiter(t, ring)
	for _, c := range shards {
		ok, err := c.ScriptExists(ctx, luascript.Take.Hash(), luascript.Refund.Hash(), luascript.Heartbeat.Hash(), luascript.Low.Hash(), luascript.Bucket.Hash()).Result()
		if err != nil || len(ok) != 5 || !ok[0] || !ok[1] || !ok[2] || !ok[3] || !ok[4] {
			t.Errorf("%s: scripts cached after Ready: %v, %v; want all five", c.Options().Addr, ok, err)
		}
	}
}

// readyLimiter returns a Limiter of one limit on a Store of c, closed when the test
// ends, once its Ready has returned, and a context of 10 s for the test's calls.
func readyLimiter(t *testing.T, c redis.UniversalClient, opts ...global.Option) (context.Context, *hybrid.Limiter) {
	t.Helper()
	store, err := global.New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	l, err := hybrid.New(store, hybrid.Config{FleetSize: 1,
		Limits: []hybrid.Limit{{Name: "api", Rate: 100, Burst: 100, Policy: breaker.FailClosed}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	if err := l.Ready(ctx); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	return ctx, l
}
