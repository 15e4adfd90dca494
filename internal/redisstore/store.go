package redisstore

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/storeerr"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// A Store is the Redis tier behind a global.Store: it runs fleetlimit's scripts (package
// lua) against the caller's go-redis client. It holds no per-key state and starts no
// goroutines; it is safe for concurrent use.
type Store struct {
	c        redis.Scripter
	pipe     pipeliner // nil when the client cannot pipeline
	prefix   string
	serverID string
	retrying bool // the client may retry a timed-out command: AllowN refuses
	seq      atomic.Uint64
	// together is how the keys of one refund call are chosen (RefundBatch): any keys
	// (one Redis), keys of one slot (a Cluster), or one key a call (any other client,
	// a Ring say, whose shards a script call cannot span).
	together grouping
}

// grouping is which keys may share a script call.
type grouping int

const (
	oneKey   grouping = iota // one key a call
	anyKeys                  // every key lives on the one Redis
	slotKeys                 // a Redis Cluster: keys of one hash slot
)

// of is the group of key: keys of one group may share a script call, and a key of group
// -1 shares none.
func (g grouping) of(key string) int {
	switch g {
	case anyKeys:
		return 0
	case slotKeys:
		return wire.Slot(key)
	}
	return -1
}

// groupingOf is the grouping of keys a client's script calls allow.
func groupingOf(c redis.Scripter) grouping {
	switch c.(type) {
	case *redis.Client:
		return anyKeys
	case *redis.ClusterClient:
		return slotKeys
	}
	return oneKey
}

// pipeliner is implemented by every go-redis client (Client, ClusterClient, Ring).
type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// An Option configures a Store.
type Option interface{ apply(*Store) error }

type optionFunc func(*Store) error

func (f optionFunc) apply(s *Store) error { return f(s) }

// Prefix is global.Prefix.
func Prefix(p string) Option {
	return optionFunc(func(s *Store) error {
		if len(p) > 32 || strings.ContainsAny(p, "{} ") {
			return fmt.Errorf("%w: prefix %q: at most 32 bytes, no space, '{' or '}'", storeerr.ErrInvalidConfig, p)
		}
		for i := 0; i < len(p); i++ {
			if p[i] < ' ' || p[i] > '~' {
				return fmt.Errorf("%w: prefix %q: byte %d is not printable ASCII", storeerr.ErrInvalidConfig, p, i)
			}
		}
		s.prefix = p
		return nil
	})
}

// ServerID is global.ServerID.
func ServerID(id string) Option {
	return optionFunc(func(s *Store) error {
		if id == "" || len(id) > MaxNameLen || strings.ContainsAny(id, " \t\r\n") {
			return fmt.Errorf("%w: server id %q: 1 to %d bytes without white space", storeerr.ErrInvalidConfig, id, MaxNameLen)
		}
		s.serverID = id
		return nil
	})
}

// RetryingClient is global.RetryingClient: AllowN is then refused, the lease calls stay
// exact.
func RetryingClient() Option {
	return optionFunc(func(s *Store) error {
		s.retrying = true
		return nil
	})
}

// New is global.New, which documents what the library needs from the client. It adds to a
// *redis.ClusterClient the hook that reloads the slot map after a call fails unavailable
// (reloadOnFailure).
func New(client redis.Scripter, opts ...Option) (*Store, error) {
	if v := reflect.ValueOf(client); client == nil || v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, fmt.Errorf("%w: nil client", storeerr.ErrInvalidConfig) // a nil *redis.Client too
	}
	s := &Store{c: client, prefix: DefaultPrefix, together: groupingOf(client)}
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
			return nil, fmt.Errorf("%w: no random server id: %v", storeerr.ErrInvalidConfig, err)
		}
		s.serverID = hex.EncodeToString(b[:])
	}
	if n, what := retries(client); n > 0 && !s.retrying {
		return nil, fmt.Errorf("%w: the client retries a timed-out command (%s = %d). To share it with a "+
			"hybrid.Limiter, pass global.RetryingClient(): the Limiter's calls recognise a replay and stay exact "+
			"(Store.AllowN, which cannot, is then refused). Or set %s to -1 (global.Configure / ConfigureCluster / "+
			"ConfigureUniversal do), so that every call, AllowN included, runs at most once",
			storeerr.ErrInvalidConfig, what, n, what)
	}
	// Sequence numbers must grow across restarts of a process that keeps its ServerID,
	// and stay below 2^53 (Lua numbers): microseconds since 1970 do both until 2255.
	s.seq.Store(uint64(time.Now().UnixMicro()))
	if cc, ok := client.(*redis.ClusterClient); ok {
		hookOnce(cc) // a failed-over master's slots are found at once
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
var errRetrying = &opError{op: "allow", class: storeerr.ErrInvalidConfig, err: errors.New(
	"the client retries timed-out commands (RetryingClient) and the per-request script cannot recognise " +
		"a replay: configure the client with MaxRetries -1 (global.Configure) to use AllowN")}
