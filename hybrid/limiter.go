package hybrid

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/local"
)

// Errors of the Limiter. Being denied is not an error, and neither is a Redis failure:
// the limit's failure policy decides, and the Decision says so.
var (
	// ErrUnknownLimit is returned by Allow and AllowN for a limit name the Limiter was
	// not configured with.
	ErrUnknownLimit = errors.New("hybrid: unknown limit")
	// ErrInvalidCost is returned by AllowN for a negative cost.
	ErrInvalidCost = errors.New("hybrid: invalid cost")
	// ErrClosed is returned by Allow and AllowN once Close has been called.
	ErrClosed = errors.New("hybrid: limiter closed")
)

// DefaultTimeout is how long a decision waits for Redis when Limit.Timeout is zero.
const DefaultTimeout = 10 * time.Millisecond

// DefaultHeartbeatInterval is how often a Limiter with a Fleet name announces itself.
const DefaultHeartbeatInterval = time.Second

// maxBatch is the most refills sent in one pipelined round trip.
const maxBatch = 256

// Limit is one named fleet-wide limit: a token bucket of Burst tokens refilled at Rate
// per second, held in Redis and shared by every server, per key (client, tenant, ...).
type Limit struct {
	// Name identifies the limit in calls and in Redis keys (see global.Limit).
	Name string
	// Rate is the fleet-wide refill rate, in tokens per second.
	Rate float64
	// Burst is the fleet-wide bucket capacity; the largest cost one request may have.
	Burst int
	// Policy decides requests when Redis does not answer (breaker open, timeout, error).
	// Required: there is no default (see breaker.Policy).
	Policy breaker.Policy
	// PreRate and PreBurst set a tighter per-server pre-check, a local bucket per key
	// consulted before anything else, which stops a hot key on one server without Redis.
	// 0 means the limit's own Rate and Burst: one server never admits more than the fleet
	// may, so the default pre-check never denies what the global bucket would allow.
	PreRate  float64
	PreBurst int
	// Timeout is the longest a decision waits for Redis: a refill not answered by then
	// goes to Policy. The Redis call itself runs to the breaker's Timeout, so that the
	// breaker counts a stalled Redis whatever the limits' Timeouts; a refill answered
	// after its requests gave up still fills the lease. default: DefaultTimeout (10ms)
	Timeout time.Duration
	// MaxCost is the largest cost passed to AllowN; it sizes the conservative local
	// fallback's burst so that such a request is not always denied during an outage.
	// default: 1
	MaxCost int
	// RefillInterval, Lifetime and LowWatermark tune the leases (see LeaseConfig).
	RefillInterval time.Duration
	Lifetime       time.Duration
	LowWatermark   float64
	// MaxKeys caps the keys held for this limit on this server (least recently used go
	// first; their leased tokens are refunded). default: local.DefaultMaxKeys
	MaxKeys int
}

// Config configures a Limiter.
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
	// Breaker guards the Redis calls. nil builds one with breaker defaults that counts
	// global.IsUnavailable errors; share one breaker per Redis.
	Breaker *breaker.Breaker
	// Seed seeds the pacing jitter; 0 picks a random seed.
	Seed uint64
	// Now is the clock; nil means time.Now. Tests and simulators pass their own.
	Now func() time.Time
}

// Source says which tier made a decision.
type Source uint8

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

// String returns the source's name.
func (s Source) String() string {
	switch s {
	case SourcePreCheck:
		return "pre-check"
	case SourceLease:
		return "lease"
	case SourceGlobal:
		return "global"
	case SourceFallback:
		return "fallback"
	}
	return fmt.Sprintf("Source(%d)", uint8(s))
}

// Decision is the answer to one request.
type Decision struct {
	// Allowed reports whether the request may proceed.
	Allowed bool
	// Remaining is the best known count of tokens left for the key, fleet-wide.
	Remaining int
	// RetryAfter, when the request is denied, is when it may pass (InfDuration: never).
	RetryAfter time.Duration
	// Source is the tier that decided; Reason says why.
	Source Source
	Reason Reason
	// Servers is the live server count the limit was divided by.
	Servers int
}

