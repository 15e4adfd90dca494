package global_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/global"
)

// startRedis stands in for a real Redis in the examples: an embedded miniredis whose
// clock (the scripts read Redis TIME) is frozen, so the output is stable.
// It returns a client built as the library recommends, and a function that stops both.
func startRedis() (*redis.Client, func()) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	m.SetTime(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC))
	opts := &redis.Options{Addr: m.Addr()}
	global.Configure(opts)
	rdb := redis.NewClient(opts)
	return rdb, func() { _ = rdb.Close(); m.Close() }
}

// Per-request decisions with the source article's script.
func ExampleStore_AllowN() {
	rdb, stop := startRedis()
	defer stop()

	store, err := global.New(rdb)
	if err != nil {
		panic(err)
	}
	login, err := global.NewLimit("login", 1, 3) // 1 attempt/s, bursts of 3, fleet-wide
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for i := 0; i < 4; i++ {
		r, err := store.AllowN(ctx, login, "alice@example.com", 1)
		if err != nil {
			panic(err) // Redis unavailable: apply the limit's failure policy instead
		}
		fmt.Printf("allowed=%v remaining=%v retry-after=%v reset-after=%v\n",
			r.Allowed, r.Remaining, r.RetryAfter, r.ResetAfter)
	}
	fmt.Println(store.Key("login", "alice@example.com"))
	// Output:
	// allowed=true remaining=2 retry-after=0s reset-after=1s
	// allowed=true remaining=1 retry-after=0s reset-after=2s
	// allowed=true remaining=0 retry-after=0s reset-after=3s
	// allowed=false remaining=0 retry-after=1s reset-after=3s
	// fl:{login:alice@example.com}
}

// A client that retries timed-out commands (go-redis's default) is refused, with the fix.
func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	_, err := global.New(rdb)
	fmt.Println(err)
	// Output:
	// global: invalid configuration: the client retries a timed-out command (Options.MaxRetries = 3). To share it with a hybrid.Limiter, pass global.RetryingClient(): the Limiter's calls recognise a replay and stay exact (Store.AllowN, which cannot, is then refused). Or set Options.MaxRetries to -1 (global.Configure / ConfigureCluster / ConfigureUniversal do), so that every call, AllowN included, runs at most once
}
