package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
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

// breakerCounter is a decider with breakers (fleetlimit's): how often they opened and
// how many calls timed out, since it was built.
type breakerCounter interface {
	breakerCounts() (opened, timeouts int64)
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
	// Kind is a fleetlimit row's kind of limit (kinds), "" for the others; Servers is
	// the fleet's size.
	Kind    string
	Servers int
	// heldTo, when set, is what the rival may admit of one key over run r, when that is
	// not burst + rate·T (Run.Bound).
	heldTo func(r Run) float64
	// unfit, when set, says why the rival cannot run a scenario's limit as specified
	// ("" when it can): the row is left out and the report says why.
	unfit func(s spec) string
	build func(ctx context.Context, env *redisEnv, s spec) (decider, error)
}

// held returns what rv may admit of one key over a run: heldTo, or burst + rate·T; nil
// for a rival that limits nothing.
func (rv rival) held() func(Run) float64 {
	switch {
	case !rv.hasBound:
		return nil
	case rv.heldTo != nil:
		return rv.heldTo
	}
	return Run.Bound
}

// whyUnfit says why rv cannot run limit s, "" when it can.
func (rv rival) whyUnfit(s spec) string {
	if rv.unfit == nil {
		return ""
	}
	return rv.unfit(s)
}

// redisEnv makes the go-redis clients the rivals use, each counting what it sends.
type redisEnv struct {
	addr    string
	calls   callCounts
	clients []*redis.Client
}

// callCounts are what the go-redis clients of a row sent to Redis, counted by a hook,
// connection set-up (HELLO, CLIENT SETINFO) included.
type callCounts struct {
	// trips counts round trips: one per command, one per pipeline.
	trips atomic.Int64
	// commands counts commands: one per command, each command of a pipeline too.
	commands atomic.Int64
	// scripts counts script runs: the commands of the EVAL family (EVAL, EVALSHA, their
	// _RO forms, FCALL) but those Redis answered NOSCRIPT, which ran nothing.
	scripts atomic.Int64
}

// callSnapshot is callCounts read at one instant.
type callSnapshot struct{ trips, commands, scripts int64 }

func (c *callCounts) snapshot() callSnapshot {
	return callSnapshot{c.trips.Load(), c.commands.Load(), c.scripts.Load()}
}

func (a callSnapshot) sub(b callSnapshot) callSnapshot {
	return callSnapshot{a.trips - b.trips, a.commands - b.commands, a.scripts - b.scripts}
}

// client returns a new go-redis client for the private Redis: go-redis's defaults, or
// the settings fleetlimit's global.Configure recommends (a Store requires them).
func (e *redisEnv) client(configured bool) *redis.Client {
	o := &redis.Options{Addr: e.addr}
	if configured {
		global.Configure(o)
	}
	c := redis.NewClient(o)
	c.AddHook(countHook{&e.calls})
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

// countHook counts what a client sends to Redis (callCounts).
type countHook struct{ n *callCounts }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.trips.Add(1)
		err := next(ctx, cmd)
		h.count(cmd)
		return err
	}
}

func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.trips.Add(1)
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			h.count(cmd)
		}
		return err
	}
}

// count counts one command sent, and a script run if it ran one.
func (h countHook) count(cmd redis.Cmder) {
	h.n.commands.Add(1)
	if isScript(cmd.Name()) && !isNoScript(cmd.Err()) {
		h.n.scripts.Add(1)
	}
}

// isScript reports whether a command (its name, as go-redis gives it: lower case) runs a
// script or a function.
func isScript(name string) bool {
	switch name {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
		return true
	}
	return false
}

// isNoScript reports whether err is Redis's NOSCRIPT: an EVALSHA of a script it does
// not hold, which ran nothing (the client then sends EVAL).
func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// fleetServers is the number of hybrid.Limiters in the fleet row.
const fleetServers = 8

// rivals returns the limiters compared, in the report's order.
func rivals() []rival {
	rvs := []rival{
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
	}
	for _, k := range kinds {
		for _, n := range []int{1, fleetServers} {
			rvs = append(rvs, fleetRival(k, n))
		}
	}
	return rvs
}

// kind is one kind of fleetlimit limit, as the comparison sets it up.
type kind struct {
	Name string
	mode hybrid.Mode
	// Algorithm and Bound are for the report's table of limiters.
	Algorithm, Bound string
	// over is what a fleet of n servers of this kind may admit of one key over run r
	// beyond burst + rate·T.
	over  func(r Run, n int) float64
	unfit func(s spec) string
}

// unasked is S·c of docs/limits.md: what n servers that do not yet know a key low may admit
// of it unasked, c = max(1, ⌈burst/n⌉) each.
func unasked(burst, n int) float64 { return float64(n * max(1, (burst+n-1)/n)) }

