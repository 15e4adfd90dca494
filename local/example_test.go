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
