package redisstore_test

import (
	"context"
	"net"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
)

// TestClientClockIgnored: the client's clock plays no part. Inside a synctest bubble the
// process's clock reads 2000-01-01 and jumps by hours on demand, while Redis's TIME
// (miniredis SetTime) says 2025: the buckets follow Redis alone.
func TestClientClockIgnored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := miniredis.NewMiniRedis()
		defer m.Close()
		m.SetTime(t0)
		opts := &redis.Options{
			Addr:                     "127.0.0.1:6379", // never dialled: an IP literal avoids a DNS lookup in the bubble
			Dialer:                   func(context.Context, string, string) (net.Conn, error) { return m.Dial() },
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		}
		global.Configure(opts)
		c := redis.NewClient(opts)
		defer c.Close()
		s := newStore(t, c)
		ctx := context.Background()
		lim := redisstore.Limit{Name: "clock", Rate: 1, Burst: 10}

		if time.Now().Year() != 2000 {
			t.Fatalf("bubble clock %v, want 2000", time.Now())
		}
		g, err := s.Take(ctx, lim, "k", 10, 10)
		if err != nil || g.Granted != 10 || !g.Now.Equal(t0) {
			t.Fatalf("Take = %+v %v, want 10 granted at Redis's %v", g, err, t0)
		}
		time.Sleep(5 * time.Hour) // the client's clock jumps; Redis's does not
		if g, _ := s.Take(ctx, lim, "k", 1, 1); g.Granted != 0 || !g.Now.Equal(t0) {
			t.Fatalf("after the client's clock moved 5h: %+v, want no refill", g)
		}
		if r, _ := s.AllowN(ctx, lim, "k", 1); r.Allowed {
			t.Fatalf("AllowN after the client's clock moved: %+v, want denied", r)
		}
		if ts, _ := c.HGet(ctx, s.Key("clock", "k"), "ts").Int64(); ts != t0.UnixMilli() {
			t.Fatalf("stored ts %d, want Redis's %d", ts, t0.UnixMilli())
		}
		m.SetTime(t0.Add(3 * time.Second)) // Redis's clock moves: 3 tokens
		if g, _ := s.Take(ctx, lim, "k", 10, 1); g.Granted != 3 || !g.Now.Equal(t0.Add(3*time.Second)) {
			t.Fatalf("after Redis's clock moved 3s: %+v, want 3 granted", g)
		}
	})
}
