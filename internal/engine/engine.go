package engine

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/internal/keystore"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
)

// Defaults of LimitConfig and Config.
const (
	// DefaultMaxWait is how long a request waits for a refill when MaxWait is zero.
	DefaultMaxWait = 10 * time.Millisecond
	// DefaultHeartbeatInterval is how often an engine with a Fleet name announces itself.
	DefaultHeartbeatInterval = time.Second
)

// MaxBatch is the most items one round trip carries (refills or refunds).
const MaxBatch = 256

// LimitConfig is one named fleet-wide limit as the engine runs it. It has the fields of
// hybrid.Limit, in the same order, so that one converts to the other; hybrid.Limit
// documents them. Zero fields take their defaults.
type LimitConfig struct {
	Name           string
	Rate           float64
	Burst          int
	Policy         breaker.Policy
	PreRate        float64
	PreBurst       int
	MaxWait        time.Duration
	MaxCost        int
	RefillInterval time.Duration
	Lifetime       time.Duration
	LowWatermark   float64
	MaxKeys        int
	// Version orders changes of the bucket's parameters across the fleet
	// (redisstore.Limit.Version); Tiers are the limit's other rates and bursts, per key.
	Version uint64
	Tiers   []TierConfig
	// Async, if positive, admits a request the lease cannot serve without asking Redis
	// when the key is not known low here, and charges it within Async (async.go).
	Async time.Duration
	// Windowed, if positive, makes the limit windowed: Burst requests per window of
	// Burst/Rate, counted in Redis's shared arrays, each server reporting every Windowed
	// (window.go). WindowWidth is the counters per row of its arrays (0: the default),
	// shared by its WindowShards shards (0 or 1: one, the unsharded format; the driver
	// sets wire.WindowShards on a Redis Cluster).
	Windowed     time.Duration
	WindowWidth  int
	WindowShards int
	// LowShards is the number of sets a charge-later limit marks its low keys in (0 or
	// 1: one; the driver sets wire.LowShards on a Redis Cluster), fixed for the limit's
	// life.
	LowShards int
	// DryRun is carried for the driver, which admits what the limit denies: the engine
	// decides and counts as for any limit.
	DryRun bool
}

// Config configures one server's Engine.
type Config struct {
	Limits []LimitConfig
	// Servers is the fleet size the limits are divided by until a heartbeat answers.
	Servers int
	// Fleet, if set, names the fleet: the engine asks for a heartbeat every
	// HeartbeatInterval and divides by the live count it answers.
	Fleet             string
	HeartbeatInterval time.Duration
	// Seed seeds the pacing jitter of every lease.
	Seed uint64
	// Shards splits each limit's key store (keystore.StoreConfig.Shards; 0: the default).
	// A simulator passes 1: which keys an idle sweep or a full store lets go of then
	// depends on nothing but the order of the requests.
	Shards int
	// NextSeq returns the sequence number of a refund (redisstore.Store.NextSeq): chosen
	// when the refund trip is built, so that a batch answered too late can be sent
	// again, in halves, without refunding twice. Required.
	NextSeq func() uint64
	// BreakerOpen reports whether a breaker is open: while one is, debts wait and the
	// charge-later limits admit nothing uncharged. nil: never open.
	BreakerOpen func() bool
	// KeyOpen reports whether the breaker that guards the bucket of limit and key (a
	// key's ID) is open. A refill that would be sent while it is fails at once, and its
	// requests go to their policy without waiting. nil: BreakerOpen stands for every
	// key's.
	KeyOpen func(limit, key string) bool
	// Notify is called whenever I/O is queued, so that the driver calls Next. nil: the
	// driver polls. It runs with neither Engine's lock nor a key's held, but possibly
	// under the mutex of a Waiter being decided: it must not call the engine.
	Notify func()
	// Decided is called for every waiting request w the engine decides by itself (a
	// refill answered or failed, Stop); never for one decided by GiveUp, which returns
	// its decision. nil: the driver watches Waiter.Done. As Notify, it may run under
	// the mutex of another Waiter (one whose recheck started the refill that decided
	// w): it may read w, and must not call the engine.
	Decided func(w *Waiter)
}

