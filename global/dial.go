package global

import (
	"context"
	"crypto/tls"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// dialFunc is the shape of go-redis's Options.Dialer.
type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// keepDialing wraps dial, the client's dialer (nil: go-redis's own, built at each dial
// from what *dialTimeout and *tlsConfig then hold), so that go-redis's pool never sees a
// dial fail: a failed dial returns a connection whose every read and write fails with
// the dial's error, and go-redis drops it at its handshake and returns that error.
//
// Why: once PoolSize dials have failed, go-redis answers every new connection with its
// last dial error, without dialling, until a background dial it retries once a second
// succeeds. Behind a breaker that is a second of recovery lost: the breaker's first
// probe after Redis came back fails without trying. The breaker already bounds how
// often the limiter dials a dead Redis (a probe per open time), so the pool need not.
func keepDialing(dial dialFunc, dialTimeout *time.Duration, tlsConfig **tls.Config) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := dial
		if d == nil {
			d = redis.NewDialer(&redis.Options{DialTimeout: *dialTimeout, TLSConfig: *tlsConfig})
		}
		c, err := d(ctx, network, addr)
		if err != nil {
			return failedConn{err: &dialError{err}, remote: dialAddr{network, addr}}, nil
		}
		return c, nil
	}
}

// dialError is a failed dial, as the reads and writes of its failedConn return it: it
// says and unwraps to the dial's own error, so a caller sees what the dial said (a
// connection refused, a timeout) and classifies it the same (ErrUnavailable).
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// failedConn is the connection keepDialing returns for a failed dial.
type failedConn struct {
	err    error
	remote net.Addr
}

func (c failedConn) Read([]byte) (int, error)         { return 0, c.err }
func (c failedConn) Write([]byte) (int, error)        { return 0, c.err }
func (c failedConn) Close() error                     { return nil }
func (c failedConn) LocalAddr() net.Addr              { return c.remote }
func (c failedConn) RemoteAddr() net.Addr             { return c.remote }
func (c failedConn) SetDeadline(time.Time) error      { return nil }
func (c failedConn) SetReadDeadline(time.Time) error  { return nil }
func (c failedConn) SetWriteDeadline(time.Time) error { return nil }

// dialAddr is the address a failed dial was for.
type dialAddr struct{ network, addr string }

func (a dialAddr) Network() string { return a.network }
func (a dialAddr) String() string  { return a.addr }
