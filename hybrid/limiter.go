package hybrid

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/internal/engine"
	"github.com/fleetlimit/fleetlimit/internal/storeerr"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// Errors of the Limiter. Being denied is not an error, and neither is a Redis failure:
// the limit's failure policy decides, and the Decision says so.
var (
	// ErrInvalidConfig is wrapped by every error New returns for a configuration it
	// cannot honour; the error also wraps global.ErrInvalidLimit for a bad rate, burst
	// or name, and breaker.ErrNoPolicy for a limit without a failure policy.
	ErrInvalidConfig = errors.New("hybrid: invalid configuration")
	// ErrUnknownLimit is returned by Allow and AllowN for a limit name the Limiter was
	// not configured with.
	ErrUnknownLimit = errors.New("hybrid: unknown limit")
	// ErrInvalidCost is returned by AllowN for a negative cost.
	ErrInvalidCost = errors.New("hybrid: invalid cost")
	// ErrClosed is returned by Allow and AllowN once Close has been called.
	ErrClosed = errors.New("hybrid: limiter closed")
	// ErrUnknownTier is returned by AllowTier (and AllowMulti) for a tier the limit does
	// not have.
	ErrUnknownTier = errors.New("hybrid: unknown tier")
)

// InfDuration is the RetryAfter of a request that can never be allowed, such as one
// asking for more tokens than the limit's burst.
const InfDuration = time.Duration(math.MaxInt64)

// Limit is one named fleet-wide limit: Burst tokens refilled at Rate per second, held in
// Redis and shared by every server, one count per key (client, tenant, IP, ...); its
// Mode says how the servers count against it. Zero fields take the defaults their
// comments name; Name, Rate, Burst and Policy are required, so the zero Limit is invalid
// (New says why). New validates every field: a Limit it accepts never fails at request
// time.
type Limit struct {
	// Name identifies the limit in calls and in Redis keys: 1 to 64 printable ASCII bytes
	// without space, '{', '}', ':' or '#'. Every server gives a limit the same Name, Rate
	// and Burst.
	Name string
	// Rate is the fleet-wide refill rate, in tokens per second: finite and > 0.
	Rate float64
	// Burst is the fleet-wide bucket capacity, at least 1; the largest cost one request
	// may have.
	Burst int
	// Policy decides requests when Redis does not answer (breaker open, timeout, error):
	// breaker.FailOpen, breaker.FailClosed or breaker.FailLocal(). Required: there is no
	// default (docs/failure-policies.md helps choose).
	Policy breaker.Policy
	// Mode is the limit's kind: Exact() (the default), ChargeLater(within) or
	// Windowed(report). SetLimit refuses to change a limit's kind, or a Windowed limit's
	// report interval; a ChargeLater limit's duration may change (docs/limits.md).
	Mode Mode
	// PreRate and PreBurst set a tighter per-server pre-check, a local bucket per key
	// consulted before anything else, which stops a hot key on one server without Redis.
	// 0 means the limit's own Rate and Burst: one server never admits more than the fleet
	// may, so the default pre-check never denies what the global bucket would allow.
	PreRate  float64
	PreBurst int
	// MaxWait is the longest a decision waits for Redis: a refill not answered by then
	// sends the request to Policy. The Redis call itself runs to the breaker's Timeout, so
	// that the breaker counts a stalled Redis whatever the limits' MaxWait; a refill
	// answered after its requests gave up still fills the lease. default: 10ms
	MaxWait time.Duration
	// MaxCost is the largest cost passed to AllowN; it sizes the FailLocal burst so that
	// such a request is not always denied during an outage. default: 1
	MaxCost int
	// Lease tunes the batches of tokens this server leases from a key's bucket; the zero
	// LeaseTuning takes every default. A Windowed limit holds no leases: zero.
	Lease LeaseTuning
	// MaxKeys caps the keys held for this limit on this server (least recently used go
	// first; their leased tokens are refunded). default: 100,000
	MaxKeys int
	// Version orders changes of Rate and Burst (the limit's or a tier's) across the
	// fleet: each bucket runs on the highest Version a server took from it with. Give
	// every such change a higher one (a config revision, its Unix time); SetLimit refuses
	// one without. 0 suits a limit that never changes. At most 2^53 - 1. (docs/limits.md)
	Version uint64
	// Tiers are other rates and bursts for some keys, chosen per request (AllowTier,
	// Item.Tier): a paid plan, a customer's exception. A key keeps one bucket whatever
	// its tier (docs/limits.md). Names unique and not empty; the Limit's other fields
	// apply to every tier. A Windowed limit has none.
	Tiers []Tier
	// DryRun makes the limit watch without enforcing, to roll a new limit out safely:
	// every request is decided, counted (Stats, the metrics) and told to OnDecision as
	// usual, tokens are taken as usual, but a denial is turned into an admission with
	// Decision.WouldDeny set; the Logger gets a line per LogInterval with how many
	// requests it would have denied. In AllowMulti a DryRun item never blocks the
	// others. SetLimit can turn it off, to start enforcing, at run time.
	DryRun bool
}