// The parameters of the kinds: ChargeLater's within and Windowed's report interval, the
// values docs/limits.md gives as its examples.
const (
	chargeWithin   = 100 * time.Millisecond
	windowedReport = 120 * time.Millisecond
)

// The bounds New puts on a windowed limit (engine.MinWindow, engine.MaxWindow).
const (
	minWindow = 100 * time.Millisecond
	maxWindow = 24 * time.Hour
)

// kinds are the kinds of fleetlimit limit the comparison runs, in the report's order.
// Every kind gets each scenario's rate and burst as they are.
var kinds = []kind{
	{
		Name: "bucket", mode: hybrid.Exact(),
		Algorithm: "the default kind (Exact): local pre-check, tokens leased from a token bucket in batches by a Lua script; a request its lease cannot serve waits for a refill",
		Bound:     "burst + rate·T: no lease is out at the start (docs/design.md §4; 2·burst + rate·T for any window)",
	},
	{
		Name: "charge-later", mode: hybrid.ChargeLater(chargeWithin),
		Algorithm: fmt.Sprintf("ChargeLater(%v): the bucket's leases; a request its lease cannot serve is admitted at once unless its key is known low, and charged to the bucket within %v (pipelined, by script)", chargeWithin, chargeWithin),
		Bound:     "burst + rate·T + S·c, S servers, c = max(1, ⌈burst/S⌉): no lease is out at the start, and each server admits at most c of a key uncharged (docs/limits.md, \"Charge later\"; 2·burst + rate·T + S·c for any window)",
		over:      func(r Run, n int) float64 { return unasked(r.Burst, n) },
	},
	{
		Name: "windowed", mode: hybrid.Windowed(windowedReport),
		Algorithm: fmt.Sprintf("Windowed(%v): burst per window of burst/rate, counted in Redis by pipelined BITFIELD INCRBY every %v, no script; keys decided locally within what their window has left", windowedReport, windowedReport),
		Bound:     "2·burst + rate·T + S·c, S servers, c = max(1, ⌈burst/S⌉): a burst per fixed window of burst/rate, at a phase of the key's own, so a run may span a window more than rate·T covers (docs/limits.md, \"Windowed limits\")",
		over:      func(r Run, n int) float64 { return float64(r.Burst) + unasked(r.Burst, n) },
		unfit: func(s spec) string {
			w := time.Duration(float64(s.Burst) / float64(s.Rate) * float64(time.Second))
			switch {
			case s.Burst > redisstore.MaxWindowBurst:
				return fmt.Sprintf("burst %d is over a windowed limit's largest (%d)", s.Burst, redisstore.MaxWindowBurst)
			case w < minWindow || w > maxWindow:
				return fmt.Sprintf("its window, burst/rate = %v, is not from %v to %v", w, minWindow, maxWindow)
			case 2*windowedReport > w:
				return fmt.Sprintf("its report interval %v is over half its window, burst/rate = %v", windowedReport, w)
			}
			return ""
		},
	},
}

// fleetRival is fleetlimit's row of kind k on n servers.
func fleetRival(k kind, n int) rival {
	rv := rival{
		Name: fmt.Sprintf("fleetlimit %s, %s", k.Name, servers(n)), Module: "github.com/fleetlimit/fleetlimit",
		Algorithm: fmt.Sprintf("hybrid.Limiter (FleetSize 1), FailClosed; %s", k.Algorithm),
		Bound:     k.Bound, hasBound: true,
		Kind: k.Name, Servers: n, unfit: k.unfit,
		build: func(_ context.Context, env *redisEnv, s spec) (decider, error) { return newFleet(env, s, n, k.mode) },
	}
	if k.over != nil {
		rv.heldTo = func(r Run) float64 { return r.Bound() + k.over(r, n) }
	}
	if n > 1 {
		rv.Algorithm = fmt.Sprintf("%d hybrid.Limiters (FleetSize %d) of the %s kind, each with its own client and breaker, requests spread round-robin", n, n, k.Name)
	}
	return rv
}

// servers says "1 server" or "n servers".
func servers(n int) string {
	if n == 1 {
		return "1 server"
	}
	return fmt.Sprintf("%d servers", n)
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

func newFleet(env *redisEnv, s spec, n int, mode hybrid.Mode) (*fleet, error) {
	f := &fleet{}
	for i := range n {
		store, err := global.New(env.client(true))
		if err != nil {
			return nil, fmt.Errorf("fleetlimit server %d: %w", i, err)
		}
		l, err := hybrid.New(store, hybrid.Config{
			FleetSize: n,
			Limits:    []hybrid.Limit{{Name: "bench", Rate: float64(s.Rate), Burst: s.Burst, Policy: breaker.FailClosed, Mode: mode}},
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

func (f *fleet) breakerCounts() (opened, timeouts int64) {
	for _, l := range f.lims {
		b := l.Stats().BreakerStats
		opened, timeouts = opened+b.Opened, timeouts+b.Timeouts
	}
	return opened, timeouts
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