// Limiter is the two-tier limiter users call: for each request, a per-server pre-check,
// then tokens leased from the global Redis bucket in batches, refilled in the background
// (one refill in flight per key; refills of many keys share one pipelined round trip),
// and the limit's failure policy when Redis does not answer. See docs/design.md.
//
// New starts one background goroutine (two with a Fleet name): refills, refunds of
// expired leases, heartbeats. Close stops them and refunds every unused leased token.
// A Limiter is safe for simultaneous use by multiple goroutines.
type Limiter struct {
	store  *global.Store
	brk    *breaker.Breaker
	limits map[string]*limit
	list   []*limit          // the same limits, scanned by lookup when there are few
	byName map[string]*limit // nil when there are few
	now    func() time.Time
	fleet  string
	beat   time.Duration

	servers atomic.Int64
	closed  atomic.Bool

	mu sync.Mutex
	// The fields below are guarded by mu.
	pending  []*flight // refills waiting to be sent
	refunds  []refund  // tokens waiting to be refunded
	expiries expiries  // grants whose lifetime ends: a min-heap on at (limits' lifetimes differ)
	stopped  bool      // the refiller has stopped: refills fail at once
	// refundsDone: Close has taken the last refunds; later ones are counted lost.
	refundsDone bool

	wake chan struct{} // buffered 1: work is pending
	stop chan struct{} // closed by Close
	wg   sync.WaitGroup

	stats counters
}

type limit struct {
	cfg      Limit
	glim     global.Limit
	lease    atomic.Pointer[LeaseConfig]
	keys     *local.Store[entry]
	fallback *breaker.Fallback
	preRate  rate.Limit
	preBurst int
	fill     time.Duration // time for an empty pre-check bucket to fill
	seed     uint64
}

// entry is what one server holds for one (limit, key): the pre-check bucket and the lease.
// It lives in the limit's bounded store and is only touched under that store's lock.
type entry struct {
	pre    rate.Limiter
	lease  Lease
	flight *flight // the refill in flight, nil if none
	slot   uint8   // which shard of the Limiter's counters this key counts in
}

// flight is one refill on its way to Redis and back. Requests that wait for it select on
// done; err and granted are set before done is closed.
type flight struct {
	lim       *limit
	key       string
	seq       uint64
	want, min int
	done      chan struct{}
	err       error
}

type refund struct {
	lim *limit
	key string
	n   int
}

type expiry struct {
	lim *limit
	key string
	at  time.Time
}

// New returns a Limiter for the limits in cfg over store, or an error wrapping
// ErrInvalidConfig (or global.ErrInvalidLimit, breaker.ErrNoPolicy) that says what is
// wrong. It starts the Limiter's background goroutines; call Close to stop them.
func New(store *global.Store, cfg Config) (*Limiter, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidConfig)
	}
	if len(cfg.Limits) == 0 {
		return nil, fmt.Errorf("%w: no limits", ErrInvalidConfig)
	}
	if cfg.FleetSize < 1 {
		return nil, fmt.Errorf("%w: FleetSize %d: say how many servers share the limits (with Fleet set, the first guess)", ErrInvalidConfig, cfg.FleetSize)
	}
	if cfg.HeartbeatInterval < 0 {
		return nil, fmt.Errorf("%w: HeartbeatInterval %v is negative", ErrInvalidConfig, cfg.HeartbeatInterval)
	}
	l := &Limiter{
		store:  store,
		brk:    cfg.Breaker,
		limits: make(map[string]*limit, len(cfg.Limits)),
		now:    cfg.Now,
		fleet:  cfg.Fleet,
		beat:   cfg.HeartbeatInterval,
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
	}
	if l.now == nil {
		l.now = time.Now
	}
	if l.beat == 0 {
		l.beat = DefaultHeartbeatInterval
	}
	if l.fleet != "" {
		// Checked here, not at the first heartbeat: the same rules as a limit name.
		if _, err := global.NewLimit(l.fleet, 1, 1); err != nil {
			return nil, fmt.Errorf("%w: fleet name: %w", ErrInvalidConfig, err)
		}
	}
	if l.brk == nil {
		b, err := breaker.New(breaker.Settings{IsFailure: global.IsUnavailable})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		l.brk = b
	}
	l.servers.Store(int64(cfg.FleetSize))
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	for i, lc := range cfg.Limits {
		if _, dup := l.limits[lc.Name]; dup {
			return nil, fmt.Errorf("%w: limit %q configured twice", ErrInvalidConfig, lc.Name)
		}
		lm, err := l.newLimit(lc, cfg.FleetSize, seed+uint64(i)*0x9e3779b97f4a7c15)
		if err != nil {
			return nil, err
		}
		l.limits[lc.Name] = lm
	}
	for _, lc := range cfg.Limits {
		l.list = append(l.list, l.limits[lc.Name])
	}
	if len(l.list) > 8 {
		l.byName = l.limits
	}
	l.wg.Add(1)
	go l.refiller()
	if l.fleet != "" {
		l.wg.Add(1)
		go l.heartbeat()
	}
	return l, nil
}