// LeaseTuning tunes a limit's leases: the batches of tokens a server takes from a key's
// bucket in Redis and decides from without a round trip. Zero fields take the defaults
// their comments name.
type LeaseTuning struct {
	// RefillInterval is how long one batch should last at the key's demand on this
	// server; a batch is at most Burst / servers. At most 24h. default: 100ms
	RefillInterval time.Duration
	// Lifetime is how long leased tokens stay usable before they are refunded. At most
	// 24h, at least 1ms. default: 1s
	Lifetime time.Duration
	// LowWatermark is the fraction of a batch below which a lease fetches the next one
	// before it runs out, so the common path does not wait; at most 1, negative disables
	// it. default: 0.5
	LowWatermark float64
}

// Tier is a named rate and burst of a Limit, for the keys a caller decides under it.
// Zero PreRate and PreBurst mean the tier's own Rate and Burst, as for a Limit.
type Tier struct {
	Name     string
	Rate     float64
	Burst    int
	PreRate  float64
	PreBurst int
}

// engineLimit is l as the engine runs it: the same fields, the Mode as Async or
// Windowed. The engine validates it; the error is for what the engine cannot see as the
// user wrote it: a Lease on a Windowed limit.
func engineLimit(l Limit) (engine.LimitConfig, error) {
	if l.Mode.kind == modeWindowed && l.Lease != (LeaseTuning{}) {
		return engine.LimitConfig{}, fmt.Errorf("limit %q: Lease: a Windowed limit holds no leases, so Lease must be zero", l.Name)
	}
	c := engine.LimitConfig{
		Name: l.Name, Rate: l.Rate, Burst: l.Burst, Policy: l.Policy, PreRate: l.PreRate, PreBurst: l.PreBurst,
		MaxWait: l.MaxWait, MaxCost: l.MaxCost, RefillInterval: l.Lease.RefillInterval, Lifetime: l.Lease.Lifetime,
		LowWatermark: l.Lease.LowWatermark, MaxKeys: l.MaxKeys, Version: l.Version, DryRun: l.DryRun,
	}
	switch l.Mode.kind {
	case modeChargeLater:
		c.Async = l.Mode.d
	case modeWindowed:
		c.Windowed = l.Mode.d
	}
	for _, t := range l.Tiers {
		c.Tiers = append(c.Tiers, engine.TierConfig(t))
	}
	return c, nil
}

// limitOf is c as the user configures it.
func limitOf(c engine.LimitConfig) Limit {
	l := Limit{
		Name: c.Name, Rate: c.Rate, Burst: c.Burst, Policy: c.Policy, PreRate: c.PreRate, PreBurst: c.PreBurst,
		MaxWait: c.MaxWait, MaxCost: c.MaxCost, MaxKeys: c.MaxKeys, Version: c.Version, DryRun: c.DryRun,
		Lease: LeaseTuning{RefillInterval: c.RefillInterval, Lifetime: c.Lifetime, LowWatermark: c.LowWatermark},
	}
	switch {
	case c.Windowed != 0:
		l.Mode = Windowed(c.Windowed)
	case c.Async != 0:
		l.Mode = ChargeLater(c.Async)
	}
	for _, t := range c.Tiers {
		l.Tiers = append(l.Tiers, Tier(t))
	}
	return l
}

