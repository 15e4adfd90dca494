package breaker

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// IsStoreFailure is the default Settings.IsFailure: it reports whether err
// means that the store did not answer, as opposed to an answer (a denied
// request, a script error, redis.Nil). It is true for timeouts and deadline
// errors, network errors, io.EOF and io.ErrUnexpectedEOF, refused, reset or
// broken connections, unreachable hosts, a closed client or connection,
// go-redis's pool timeout and exhaustion, and the Redis replies that say
// the server cannot serve now: LOADING, READONLY (a failover demoted it),
// MASTERDOWN, CLUSTERDOWN, TRYAGAIN, NOREPLICAS, BUSY (a script runs too
// long) and max number of clients reached.
func IsStoreFailure(err error) bool {
	if err == nil {
		return false
	}
	if isTimeout(err) {
		return true
	}
	for _, target := range []error{
		io.EOF, io.ErrUnexpectedEOF, net.ErrClosed,
		syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE,
		syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.ENETDOWN,
		redis.ErrClosed, redis.ErrPoolTimeout, redis.ErrPoolExhausted,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	return redis.IsLoadingError(err) || redis.IsReadOnlyError(err) ||
		redis.IsMasterDownError(err) || redis.IsClusterDownError(err) ||
		redis.IsTryAgainError(err) || redis.IsNoReplicasError(err) ||
		redis.IsMaxClientsError(err) || redis.HasErrorPrefix(err, "BUSY")
}

// isTimeout reports whether err is a deadline or timeout error.
func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr) && netErr.Timeout()
}
