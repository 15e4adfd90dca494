package local

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/fleetlimit/fleetlimit/internal/keystore"
	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
)

// ErrInvalidConfig is wrapped by every error that NewLimiter and SetLimitAt
// return for a configuration they cannot honour.
var ErrInvalidConfig = errors.New("local: invalid configuration")

// Config configures a Limiter. Rate and Burst are required.
type Config struct {
	// Rate is the refill rate in tokens per second of every key's bucket:
	// a finite number > 0, slow enough that an empty bucket fills within
	// about 292 years (a time.Duration). rate.Inf admits everything.
	Rate rate.Limit

	// Burst is the size of every key's bucket: the most one key can spend
	// at once (with Rate rate.Inf, any cost passes, as in x/time/rate). It
	// must be at least 1 (x/time/rate treats a burst of 0 as
	// "deny everything", which as a configuration is a silent fail-closed)
	// and at most 2^53 (x/time/rate counts tokens in a float64: past 2^53,
	// taking one token from a full bucket leaves it full).
	Burst int

	// MaxKeys caps the number of keys held; 0 means 100,000.
	MaxKeys int

	// IdleTimeout drops a key's bucket after it has been unused this long.
	// 0 means the time an empty bucket takes to fill up, plus one second
	// (the same rule as the TTL of the Redis script): a bucket dropped then
	// is full, and a full bucket is the same as no key, so nothing is lost.
	// A shorter timeout saves memory but lets a key that comes back after it
	// start with a full bucket early. Negative is an error.
	IdleTimeout time.Duration

	// Shards splits the keys over this many shards, each under its own mutex, with
	// MaxKeys divided among them; 0 picks a default from GOMAXPROCS. Negative is an
	// error.
	Shards int
}

// A Limiter is a set of token buckets, one per key, each a
// golang.org/x/time/rate Limiter with the same rate and burst: the
// per-process tier of fleetlimit, for one limit.
//
// A key's bucket is created full on first use and dropped when it has been
// idle for the idle timeout or when the limiter is full and it is the least
// recently used key of its shard. A dropped key that comes back
// starts with a full bucket again: that is token-bucket semantics, a full
// bucket is the same as no bucket, and with the default idle timeout a
// bucket is only dropped for idleness once it is full anyway. A bucket
// dropped for capacity, though, may have been partly spent; size MaxKeys
// for the number of keys active within one idle timeout.
//
// Time is a parameter: AllowN takes the instant of the request, and Allow
// is shorthand for AllowN(time.Now(), key, 1). An instant earlier than one
// already seen for the same key counts as that later instant, so a clock
// that steps back never creates tokens (a bare rate.Limiter does create
// them in that case). Its instants may come from any clock, a virtual one
// starting at the zero Time included, as long as they lie within 292 years of
// the first one it is given (a time.Duration).
//
// Most callers should use AllowN, or Allow. A Limiter is safe for
// simultaneous use by multiple goroutines and starts no goroutines.
type Limiter struct {
	store *keystore.Store[bucket]
	cfg   atomic.Pointer[limitConfig]

	mu          sync.Mutex // serialises SetLimitAt
	defaultIdle bool       // IdleTimeout follows the refill time
	// epoch is the first instant the Limiter was given (set once, by epochOnce): the
	// key store keeps a key's latest instant as nanoseconds since (nanos), read by
	// time.Time's Sub, on the monotonic clock when both instants have a reading of it,
	// so a step of the wall clock does not make keys idle, and exact for any clock
	// within 292 years of it.
	epochOnce sync.Once
	epoch     time.Time
}

// limitConfig is one version of the limit; buckets pick up a newer version
// the next time they are used.
type limitConfig struct {
	r     rate.Limit
	burst int
	fill  time.Duration // an empty bucket's time to fill, plus a second
	gen   uint64
	at    time.Time // instant SetLimitAt took effect
}

type bucket struct {
	lim rate.Limiter
	gen uint64
}

