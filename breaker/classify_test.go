package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// replies are Redis error replies and whether each means the server cannot
// serve now: every first word Redis and Redis Cluster answer with, and some
// that only start like one of those. A redirect (MOVED, ASK) is unavailable,
// yet no failure of the node that answered it.
var replies = []struct {
	msg         string
	unavailable bool
	redirect    bool
}{
	{"LOADING Redis is loading the dataset in memory", true, false},
	{"BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", true, false},
	{"CLUSTERDOWN The cluster is down", true, false},
	{"TRYAGAIN Multiple keys request during rehashing of slot", true, false},
	{"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", true, false},
	{"READONLY You can't write against a read only replica.", true, false},
	{"NOREPLICAS Not enough good replicas to write.", true, false},
	{"MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.", true, false},
	{"OOM command not allowed when used memory > 'maxmemory'.", true, false},
	{"MOVED 3999 127.0.0.1:6381", true, true},
	{"ASK 3999 127.0.0.1:6381", true, true},
	{"ERR max number of clients reached", true, false},
	{"ERR Error running script (call to f_0123): @user_script:1: oops", false, false},
	{"ERR unknown command 'EVALSHA'", false, false},
	{"WRONGTYPE Operation against a key holding the wrong kind of value", false, false},
	{"NOSCRIPT No matching script. Please use EVAL.", false, false},
	{"NOAUTH Authentication required.", false, false},
	{"WRONGPASS invalid username-password pair or user is disabled.", false, false},
	{"NOPERM this user has no permissions to run the 'evalsha' command", false, false},
	{"EXECABORT Transaction discarded because of previous errors.", false, false},
	{"CROSSSLOT Keys in request don't hash to the same slot", false, false},
	{"NOTBUSY No scripts in execution right now.", false, false},
	{"UNKILLABLE Sorry the script already executed write commands against the dataset.", false, false},
	{"NOPROTO unsupported protocol version", false, false},
	{"BUSYKEY Target key name already exists.", false, false},
	{"BUSYGROUP Consumer Group name already exists", false, false},
}

type classCase struct {
	name     string
	err      error
	want     bool
	redirect bool // a default Breaker does not count it, though unavailable
}

