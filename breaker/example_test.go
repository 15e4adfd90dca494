package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
)

// One breaker guards one store. Store failures open it; while open, calls
// are refused at once, without touching the store, and the limit's policy
// decides the request (here FailClosed: denied).
func ExampleBreaker() {
	b, err := breaker.New(breaker.Settings{
		Timeout:          10 * time.Millisecond,
		FailureThreshold: 2,
		OnStateChange: func(from, to breaker.State) {
			fmt.Println("breaker:", from, "->", to)
		},
	})
	if err != nil {
		panic(err)
	}
	down := func(ctx context.Context) error { return io.EOF } // the store's connection is gone
	for i := range 3 {
		err := b.Do(context.Background(), down)
		if err != nil {
			fmt.Printf("call %d: %v; open: %v\n", i, err, errors.Is(err, breaker.ErrOpen))
		}
	}
	// Output:
	// call 0: EOF; open: false
	// breaker: closed -> open
	// call 1: EOF; open: false
	// call 2: breaker: open: circuit breaker is open; open: true
}

// The failure policies a limit chooses from. The zero Policy is none of them:
// hybrid.New refuses a limit without one, with an error wrapping ErrNoPolicy.
func ExamplePolicy() {
	for _, p := range []breaker.Policy{breaker.FailOpen, breaker.FailClosed, breaker.FailLocal(), breaker.FailLocalLimit(5, 2)} {
		fmt.Println(p)
	}
	// Output:
	// fail-open
	// fail-closed
	// fail-local
	// fail-local(5/s, burst 2)
}
