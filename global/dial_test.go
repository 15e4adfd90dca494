package global_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/fleetlimit/fleetlimit/global"
)

// TestConfiguredClientKeepsDialling: a client built with Configure, Redis refusing
// connections, dials again for every call, also after more than PoolSize dials failed
// (go-redis's pool would otherwise answer without dialling), and each call reports the
// dial's own error, classified ErrUnavailable; for Configure and ConfigureUniversal
// (ConfigureCluster wraps the Dialer the same way; it needs a cluster to dial).
func TestConfiguredClientKeepsDialling(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close() // nothing listens there now: connection refused
	const poolSize, calls = 2, 10
	off := &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	for _, tc := range []struct {
		name string
		new  func(dial func(ctx context.Context, network, addr string) (net.Conn, error)) redis.UniversalClient
	}{
		{"Configure", func(dial func(context.Context, string, string) (net.Conn, error)) redis.UniversalClient {
			o := &redis.Options{Addr: addr, PoolSize: poolSize, Dialer: dial, MaintNotificationsConfig: off}
			global.Configure(o)
			return redis.NewClient(o)
		}},
		{"ConfigureUniversal", func(dial func(context.Context, string, string) (net.Conn, error)) redis.UniversalClient {
			o := &redis.UniversalOptions{Addrs: []string{addr}, PoolSize: poolSize, Dialer: dial, MaintNotificationsConfig: off}
			global.ConfigureUniversal(o)
			return redis.NewUniversalClient(o)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dials atomic.Int64
			var d net.Dialer
			c := tc.new(func(ctx context.Context, network, addr string) (net.Conn, error) {
				dials.Add(1)
				return d.DialContext(ctx, network, addr)
			})
			defer c.Close()
			for i := range calls {
				err := c.Ping(context.Background()).Err()
				if !global.IsUnavailable(err) || !errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), "connection refused") {
					t.Fatalf("call %d: %v, want the dial's connection refused, unavailable", i, err)
				}
			}
			if got := dials.Load(); got != calls {
				t.Errorf("%d dials for %d calls with PoolSize %d: the pool stopped dialling", got, calls, poolSize)
			}
		})
	}
}