// TestOneClassifier: a Breaker's default IsFailure and global.IsUnavailable
// answer the same for every error: raw go-redis, net and syscall errors, every
// Redis reply as go-redis returns it, the same replies as global's Store
// returns them, and errors that carry each of global's classes, which count
// by their class, whatever they wrap. But for a MOVED or ASK reply: unavailable
// (the call failed), yet no failure of the node that answered it.
func TestOneClassifier(t *testing.T) {
	cases := []classCase{
		{"nil", nil, false, false},
		{"context.Canceled", context.Canceled, false, false},
		{"wrapped context.Canceled", fmt.Errorf("dial: %w", context.Canceled), false, false},
		{"dial cancelled", &net.OpError{Op: "dial", Net: "tcp", Err: context.Canceled}, false, false},
		{"context.DeadlineExceeded", context.DeadlineExceeded, true, false},
		{"os.ErrDeadlineExceeded", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, true, false},
		{"io.EOF", io.EOF, true, false},
		{"io.ErrUnexpectedEOF", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true, false},
		{"net.ErrClosed", net.ErrClosed, true, false},
		{"DNS error", &net.DNSError{Err: "no such host", Name: "redis.invalid", IsNotFound: true}, true, false},
		{"TLS failure", errors.New("tls: handshake failure"), true, false},
		{"redis.ErrClosed", redis.ErrClosed, true, false},
		{"redis.ErrPoolTimeout", redis.ErrPoolTimeout, true, false},
		{"redis.ErrPoolExhausted", redis.ErrPoolExhausted, true, false},
		{"redis.Nil", redis.Nil, false, false},
		{"redis.ErrNoScript", redis.ErrNoScript, false, false},
		{"breaker.ErrTimeout", breaker.ErrTimeout, true, false},
		{"breaker.ErrOpen", breaker.ErrOpen, true, false},
		{"breaker.ErrOverloaded", breaker.ErrOverloaded, true, false},
		// A class wins over what it wraps.
		{"ErrUnavailable", global.ErrUnavailable, true, false},
		{"ErrUnavailable over a script error", fmt.Errorf("%w: %w", global.ErrUnavailable, redis.ErrNoScript), true, false},
		{"ErrRedis", global.ErrRedis, false, false},
		{"ErrRedis over EOF", fmt.Errorf("%w: %w", global.ErrRedis, io.EOF), false, false},
		{"ErrInvalidLimit", global.ErrInvalidLimit, false, false},
		{"ErrInvalidLimit over a deadline", fmt.Errorf("%w: %w", global.ErrInvalidLimit, context.DeadlineExceeded), false, false},
		{"ErrInvalidConfig", global.ErrInvalidConfig, false, false},
		{"ErrInvalidConfig over a refused connection", fmt.Errorf("%w: %w", global.ErrInvalidConfig, syscall.ECONNREFUSED), false, false},
	}
	for _, errno := range []syscall.Errno{
		syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE,
		syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.ENETDOWN, syscall.ETIMEDOUT,
	} {
		cases = append(cases,
			classCase{errno.Error(), errno, true, false},
			classCase{"net.OpError " + errno.Error(), &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", errno)}, true, false})
	}
	cases = append(cases, replyCases(t)...)
	cases = append(cases, storeCases(t)...)

	for _, tc := range cases {
		got := global.IsUnavailable(tc.err)
		if brk := defaultIsFailure(t, tc.err); brk != (got && !tc.redirect) || got != tc.want {
			t.Errorf("%s (%v): global.IsUnavailable %v, a default Breaker counts a failure: %v; want %v, and a failure %v",
				tc.name, tc.err, got, brk, tc.want, tc.want && !tc.redirect)
		}
	}
}

// defaultIsFailure reports whether a Breaker with the default IsFailure
// counts err, returned by a call, as a store failure.
func defaultIsFailure(t *testing.T, err error) bool {
	t.Helper()
	b, e := breaker.New(breaker.Settings{FailureThreshold: 1, Timeout: time.Minute})
	if e != nil {
		t.Fatal(e)
	}
	if got := b.Do(context.Background(), func(context.Context) error { return err }); got != err {
		t.Fatalf("Do = %v, want the call's %v", got, err)
	}
	return b.State() == breaker.StateOpen
}

// replyCases are the Redis error replies as go-redis returns them: miniredis
// answers a command with the reply, and go-redis parses it (into its own
// types for LOADING, MOVED, OOM and others).
func replyCases(t *testing.T) []classCase {
	m, c := redistest.Mini(t)
	if err := m.Server().Register("REPLY", func(p *server.Peer, _ string, args []string) {
		p.WriteError(args[0])
	}); err != nil {
		t.Fatal(err)
	}
	var cases []classCase
	for _, r := range replies {
		err := c.Do(context.Background(), "REPLY", r.msg).Err()
		var reply redis.Error
		if !errors.As(err, &reply) || err.Error() != r.msg {
			t.Fatalf("REPLY %q: %v (%T), want it as a Redis error", r.msg, err, err)
		}
		cases = append(cases, classCase{"go-redis: " + r.msg, err, r.unavailable, r.redirect})
	}
	return cases
}

// storeCases are errors as global's Store returns them: each Redis reply, the
// caller's cancellation, a passed deadline, a refused connection, an invalid
// limit and an unusable configuration.
func storeCases(t *testing.T) []classCase {
	ctx := context.Background()
	lim := global.Limit{Name: "classify", Rate: 1, Burst: 10}
	m, c := redistest.Mini(t)
	s, err := global.New(c)
	if err != nil {
		t.Fatal(err)
	}
	take := func(ctx context.Context, lim global.Limit) error {
		_, err := redisstore.Of(s).Take(ctx, redisstore.Limit(lim), "k", 1, 1)
		if err == nil {
			t.Fatalf("Take(%+v): no error", lim)
		}
		return err
	}
	var cases []classCase
	for _, r := range replies {
		m.SetError(r.msg)
		cases = append(cases, classCase{"Store: " + r.msg, take(ctx, lim), r.unavailable, r.redirect})
	}
	m.SetError("")

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	past, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	_, errConfig := global.New(nil)
	cases = append(cases,
		classCase{"Store: cancelled", take(cancelled, lim), false, false},
		classCase{"Store: deadline passed", take(past, lim), true, false},
		classCase{"Store: invalid limit", take(ctx, global.Limit{Name: "classify", Burst: 10}), false, false},
		classCase{"Store: nil client", errConfig, false, false},
	)
	m.Close()
	cases = append(cases, classCase{"Store: connection refused", take(ctx, lim), true, false})
	return cases
}
