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
	reply, err := lua.Bucket.Run(ctx, rdb, []string{"fl:{api:alice}"}, 100, 10, 1).Slice()
	fmt.Println(reply, err)

	// A lease: take up to 30 tokens, at least 5, as server "s1" with sequence number 1.
	take, err := lua.Take.Run(ctx, rdb, []string{"fl:{api:alice}"}, 100, 10, 30, 5, "s1", 1, 0).Slice()
	fmt.Println("granted", take[0], "left", take[1], "wait ms", take[2], err)

	// The same call again (a client retry) is answered from the record: nothing spent.
	again, _ := lua.Take.Run(ctx, rdb, []string{"fl:{api:alice}"}, 100, 10, 30, 5, "s1", 1, 0).Slice()
	fmt.Println("replayed", again[4] == int64(lua.Replayed), "granted", again[0], "left", again[1])
	// Output:
	// [1 99] <nil>
	// granted 30 left 69 wait ms 0 <nil>
	// replayed true granted 30 left 69
}
