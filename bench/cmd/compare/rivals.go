package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/throttled/throttled/v2"
	goredisstore "github.com/throttled/throttled/v2/store/goredisstore.v9"
	"github.com/ulule/limiter/v3"
	ulredis "github.com/ulule/limiter/v3/drivers/store/redis"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
)

// spec is the limit every key of a scenario has: a token bucket of burst tokens refilled
// at rate per second, or the nearest thing a rival's algorithm offers.
type spec struct {
	Rate  int
	Burst int
}

// verdict is the outcome of one decision.
type verdict uint8

const (
	admitted verdict = iota
	denied
	failed   // the limiter returned an error: neither admitted nor denied
	fellBack // fleetlimit's failure policy decided (Redis did not answer in time)
)

// decider makes one decision for key. seq numbers the caller's requests; a fleet uses
// it to spread them over its servers as a round-robin load balancer would.
type decider interface {
	decide(ctx context.Context, seq uint64, key string) (verdict, error)
	close(ctx context.Context) error
}

// rival is one limiter under test.
type rival struct {
	Name string
	// Module is the Go module whose pinned version the report names ("" for none).
	Module string
	// Algorithm says what it does per decision, for the report.
	Algorithm string
	// Bound says how admitted/bound is computed for it, for the report.
	Bound string
	// hasBound is false for a row that limits nothing (PING).
	hasBound bool
	build    func(ctx context.Context, env *redisEnv, s spec) (decider, error)
}

// redisEnv makes the go-redis clients the rivals use, each counting its round trips.
type redisEnv struct {
	addr       string
	roundTrips atomic.Int64
	clients    []*redis.Client
}

// client returns a new go-redis client for the private Redis: go-redis's defaults, or
// the settings fleetlimit's global.Configure recommends (a Store requires them).
func (e *redisEnv) client(configured bool) *redis.Client {
	o := &redis.Options{Addr: e.addr}
	if configured {
		global.Configure(o)
	}
	c := redis.NewClient(o)
	c.AddHook(countHook{&e.roundTrips})
	e.clients = append(e.clients, c)
	return c
}

// closeClients closes every client made since the last call.
func (e *redisEnv) closeClients() error {
	var errs []error
	for _, c := range e.clients {
		errs = append(errs, c.Close())
	}
	e.clients = nil
	return errors.Join(errs...)
}

// countHook counts round trips to Redis: one per command, one per pipeline.
type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// fleetServers is the number of hybrid.Limiters in the fleet row.
const fleetServers = 8

// rivals returns the limiters compared, in the report's order.
func rivals() []rival {
	return []rival{
		{
			Name: "go-redis PING", Module: "github.com/redis/go-redis/v9",
			Algorithm: "no limit: one PING per decision, the floor of any one-round-trip design",
			build: func(_ context.Context, env *redisEnv, _ spec) (decider, error) {
				return pingDecider{env.client(false)}, nil
			},
		},
		{
			Name: "article script", Module: "github.com/fleetlimit/fleetlimit",
			Algorithm: "the source article's token bucket (lua/bucket.lua) by EVALSHA per decision (global.Store.AllowN)",
			Bound:     "burst + rate·T", hasBound: true,
			build: func(_ context.Context, env *redisEnv, s spec) (decider, error) {
				store, err := global.New(env.client(true))
				if err != nil {
					return nil, fmt.Errorf("article script: %w", err)
				}
				lim, err := global.NewLimit("bench", float64(s.Rate), s.Burst)
				if err != nil {
					return nil, fmt.Errorf("article script: %w", err)
				}
				return scriptDecider{store, lim}, nil
			},
		},
		{
			Name: "redis_rate", Module: "github.com/go-redis/redis_rate/v10",
			Algorithm: "GCRA in one Lua script by EVALSHA per decision; Limit{Rate, Burst, Period: 1s}",
			Bound:     "burst + rate·T", hasBound: true,
			build: func(_ context.Context, env *redisEnv, s spec) (decider, error) {
				return redisRateDecider{
					redis_rate.NewLimiter(env.client(false)),
					redis_rate.Limit{Rate: s.Rate, Burst: s.Burst, Period: time.Second},
				}, nil
			},
		},
		{
			Name: "ulule/limiter", Module: "github.com/ulule/limiter/v3",
			Algorithm: "fixed window (INCRBY + PEXPIRE in one script by EVALSHA); burst per 1 s window, so rate = burst",
			Bound:     "burst · ⌈T / 1 s⌉ (windows start at the first hit), ≤ burst + rate·T", hasBound: true,
			build: func(_ context.Context, env *redisEnv, s spec) (decider, error) {
				if s.Rate != s.Burst {
					return nil, fmt.Errorf("ulule/limiter: a fixed window of 1 s needs rate = burst, got %d and %d", s.Rate, s.Burst)
				}
				store, err := ulredis.NewStore(env.client(false))
				if err != nil {
					return nil, fmt.Errorf("ulule/limiter store: %w", err)
				}
				return ululeDecider{limiter.New(store, limiter.Rate{Period: time.Second, Limit: int64(s.Burst)})}, nil
			},
		},
		{
			Name: "throttled", Module: "github.com/throttled/throttled/v2",
			Algorithm: "GCRA by compare-and-swap: pipelined TIME+GET, then EVAL of a CAS script (SETNX+EXPIRE for a new key), up to 10 attempts",
			Bound:     "burst + rate·T (MaxBurst = burst − 1: throttled admits MaxBurst + 1 at once)", hasBound: true,
			build: func(_ context.Context, env *redisEnv, s spec) (decider, error) {
				store, err := goredisstore.NewCtx(env.client(false), "bench:")
				if err != nil {
					return nil, fmt.Errorf("throttled store: %w", err)
				}
				l, err := throttled.NewGCRARateLimiterCtx(store, throttled.RateQuota{MaxRate: throttled.PerSec(s.Rate), MaxBurst: s.Burst - 1})
				if err != nil {
					return nil, fmt.Errorf("throttled: %w", err)
				}
				return throttledDecider{l}, nil
			},
		},
		{
			Name: "fleetlimit, 1 server", Module: "github.com/fleetlimit/fleetlimit",
			Algorithm: "hybrid.Limiter (FleetSize 1): local pre-check, tokens leased in batches by a Lua script, FailClosed",
			Bound:     "burst + rate·T: no lease is out at the start (docs/design.md §4; 2·burst + rate·T for any window)", hasBound: true,
			build: func(_ context.Context, env *redisEnv, s spec) (decider, error) { return newFleet(env, s, 1) },
		},
		{
			Name: fmt.Sprintf("fleetlimit, %d servers", fleetServers), Module: "github.com/fleetlimit/fleetlimit",
			Algorithm: fmt.Sprintf("%d hybrid.Limiters (FleetSize %d), each with its own client and breaker, requests spread round-robin", fleetServers, fleetServers),
			Bound:     "burst + rate·T: no lease is out at the start (docs/design.md §4; 2·burst + rate·T for any window)", hasBound: true,
			build: func(_ context.Context, env *redisEnv, s spec) (decider, error) { return newFleet(env, s, fleetServers) },
		},
	}
}

