package global

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Store is the Redis tier: it runs fleetlimit's scripts (package lua) against the
// caller's go-redis client. It holds no per-key state and starts no goroutines; it is
// safe for concurrent use.
//
// What it needs from the client, and why, is in New. The short form: build the client
// with Configure (or ConfigureCluster, ConfigureUniversal), so that it does not retry
// timed-out commands and fails fast when Redis is away.
type Store struct {
	c        redis.Scripter
	pipe     pipeliner // nil when the client cannot pipeline
	prefix   string
	serverID string
	retrying bool // the client may retry a timed-out command: AllowN refuses
	seq      atomic.Uint64
}

// pipeliner is implemented by every go-redis client (Client, ClusterClient, Ring).
type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// An Option configures a Store.
type Option interface{ apply(*Store) error }

type optionFunc func(*Store) error

func (f optionFunc) apply(s *Store) error { return f(s) }

// Prefix sets the key prefix (default DefaultPrefix, "fl:"): at most 32 printable ASCII
// bytes without space, '{' or '}'. It lets several environments share one Redis.
func Prefix(p string) Option {
	return optionFunc(func(s *Store) error {
		if len(p) > 32 || strings.ContainsAny(p, "{} ") {
			return fmt.Errorf("%w: prefix %q: at most 32 bytes, no space, '{' or '}'", ErrInvalidConfig, p)
		}
		for i := 0; i < len(p); i++ {
			if p[i] < ' ' || p[i] > '~' {
				return fmt.Errorf("%w: prefix %q: byte %d is not printable ASCII", ErrInvalidConfig, p, i)
			}
		}
		s.prefix = p
		return nil
	})
}

// ServerID names this Store in the take and refund records that make those calls
// idempotent (default: 12 random hex digits, new for every Store). Give each process
// its own id; two live Stores with one id would see each other's calls as replays. A
// restarted process may reuse its id: sequence numbers start from the wall clock in
// microseconds, so they keep growing across restarts.
func ServerID(id string) Option {
	return optionFunc(func(s *Store) error {
		if id == "" || len(id) > MaxNameLen || strings.ContainsAny(id, " \t\r\n") {
			return fmt.Errorf("%w: server id %q: 1 to %d bytes without white space", ErrInvalidConfig, id, MaxNameLen)
		}
		s.serverID = id
		return nil
	})
}

// RetryingClient accepts a client that retries timed-out commands (for example a
// ClusterClient that keeps MaxRedirects > 0 to follow MOVED during resharding).
// Take, Refund, TakeBatch and Heartbeat stay exact with such a client, because their
// scripts recognise a replay. AllowN then returns an error wrapping ErrInvalidConfig: the
// source article's script cannot recognise a replay, and a retried call would be
// charged once per attempt.
func RetryingClient() Option {
	return optionFunc(func(s *Store) error {
		s.retrying = true
		return nil
	})
}

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
//     RetryingClient is given (AllowN is then refused; the lease calls are idempotent
//     and stay exact).
//     New can only inspect go-redis's own client types; for any other Scripter the
//     caller answers for it.
//   - A short ReadTimeout and one dial attempt, so a stalled or dead Redis costs
//     milliseconds (Configure sets these). Per-call deadlines belong to the breaker.
//   - For TakeBatch, a Pipeline method (all go-redis clients have one); without it the
//     batch is sent one call at a time.
//
// New adds a hook to a *redis.ClusterClient (a UniversalClient in cluster mode is one):
// a call that fails unavailable makes the client reload its slot map, so that once a
// dead master's replica has taken over, the next call goes to it, not to the dead
// address until go-redis's periodic reload (ClusterStateReloadInterval, 60 s).
func New(client redis.Scripter, opts ...Option) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidConfig)
	}
	s := &Store{c: client, prefix: DefaultPrefix}
	if p, ok := client.(pipeliner); ok {
		s.pipe = p
	}
	for _, o := range opts {
		if err := o.apply(s); err != nil {
			return nil, err
		}
	}
	if s.serverID == "" {
		var b [6]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("%w: no random server id: %v", ErrInvalidConfig, err)
		}
		s.serverID = hex.EncodeToString(b[:])
	}
	if n, what := retries(client); n > 0 && !s.retrying {
		return nil, fmt.Errorf("%w: the client retries a timed-out command (%s = %d). To share it with a "+
			"hybrid.Limiter, pass global.RetryingClient(): the Limiter's calls recognise a replay and stay exact "+
			"(Store.AllowN, which cannot, is then refused). Or set %s to -1 (global.Configure / ConfigureCluster / "+
			"ConfigureUniversal do), so that every call, AllowN included, runs at most once",
			ErrInvalidConfig, what, n, what)
	}
	// Sequence numbers must grow across restarts of a process that keeps its ServerID,
	// and stay below 2^53 (Lua numbers): microseconds since 1970 do both until 2255.
	s.seq.Store(uint64(time.Now().UnixMicro()))
	if cc, ok := client.(*redis.ClusterClient); ok {
		cc.AddHook(reloadOnFailure{cc}) // a failed-over master's slots are found at once
	}
	return s, nil
}

// retries returns how many times the client re-sends a command whose reply timed out,
// and the option that says so. Unknown client types answer 0.
func retries(c redis.Scripter) (int, string) {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().MaxRetries, "Options.MaxRetries" // after init: 0 means none
	case *redis.ClusterClient:
		o := c.Options()
		if o.MaxRedirects > 0 {
			return o.MaxRedirects, "ClusterOptions.MaxRedirects"
		}
		if o.MaxRetries > 0 {
			return o.MaxRetries, "ClusterOptions.MaxRetries"
		}
	case *redis.Ring:
		return c.Options().MaxRetries, "RingOptions.MaxRetries"
	}
	return 0, ""
}

// Client returns the client the Store runs its scripts through, as given to New.
func (s *Store) Client() redis.Scripter { return s.c }

// ServerID returns the id this Store records with its takes and refunds.
func (s *Store) ServerID() string { return s.serverID }

// nextSeq returns a fresh sequence number for one take or refund.
func (s *Store) nextSeq() uint64 { return s.seq.Add(1) }

// errRetrying is returned by AllowN on a Store built with RetryingClient.
var errRetrying = &opError{op: "allow", class: ErrInvalidConfig, err: errors.New(
	"the client retries timed-out commands (RetryingClient) and the per-request script cannot recognise " +
		"a replay: configure the client with MaxRetries -1 (global.Configure) to use AllowN")}

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
// MaxRedirects and use RetryingClient (leases only).
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