// NewLimiter returns a Limiter with no keys, or an error wrapping
// ErrInvalidConfig that says what is wrong with cfg.
func NewLimiter(cfg Config) (*Limiter, error) {
	lc, err := newLimitConfig(cfg.Rate, cfg.Burst)
	if err != nil {
		return nil, err
	}
	if cfg.IdleTimeout < 0 {
		return nil, fmt.Errorf("%w: IdleTimeout %v is negative", ErrInvalidConfig, cfg.IdleTimeout)
	}
	l := &Limiter{defaultIdle: cfg.IdleTimeout == 0}
	l.cfg.Store(lc)
	idle := cfg.IdleTimeout
	if l.defaultIdle {
		idle = lc.fill
	}
	l.store, err = keystore.NewStore(keystore.StoreConfig[bucket]{
		MaxKeys:     cfg.MaxKeys,
		IdleTimeout: idle,
		Shards:      cfg.Shards,
		Init:        l.initBucket,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return l, nil
}

// newLimitConfig checks r and burst by the rule every tier shares (tokenbucket.Check), with
// this package's own extension: rate.Inf, a bucket that admits everything, needs only a
// valid burst.
func newLimitConfig(r rate.Limit, burst int) (*limitConfig, error) {
	if r == rate.Inf {
		if err := tokenbucket.CheckBurst(burst); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		return &limitConfig{r: r, burst: burst, fill: time.Second}, nil
	}
	if err := tokenbucket.Check(float64(r), burst); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	fill := tokenbucket.FromMillis(tokenbucket.TTLMillis(float64(burst), float64(r)))
	return &limitConfig{r: r, burst: burst, fill: fill}, nil
}

// nanos is t as the key store keeps it: nanoseconds since the first instant the
// Limiter was given (t, if it is that one).
func (l *Limiter) nanos(t time.Time) int64 {
	l.epochOnce.Do(func() { l.epoch = t })
	return int64(t.Sub(l.epoch))
}

// instant is the instant the key store keeps as ns (nanos).
func (l *Limiter) instant(ns int64) time.Time { return l.epoch.Add(time.Duration(ns)) }

// initBucket makes a full bucket for a new key: its history starts one
// fill time before now. It runs under the shard lock.
func (l *Limiter) initBucket(b *bucket, _ string, now int64) {
	c := l.cfg.Load()
	start := l.instant(now).Add(-c.fill)
	b.lim.SetLimitAt(start, c.r)
	b.lim.SetBurstAt(start, c.burst)
	b.gen = c.gen
}

// AllowN reports whether n tokens may be taken from key's bucket at instant
// now, and takes them if so. It never waits. AllowN(now, key, 0) reports
// true without taking anything; a negative n reports false. The empty
// string is a key like any other. A closed Limiter reports false.
func (l *Limiter) AllowN(now time.Time, key string, n int) bool {
	if n < 0 {
		return false
	}
	ns := l.nanos(now)
	sh, e, ok := l.store.Acquire(ns, key)
	if !ok {
		return false
	}
	t := l.advance(e, now, ns)
	allowed := n == 0 || e.Val.lim.AllowN(t, n)
	l.store.Release(sh)
	return allowed
}

// Allow is shorthand for AllowN(time.Now(), key, 1).
func (l *Limiter) Allow(key string) bool {
	return l.AllowN(time.Now(), key, 1)
}

// TokensAt returns the number of tokens key's bucket holds at instant now,
// without taking any or making the key more recently used; a key that is
// not held has a full bucket. An instant earlier than the key's latest
// counts as that latest one, as in AllowN. It does not advance the key's
// time, so looking at a key does not keep it from expiring when idle (but
// after SetLimitAt, the key's time moves to that change's instant).
func (l *Limiter) TokensAt(now time.Time, key string) float64 {
	tokens := float64(l.cfg.Load().burst) // a key not held: AllowN would start afresh
	ns := l.nanos(now)
	l.store.Inspect(key, ns, func(e *keystore.Entry[bucket]) {
		if e == nil {
			return
		}
		t := now
		if ns-e.Last < 0 {
			t = l.instant(e.Last)
		}
		if c := l.cfg.Load(); e.Val.gen < c.gen {
			// Applying the newer limit moves the bucket's time to when it was set;
			// the key's time follows it (never beyond), so its idle time is not reset.
			e.Last = l.nanos(l.applyConfig(&e.Val, c, l.instant(e.Last), t))
		}
		// rate.Limiter.TokensAt only reads: the key's time stays as it was, so
		// looking does not keep an idle key alive.
		tokens = e.Val.lim.TokensAt(t)
	})
	return tokens
}

// advance moves the entry's time to max(now, its last instant), applies a
// newer limit if there is one, and returns that time; ns is now as the key store
// keeps it (nanos). It requires that the entry's shard is locked.
func (l *Limiter) advance(e *keystore.Entry[bucket], now time.Time, ns int64) time.Time {
	prev := e.Last
	t := now
	if e.Touch(ns) != ns {
		t = l.instant(e.Last) // now is earlier: it counts as the key's latest instant
	}
	if c := l.cfg.Load(); e.Val.gen < c.gen {
		l.applyConfig(&e.Val, c, l.instant(prev), t)
	}
	return t
}

// applyConfig gives b the current limit if it has an older one: the old
// limit applies until the instant SetLimitAt was called, clamped into
// [prev, t] so the bucket's time never moves backwards. It requires that
// b's shard is locked. It returns the instant the limit took effect, in
// [prev, t].
func (l *Limiter) applyConfig(b *bucket, c *limitConfig, prev, t time.Time) time.Time {
	at := c.at
	if at.Before(prev) {
		at = prev
	}
	if at.After(t) {
		at = t
	}
	b.lim.SetLimitAt(at, c.r)
	b.lim.SetBurstAt(at, c.burst)
	b.gen = c.gen
	return at
}

// SetLimitAt changes the rate and burst of every bucket, held or not, from
// instant now on, with the same rules for r and burst as NewLimiter; an
// invalid pair leaves the limit unchanged and returns an error wrapping
// ErrInvalidConfig. Held buckets keep their tokens (capped at the new
// burst) and take up the new limit when next used; if a key is not used
// between two changes, only the later one applies to it, from its instant.
// If the idle timeout was left to its default, it grows to the new refill
// time when that is longer, and never shrinks: a bucket last used under the
// old limit may need the old time to fill. now is meant as the present: a
// request at an earlier instant (a caller's clock behind the one that set
// the limit) takes the new limit at its own instant, not at now.
func (l *Limiter) SetLimitAt(now time.Time, r rate.Limit, burst int) error {
	nc, err := newLimitConfig(r, burst)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	nc.gen = l.cfg.Load().gen + 1
	nc.at = now
	l.cfg.Store(nc)
	if l.defaultIdle && nc.fill > l.store.IdleTimeout() {
		l.store.SetIdleTimeout(nc.fill)
	}
	return nil
}

// Limit returns the current rate and burst.
func (l *Limiter) Limit() (rate.Limit, int) {
	c := l.cfg.Load()
	return c.r, c.burst
}

// Len returns the number of keys whose buckets are held.
func (l *Limiter) Len() int {
	return l.store.Len()
}

// Sweep drops up to max buckets (no limit if max <= 0) that are idle at
// instant now and returns how many it dropped, the least recently used
// first; a bucket idle behind one used after it may wait for a later Sweep.
// Buckets are also dropped as new keys arrive, so Sweep is only needed to
// give memory back promptly.
func (l *Limiter) Sweep(now time.Time, max int) int {
	return l.store.Sweep(l.nanos(now), max)
}

// Close drops every bucket; AllowN then reports false. Close is
// idempotent.
func (l *Limiter) Close() {
	l.store.Close()
}
