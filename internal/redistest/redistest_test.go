package redistest

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestRunPings(t *testing.T) {
	Run(t, func(t *testing.T, tg Target) {
		ctx := context.Background()
		key := Unique(t)
		if err := tg.Client.Set(ctx, key, "v", time.Minute).Err(); err != nil {
			t.Fatalf("SET on %s: %v", tg.Name, err)
		}
		if got := tg.Client.Get(ctx, key).Val(); got != "v" {
			t.Fatalf("GET on %s = %q, want %q", tg.Name, got, "v")
		}
		tg.Client.Del(ctx, key)
	})
}

func TestUniqueHasNoHashTagBraces(t *testing.T) {
	a, b := Unique(t), Unique(t)
	if a == b {
		t.Fatalf("Unique returned %q twice", a)
	}
	if strings.ContainsAny(a, "{} ") {
		t.Fatalf("Unique(t) = %q, contains a brace or space", a)
	}
}

func TestServerStopContRestart(t *testing.T) {
	s := StartServer(t)
	c := s.Client()
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}

	s.Stop()
	stalled, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err := s.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true }).Ping(stalled).Err()
	cancel()
	var ne net.Error
	if !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("PING to a stopped server: err = %v, want a timeout", err)
	}
	s.Cont()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Cont: %v", err)
	}

	s.Restart()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	if n := c.Exists(ctx, "k").Val(); n != 0 {
		t.Fatalf("after Restart key exists (%d); want an empty server", n)
	}
}

func TestMissingFailsUnderCI(t *testing.T) {
	if InCI() {
		t.Skip("checks the non-CI path")
	}
	t.Setenv("REDIS_CLUSTER_ADDRS", "")
	os.Unsetenv("REDIS_CLUSTER_ADDRS")
	ran := false
	t.Run("skips", func(t *testing.T) {
		Cluster(t)
		ran = true
	})
	if ran {
		t.Fatal("Cluster(t) without REDIS_CLUSTER_ADDRS did not skip")
	}
}