// Engine is one server's state for every key of every limit: the per-key entries
// (pre-check, lease, the refill in flight and the requests waiting for it), the refills
// and refunds waiting to be sent, the lease-expiry order, the heartbeat schedule and the
// counters. It makes no I/O, starts no goroutine, sets no timer and reads no clock:
// every input carries its instant, and the I/O it wants comes out of Next as a Trip for
// the driver to carry out and hand back to Done. See the package documentation for the
// concurrency model.
type Engine struct {
	limits atomic.Pointer[limitTable]
	// cfgMu orders the changes of configuration (SetLimit, AddLimit, RemoveLimit) and
	// of the fleet size, which resizes every shape.
	cfgMu     sync.Mutex
	removedMu sync.Mutex
	// past are the limits RemoveLimit removed (not their companions), guarded by
	// removedMu: their counters stay in Stats, and in StatsOf a limit added again under
	// their name, so that counters since New never go back.
	past []*Limit
	// retiring are the removed windowed limits whose last report has not gone (what they
	// admitted without asking, the grants their keys gave back); guarded by mu.
	retiring []*windowed
	seed     uint64
	shards   int

	fleet     string
	beat      time.Duration
	tickEvery time.Duration
	nextSeq   func() uint64
	open      func() bool
	keyOpen   func(limit, key string) bool
	notify    func()
	decided   func(w *Waiter)

	servers atomic.Int64
	cl      laterSched // the charge-later limits' schedule (async.go)

	mu sync.Mutex
	// The fields below are guarded by mu.
	rng           uint64        // splitmix64 state: the schedule's phase
	pending       []*Flight     // refills waiting to be sent
	refunds       []refund      // tokens waiting to be refunded
	refundTrips   []refundBatch // refunds summed and numbered, one trip each
	expiries      expiries      // grants by the end of their lifetime
	busy          bool          // a trip is out
	lastTake      bool          // the last trip was a TakeTrip
	lastWindows   bool          // the last trip was a WindowsTrip
	stopped       bool          // Stop was called: refills fail at once
	finished      bool          // Finish was called: refunds are counted lost
	ticked        bool          // Tick has run once
	nextExpiry    time.Time
	nextBeat      time.Time
	beatDue       bool
	repsDue       bool // the record of representations is to be written and read (reps.go)
	firstReps     bool // and it was never answered
	nextReps      time.Time
	debtWait      bool      // a debt was owed since Redis last answered a trip: debts wait for an answer
	debtHoldUntil time.Time // if not zero: a debt trip failed, and debts wait until then
	// debtSpreadUntil, if not zero: FailLocal's debts, which waited for Redis to answer,
	// wait until then more (redisAnswered), once for each time they waited.
	debtSpreadUntil time.Time
	debts           owed          // FailLocal's admissions, owed to the buckets
	debtSeq         uint64        // debts and charges first owed, to send them in that order
	stopFailed      int           // debt trips failed after Stop (stopRetries)
	abandonedSeqs   []uint64      // lost takes whose planned resend was let go of (abandon), oldest first
	debtRetry       []refundBatch // debt trips that timed out, to send again with their sequence numbers (one that timed out whole, in halves)

	stats counters
}

// Limit is the state of one limit on this server. Obtain it with Engine.Limit.
type Limit struct {
	e     *Engine
	name  string
	cur   atomic.Pointer[shapes] // the current configuration, one shape per tier
	keys  *keystore.Store[entry]
	seed  uint64
	stats limitCounters
	kind  kind // what the limit is (kind.go), fixed when it is made

	// also are the companions of a limit the engine runs (reps.go), nil if none; rep is
	// a companion's representation.
	also atomic.Pointer[[]*Limit]
	rep  string
}

