package redisstore

import (
	"errors"

	"github.com/fleetlimit/fleetlimit/internal/storeerr"
)

// opError is what the Store returns: the operation, its class and the cause.
type opError struct {
	op    string
	class error // ErrUnavailable, ErrRedis, ErrInvalidConfig, or nil for a cancellation
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
	return &opError{op: op, class: storeerr.Class(err), err: err}
}

// unexpected reports a reply of the wrong shape.
func unexpected(op string, what string) error {
	return &opError{op: op, class: storeerr.ErrRedis, err: errors.New("unexpected reply: " + what)}
}

// refusal is Redis's error for one key of a script call that answered the others
// (luascript.Refused): a Redis error reply of its own, so that it is classified as the
// reply would be (storeerr.Class: WRONGTYPE is ErrRedis, OOM and READONLY unavailable).
type refusal string

func (e refusal) Error() string { return string(e) }

// RedisError marks refusal as a Redis error reply (go-redis's redis.Error).
func (refusal) RedisError() {}