// Config configures a Limiter. FleetSize and at least one Limit are required; the other
// zero fields take the defaults their comments name. New copies what it needs: changing a
// Config after New changes nothing.
type Config struct {
	// Limits are the named limits; at least one, names unique.
	Limits []Limit
	// FleetSize is the number of servers sharing the limits. Required (>= 1). With Fleet
	// set it is only the first guess, used until the first heartbeat answers.
	FleetSize int
	// Fleet, if set, names the fleet in Redis: the Limiter announces itself there every
	// HeartbeatInterval (global.Store.Heartbeat) and divides by the live count, keeping the
	// last known count while Redis is down.
	Fleet string
	// HeartbeatInterval is how often the Limiter announces itself; a member is dropped
	// after three intervals without a heartbeat. default: 1s
	HeartbeatInterval time.Duration
	// Breaker guards the Redis calls. nil builds one with the breaker package's
	// defaults; share one breaker per Redis. On a Redis Cluster (the store's client is
	// a *redis.ClusterClient) the Limiter keeps one breaker per master, made with
	// Breaker's settings (breaker.Breaker.Settings) and named after the master's
	// address, so that a failed master fails only the keys whose slots it serves;
	// Breaker then guards the calls for which the client knows no master.
	Breaker *breaker.Breaker
	// Seed seeds the pacing jitter; 0 picks a random seed.
	Seed uint64
	// Clock is where the Limiter reads the time and sets its timers (the background
	// goroutine's wake-ups, MaxWait, Wait's sleeps); it is also the Clock of the breaker
	// New builds when Breaker is nil. nil means breaker.SystemClock. Tests pass their
	// own, for instance one that embeds SystemClock and freezes Now.
	Clock breaker.Clock
	// Logger, if set, hears of the rare events an operator needs: the breaker opening
	// and closing, leased tokens whose refund was lost, the live fleet size changing,
	// Redis refusing the scripts (an error that waiting will not cure), and, once at
	// start, a Redis that may evict the buckets (global.Store.CheckEviction). Never a
	// line per request; a kind of event that repeats is logged at most once per
	// LogInterval. nil: silent.
	Logger *slog.Logger
	// RequireNoEviction makes New check that Redis cannot evict the buckets
	// (global.Store.CheckEviction: every master of a Cluster) and refuse to start, with
	// an error wrapping ErrInvalidConfig, if it may (the error wraps global.ErrEvicting
	// too and names the fix) or if the check cannot tell (CONFIG refused, as managed
	// services often do, or no answer within 2 s). For limits that protect something
	// fragile: an evicted bucket comes back full, silently, and every failure policy
	// then admits more than its limit. Without it the Logger hears of it once at start.
	RequireNoEviction bool
	// LogInterval is the shortest time between two lines of one kind of repeated event
	// (lost refunds, refused scripts); the next line says how many were not logged.
	// default: 10s
	LogInterval time.Duration
	// OnDecision, if set, is called with every decision AllowN, Allow, WaitN and Wait
	// make, and once per AllowMulti call with its MultiDecision.Decision, on the
	// caller's goroutine, before they return; key is the request's key (the item's).
	// It runs on the hot path: keep it short and non-blocking. The Limiter's counters
	// (Stats) need no callback. nil: no call.
	OnDecision func(key string, d Decision)
}

// Source says which tier made a decision.
type Source uint8

// Decision sources.
const (
	// SourcePreCheck: the per-server pre-check denied the request; Redis was not asked.
	SourcePreCheck Source = iota + 1
	// SourceLease: decided from tokens this server already held (or denied while the key
	// is paced after contention); Redis was not asked.
	SourceLease
	// SourceGlobal: decided after waiting for a refill from the global bucket.
	SourceGlobal
	// SourceFallback: Redis did not answer; the limit's failure policy decided.
	SourceFallback
)

var sourceNames = [...]string{
	SourcePreCheck: "pre-check", SourceLease: "lease", SourceGlobal: "global", SourceFallback: "fallback",
}

// String returns the source's name, as in "pre-check" or "lease".
func (s Source) String() string {
	if int(s) < len(sourceNames) && sourceNames[s] != "" {
		return sourceNames[s]
	}
	return fmt.Sprintf("Source(%d)", uint8(s))
}

// Reason says why a decision was made.
type Reason uint8

// Decision reasons.
const (
	// ReasonNone is the zero Reason.
	ReasonNone Reason = iota
	// ReasonLease: served from tokens this server held.
	ReasonLease
	_ // a request waiting for a refill: never a decision's reason
	// ReasonPaced: no tokens on hand and the key is paced after contention on the global
	// bucket; this server does not ask again before RetryAfter.
	ReasonPaced
	// ReasonExceedsBurst: the request costs more than the limit's burst and can never pass.
	ReasonExceedsBurst
	// ReasonInvalidCost: the request's cost is negative.
	ReasonInvalidCost
	// ReasonPreCheck: the per-server pre-check bucket of the key is empty.
	ReasonPreCheck
	// ReasonGranted: a refill answered and the request was served from it.
	ReasonGranted
	// ReasonBreakerOpen: the breaker is open; no Redis call was made.
	ReasonBreakerOpen
	// ReasonTimeout: Redis did not answer within the limit's MaxWait.
	ReasonTimeout
	// ReasonUnavailable: the Redis call failed (connection, Redis error, overload).
	ReasonUnavailable
	// ReasonCanceled: the caller's context ended while waiting for Redis.
	ReasonCanceled
	// ReasonClosed: the Limiter is closed.
	ReasonClosed
	// ReasonAsync: admitted without asking Redis and counted later: charged to the
	// bucket within a ChargeLater limit's duration, or counted in the key's window with
	// the next report of a Windowed limit; the key was not known low here.
	ReasonAsync
)

var reasonNames = [...]string{
	ReasonNone: "none", ReasonLease: "lease",
	ReasonPaced: "paced after contention", ReasonExceedsBurst: "cost exceeds burst",
	ReasonInvalidCost: "invalid cost", ReasonPreCheck: "pre-check bucket empty",
	ReasonGranted: "refill granted", ReasonBreakerOpen: "breaker open", ReasonTimeout: "redis timeout",
	ReasonUnavailable: "redis unavailable", ReasonCanceled: "caller canceled", ReasonClosed: "limiter closed",
	ReasonAsync: "charged later",
}