// entry is what one server holds for one (limit, key). It lives in the limit's bounded
// store and is only touched under that store's lock for the key.
type entry struct {
	// What a lease hit reads and writes comes first, together (with the store's own
	// fields before it, the key's bytes among them: 164 bytes, three or four cache
	// lines): a hit on one of many keys misses the cache once per line.
	shape *Shape             // the shape the key was last decided on; nil for a new key
	pre   tokenbucket.Bucket // the pre-check: x/time/rate's arithmetic, under the key's lock
	lease Lease              // its hot fields first

	// key is the key's ID (wire.KeyID), the engine's own copy (initEntry), apart from
	// the store's, which may live in this entry: flights, waiters, refunds and expiries
	// hold it, never the caller's string, which may pin a larger buffer. A hit does
	// not read it.
	key string

	// credit is the bucket's credit (redisstore.Grant.Credit) at the key's last grant on
	// this server, if hasCredit: the reference of a debt its fallback runs up.
	credit    float64
	hasCredit bool
	flight    *Flight // the refill in flight, nil if none
	win       *wkey   // a windowed limit's state of the key (window.go); nil for a bucket's

	// pad keeps a key's state (with the store's fields) at 352 bytes, where its fields
	// make 320: the size class a hit over 10,000 keys measured fastest in (TestEntrySize's
	// comment).
	pad [32]byte
}

type refund struct {
	lim   *Limit
	shape *Shape // the key's shape when its tokens were given back
	key   string // the key's ID
	n     int
}

// New returns an Engine for cfg, or an error that says what is wrong with it (wrapping
// storeerr.ErrInvalidLimit or breaker.ErrNoPolicy where those say more). The driver wraps
// it in its own configuration error.
func New(cfg Config) (*Engine, error) {
	if len(cfg.Limits) == 0 {
		return nil, errors.New("no limits")
	}
	if cfg.Servers < 1 {
		return nil, fmt.Errorf("FleetSize %d: say how many servers share the limits (with Fleet set, the first guess)", cfg.Servers)
	}
	if cfg.HeartbeatInterval < 0 || cfg.HeartbeatInterval > 0 && cfg.HeartbeatInterval < time.Millisecond {
		// Redis counts a server live for three intervals, in whole milliseconds.
		return nil, fmt.Errorf("HeartbeatInterval %v: want 0 (the default) or at least 1ms", cfg.HeartbeatInterval)
	}
	if cfg.NextSeq == nil {
		return nil, errors.New("no NextSeq")
	}
	if cfg.Fleet != "" {
		if _, err := redisstore.NewLimit(cfg.Fleet, 1, 1); err != nil { // a fleet name follows the limit-name rules
			return nil, fmt.Errorf("fleet name: %w", err)
		}
	}
	if cfg.KeyOpen == nil && cfg.BreakerOpen != nil {
		open := cfg.BreakerOpen
		cfg.KeyOpen = func(string, string) bool { return open() } // one breaker for every key
	}
	e := &Engine{
		fleet:   cfg.Fleet,
		beat:    cmpOr(cfg.HeartbeatInterval, DefaultHeartbeatInterval),
		nextSeq: cfg.NextSeq,
		open:    cfg.BreakerOpen,
		keyOpen: cfg.KeyOpen,
		notify:  cfg.Notify,
		decided: cfg.Decided,
		rng:     cfg.Seed ^ 0x5eed7ac4,
		seed:    cfg.Seed,
		shards:  cfg.Shards,
	}
	e.servers.Store(int64(cfg.Servers))
	var list []*Limit
	for i, lc := range cfg.Limits {
		if slices.ContainsFunc(list, func(l *Limit) bool { return l.name == lc.Name }) {
			return nil, fmt.Errorf("limit %q configured twice", lc.Name)
		}
		lm, err := e.newLimit(lc, cfg.Servers, cfg.Shards, cfg.Seed+uint64(i)*0x9e3779b97f4a7c15)
		if err != nil {
			return nil, err
		}
		list = append(list, lm)
	}
	e.limits.Store(newLimitTable(list, nil))
	e.tickEvery = e.tickInterval()
	e.repsDue, e.firstReps = true, true // read the record of representations before serving (reps.go)
	return e, nil
}

