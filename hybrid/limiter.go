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
	"github.com/fleetlimit/fleetlimit/internal/linger"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/storeerr"
	"github.com/fleetlimit/fleetlimit/internal/sysclock"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// Errors of the Limiter. A denial, or a Redis failure, is not an error.
var (
	// ErrInvalidConfig is wrapped by every error New returns, with global.ErrInvalidLimit
	// or breaker.ErrNoPolicy where those say more.
	ErrInvalidConfig = errors.New("hybrid: invalid configuration")
	// ErrUnknownLimit is returned for a limit name the Limiter does not have.
	ErrUnknownLimit = errors.New("hybrid: unknown limit")
	// ErrInvalidCost is returned by AllowN for a negative cost.
	ErrInvalidCost = errors.New("hybrid: invalid cost")
	// ErrClosed is returned once Close has been called.
	ErrClosed = errors.New("hybrid: limiter closed")
	// ErrUnknownTier is returned for a tier the limit does not have.
	ErrUnknownTier = errors.New("hybrid: unknown tier")
)

// InfDuration is the RetryAfter of a request that can never be allowed.
const InfDuration = time.Duration(math.MaxInt64)

// Limit is one named fleet-wide limit: Burst tokens refilled at Rate per second, one
// bucket per key (client, tenant, IP, ...) shared by every server. Name, Rate, Burst and
// Policy are required; zero fields take the defaults their comments name. New validates
// every field: a Limit it accepts never fails at request time.
type Limit struct {
	// Name identifies the limit in calls and in Redis keys: 1 to 64 printable ASCII bytes
	// without space, '{', '}', ':' or '#'. Every server gives it the same Name, Rate,
	// Burst.
	Name string
	// Rate is the fleet-wide refill rate, in tokens per second: finite and > 0.
	Rate float64
	// Burst is the fleet-wide bucket capacity (>= 1), the largest cost of one request.
	Burst int
	// Policy decides requests when Redis does not answer: breaker.FailOpen, FailClosed or
	// FailLocal(). Required (docs/failure-policies.md helps choose).
	Policy breaker.Policy
	// Mode is the limit's kind: Exact() (the default), ChargeLater or Windowed.
	Mode Mode
	// PreRate and PreBurst set a tighter per-server pre-check per key, which stops a hot
	// key on one server without Redis. 0: the limit's own Rate and Burst.
	PreRate  float64
	PreBurst int
	// MaxWait is the longest a decision waits for Redis before Policy decides. default:
	// 10ms
	MaxWait time.Duration
	// MaxCost is the largest cost passed to AllowN; it sizes the FailLocal burst.
	// default: 1
	MaxCost int
	// Lease tunes the batches of tokens leased from a key's bucket (zero for Windowed).
	Lease LeaseTuning
	// MaxKeys caps the keys held on this server, least recently used out. default:
	// 100,000
	MaxKeys int
	// Version orders changes of Rate and Burst across the fleet: give each change a
	// higher one (a config revision, its Unix time). 0 suits a limit that never changes.
	Version uint64
	// Tiers are other rates and bursts for some keys, chosen per request (AllowTier,
	// Item.Tier). Names unique and not empty. A Windowed limit has none.
	Tiers []Tier
	// DryRun makes the limit watch without enforcing: a denial is admitted with
	// Decision.WouldDeny set, and counted and logged as a denial.
	DryRun bool
}

// LeaseTuning tunes the batches of tokens a server leases from a key's bucket. Zero
// fields take the defaults their comments name.
type LeaseTuning struct {
	// RefillInterval is how long one batch should last at the key's demand; a key whose
	// bucket has room to spare for every server gets batches of 25 intervals (at most
	// two and a half Lifetimes), so that a key far within its limit costs fewer takes.
	// default: 100ms
	RefillInterval time.Duration
	// Lifetime is how long leased tokens stay usable before they are refunded; five
	// Lifetimes for tokens whose grant left the key's bucket holding twice them for every
	// server (a key far within its limit). default: 1s
	Lifetime time.Duration
	// LowWatermark is the fraction of a batch left when the next is fetched. default: 0.5
	LowWatermark float64
}

// Tier is a named rate and burst of a Limit for some keys; zero PreRate and PreBurst mean
// its own.
type Tier struct {
	Name     string
	Rate     float64
	Burst    int
	PreRate  float64
	PreBurst int
}

