package global

import (
	"context"
	"runtime"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/redisstore"
)

// A Store is the Redis tier: it runs fleetlimit's scripts (package lua) against the
// caller's go-redis client. It holds no per-key state and starts no goroutines; it is
// safe for concurrent use.
//
// What it needs from the client, and why, is in New. The short form: build the client
// with Configure (or ConfigureCluster, ConfigureUniversal), so that it does not retry
// timed-out commands and fails fast when Redis is away.
type Store struct {
	s *redisstore.Store
}

func init() {
	redisstore.Of = func(store any) *redisstore.Store { return store.(*Store).s }
}

// An Option configures a Store.
type Option struct{ o redisstore.Option }

// Prefix sets the key prefix (default "fl:"): at most 32 printable ASCII
// bytes without space, '{' or '}'. It lets several environments share one Redis.
func Prefix(p string) Option { return Option{redisstore.Prefix(p)} }

// ServerID names this Store in the records that make a hybrid.Limiter's takes and
// refunds idempotent (default: 12 random hex digits, new for every Store). Give each process
// its own id; two live Stores with one id would see each other's calls as replays. A
// restarted process may reuse its id: sequence numbers start from the wall clock in
// microseconds, so they keep growing across restarts.
func ServerID(id string) Option { return Option{redisstore.ServerID(id)} }

// RetryingClient accepts a client that retries timed-out commands (for example a
// ClusterClient that keeps MaxRedirects > 0 to follow MOVED during resharding).
// A hybrid.Limiter's calls stay exact with such a client, because their scripts
// recognise a replay. AllowN then returns an error wrapping ErrInvalidConfig: the
// source article's script cannot recognise a replay, and a retried call would be
// charged once per attempt.
func RetryingClient() Option { return Option{redisstore.RetryingClient()} }

// New returns a Store that runs the scripts through client: a *redis.Client (single
// node or Sentinel), *redis.ClusterClient, *redis.Ring, or anything else that
// implements redis.Scripter (a redis.UniversalClient does).
//
// What the library needs from the client:
//
//   - No retry of a timed-out command for AllowN. go-redis retries a read timeout by
//     default (MaxRetries 3; a ClusterClient retries up to MaxRedirects 3 times), and
//     the server may have run the script each time: one call, up to four charges. New
//     refuses such a client with an error wrapping ErrInvalidConfig, unless
//     RetryingClient is given (AllowN is then refused; a hybrid.Limiter's calls are
//     idempotent and stay exact).
//     New can only inspect go-redis's own client types; for any other Scripter the
//     caller answers for it.
//   - A short ReadTimeout and one dial attempt, so a stalled or dead Redis costs
//     milliseconds (Configure sets these). Per-call deadlines belong to the breaker.
//   - A Pipeline method (all go-redis clients have one), so that a hybrid.Limiter sends
//     the refills of many keys in one round trip; without it they go one call at a time.
//
// New adds a hook to a *redis.ClusterClient (a UniversalClient in cluster mode is one):
// a call that fails unavailable makes the client reload its slot map, so that once a
// dead master's replica has taken over, the next call goes to it, not to the dead
// address until go-redis's periodic reload (ClusterStateReloadInterval, 60 s).
func New(client redis.Scripter, opts ...Option) (*Store, error) {
	os := make([]redisstore.Option, len(opts))
	for i, o := range opts {
		os[i] = o.o
	}
	s, err := redisstore.New(client, os...)
	if err != nil {
		return nil, err
	}
	return &Store{s}, nil
}

// Result is the answer of one per-request decision (AllowN).
type Result struct {
	// Allowed reports whether the request may go ahead; its cost has been spent.
	Allowed bool
	// Remaining is the number of tokens left in the bucket after the decision. It may be
	// fractional; round it down for a header such as X-RateLimit-Remaining.
	Remaining float64
	// RetryAfter is 0 when allowed; otherwise how long until the bucket holds the
	// request's cost, if nobody else spends meanwhile (a Retry-After header).
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again if nothing is spent.
	ResetAfter time.Duration
}

// AllowN decides one request of cost n against the fleet-wide bucket of lim and key,
// with one call of the source article's script (luascript.Bucket): Redis's clock, one atomic
// step, no race between servers. Being denied is a Result with Allowed false, not an
// error. Errors wrap ErrInvalidLimit (no call made), ErrUnavailable, ErrRedis, or
// ErrInvalidConfig (a Store built with RetryingClient cannot run this non-idempotent
// script).
func (s *Store) AllowN(ctx context.Context, lim Limit, key string, n int) (Result, error) {
	r, err := s.s.AllowN(ctx, redisstore.Limit(lim), key, n)
	return Result(r), err
}