func (e *Engine) newLimit(c LimitConfig, servers, shards int, seed uint64) (*Limit, error) {
	ss, c, err := buildShapes(c, servers)
	if err != nil {
		return nil, err
	}
	lm := &Limit{e: e, name: c.Name, seed: seed}
	lm.cur.Store(ss)
	var keep time.Duration
	lm.kind, keep = newKind(lm, c, seed)
	idle := max(ss.idleTimeout(), keep)
	lm.keys, err = keystore.NewStore(keystore.StoreConfig[entry]{
		MaxKeys:     c.MaxKeys,
		IdleTimeout: idle,
		Shards:      shards,
		Init:        lm.initEntry,
		OnEvict:     func(_ string, en *entry, _ keystore.EvictReason) { lm.kind.evicted(en) },
	})
	if err != nil {
		return nil, fmt.Errorf("limit %q: %w", c.Name, err)
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

// Limit returns the named limit, or nil if the engine has none of that name.
func (e *Engine) Limit(name string) *Limit {
	t := e.limits.Load()
	if t.byName != nil {
		return t.byName[name]
	}
	for _, lm := range t.prim {
		if lm.name == name {
			return lm
		}
	}
	return nil
}

// Config returns the limit's current configuration, MaxWait's and MaxCost's defaults
// filled in; a default pre-check stays 0 (PreRate, PreBurst), as given.
func (lm *Limit) Config() LimitConfig { return lm.cur.Load().base.cfg }

// Shape returns the current shape of tier ("" for the limit's own rate and burst; a
// tier the limit does not have is that one too).
func (lm *Limit) Shape(tier string) *Shape { return lm.cur.Load().of(tier) }

// HasTier reports whether the limit has tier now ("" always).
func (lm *Limit) HasTier(tier string) bool { return tier == "" || lm.cur.Load().of(tier).tier == tier }

// Window returns the time the limit's bucket takes to refill from empty (Burst / Rate).
func (lm *Limit) Window() time.Duration { return lm.Shape("").window }

// RefillTime is Shape("").RefillTime.
func (lm *Limit) RefillTime(n int) time.Duration { return lm.Shape("").RefillTime(n) }

// Name returns the limit's name; Rate and Burst its fleet-wide refill rate and capacity
// (of the tier ""). Unlike Config they copy nothing, for the hot path.
func (lm *Limit) Name() string  { return lm.name }
func (lm *Limit) Rate() float64 { return lm.Shape("").cfg.Rate }
func (lm *Limit) Burst() int    { return lm.Shape("").cfg.Burst }

// Limits returns the engine's limits, in the order they were configured; the slice is
// the engine's own, not to be modified.
func (e *Engine) Limits() []*Limit { return e.limits.Load().prim }

// Servers returns the live server count the limits are divided by.
func (e *Engine) Servers() int { return int(e.servers.Load()) }

// setServers divides every limit among n live servers from now on.
func (e *Engine) setServers(now time.Time, n int) {
	e.cfgMu.Lock()
	defer e.cfgMu.Unlock()
	if int64(n) == e.servers.Swap(int64(n)) {
		return
	}
	for _, lm := range e.limits.Load().list {
		for _, s := range lm.cur.Load().all() {
			s.setServers(now, n)
		}
	}
}

// initEntry makes the state of a key new to this server: an empty lease, and no shape
// yet (its first decision gives it one, with a full pre-check bucket: reshape).
func (lm *Limit) initEntry(en *entry, key string, _ int64) {
	h := hashKey(key)
	en.pre = tokenbucket.Bucket{}
	en.shape = nil
	en.lease = NewLease(lm.seed ^ h)
	en.flight = nil
	en.win = nil
	lm.kind.initKey(en)
	// A clone: refunds, debts, charges and marks hold the key's ID after its entry is
	// let go of, and the store's copy of a short key lives in the entry.
	en.key = strings.Clone(key)
}

// hashKey is FNV-1a, to give each key its own jitter seed and draws.
func hashKey(key string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	return h
}
