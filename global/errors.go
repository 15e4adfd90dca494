package global

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Error classes. Every error a Store returns wraps exactly one of them (or none, for the
// caller's own cancellation), and also the underlying error, so both match errors.Is.
var (
	// ErrUnavailable means the store did not answer usefully: a timeout or deadline, a
	// refused, reset or closed connection, a pool timeout, or a Redis that answered that
	// it cannot serve now (LOADING, BUSY, CLUSTERDOWN, TRYAGAIN, MASTERDOWN, READONLY,
	// NOREPLICAS, MISCONF, OOM, MOVED/ASK that the client did not follow, max clients).
	// A circuit breaker counts these; a timed-out take may still have been executed
	// (takes and refunds are idempotent, so that is safe to retry).
	ErrUnavailable = errors.New("global: redis unavailable")
	// ErrRedis means Redis answered with an error that will not go away by waiting
	// (a script error, WRONGTYPE on a key the library did not create, an auth or ACL
	// error), or with a reply the library does not understand.
	ErrRedis = errors.New("global: redis error")
	// ErrInvalidLimit means a Limit, a cost or a name is not valid. No call was made.
	ErrInvalidLimit = errors.New("global: invalid limit")
	// ErrConfig means the Store or its client is configured in a way the library cannot
	// work with safely (for example a client that retries timed-out commands, used for
	// AllowN). The message says how to fix it.
	ErrConfig = errors.New("global: configuration error")
)

// IsUnavailable reports whether err means the store did not answer usefully (see
// ErrUnavailable). It also classifies raw go-redis and network errors. It is false for
// nil, for a denial (not an error), for context.Canceled (the caller gave up; that says
// nothing about the store) and for ErrRedis, ErrInvalidLimit and ErrConfig.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrUnavailable) {
		return true
	}
	var oe *opError
	if errors.As(err, &oe) || errors.Is(err, ErrRedis) || errors.Is(err, ErrInvalidLimit) || errors.Is(err, ErrConfig) {
		return false // already classified, as something else
	}
	return classify(err) == ErrUnavailable
}

// opError is what the Store returns: the operation, its class and the cause.
type opError struct {
	op    string
	class error // ErrUnavailable, ErrRedis, ErrConfig, or nil for the caller's cancellation
	err   error
}

func (e *opError) Error() string { return "global: " + e.op + ": " + e.err.Error() }

func (e *opError) Unwrap() []error {
	if e.class == nil {
		return []error{e.err}
	}
	return []error{e.class, e.err}
}

// wrap classifies a go-redis error from operation op.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return &opError{op: op, class: classify(err), err: err}
}

// unexpected reports a reply of the wrong shape.
func unexpected(op string, what string) error {
	return &opError{op: op, class: ErrRedis, err: errors.New("unexpected reply: " + what)}
}

// unavailableReplies are the Redis error prefixes that mean "cannot serve now".
var unavailableReplies = []string{
	"LOADING", "BUSY", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "READONLY",
	"NOREPLICAS", "MISCONF", "OOM", "MOVED", "ASK", "ERR max number of clients",
}

// classify maps an error from go-redis to ErrUnavailable, ErrRedis, or nil (the
// caller's own cancellation).
func classify(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		for _, p := range unavailableReplies {
			if strings.HasPrefix(msg, p) {
				return ErrUnavailable
			}
		}
		return ErrRedis
	}
	// Everything else happened below the Redis protocol: a deadline, a network error,
	// a closed client, a pool timeout, a dialer or TLS failure. The store did not answer.
	return ErrUnavailable
}
