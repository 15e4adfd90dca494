package storeerr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"
)

// reply is a Redis error reply, as go-redis gives it.
type reply string

func (r reply) Error() string { return string(r) }
func (reply) RedisError()     {}

var _ redis.Error = reply("")

// TestDidNotRun: only an error that proves the call never ran says so; a deadline and a
// connection lost once the call was written leave it unknown.
func TestDidNotRun(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"an error reply", reply("WRONGTYPE Operation against a key holding the wrong kind of value"), true},
		{"an unavailable reply, wrapped", fmt.Errorf("take: %w", reply("LOADING Redis is loading")), true},
		{"invalid arguments", fmt.Errorf("%w: burst 0", ErrInvalidLimit), true},
		{"a configuration refused", fmt.Errorf("%w: no client", ErrInvalidConfig), true},
		{"the pool's timeout", redis.ErrPoolTimeout, true},
		{"a closed client", fmt.Errorf("take: %w", redis.ErrClosed), true},
		{"a dial that failed", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, true},
		{"a read that failed", &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}, false},
		{"EOF", io.EOF, false},
		{"a deadline", context.DeadlineExceeded, false},
		{"canceled", context.Canceled, false},
		{"unavailable, with no reply", fmt.Errorf("%w: something", ErrUnavailable), false},
	} {
		if got := DidNotRun(tc.err); got != tc.want {
			t.Errorf("%s: DidNotRun(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
