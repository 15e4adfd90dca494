// Package storeerr holds the error classes of fleetlimit's Redis tier, the one rule
// that says which errors mean that the store did not answer, and the one that says
// which are a deadline that passed (IsTimeout). Package global
// exports both (global.ErrUnavailable and the other classes, global.IsUnavailable);
// package breaker applies the rule, less the redirects of a Cluster node that answered
// (IsNodeFailure), as its default Settings.IsFailure, so a breaker built by hand counts
// exactly the failures the hybrid limiter's own breakers count.
package storeerr

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The error classes. Package global documents them, as global.ErrUnavailable,
// global.ErrRedis, global.ErrInvalidLimit and global.ErrInvalidConfig.
var (
	ErrUnavailable   = errors.New("global: redis unavailable")
	ErrRedis         = errors.New("global: redis error")
	ErrInvalidLimit  = errors.New("global: invalid limit")
	ErrInvalidConfig = errors.New("global: invalid configuration")
)

// classes are checked in this order: an error carrying one keeps it.
var classes = [...]error{ErrUnavailable, ErrRedis, ErrInvalidLimit, ErrInvalidConfig}

// unavailableReplies are the first words of the Redis error replies that mean the
// server cannot serve now.
var unavailableReplies = map[string]bool{
	"LOADING": true, "BUSY": true, "CLUSTERDOWN": true, "TRYAGAIN": true,
	"MASTERDOWN": true, "READONLY": true, "NOREPLICAS": true, "MISCONF": true,
	"OOM": true, "MOVED": true, "ASK": true,
}

// maxClients starts the reply of a server that has no room for another connection.
const maxClients = "ERR max number of clients"

// Class returns the class of err: nil for nil and for anything that matches
// context.Canceled (the caller gave up, which says nothing about the store); the
// class err already carries, if any; for a Redis error reply, ErrUnavailable if
// its first word is one of LOADING, BUSY, CLUSTERDOWN, TRYAGAIN, MASTERDOWN,
// READONLY, NOREPLICAS, MISCONF, OOM, MOVED or ASK, or it says the server has
// reached its maximum number of clients, and ErrRedis otherwise; and ErrUnavailable
// for every other error, which happened below the Redis protocol (a deadline, a
// network error, a closed client, a pool timeout, a dialer or TLS failure).
func Class(err error) error {
	if err == nil || errors.Is(err, context.Canceled) {
		return nil
	}
	for _, c := range classes {
		if errors.Is(err, c) {
			return c
		}
	}
	if msg, ok := replyOf(err); ok {
		if unavailableReplies[firstWord(msg)] || strings.HasPrefix(msg, maxClients) {
			return ErrUnavailable
		}
		return ErrRedis
	}
	return ErrUnavailable
}

// replyOf returns the text of the Redis error reply err is or wraps, false if none.
func replyOf(err error) (string, bool) {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return "", false
	}
	return reply.Error(), true
}

// firstWord is a reply's first word: its error code.
func firstWord(msg string) string {
	word, _, _ := strings.Cut(msg, " ")
	return word
}

// IsUnavailable reports whether Class(err) is ErrUnavailable.
func IsUnavailable(err error) bool { return Class(err) == ErrUnavailable }

// IsNodeFailure is the rule a breaker counts failures by: IsUnavailable, but for a MOVED
// or ASK reply, which a Cluster node that answered sends for a key whose slot it no
// longer serves, or is handing to another node. During a resharding the calls for a
// moving slot's keys answer so until the client's slot map catches up (MOVED) or the
// slot's migration ends (ASK); counted as failures, they would open the breaker of a
// healthy master and send every key it serves to their policy. The call itself still
// failed, unavailable: its request goes to its policy, and the client reloads its map.
func IsNodeFailure(err error) bool { return IsUnavailable(err) && !isRedirect(err) }

// isRedirect reports whether err is, or wraps, a MOVED or ASK reply.
func isRedirect(err error) bool {
	msg, ok := replyOf(err)
	return ok && (firstWord(msg) == "MOVED" || firstWord(msg) == "ASK")
}

// DidNotRun reports whether err proves that the call it ended did not run in Redis: Redis
// refused it with an error reply, its arguments failed their own check before it was
// sent (ErrInvalidLimit, ErrInvalidConfig), or it had no connection to go on (the pool's
// timeout, a closed client, a dial that failed). A deadline, or a connection lost once
// the call was written, leaves it unknown: it may have run.
func DidNotRun(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrInvalidLimit) || errors.Is(err, ErrInvalidConfig) ||
		errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrClosed) {
		return true
	}
	if _, ok := replyOf(err); ok {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// IsTimeout reports whether err is a deadline that passed: the context's, or a
// connection's read or write deadline. A call that ends so may have run in Redis or
// not: its answer is unknown.
func IsTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr) && netErr.Timeout()
}
