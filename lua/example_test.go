package lua_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/lua"
)

// The article's example: the first call on a new bucket with capacity 100, rate 10/s,
// cost 1 is allowed and leaves 99 tokens.
func Example() {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	m.SetTime(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)) // freeze Redis TIME for a stable output
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	defer rdb.Close()

	ctx := context.Background()
	bucket := redis.NewScript(lua.BucketSource)
	reply, err := bucket.Run(ctx, rdb, []string{"fl:{api:alice}"}, 100, 10, 1).Slice()
	fmt.Println(reply, err)
	// Output:
	// [1 99] <nil>
}
