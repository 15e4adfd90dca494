package local_test

import (
	"fmt"
	"time"

	"github.com/fleetlimit/fleetlimit/local"
)

// A per-client limit of 2 requests per second with bursts of 3, driven at
// explicit instants.
func ExampleLimiter() {
	lim, err := local.NewLimiter(local.Config{Rate: 2, Burst: 3, MaxKeys: 10_000})
	if err != nil {
		panic(err)
	}
	defer lim.Close()

	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 5 {
		fmt.Println("alice", i, lim.AllowN(start, "alice", 1))
	}
	fmt.Println("bob", lim.AllowN(start, "bob", 1))
	// Half a second later alice has one token again.
	fmt.Println("alice later", lim.AllowN(start.Add(500*time.Millisecond), "alice", 1))
	// Output:
	// alice 0 true
	// alice 1 true
	// alice 2 true
	// alice 3 false
	// alice 4 false
	// bob true
	// alice later true
}

// The conservative fallback share of a fleet-wide limit of 1000/s with a
// burst of 100, for one server of 200.
func ExampleFallbackLimit() {
	r, burst := local.FallbackLimit(1000, 100, 200, 1)
	fmt.Println(r, burst)
	// Output: 5 1
}

// A Store keeps per-key state of any type, bounded, and hands evicted
// values to a callback outside its locks.
func ExampleStore() {
	type session struct{ requests int }
	store, err := local.NewStore(local.StoreConfig[session]{
		MaxKeys: 2,
		Shards:  1,
		OnEvict: func(key string, s *session, why local.EvictReason) {
			fmt.Printf("evicted %s after %d requests (%v)\n", key, s.requests, why)
		},
	})
	if err != nil {
		panic(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, key := range []string{"a", "b", "a", "c"} {
		store.Update(now, key, func(s *session, _ time.Time) { s.requests++ })
	}
	store.Close()
	// Output:
	// evicted b after 1 requests (capacity)
	// evicted a after 2 requests (purged)
	// evicted c after 1 requests (purged)
}