func (l *Limiter) newLimit(c Limit, servers int, seed uint64) (*limit, error) {
	glim, err := global.NewLimit(c.Name, c.Rate, c.Burst)
	if err != nil {
		return nil, err
	}
	if err := c.Policy.Validate(); err != nil {
		return nil, fmt.Errorf("%w: limit %q: %w", ErrInvalidConfig, c.Name, err)
	}
	switch {
	case c.PreRate < 0 || math.IsNaN(c.PreRate) || math.IsInf(c.PreRate, 0):
		return nil, fmt.Errorf("%w: limit %q: PreRate %v", ErrInvalidConfig, c.Name, c.PreRate)
	case c.PreBurst < 0:
		return nil, fmt.Errorf("%w: limit %q: PreBurst %d", ErrInvalidConfig, c.Name, c.PreBurst)
	case c.Timeout < 0:
		return nil, fmt.Errorf("%w: limit %q: Timeout %v", ErrInvalidConfig, c.Name, c.Timeout)
	case c.MaxCost < 0 || c.MaxCost > c.Burst:
		return nil, fmt.Errorf("%w: limit %q: MaxCost %d must be between 1 and Burst %d", ErrInvalidConfig, c.Name, c.MaxCost, c.Burst)
	case c.PreRate > c.Rate || c.PreBurst > c.Burst:
		return nil, fmt.Errorf("%w: limit %q: the pre-check (%v/s, burst %d) must be tighter than the limit (%v/s, burst %d)",
			ErrInvalidConfig, c.Name, c.PreRate, c.PreBurst, c.Rate, c.Burst)
	case c.MaxKeys < 0:
		return nil, fmt.Errorf("%w: limit %q: MaxKeys %d", ErrInvalidConfig, c.Name, c.MaxKeys)
	}
	c.Timeout = cmpOr(c.Timeout, DefaultTimeout)
	c.MaxCost = max(c.MaxCost, 1)
	c.PreRate = cmpOr(c.PreRate, c.Rate)
	c.PreBurst = cmpOr(c.PreBurst, c.Burst)
	lc, err := LeaseConfig{
		Rate: c.Rate, Burst: c.Burst, Servers: servers,
		RefillInterval: c.RefillInterval, Lifetime: c.Lifetime, LowWatermark: c.LowWatermark,
	}.Normalize()
	if err != nil {
		return nil, fmt.Errorf("limit %q: %w", c.Name, err)
	}
	lm := &limit{
		cfg: c, glim: glim, seed: seed,
		preRate: rate.Limit(c.PreRate), preBurst: c.PreBurst,
		fill: time.Duration(math.Min(float64(c.PreBurst)/c.PreRate*float64(time.Second), float64(24*time.Hour))),
	}
	lm.lease.Store(&lc)
	// Idle keys go after twice the lease lifetime, and not before their pre-check bucket
	// would be full again (a dropped bucket comes back full); their leases are refunded.
	idle := max(2*lc.Lifetime, lm.fill+time.Second)
	lm.keys, err = local.NewStore(local.StoreConfig[entry]{
		MaxKeys:     c.MaxKeys,
		IdleTimeout: idle,
		Init:        lm.initEntry,
		OnEvict: func(key string, e *entry, _ local.EvictReason) {
			l.evicted(lm, key, e)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("%w: limit %q: %w", ErrInvalidConfig, c.Name, err)
	}
	if lm.fallback, err = newFallback(c, servers); err != nil {
		return nil, err
	}
	return lm, nil
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