// Key returns the Redis key of the bucket for limit name (a valid Limit.Name) and user
// key, for inspecting a bucket with redis-cli:
//
//	<prefix>{<name>:<key>}            key of at most 64 bytes without '{' or '}'
//	<prefix>{<name>#<sha256(key)[:16] in hex>}   any other key
//
// A longer key, or one with a brace, goes by its digest, so a bucket key stays short and
// keeps its hash tag whatever the caller passes. The braces are the Redis Cluster hash
// tag: it covers the whole bucket (limit and key), so the buckets of one limit spread
// over every master, while everything one bucket needs lives in one slot.
func (s *Store) Key(name, key string) string { return s.s.Key(name, key) }

// CheckEviction asks Redis (CONFIG GET; every master of a Cluster) whether it may evict
// keys: a maxmemory limit with any policy but noeviction. The buckets carry TTLs, so the
// volatile-* policies evict them as readily as allkeys-*; an evicted bucket that a
// Limiter's servers lease from comes back empty (they saw it in use), taking from its key
// the tokens it held, one that only AllowN uses comes back full, giving its key its burst
// again, and a charge-later limit's debts and low keys are not so kept. It returns
// nil when nothing can be evicted, an error wrapping ErrEvicting that names the fix when
// buckets can be, and another error (classified as the Store's are) when Redis does not
// answer or refuses CONFIG, as managed services often do: then the operator must check.
//
// The fix: maxmemory-policy noeviction (a write over the limit then fails with OOM,
// which the breaker counts and the limit's failure policy handles, in the open), or a
// Redis for the limiter alone with maxmemory 0, sized by docs/operations.md.
func (s *Store) CheckEviction(ctx context.Context) error { return s.s.CheckEviction(ctx) }

// Configure sets o to the settings fleetlimit recommends for a limiter's client,
// overwriting these fields (change any of them afterwards):
//
//	MaxRetries    -1      a timed-out script is never re-sent (it may have run)
//	DialTimeout   250ms   a dead Redis is found quickly
//	DialerRetries 1       one dial attempt per connection
//	ReadTimeout   100ms   bounds a stalled call; the breaker's deadline is shorter
//	WriteTimeout  100ms
//	PoolTimeout   100ms   waiting for a connection is bounded too
//	MaxActiveConns = PoolSize (10 per CPU when unset): dials are bounded in an outage
//	Dialer        wraps the one set (or go-redis's own, with DialTimeout and TLSConfig
//	              as they are when it dials) so that a failed dial never makes the pool
//	              fail the next ones without dialling
//
// go-redis's pool, once PoolSize dials have failed, answers every new connection with
// the last dial error, without dialling, until a background dial it retries once a
// second succeeds; behind the limiter's breaker that costs up to a second of recovery
// after an outage, as the breaker's first probe fails without trying. With the wrapped
// Dialer a failed dial hands the pool a connection that fails its handshake with the
// dial's error instead: the caller sees the same error, the pool counts no dial failure,
// and the breaker (a probe per OpenTimeout) bounds how often a dead Redis is dialled.
// Set Dialer before Configure, not after, to keep this.
//
// ContextTimeoutEnabled is left as it is: with it, a deadline closes the connection
// (a reconnect per timeout under load); without it, ReadTimeout bounds the call and
// the breaker returns to the caller at its own deadline.
func Configure(o *redis.Options) {
	o.Dialer = keepDialing(o.Dialer, &o.DialTimeout, &o.TLSConfig)
	recommend(&o.MaxRetries, &o.DialerRetries, &o.MaxActiveConns, o.PoolSize,
		&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout)
}

// ConfigureCluster is Configure for a ClusterClient. It also sets MaxRedirects to -1,
// which stops timeout retries but also stops following MOVED: during a resharding or
// a failover that moves slots away from a live master a call answers ErrUnavailable
// once and the next goes to the new owner (a master that died answers nothing: see New
// for how the Store finds its replica). If you would rather follow MOVED, keep
// MaxRedirects and use RetryingClient (a hybrid.Limiter's calls only).
func ConfigureCluster(o *redis.ClusterOptions) {
	o.MaxRedirects = -1
	o.Dialer = keepDialing(o.Dialer, &o.DialTimeout, &o.TLSConfig)
	recommend(&o.MaxRetries, &o.DialerRetries, &o.MaxActiveConns, o.PoolSize,
		&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout)
}

// ConfigureUniversal is Configure for the options of redis.NewUniversalClient.
func ConfigureUniversal(o *redis.UniversalOptions) {
	o.MaxRedirects = -1
	o.Dialer = keepDialing(o.Dialer, &o.DialTimeout, &o.TLSConfig)
	recommend(&o.MaxRetries, &o.DialerRetries, &o.MaxActiveConns, o.PoolSize,
		&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout)
}

// recommend writes the settings Configure documents into one options struct's fields.
func recommend(maxRetries, dialerRetries, maxActive *int, poolSize int, dial, read, write, pool *time.Duration) {
	*maxRetries = -1
	*dialerRetries = 1
	*dial = 250 * time.Millisecond
	*read = 100 * time.Millisecond
	*write = 100 * time.Millisecond
	*pool = 100 * time.Millisecond
	if poolSize <= 0 {
		poolSize = 10 * runtime.GOMAXPROCS(0)
	}
	*maxActive = poolSize
}