// engineLimit is lim as the engine runs it on the Limiter's client: the same fields, the
// Mode as Async or Windowed, and a Windowed limit counted in wire.WindowShards shards on
// a Redis Cluster, whose tags spread its Redis work over every master (one shard, the
// unsharded format, elsewhere). The engine validates it; the error is for what the
// engine cannot see as the user wrote it: a Lease on a Windowed limit.
func (l *Limiter) engineLimit(lim Limit) (engine.LimitConfig, error) {
	if lim.Mode.kind == modeWindowed && lim.Lease != (LeaseTuning{}) {
		return engine.LimitConfig{}, fmt.Errorf("limit %q: Lease: a Windowed limit holds no leases, so Lease must be zero", lim.Name)
	}
	c := engine.LimitConfig{
		Name: lim.Name, Rate: lim.Rate, Burst: lim.Burst, Policy: lim.Policy, PreRate: lim.PreRate, PreBurst: lim.PreBurst,
		MaxWait: lim.MaxWait, MaxCost: lim.MaxCost, RefillInterval: lim.Lease.RefillInterval, Lifetime: lim.Lease.Lifetime,
		LowWatermark: lim.Lease.LowWatermark, MaxKeys: lim.MaxKeys, Version: lim.Version, DryRun: lim.DryRun,
	}
	switch lim.Mode.kind {
	case modeChargeLater:
		c.Async = lim.Mode.d
		if l.nodes.cc != nil {
			c.LowShards = wire.LowShards
		}
	case modeWindowed:
		c.Windowed = lim.Mode.d
		if l.nodes.cc != nil {
			c.WindowShards = wire.WindowShards
		}
	}
	for _, t := range lim.Tiers {
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

// Config configures a Limiter. FleetSize and at least one Limit are required; zero fields
// take the defaults their comments name.
type Config struct {
	// Limits are the named limits; at least one, names unique.
	Limits []Limit
	// FleetSize is the number of servers sharing the limits (>= 1); with Fleet set, the
	// first guess until a heartbeat answers.
	FleetSize int
	// Fleet, if set, names the fleet in Redis: the Limiter announces itself there and
	// divides the limits by the live count.
	Fleet string
	// HeartbeatInterval is how often the Limiter announces itself: at least 1ms.
	// default: 1s
	HeartbeatInterval time.Duration
	// Breaker guards the Redis calls; nil builds one with the defaults. Share one per
	// Redis. On a Redis Cluster each master gets its own, made with Breaker's settings.
	Breaker *breaker.Breaker
	// Seed seeds the pacing jitter; 0 picks a random seed.
	Seed uint64
	// Clock is the Limiter's time and timers, for tests. nil: the system clock. Its
	// instants must lie within the years 1678 to 2261, where time.Time.UnixNano holds
	// them: the engine keeps a key's instants as Unix nanoseconds. New refuses a Clock
	// that reads a year outside them.
	Clock breaker.Clock
	// Logger, if set, hears of the rare events an operator needs; never a line per
	// request.
	Logger *slog.Logger
	// RequireNoEviction makes New refuse to start unless Redis cannot evict the buckets
	// (global.Store.CheckEviction).
	RequireNoEviction bool
	// LogInterval is the shortest time between two lines of one kind of event. default:
	// 10s
	LogInterval time.Duration
	// OnDecision, if set, is called with the decision of every Allow, AllowN, AllowTier,
	// WaitN and AllowMulti call (once per AllowMulti call; not ReserveN's, whose
	// Reservation carries it), on the caller's goroutine before it returns: keep it
	// short.
	OnDecision func(key string, d Decision)
}

// Source says which tier made a decision.
type Source uint8

// Decision sources.
const (
	// SourcePreCheck: the per-server pre-check denied the request; Redis was not asked.
	SourcePreCheck Source = iota + 1
	// SourceLease: decided from tokens this server held; Redis was not asked.
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

// Decision reasons. The zero Reason ("none") is that of a Decision no tier made: with
// ErrUnknownLimit, or ErrWouldExceedDeadline for a reservation (a denial has its own).
// ErrInvalidCost, ErrClosed and the context's errors come with reasons String names
// ("invalid cost", "limiter closed", "caller canceled") for metrics; check the error.
const (
	_ Reason = iota
	// ReasonLease: served from tokens this server held.
	ReasonLease
	_ // a request waiting for a refill: never a decision's reason
	// ReasonPaced: no tokens on hand and the key is paced after contention.
	ReasonPaced
	// ReasonExceedsBurst: the request costs more than the limit's burst and can never pass.
	ReasonExceedsBurst
	reasonInvalidCost // the request's cost is negative: ErrInvalidCost
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
	reasonCanceled // the caller's context ended while waiting for Redis: ctx.Err()
	reasonClosed   // the Limiter is closed: ErrClosed
	// ReasonAsync: admitted at once and counted later (ChargeLater, Windowed).
	ReasonAsync
)

var reasonNames = [...]string{
	0: "none", ReasonLease: "lease",
	ReasonPaced: "paced after contention", ReasonExceedsBurst: "cost exceeds burst",
	reasonInvalidCost: "invalid cost", ReasonPreCheck: "pre-check bucket empty",
	ReasonGranted: "refill granted", ReasonBreakerOpen: "breaker open", ReasonTimeout: "redis timeout",
	ReasonUnavailable: "redis unavailable", reasonCanceled: "caller canceled", reasonClosed: "limiter closed",
	ReasonAsync: "charged later",
}

// String returns the reason in a few words.
func (r Reason) String() string {
	if int(r) < len(reasonNames) && reasonNames[r] != "" {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// Decision is the answer to one request: a plain value. The zero Decision denies. Besides
// the answer it describes the limit (Quota, Window, Reset), so that a handler can write
// rate-limit headers; package httplimit does.
type Decision struct {
	// Allowed reports whether the request may proceed.
	Allowed bool
	// Source is the tier that decided; Reason says why.
	Source Source
	Reason Reason
	// Remaining is an estimate of the tokens left for the key, fleet-wide.
	Remaining int
	// RetryAfter, when the request is denied, is when it may pass (InfDuration: never).
	RetryAfter time.Duration
	// Servers is the live server count the limit was divided by.
	Servers int
	// Limit and Tier name the limit and tier asked.
	Limit string
	Tier  string
	// Quota is the limit's (tier's) Burst; Window the time it takes to refill
	// (Burst/Rate).
	Quota  int
	Window time.Duration
	// Reset is how long until the key's bucket is full again.
	Reset time.Duration
	// WouldDeny reports that a DryRun limit denied the request and it was admitted.
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
	// Field by field: a composite literal assigned through a pointer is built in a
	// temporary and copied, 96 bytes more to move on every decision.
	out.Allowed, out.Source, out.Reason = d.Allowed, Source(d.Source), Reason(d.Reason)
	out.Remaining, out.RetryAfter, out.Servers = d.Remaining, d.RetryAfter, d.Servers
	out.Limit, out.Tier, out.Quota, out.Window = lm.Name(), sh.Tier(), sh.Burst(), sh.Window()
	out.WouldDeny = false
	if out.Source == SourceFallback {
		out.Reset = out.Window
	} else {
		out.Reset = sh.RefillTime(out.Quota - out.Remaining)
	}
	if !out.Allowed && sh.DryRun() && out.Reason != reasonInvalidCost && out.Reason != reasonCanceled && out.Reason != reasonClosed {
		out.Allowed, out.WouldDeny, out.RetryAfter = true, true, 0
	}
}

// Limiter is the two-tier limiter users call (docs/design.md). Build one with New and
// stop it with Close. A Limiter is safe for concurrent use.
type Limiter struct {
	eng   *engine.Engine
	store *redisstore.Store
	nodes *nodes // the breakers: Config.Breaker, and one per master of a Cluster
	clock breaker.Clock
	sys   bool // clock is the system clock (nanos)

	onDecision  func(key string, d Decision)
	events      *events            // nil without a Logger
	cancelStart context.CancelFunc // ends the start-up work: Warm, and the eviction check
	ready       chan struct{}      // closed once Warm has returned
	repsRead    chan struct{}      // closed once the first record of representations is done
	repsOnce    sync.Once
	readyErr    error // Warm's error; read after ready

	closed    atomic.Bool
	wake      chan struct{} // buffered 1: the engine has I/O queued
	stop      chan struct{} // closed by Close
	wg        sync.WaitGroup
	lingering sync.WaitGroup // take calls, which may outlive their Do (lateTake)
	closeDone chan struct{}  // closed once the first Close has sent its refunds
	closeErr  error          // that Close's result; read after closeDone

	reconfMu sync.Mutex // one Reconfigure at a time: each all or nothing
}

// New returns a Limiter for the limits in cfg over store, or an error wrapping
// ErrInvalidConfig that says what is wrong. Call Close to stop it.
func New(store *global.Store, cfg Config) (*Limiter, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidConfig)
	}
	if cfg.LogInterval < 0 {
		return nil, fmt.Errorf("%w: LogInterval %v is negative", ErrInvalidConfig, cfg.LogInterval)
	}
	if cfg.Clock != nil {
		if y := cfg.Clock.Now().Year(); y < 1678 || y > 2261 {
			return nil, fmt.Errorf("%w: Clock reads the year %d, outside the years 1678 to 2261 that Unix nanoseconds hold", ErrInvalidConfig, y)
		}
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
		store:      redisstore.Of(store),
		clock:      cfg.Clock,
		onDecision: cfg.OnDecision,
		wake:       make(chan struct{}, 1),
		stop:       make(chan struct{}),
		closeDone:  make(chan struct{}),
	}
	if l.clock == nil {
		l.clock = sysclock.Clock{}
	}
	_, l.sys = l.clock.(sysclock.Clock)
	brk := cfg.Breaker
	if brk == nil {
		b, err := breaker.New(breaker.Settings{Clock: l.clock})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		brk = b
	}
	l.nodes = newNodes(brk, l.store.Client())
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	limits := make([]engine.LimitConfig, len(cfg.Limits))
	for i, c := range cfg.Limits {
		var err error
		if limits[i], err = l.engineLimit(c); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	eng, err := engine.New(engine.Config{
		Limits:            limits,
		Servers:           cfg.FleetSize,
		Fleet:             cfg.Fleet,
		HeartbeatInterval: cfg.HeartbeatInterval,
		Seed:              seed,
		NextSeq:           l.store.NextSeq,
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
	l.repsRead = make(chan struct{})
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

// Ready waits until the Limiter has readied Redis for its first requests (scripts loaded,
// connections open, the fleet's record read) and returns what it found, or ctx.Err().
// Call it before the service takes traffic, so that the first requests cost what later
// ones do. The Limiter decides requests whatever Ready returns.
func (l *Limiter) Ready(ctx context.Context) error {
	for _, ch := range []chan struct{}{l.repsRead, l.ready} {
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return l.readyErr
}

// readReps marks the first record of representations done (or the Limiter stopped).
func (l *Limiter) readReps() { l.repsOnce.Do(func() { close(l.repsRead) }) }

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
	defer l.readReps()
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
			lates := l.do(context.Background(), t)
			l.eng.Done(l.clock.Now(), t)
			for _, lt := range lates {
				lt.tripDone()
			}
			if l.events != nil {
				l.events.trip(l.clock.Now(), t, l.eng.Servers())
			}
			if t.Reps != nil {
				l.readReps()
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
// into memory nothing reads once Do has failed, but for a take's: its call lingers
// (internal/linger), and answers that come after Do gave up are read (lateTake) once
// the engine has taken the trip as failed. do returns those calls; the caller tells
// each once Done has run (lateTake.tripDone).
func (l *Limiter) do(ctx context.Context, t *engine.Trip) []*lateTake {
	defer l.nodes.settle(ctx)
	switch t.Kind {
	case engine.TakeTrip:
		parts := l.nodes.split(ctx, len(t.Takes), func(i int) string {
			r := &t.Takes[i]
			return wire.BucketKeyOfID("", r.Limit.Name, cmp.Or(string(r.ID), wire.KeyID(r.Key)))
		})
		lctx := linger.With(ctx)
		run(parts, func(p *part) {
			reqs, out := pick(t.Takes, p), pick(t.TakeResults, p)
			lt := &lateTake{l: l, t: t, idx: p.idx}
			mine := make([]redisstore.TakeResult, len(reqs)) // the call's own: it may outlive Do
			// The call lingers, and Close waits for it: its refills' late grants go to
			// their leases, its reservations' claims' back to their buckets.
			var started atomic.Int32 // 1: the call started; 2: Do returned first
			l.lingering.Add(1)
			p.err = p.nd.brk.Do(lctx, func(ctx context.Context) error {
				if !started.CompareAndSwap(0, 1) {
					return context.Canceled // too late to start: Do has returned
				}
				defer l.lingering.Done()
				if len(reqs) == 1 { // a refill, or a reservation's claim (Floor)
					g, err := l.store.TakeOne(ctx, reqs[0])
					if err == nil {
						mine[0].Grant = g
						lt.answered(mine)
					}
					return err
				}
				// As doBatch: answered unless the whole call ran out of time; an item
				// that found the store unavailable fails the call for the breaker.
				err := l.store.TakeBatch(ctx, reqs, mine)
				if ctx.Err() != nil && storeerr.IsTimeout(err) {
					return err
				}
				lt.answered(mine)
				if global.IsUnavailable(err) {
					return err
				}
				return nil
			})
			if started.CompareAndSwap(0, 2) {
				l.lingering.Done() // the call never started (breaker open, overloaded)
			}
			if p.answered = lt.settle(p.err); p.answered {
				copy(out, mine)
			} else if errors.Is(p.err, breaker.ErrTimeout) {
				p.late = lt
			}
			settle(t.TakeResults, p, out, func(r *redisstore.TakeResult, err error) { r.Err = err })
		})
		t.Answered, t.Err = outcome(parts)
		var lates []*lateTake
		for _, p := range parts {
			if p.late != nil {
				lates = append(lates, p.late)
			}
		}
		return lates
	case engine.RefundTrip:
		parts := l.nodes.split(ctx, len(t.Refunds), func(i int) string {
			r := &t.Refunds[i]
			return wire.BucketKeyOfID("", r.Limit.Name, cmp.Or(string(r.ID), wire.KeyID(r.Key)))
		})
		run(parts, func(p *part) {
			reqs, out := pick(t.Refunds, p), pick(t.RefundResults, p)
			p.answered, p.err = doBatch(ctx, p.nd.brk, func(ctx context.Context) error { return l.store.RefundBatch(ctx, reqs, out) })
			settle(t.RefundResults, p, out, func(r *redisstore.RefundResult, err error) { r.Err = err })
		})
		t.Answered, t.Err = outcome(parts)
	case engine.HeartbeatTrip:
		// The heartbeat and the record of representations, each a call of its own (their
		// keys may be on two Cluster masters), made at once. The trip is the heartbeat's,
		// or the record's when it carries no heartbeat; the record's outcome is its own.
		// Both calls are routed here, on the Limiter's goroutine, as nodes requires.
		var repsNd *node
		if t.Fleet == "" || t.Reps != nil {
			repsNd = l.nodes.split(ctx, 1, func(int) string { return wire.RepsKey("") })[0].nd
		}
		record := func() {
			var got []string
			err := repsNd.brk.Do(ctx, func(ctx context.Context) error {
				var err error
				got, err = l.store.Reps(ctx, t.Reps, t.RepsLive)
				return err
			})
			if t.RepsErr = err; err == nil {
				t.RepsGot = got
			}
		}
		if t.Fleet == "" {
			record()
			t.Err, t.Answered = t.RepsErr, t.RepsErr == nil
			break
		}
		var reps sync.WaitGroup
		if t.Reps != nil {
			reps.Go(record)
		}
		nd := l.nodes.split(ctx, 1, func(int) string { return wire.FleetKey("", t.Fleet) })[0].nd
		var live int
		t.Err = nd.brk.Do(ctx, func(ctx context.Context) error {
			var err error
			live, err = l.store.Heartbeat(ctx, t.Fleet, l.store.ServerID(), t.TTL)
			return err
		})
		if t.Answered = t.Err == nil; t.Answered {
			t.Live = live
		}
		reps.Wait()
	case engine.LowTrip:
		// Each call works on its own slices, read only once it has returned (answered):
		// it may outlive the breaker's deadline.
		parts := l.nodes.split(ctx, len(t.Lows), func(i int) string {
			x := &t.Lows[i]
			return wire.LowKey("", x.Limit, x.Shards, x.Shard)
		})
		run(parts, func(p *part) {
			lows := pick(t.Lows, p)
			sets := make([]redisstore.LowSet, len(lows))
			for i, x := range lows {
				sets[i] = x.LowSet
			}
			got, errs := make([][]redisstore.KeyID, len(lows)), make([]error, len(lows))
			p.answered, p.err = doBatch(ctx, p.nd.brk, func(ctx context.Context) error {
				// each set on its own: one's error does not stop the rest; one with
				// nothing to write is only read (LowExchange.ReadOnly)
				return l.store.LowBatch(ctx, sets, engine.LowShare, got, errs)
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
		// A part per master, through its breaker: the shards with work whose slots it
		// serves, in one round trip (a transaction each), so one master's failure fails
		// only its shards'. As for LowTrip, each call works on copies, read once it has
		// returned.
		parts := l.nodes.split(ctx, len(t.Windows), func(i int) string {
			x := &t.Windows[i]
			return wire.MarksKey("", x.Limit.Name, x.Shards, x.Shard)
		})
		run(parts, func(p *part) {
			trips := pick(t.Windows, p)
			if p.idx == nil {
				trips = slices.Clone(trips)
			}
			for k := range trips {
				trips[k].Ops = slices.Clone(trips[k].Ops)
			}
			errs := make([]error, len(trips))
			p.answered, p.err = doBatch(ctx, p.nd.brk, func(ctx context.Context) error {
				return l.store.WindowsBatch(ctx, trips, errs) // each shard on its own: one's error does not stop the rest
			})
			each(p, len(trips), func(k, i int) {
				if p.answered {
					t.Windows[i], t.WindowErrs[i] = trips[k], errs[k]
				} else if p.idx != nil {
					t.WindowErrs[i] = p.err
				}
			})
		})
		t.Answered, t.Err = outcome(parts)
	}
	return nil
}

// waited returns a channel closed once wg's Wait returns.
func waited(wg *sync.WaitGroup) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		wg.Wait()
		close(ch)
	}()
	return ch
}

// lateTake is one call of a take trip (a part's), and its answers should they come
// after Do gave up on it: they are the grants Redis spent when the takes ran, and the
// engine reads them (Engine.Late) once it has taken the trip as failed (Done), whichever
// of the two comes last doing it.
type lateTake struct {
	l   *Limiter
	t   *engine.Trip
	idx []int // the part's items' indexes in the trip; nil: every item

	mu   sync.Mutex
	res  []redisstore.TakeResult // the call's answers, once it has them
	late bool                    // Do gave up on the call (its deadline)
	done bool                    // the engine took the trip as done
}

// answered hands the call's answers res, from the call's goroutine.
func (lt *lateTake) answered(res []redisstore.TakeResult) {
	lt.mu.Lock()
	lt.res = res
	read := lt.late && lt.done
	lt.mu.Unlock()
	if read {
		lt.read()
	}
}

// settle takes Do's outcome err: it reports whether the call answered by then (its
// answers are to be read now), and otherwise, for a timeout, marks them late.
func (lt *lateTake) settle(err error) (answered bool) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if errors.Is(err, breaker.ErrTimeout) {
		lt.late = true
		return false
	}
	return lt.res != nil
}

// tripDone tells lt that the engine took its trip as done, on the driver's goroutine.
func (lt *lateTake) tripDone() {
	lt.mu.Lock()
	lt.done = true
	read := lt.late && lt.res != nil
	lt.mu.Unlock()
	if read {
		lt.read()
	}
}

// read hands the late answers to the engine.
func (lt *lateTake) read() {
	now := lt.l.clock.Now()
	for k := range lt.res {
		i := k
		if lt.idx != nil {
			i = lt.idx[k]
		}
		lt.l.eng.Late(now, lt.t, i, &lt.res[k])
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
func (l *Limiter) Allow(ctx context.Context, limit, key string) (d Decision, err error) {
	err = l.allowN(&d, ctx, limit, "", key, 1, l.onDecision) // not AllowN: one call, inlined
	return d, err
}

// AllowN decides whether a request of cost n for key may proceed under the named limit,
// taking its n tokens atomically. It waits for Redis, at most the limit's MaxWait, only
// when this server holds no tokens for the key. The error is non-nil only for a misuse,
// after Close, or when ctx ends; a Redis failure is decided by the limit's policy.
func (l *Limiter) AllowN(ctx context.Context, limit, key string, n int) (d Decision, err error) {
	err = l.allowN(&d, ctx, limit, "", key, n, l.onDecision)
	return d, err
}

// AllowTier is AllowN for a key of the named tier of the limit (Limit.Tiers; "" is the
// limit's own rate and burst). A key keeps one bucket, re-shaped when its tier changes
// (docs/limits.md).
func (l *Limiter) AllowTier(ctx context.Context, limit, tier, key string, n int) (d Decision, err error) {
	err = l.allowN(&d, ctx, limit, tier, key, n, l.onDecision)
	return d, err
}

// allowN is AllowTier writing its decision to *out and telling hook (nil: nobody) of it.
// It writes through out, where returning the Decision would copy its 96 bytes once more
// on every decision, just after they were written: 8% of a lease hit (docs/hot-path.md).
func (l *Limiter) allowN(out *Decision, ctx context.Context, limit, tier, key string, n int, hook func(string, Decision)) (err error) {
	lm := l.eng.Limit(limit)
	switch {
	case lm == nil:
		*out = Decision{RetryAfter: InfDuration, Limit: limit, Tier: tier}
		return ErrUnknownLimit
	case tier != "" && !lm.HasTier(tier):
		*out = Decision{RetryAfter: InfDuration, Limit: limit, Tier: tier}
		return ErrUnknownTier
	case n < 0:
		d := engine.Decision{Reason: engine.ReasonInvalidCost, RetryAfter: InfDuration}
		out.set(lm, tier, &d)
		return ErrInvalidCost
	case l.closed.Load():
		*out, err = l.closedDecision(limit, tier)
		return err
	}
	if lm.Companions() != nil {
		// The fleet counts the limit in more than one representation while a change of
		// its kind or window rolls out: the request is decided on each (docs/limits.md).
		var m engine.Multi
		m.Add(engine.MultiItem{Limit: lm, Tier: tier, Key: key, N: n})
		var md MultiDecision
		err = l.decideMulti(&md, ctx, &m, hook)
		*out = md.Decision
		return err
	}
	var d engine.Decision
	if w := l.eng.Decide(l.nanos(), lm, tier, key, n, &d); w != nil {
		*out, err = l.wait(ctx, lm, tier, key, w, hook)
		return err
	}
	if d.Reason == engine.ReasonClosed {
		*out, err = l.closedDecision(limit, tier)
		return err
	}
	out.set(lm, tier, &d)
	if hook != nil {
		hook(key, *out)
	}
	return nil
}

// nanos is the clock's instant in Unix nanoseconds, as Engine.Decide takes it: on the
// system clock read without building a time.Time (sysclock.UnixNano).
func (l *Limiter) nanos() int64 {
	if l.sys {
		return sysclock.UnixNano()
	}
	return l.clock.Now().UnixNano()
}

// closedDecision is the answer to a request of limit and tier the engine found closed:
// the Limiter's Close (ErrClosed), or, on an open Limiter, the limit's removal by
// Reconfigure while the request was decided (ErrUnknownLimit).
func (l *Limiter) closedDecision(limit, tier string) (Decision, error) {
	if l.closed.Load() {
		return Decision{Reason: reasonClosed, Limit: limit, Tier: tier}, ErrClosed
	}
	return Decision{RetryAfter: InfDuration, Limit: limit, Tier: tier}, ErrUnknownLimit
}

// result is d, for key under tier of lm, as AllowN returns it with err; it tells hook.
func (l *Limiter) result(lm *engine.Limit, tier, key string, d *engine.Decision, err error, hook func(string, Decision)) (Decision, error) {
	if d.Reason == engine.ReasonClosed {
		return l.closedDecision(lm.Name(), tier)
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
	d, err := l.await(ctx, w, lm.Config().MaxWait)
	return l.result(lm, tier, key, &d, err, hook)
}

// await waits for the decision of a request that waits for a refill: the engine's, or
// the policy's once maxWait (the limit's MaxWait, or what a caller has left of it) has
// passed, or a denial with ctx.Err() once ctx ends.
func (l *Limiter) await(ctx context.Context, w *engine.Waiter, maxWait time.Duration) (engine.Decision, error) {
	select {
	case <-w.Done(): // decided already
		return w.Decision(), nil
	default:
	}
	expired := make(chan struct{})
	stop := l.clock.AfterFunc(maxWait, func() { close(expired) })
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

// minLoopGrace is the least Close waits for the limiter's loop to stop once its ctx has
// ended (loopGrace): scheduling slack past the breaker's Timeout.
const minLoopGrace = 100 * time.Millisecond

// loopGrace is how long Close waits for the limiter's loop to stop once its ctx has
// ended: the loop ends when its trip is answered or Do gives up on it, by the breaker's
// Timeout (a zero Timeout is the breaker's default, 10 ms, which minLoopGrace covers),
// and a Cluster's map reloads after it (reloadTimeout each), with minLoopGrace for the
// scheduling.
func (l *Limiter) loopGrace() time.Duration {
	d := l.nodes.all.brk.Settings().Timeout
	if l.nodes.cc != nil {
		d += 3 * reloadTimeout // a pass may reload the slot map thrice: recheck, a split's, settle
	}
	return d + minLoopGrace
}

// errNotSent explains refunds queued while Close was sending the last ones.
var errNotSent = errors.New("queued after Close sent its last refunds")

// Close stops the Limiter and gives every unused leased token back to Redis, bounded by
// ctx; the error reports tokens that could not be (LimitStats.RefundsLost counts them),
// also when ctx has ended before Close (Close then waits for the Limiter's round trip
// in flight to end, by the breaker's Timeout and 100 ms more, so that its leases are let
// go of and counted), and admissions it could not charge to their
// buckets (a FailLocal limit's admissions during an outage, a ChargeLater limit's not
// charged yet), which it reports wrapping global.ErrUnavailable, and LimitStats.Forgiven
// counts: Redis did not take their last trips, and the fleet may have admitted that
// many more than its limits. It first waits for take calls whose answers are
// late (at most the breaker's probe deadline), so that what refills were granted, and
// reservations' claims that failed took, is given back too; and, when a breaker is open (a passing stall tripped it) and ctx has
// a deadline, for it to let a probe through (its OpenTimeout), once and for at most half
// of what ctx leaves, since an open breaker refuses the refunds, and the charges of a
// ChargeLater limit and the debts of FailLocal, which it then sends too.
// Calls after Close return ErrClosed, and so do WaitN calls asleep toward their
// reservations' instants when it starts: they cancel their reservations rather than act
// after Close, and a ReserveN whose claim was waiting for Redis returns ErrClosed.
// Close may be called more than once: every call returns once the first is done.
func (l *Limiter) Close(ctx context.Context) error {
	// Under reconfMu: a Reconfigure that found the Limiter open finishes first, so that no
	// limit is added once Close has let the leases go.
	l.reconfMu.Lock()
	was := l.closed.Swap(true)
	l.reconfMu.Unlock()
	if was {
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

// awaitProbe waits until no breaker refuses calls (open, or half-open with its probes in
// flight: another caller's, on a shared breaker), for at most half of what ctx leaves
// when it starts (the refunds keep the rest), and not at all for a ctx without a
// deadline: an open breaker moves to half-open once its OpenTimeout has passed
// (gobreaker moves it when its state is read: there is no event to wait on), and the
// next call is its probe, unless one is out already. A Redis still down fails the probe,
// and Close does not wait again.
func (l *Limiter) awaitProbe(ctx context.Context) {
	if _, ok := ctx.Deadline(); !ok || !l.nodes.anyRefusing() {
		return
	}
	wait, cancel := halfOf(ctx)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for l.nodes.anyRefusing() {
		select {
		case <-wait.Done():
			return
		case <-tick.C:
		}
	}
}

// halfOf is ctx ending, if ctx has a deadline, halfway from now to it: what Close gives
// each of its waits, so that the refunds keep the rest.
func halfOf(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, time.Now().Add(time.Until(dl)/2))
}

// close is the work of the first Close.
func (l *Limiter) close(ctx context.Context) error {
	close(l.stop)
	l.cancelStart()
	// The engine is stopped, and its last round trip answered; a loop that does not get
	// there (a Redis call that ignores its deadline) does not hold Close past ctx.
	stopped := waited(&l.wg)
	select {
	case <-stopped:
	case <-ctx.Done():
		// ctx ended first, or before Close (a server's shutdown spent it): the loop stops
		// within microseconds when idle, by the breaker's Timeout when a trip is out.
		// Close waits that long, then counts what it could not give back.
		grace := time.NewTimer(l.loopGrace())
		select {
		case <-stopped:
			grace.Stop()
		case <-grace.C:
			return fmt.Errorf("hybrid: Close: the limiter's loop did not stop: %w", ctx.Err())
		}
	}
	// Take calls that outlive their Do end by the breaker's probe deadline: their late
	// answers go to the keys' leases before the leases are refunded. Close waits for
	// them at most half of what ctx leaves it, keeping the rest for the refunds.
	lingered := waited(&l.lingering)
	wait, cancel := halfOf(ctx)
	select {
	case <-lingered:
	case <-wait.Done():
	}
	cancel()
	l.eng.Drain()
	lost := 0
	var firstErr error
	var t *engine.Trip
	if ctx.Err() == nil {
		// The last trips go once an open breaker lets a probe through: refunds make a
		// trip at once; debts and charges make none while it is open (Owes).
		if t = l.eng.Next(); t != nil || l.eng.Owes() {
			l.awaitProbe(ctx)
			if t == nil {
				t = l.eng.Next()
			}
		}
	}
	for ; t != nil; t = l.eng.Next() {
		lates := l.do(ctx, t)
		l.eng.Done(l.clock.Now(), t)
		for _, lt := range lates {
			lt.tripDone()
		}
		n, err := t.Lost()
		lost += n
		firstErr = cmp.Or(firstErr, err)
		if ctx.Err() != nil {
			break
		}
	}
	n, forgiven := l.eng.Finish()
	if n > 0 {
		lost += n
		firstErr = cmp.Or(firstErr, ctx.Err(), errNotSent)
	}
	var errs []error
	if lost > 0 {
		errs = append(errs, fmt.Errorf("hybrid: %d leased tokens not refunded: %w", lost, firstErr))
	}
	if forgiven > 0 {
		err := fmt.Errorf("hybrid: %d admitted tokens not charged to their buckets: %w", forgiven, global.ErrUnavailable)
		if ctx.Err() != nil {
			err = fmt.Errorf("%w: %w", err, ctx.Err())
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