type pingDecider struct{ c *redis.Client }

func (p pingDecider) decide(ctx context.Context, _ uint64, _ string) (verdict, error) {
	if err := p.c.Ping(ctx).Err(); err != nil {
		return failed, err
	}
	return admitted, nil
}

func (p pingDecider) close(context.Context) error { return nil }

type scriptDecider struct {
	store *global.Store
	lim   global.Limit
}

func (s scriptDecider) decide(ctx context.Context, _ uint64, key string) (verdict, error) {
	r, err := s.store.AllowN(ctx, s.lim, key, 1)
	return allowed(r.Allowed, err)
}

func (s scriptDecider) close(context.Context) error { return nil }

type redisRateDecider struct {
	l   *redis_rate.Limiter
	lim redis_rate.Limit
}

func (r redisRateDecider) decide(ctx context.Context, _ uint64, key string) (verdict, error) {
	res, err := r.l.Allow(ctx, key, r.lim)
	if err != nil {
		return failed, err
	}
	return allowed(res.Allowed > 0, nil)
}

func (r redisRateDecider) close(context.Context) error { return nil }

type ululeDecider struct{ l *limiter.Limiter }

func (u ululeDecider) decide(ctx context.Context, _ uint64, key string) (verdict, error) {
	c, err := u.l.Get(ctx, key)
	return allowed(!c.Reached, err)
}

func (u ululeDecider) close(context.Context) error { return nil }

type throttledDecider struct{ l *throttled.GCRARateLimiterCtx }

func (t throttledDecider) decide(ctx context.Context, _ uint64, key string) (verdict, error) {
	limited, _, err := t.l.RateLimitCtx(ctx, key, 1)
	return allowed(!limited, err)
}

func (t throttledDecider) close(context.Context) error { return nil }

// allowed turns a limiter's answer into a verdict.
func allowed(ok bool, err error) (verdict, error) {
	switch {
	case err != nil:
		return failed, err
	case ok:
		return admitted, nil
	default:
		return denied, nil
	}
}

// fleet is n hybrid.Limiters, each a server with its own client, store and breaker.
type fleet struct{ lims []*hybrid.Limiter }

func newFleet(env *redisEnv, s spec, n int) (*fleet, error) {
	f := &fleet{}
	for i := range n {
		store, err := global.New(env.client(true))
		if err != nil {
			return nil, fmt.Errorf("fleetlimit server %d: %w", i, err)
		}
		l, err := hybrid.New(store, hybrid.Config{
			FleetSize: n,
			Limits:    []hybrid.Limit{{Name: "bench", Rate: float64(s.Rate), Burst: s.Burst, Policy: breaker.FailClosed}},
		})
		if err != nil {
			_ = f.close(context.Background())
			return nil, fmt.Errorf("fleetlimit server %d: %w", i, err)
		}
		f.lims = append(f.lims, l)
	}
	return f, nil
}

func (f *fleet) decide(ctx context.Context, seq uint64, key string) (verdict, error) {
	d, err := f.lims[seq%uint64(len(f.lims))].Allow(ctx, "bench", key)
	switch {
	case err != nil:
		return failed, err
	case d.Source == hybrid.SourceFallback:
		return fellBack, nil
	case d.Allowed:
		return admitted, nil
	default:
		return denied, nil
	}
}

// stats sums the servers' counters.
func (f *fleet) stats() hybrid.Stats {
	var sum hybrid.Stats
	for _, l := range f.lims {
		s := l.Stats()
		sum.Takes += s.Takes
		sum.RoundTrips += s.RoundTrips
		sum.RefillErrors += s.RefillErrors
		sum.Fallback += s.Fallback
		sum.Granted += s.Granted
	}
	return sum
}

func (f *fleet) close(ctx context.Context) error {
	var errs []error
	for _, l := range f.lims {
		errs = append(errs, l.Close(ctx))
	}
	return errors.Join(errs...)
}