// String returns the reason in a few words.
func (r Reason) String() string {
	if int(r) < len(reasonNames) && reasonNames[r] != "" {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// Decision is the answer to one request: a plain value, safe to keep and share. The zero
// Decision denies, with no source or reason (what AllowN returns with an error that
// happened before any tier was asked).
//
// Besides the answer it describes the limit, so that a handler can write rate-limit
// headers without its own copy of the configuration: the limit's Name, its Quota and
// Window (the bucket holds Quota tokens and refills them all in Window), and how long
// until the key's bucket is full again (Reset). Package httplimit maps these onto the
// standard HTTP headers.
type Decision struct {
	// Allowed reports whether the request may proceed.
	Allowed bool
	// Source is the tier that decided; Reason says why.
	Source Source
	Reason Reason
	// Remaining is the best known count of tokens left for the key, fleet-wide: tokens
	// this server holds plus what the bucket reported at its last grant. Other servers
	// spend from the same bucket, so it is an estimate; 0 when the fallback decided.
	Remaining int
	// RetryAfter, when the request is denied, is when it may pass (InfDuration: never).
	RetryAfter time.Duration
	// Servers is the live server count the limit was divided by.
	Servers int
	// Limit is the name of the limit asked; Tier the tier ("" for the limit's own
	// rate and burst).
	Limit string
	Tier  string
	// Quota is the limit's (the tier's) Burst: the most tokens the key's bucket holds.
	Quota int
	// Window is the time the bucket takes to refill from empty to Quota at the limit's
	// Rate (Burst / Rate): Quota per Window is the limit's long-run rate.
	Window time.Duration
	// Reset is how long until the key's bucket is full again, from Remaining at the
	// limit's Rate: 0 when Remaining is Quota, Window when the fallback decided (the
	// bucket's level is not known then).
	Reset time.Duration
	// WouldDeny reports that the limit, a DryRun one, denied the request, and that it
	// was admitted all the same: Allowed is true, RetryAfter 0, and Source and Reason
	// say why it would have been denied.
	WouldDeny bool
}

// decision is d, for the limit lm, as the user sees it.
func decision(lm *engine.Limit, tier string, d *engine.Decision) Decision {
	var out Decision
	out.set(lm, tier, d)
	return out
}

// set makes out d, for tier of the limit lm, as the user sees it; in place, for the hot
// path.
func (out *Decision) set(lm *engine.Limit, tier string, d *engine.Decision) {
	sh := lm.Shape(tier)
	*out = Decision{Allowed: d.Allowed, Remaining: d.Remaining, RetryAfter: d.RetryAfter,
		Source: Source(d.Source), Reason: Reason(d.Reason), Servers: d.Servers,
		Limit: lm.Name(), Tier: sh.Tier(), Quota: sh.Burst(), Window: sh.Window()}
	if out.Source == SourceFallback {
		out.Reset = out.Window
	} else {
		out.Reset = sh.RefillTime(out.Quota - out.Remaining)
	}
	if !out.Allowed && sh.DryRun() && out.Reason != ReasonInvalidCost && out.Reason != ReasonCanceled && out.Reason != ReasonClosed {
		out.Allowed, out.WouldDeny, out.RetryAfter = true, true, 0
	}
}

// Limiter is the two-tier limiter users call: for each request, a per-server pre-check,
// then tokens leased from the global Redis bucket in batches, refilled in the background
// (one refill in flight per key; refills of many keys share one pipelined round trip),
// and the limit's failure policy when Redis does not answer. docs/design.md describes
// the rules and the accuracy they give.
//
// The zero Limiter is not usable; build one with New. New starts one background
// goroutine (refills, refunds, lease expiry, heartbeats); Close stops it and refunds every
// unused leased token. Most callers use Allow, or Wait for work that should queue. A
// Limiter is safe for simultaneous use by multiple goroutines: decisions for different
// keys take no common lock.
type Limiter struct {
	eng   *engine.Engine
	store *global.Store
	nodes *nodes // the breakers: Config.Breaker, and one per master of a Cluster
	clock breaker.Clock

	onDecision  func(key string, d Decision)
	events      *events            // nil without a Logger
	cancelStart context.CancelFunc // ends the start-up work: Warm, and the eviction check
	ready       chan struct{}      // closed once Warm has returned
	readyErr    error              // Warm's error; read after ready

	closed    atomic.Bool
	wake      chan struct{} // buffered 1: the engine has I/O queued
	stop      chan struct{} // closed by Close
	wg        sync.WaitGroup
	closeDone chan struct{} // closed once the first Close has sent its refunds
	closeErr  error         // that Close's result; read after closeDone
}

// New returns a Limiter for the limits in cfg over store, or an error wrapping
// ErrInvalidConfig that says what is wrong. It starts the Limiter's background
// goroutine; call Close to stop it.
//
// The store may share the application's go-redis client even if that client retries
// timed-out commands (go-redis's default): the Limiter's calls recognise a replay and
// stay exact. global.New refuses such a client unless given global.RetryingClient(),
// so build the store with global.New(rdb, global.RetryingClient()). A client of its own,
// configured by global.Configure, also bounds how long a dead Redis holds a call.
func New(store *global.Store, cfg Config) (*Limiter, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidConfig)
	}
	if cfg.LogInterval < 0 {
		return nil, fmt.Errorf("%w: LogInterval %v is negative", ErrInvalidConfig, cfg.LogInterval)
	}
	if cfg.RequireNoEviction {
		ctx, cancel := context.WithTimeout(context.Background(), evictionCheckTimeout)
		err := store.CheckEviction(ctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("%w: RequireNoEviction: %w", ErrInvalidConfig, err)
		}
	}
	l := &Limiter{
		store:      store,
		clock:      cfg.Clock,
		onDecision: cfg.OnDecision,
		wake:       make(chan struct{}, 1),
		stop:       make(chan struct{}),
		closeDone:  make(chan struct{}),
	}
	if l.clock == nil {
		l.clock = breaker.SystemClock{}
	}
	brk := cfg.Breaker
	if brk == nil {
		b, err := breaker.New(breaker.Settings{Clock: l.clock})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		brk = b
	}
	l.nodes = newNodes(brk, store.Client())
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	limits := make([]engine.LimitConfig, len(cfg.Limits))
	for i, c := range cfg.Limits {
		var err error
		if limits[i], err = engineLimit(c); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	eng, err := engine.New(engine.Config{
		Limits:            limits,
		Servers:           cfg.FleetSize,
		Fleet:             cfg.Fleet,
		HeartbeatInterval: cfg.HeartbeatInterval,
		Seed:              seed,
		NextSeq:           store.NextSeq,
		BreakerOpen:       l.nodes.anyOpen,
		KeyOpen:           l.nodes.keyOpen,
		Notify:            l.poke,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	l.eng = eng
	start, cancel := context.WithCancel(context.Background())
	l.cancelStart = cancel
	l.ready = make(chan struct{})
	l.wg.Go(func() { // dials and script loads now, not on the first requests' time
		ctx, done := context.WithTimeout(start, warmTimeout)
		defer done()
		l.readyErr = l.store.Warm(ctx)
		close(l.ready)
	})
	if cfg.Logger != nil {
		l.events = newEvents(cfg.Logger, cmp.Or(cfg.LogInterval, defaultLogInterval), l.nodes, cfg.Fleet, eng.Servers(), eng.Limits)
		// Once, at start: a Redis that may evict the buckets breaks every policy silently.
		l.wg.Go(func() {
			ctx, done := context.WithTimeout(start, evictionCheckTimeout)
			defer done()
			l.events.eviction(l.store.CheckEviction(ctx))
		})
	}
	l.wg.Add(1)
	go l.run()
	return l, nil
}

// Ready waits until the Limiter has readied Redis and its client for the first
// requests (global.Store.Warm, which New starts: scripts loaded, connections open) and
// returns what that found: nil, or the error of a node it could not ready (ctx.Err()
// if ctx ends first). Call it before the service takes traffic, in its start-up or its
// readiness probe, so that the first requests cost what later ones do instead of a
// dial and a script load, which can run past the breaker's deadline on a healthy Redis
// and send them to their policy. The Limiter decides requests whatever Ready returns,
// before and after.
func (l *Limiter) Ready(ctx context.Context) error {
	select {
	case <-l.ready:
		return l.readyErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// poke wakes the background goroutine without blocking.
func (l *Limiter) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// run is the Limiter's background goroutine: it carries out the engine's round trips,
// one at a time, and ticks it.
func (l *Limiter) run() {
	defer l.wg.Done()
	for {
		select {
		case <-l.stop:
			l.eng.Stop(l.clock.Now())
			return
		default:
		}
		now := l.clock.Now()
		watch := l.nodes.recheck(context.Background(), now)
		l.eng.Tick(now)
		if t := l.eng.Next(); t != nil {
			l.do(context.Background(), t)
			l.eng.Done(l.clock.Now(), t)
			if l.events != nil {
				l.events.trip(l.clock.Now(), t, l.eng.Servers())
			}
			continue
		}
		if l.events != nil {
			l.events.breaker()
			l.events.dryRuns(now)
		}
		wait := max(l.eng.NextTick().Sub(now), time.Millisecond)
		if watch {
			wait = min(wait, recheckEvery)
		}
		stop := l.clock.AfterFunc(wait, l.poke)
		select {
		case <-l.stop:
			stop()
			l.eng.Stop(l.clock.Now())
			return
		case <-l.wake:
			stop()
		}
	}
}

// do makes the round trip t through the breakers and writes its answers into t. Each
// item goes through the breaker of the node that holds its key (nodes): on a Redis
// Cluster the items of each master are a call of their own, made at once with the
// others', and one master's failure fails only its items; the trip is answered if any
// part was. The call's deadline is the breaker's own Timeout (or ctx's, if shorter),
// never a limit's MaxWait: a request waits at most its MaxWait (then its policy
// decides), but the refill may finish later and still fill the lease. With the limit's
// MaxWait as a caller deadline, a MaxWait near or below the breaker's MinCountedTimeout
// would make every timeout look like the caller's own impatience, and a stalled Redis
// would never open the breaker.
//
// A call may outlive Do (the breaker returns at its deadline): it then writes only
// into memory nothing reads once Do has failed.
func (l *Limiter) do(ctx context.Context, t *engine.Trip) {
	switch t.Kind {
	case engine.TakeTrip:
		parts := l.nodes.split(ctx, len(t.Takes), func(i int) string {
			r := &t.Takes[i]
			return wire.BucketKeyOfID("", r.Limit.Name, cmp.Or(string(r.ID), wire.KeyID(r.Key)))
		})
		run(parts, func(p *part) {
			reqs, out := pick(t.Takes, p), pick(t.TakeResults, p)
			if len(reqs) == 1 {
				var g global.Grant
				p.err = p.nd.brk.Do(ctx, func(ctx context.Context) error {
					var err error
					g, err = l.store.TakeOne(ctx, reqs[0]) // a refill, or a reservation's claim (Floor)
					return err
				})
				if p.answered = p.err == nil; p.answered {
					out[0].Grant, out[0].Err = g, nil
				}
			} else {
				p.answered, p.err = doBatch(ctx, p.nd.brk, func(ctx context.Context) error { return l.store.TakeBatch(ctx, reqs, out) })
			}
			settle(t.TakeResults, p, out, func(r *global.TakeResult, err error) { r.Err = err })
		})
		t.Answered, t.Err = outcome(parts)
	case engine.RefundTrip:
		parts := l.nodes.split(ctx, len(t.Refunds), func(i int) string {
			r := &t.Refunds[i]
			return wire.BucketKeyOfID("", r.Limit.Name, cmp.Or(string(r.ID), wire.KeyID(r.Key)))
		})
		run(parts, func(p *part) {
			reqs, out := pick(t.Refunds, p), pick(t.RefundResults, p)
			p.answered, p.err = doBatch(ctx, p.nd.brk, func(ctx context.Context) error { return l.store.RefundBatch(ctx, reqs, out) })
			settle(t.RefundResults, p, out, func(r *global.RefundResult, err error) { r.Err = err })
		})
		t.Answered, t.Err = outcome(parts)
	case engine.HeartbeatTrip:
		parts := l.nodes.split(ctx, 1, func(int) string { return wire.FleetKey("", t.Fleet) })
		var live int
		t.Err = parts[0].nd.brk.Do(ctx, func(ctx context.Context) error {
			var err error
			live, err = l.store.Heartbeat(ctx, t.Fleet, l.store.ServerID(), t.TTL)
			return err
		})
		if t.Err == nil {
			t.Live, t.Answered = live, true
		}
	case engine.LowTrip:
		// Each call works on its own slices, read only once it has returned (answered):
		// it may outlive the breaker's deadline.
		parts := l.nodes.split(ctx, len(t.Lows), func(i int) string { return wire.LowKey("", t.Lows[i].Limit) })
		run(parts, func(p *part) {
			lows := pick(t.Lows, p)
			got, errs := make([][]global.KeyID, len(lows)), make([]error, len(lows))
			p.answered, p.err = doBatch(ctx, p.nd.brk, func(ctx context.Context) error {
				var first error
				for i, x := range lows { // each limit on its own: one's error does not stop the rest
					got[i], errs[i] = l.store.Low(ctx, x.Limit, x.Mark, x.Unmark, engine.LowShare)
					first = cmp.Or(first, errs[i])
				}
				return first
			})
			each(p, len(lows), func(k, i int) {
				if p.answered {
					t.Lows[i].Got, t.Lows[i].Err = got[k], errs[k]
				} else if p.idx != nil {
					t.Lows[i].Err = p.err
				}
			})
		})
		t.Answered, t.Err = outcome(parts)
	case engine.WindowsTrip:
		// As for LowTrip, each call works on copies, read once it has returned.
		parts := l.nodes.split(ctx, len(t.Windows), func(i int) string { return wire.WindowKey("", t.Windows[i].Limit.Name, 0, 0) })
		run(parts, func(p *part) {
			wins := pick(t.Windows, p)
			trips, errs := make([]global.WindowTrip, len(wins)), make([]error, len(wins))
			for k, x := range wins {
				x.Ops = slices.Clone(x.Ops)
				trips[k] = x
			}
			p.answered, p.err = doBatch(ctx, p.nd.brk, func(ctx context.Context) error {
				var first error
				for k := range trips { // each limit on its own: one's error does not stop the rest
					errs[k] = l.store.Windows(ctx, &trips[k])
					first = cmp.Or(first, errs[k])
				}
				return first
			})
			each(p, len(wins), func(k, i int) {
				if p.answered {
					t.Windows[i], t.WindowErrs[i] = trips[k], errs[k]
				} else if p.idx != nil {
					t.WindowErrs[i] = p.err
				}
			})
		})
		t.Answered, t.Err = outcome(parts)
	}
}

// settle writes part p's answers (out, from pick) into the trip's results all; a part
// of several that was not answered gets its error in each of its items (fail), so that
// the trip, answered by the other parts, reads it there. A part that is the whole trip
// and was not answered leaves all alone: the call may still be writing into it.
func settle[T any](all []T, p *part, out []T, fail func(r *T, err error)) {
	if p.idx == nil {
		return // out is all
	}
	for k, i := range p.idx {
		if p.answered {
			all[i] = out[k]
		} else {
			fail(&all[i], p.err)
		}
	}
}

// doBatch runs one batch call (TakeBatch, RefundBatch, or a low-key exchange per
// limit, writing each item's answer to its out) through the breaker brk. An item that
// found the store unavailable fails the call for the breaker to count; other item
// errors are read from out. answered reports that the call itself returned with
// answers, so out holds every item's answer even when err is set; if not (breaker open,
// deadline), out must not be read: the call may still be running. A call that returns
// once the breaker's deadline passed, with that deadline as its error, has no answers
// either (Do may read its result as it gives up): what it sent may have run in Redis or
// not, so a refund or debt trip goes again with its sequence numbers, never owed again
// as if refused. A deadline of one node's items before the breaker's stays theirs: the
// other items' answers are read.
func doBatch(ctx context.Context, brk *breaker.Breaker, call func(ctx context.Context) error) (answered bool, err error) {
	var done atomic.Bool
	err = brk.Do(ctx, func(ctx context.Context) error {
		err := call(ctx)
		if ctx.Err() != nil && storeerr.IsTimeout(err) {
			return err // the whole call ran out of time: no answers
		}
		done.Store(true)
		if global.IsUnavailable(err) {
			return err
		}
		return nil
	})
	return done.Load(), err
}

// Allow is shorthand for AllowN(ctx, limit, key, 1).
func (l *Limiter) Allow(ctx context.Context, limit, key string) (Decision, error) {
	return l.AllowN(ctx, limit, key, 1)
}

// AllowN decides whether a request of cost n for key may proceed under the named limit,
// taking its n tokens atomically (all or none). It waits for Redis only when this server
// holds no tokens for the key, at most the limit's MaxWait and never past ctx.
//
// The error is non-nil only for a misuse (ErrUnknownLimit, ErrInvalidCost), after Close
// (ErrClosed), or when ctx ends while waiting (ctx.Err()); the Decision then denies. A
// Redis failure is not an error: the limit's policy decides, and the Decision says so.
// Cost 0 is allowed and spends nothing; on a key this server never asked Redis about, its
// Remaining is the burst (nothing is known against a full bucket).
func (l *Limiter) AllowN(ctx context.Context, limit, key string, n int) (Decision, error) {
	return l.allowN(ctx, limit, "", key, n, l.onDecision)
}

// AllowTier is AllowN for a key of the named tier of the limit (Limit.Tiers; "" is the
// limit's own rate and burst): the key's bucket holds the tier's Burst and refills at
// its Rate. A key decided under another tier than before is re-shaped first: this
// server gives back the tokens it leased for the key, its pre-check takes the tier's
// rate and burst, and its bucket in Redis takes them at the next refill, on Redis's
// clock and never adding tokens (docs/limits.md). ErrUnknownTier for a tier the limit
// does not have.
func (l *Limiter) AllowTier(ctx context.Context, limit, tier, key string, n int) (Decision, error) {
	return l.allowN(ctx, limit, tier, key, n, l.onDecision)
}

// allowN is AllowTier telling hook (nil: nobody) of the decision.
func (l *Limiter) allowN(ctx context.Context, limit, tier, key string, n int, hook func(string, Decision)) (Decision, error) {
	lm := l.eng.Limit(limit)
	switch {
	case lm == nil:
		return Decision{RetryAfter: InfDuration, Limit: limit, Tier: tier}, ErrUnknownLimit
	case tier != "" && !lm.HasTier(tier):
		return Decision{RetryAfter: InfDuration, Limit: limit, Tier: tier}, ErrUnknownTier
	case n < 0:
		d := engine.Decision{Reason: engine.ReasonInvalidCost, RetryAfter: InfDuration}
		return decision(lm, tier, &d), ErrInvalidCost
	case l.closed.Load():
		return Decision{Reason: ReasonClosed, Limit: limit, Tier: tier}, ErrClosed
	}
	var d engine.Decision
	if w := l.eng.Decide(l.clock.Now(), lm, tier, key, n, &d); w != nil {
		return l.wait(ctx, lm, tier, key, w, hook)
	}
	if d.Reason == engine.ReasonClosed {
		return Decision{Reason: ReasonClosed, Limit: limit, Tier: tier}, ErrClosed
	}
	var out Decision
	out.set(lm, tier, &d)
	if hook != nil {
		hook(key, out)
	}
	return out, nil
}

// result is d, for key under tier of lm, as AllowN returns it with err; it tells hook.
func (l *Limiter) result(lm *engine.Limit, tier, key string, d *engine.Decision, err error, hook func(string, Decision)) (Decision, error) {
	if d.Reason == engine.ReasonClosed {
		return Decision{Reason: ReasonClosed, Limit: lm.Name(), Tier: tier}, ErrClosed
	}
	var out Decision
	out.set(lm, tier, d)
	if hook != nil {
		hook(key, out)
	}
	return out, err
}

// wait waits for the decision of a request that waits for a refill (await), and
// returns it as AllowN does.
func (l *Limiter) wait(ctx context.Context, lm *engine.Limit, tier, key string, w *engine.Waiter, hook func(string, Decision)) (Decision, error) {
	d, err := l.await(ctx, w)
	return l.result(lm, tier, key, &d, err, hook)
}

// await waits for the decision of a request that waits for a refill: the engine's, or
// the policy's once the limit's MaxWait has passed, or a denial with ctx.Err() once ctx
// ends.
func (l *Limiter) await(ctx context.Context, w *engine.Waiter) (engine.Decision, error) {
	select {
	case <-w.Done(): // decided already
		return w.Decision(), nil
	default:
	}
	expired := make(chan struct{})
	stop := l.clock.AfterFunc(w.Limit().Config().MaxWait, func() { close(expired) })
	defer stop()
	select {
	case <-w.Done():
		return w.Decision(), nil
	case <-expired:
		return l.eng.GiveUp(l.clock.Now(), w, engine.ReasonTimeout), nil
	case <-ctx.Done():
		d := l.eng.GiveUp(l.clock.Now(), w, engine.ReasonCanceled)
		if d.Reason == engine.ReasonCanceled { // not decided just before
			return d, ctx.Err()
		}
		return d, nil
	}
}

// errNotSent explains refunds queued while Close was sending the last ones.
var errNotSent = errors.New("queued after Close sent its last refunds")

// Close stops the background goroutine, fails the refills not yet sent, and gives every
// unused leased token back to its bucket (in as few calls as it can, bounded by ctx).
// Calls after Close return ErrClosed. The error reports tokens that could not be
// refunded.
//
// Close may be called more than once, also concurrently: the first call does the work,
// bounded by its own ctx, and every call returns only once that work is done, with the
// same result. A call whose ctx ends first returns at once with an error wrapping
// ctx.Err(); the refunds go on under the first call's ctx.
func (l *Limiter) Close(ctx context.Context) error {
	if l.closed.Swap(true) {
		select {
		case <-l.closeDone:
			return l.closeErr
		default:
		}
		select {
		case <-l.closeDone:
			return l.closeErr
		case <-ctx.Done():
			return fmt.Errorf("hybrid: Close still refunding in another call: %w", ctx.Err())
		}
	}
	l.closeErr = l.close(ctx)
	close(l.closeDone)
	return l.closeErr
}

// close is the work of the first Close.
func (l *Limiter) close(ctx context.Context) error {
	close(l.stop)
	l.cancelStart()
	// The engine is stopped, and its last round trip answered; a loop that does not get
	// there (a Redis call that ignores its deadline) does not hold Close past ctx.
	stopped := make(chan struct{})
	go func() {
		l.wg.Wait()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		select {
		case <-stopped: // both ready: the loop did stop
		default:
			return fmt.Errorf("hybrid: Close: the limiter's loop did not stop: %w", ctx.Err())
		}
	}
	l.eng.Drain()
	lost := 0
	var firstErr error
	for ctx.Err() == nil {
		t := l.eng.Next()
		if t == nil {
			break
		}
		l.do(ctx, t)
		l.eng.Done(l.clock.Now(), t)
		n, err := t.Lost()
		lost += n
		firstErr = cmp.Or(firstErr, err)
	}
	if n := l.eng.Finish(); n > 0 {
		lost += n
		firstErr = cmp.Or(firstErr, ctx.Err(), errNotSent)
	}
	if lost > 0 {
		return fmt.Errorf("hybrid: %d leased tokens not refunded: %w", lost, firstErr)
	}
	return nil
}
