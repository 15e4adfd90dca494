package global_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// TestCheckEviction: a Redis that may evict keys (a maxmemory limit with any policy but
// noeviction, volatile-* included: the buckets have TTLs) is reported with the fix; one
// that cannot, or has no limit, passes; one without CONFIG (miniredis) is an error that
// is not ErrEvicting, so the caller knows it could not check.
func TestCheckEviction(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client()
	s, err := global.New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		maxmemory, policy string
		evicting          bool
	}{
		{"0", "allkeys-lru", false},
		{"0", "noeviction", false},
		{"100mb", "noeviction", false},
		{"100mb", "allkeys-lru", true},
		{"100mb", "allkeys-lfu", true},
		{"100mb", "volatile-ttl", true},
		{"100mb", "volatile-lru", true},
	} {
		if err := c.ConfigSet(ctx, "maxmemory", tc.maxmemory).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.ConfigSet(ctx, "maxmemory-policy", tc.policy).Err(); err != nil {
			t.Fatal(err)
		}
		err := s.CheckEviction(ctx)
		if got := errors.Is(err, global.ErrEvicting); got != tc.evicting || (!tc.evicting && err != nil) {
			t.Errorf("maxmemory %s, %s: CheckEviction = %v; want evicting %v", tc.maxmemory, tc.policy, err, tc.evicting)
		}
	}

	_, mc := redistest.Mini(t)
	ms, err := global.New(mc)
	if err != nil {
		t.Fatal(err)
	}
	if err := ms.CheckEviction(ctx); err == nil || errors.Is(err, global.ErrEvicting) || !errors.Is(err, global.ErrRedis) {
		t.Errorf("miniredis (no CONFIG): CheckEviction = %v; want an ErrRedis that is not ErrEvicting", err)
	}
}

func TestCheckEvictionCluster(t *testing.T) {
	c := redistest.Cluster(t)
	s, err := global.New(c, global.RetryingClient())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// The CI cluster is started without a memory limit.
	if err := s.CheckEviction(ctx); err != nil {
		t.Fatalf("CheckEviction on the cluster = %v", err)
	}
	// One master that may evict is enough to be reported, by its address.
	var mu sync.Mutex // ForEachMaster calls fn on every master at once
	var one *redis.Client
	_ = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		if one == nil {
			one = m
		}
		return nil
	})
	// The Cluster may be one the test did not start (CI's, reused): what it set goes
	// back to what it found.
	for k, v := range map[string]string{"maxmemory": "1gb", "maxmemory-policy": "volatile-lru"} {
		was, err := one.ConfigGet(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { one.ConfigSet(context.Background(), k, was[k]) })
		if err := one.ConfigSet(ctx, k, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
	err = s.CheckEviction(ctx)
	if !errors.Is(err, global.ErrEvicting) || !strings.Contains(err.Error(), one.Options().Addr) {
		t.Fatalf("one master evicting: CheckEviction = %v; want ErrEvicting naming %s", err, one.Options().Addr)
	}
}

// TestCheckEvictionRing: on a Ring every shard is checked, each with its own memory: one
// that may evict is reported by its address on every call, where a command without a
// key would go to one shard at random.
func TestCheckEvictionRing(t *testing.T) {
	a, b := redistest.StartServer(t), redistest.StartServer(t)
	ctx := context.Background()
	evicting := b.Client()
	for k, v := range map[string]string{"maxmemory": "100mb", "maxmemory-policy": "allkeys-lru"} {
		if err := evicting.ConfigSet(ctx, k, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
	ring := redis.NewRing(&redis.RingOptions{MaxRetries: -1,
		Addrs: map[string]string{"a": a.Client().Options().Addr, "b": evicting.Options().Addr}})
	t.Cleanup(func() { ring.Close() })
	s, err := global.New(ring)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := s.CheckEviction(ctx); !errors.Is(err, global.ErrEvicting) || !strings.Contains(err.Error(), evicting.Options().Addr) {
			t.Fatalf("call %d: CheckEviction = %v; want ErrEvicting naming %s", i, err, evicting.Options().Addr)
		}
	}
}
