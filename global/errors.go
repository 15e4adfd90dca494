package global

import (
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/storeerr"
)

// Error classes. Every error a Store returns wraps exactly one of them (or none, for the
// caller's own cancellation), and also the underlying error, so both match errors.Is.
var (
	// ErrUnavailable means the store did not answer usefully: a timeout or deadline, a
	// refused, reset or closed connection, a pool timeout, any other failure below the
	// Redis protocol (a dialer or TLS error), or a Redis that answered that it cannot
	// serve now (LOADING, BUSY, CLUSTERDOWN, TRYAGAIN, MASTERDOWN, READONLY, NOREPLICAS,
	// MISCONF, OOM, MOVED/ASK that the client did not follow, max clients).
	// A circuit breaker counts these; a timed-out call may still have run in Redis (a
	// hybrid.Limiter's takes and refunds are idempotent, so it sends them again safely).
	ErrUnavailable = storeerr.ErrUnavailable
	// ErrRedis means Redis answered with an error that will not go away by waiting
	// (a script error, WRONGTYPE on a key the library did not create, an auth or ACL
	// error), or with a reply the library does not understand.
	ErrRedis = storeerr.ErrRedis
	// ErrInvalidLimit means a Limit, a cost or a name is not valid. No call was made.
	ErrInvalidLimit = storeerr.ErrInvalidLimit
	// ErrInvalidConfig means the Store or its client is configured in a way the library
	// cannot work with safely (for example a client that retries timed-out commands, used
	// for AllowN). The message says how to fix it.
	ErrInvalidConfig = storeerr.ErrInvalidConfig
)

// ErrEvicting is wrapped by CheckEviction's error when Redis may evict the buckets.
var ErrEvicting = redisstore.ErrEvicting

// IsUnavailable reports whether err means the store did not answer usefully (see
// ErrUnavailable). An error that carries a class answers by its class; a raw go-redis,
// network or context error is classified the way the Store classifies it. It is false
// for nil, for anything that matches context.Canceled (the caller gave up; that says
// nothing about the store), and for ErrRedis, ErrInvalidLimit and ErrInvalidConfig. A
// breaker.Breaker counts failures by this same rule, but for a Cluster node's MOVED and
// ASK replies (the node answered), unless its Settings.IsFailure says otherwise.
func IsUnavailable(err error) bool { return storeerr.IsUnavailable(err) }
