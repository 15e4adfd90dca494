package hybrid

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
)

// TestDoBatchDeadlineIsNoAnswer: a batch call that ends in a deadline, its client's own
// or the breaker's, has no answers (what it sent may have run in Redis): answered is
// false, so the engine sends a refund or debt trip again with its sequence numbers
// instead of owing its items again as if Redis had refused them. A call that returned
// answers, with item errors or none, is answered.
func TestDoBatchDeadlineIsNoAnswer(t *testing.T) {
	brk, err := breaker.New(breaker.Settings{Name: "t", Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	l := &Limiter{brk: brk}
	for _, tc := range []struct {
		name     string
		call     func(ctx context.Context) error
		answered bool
	}{
		{"answers", func(context.Context) error { return nil }, true},
		{"an item's Redis error", func(context.Context) error { return errors.New("ERR wrong number of arguments") }, true},
		{"the client's read deadline", func(context.Context) error {
			return fmt.Errorf("global: redis unavailable: read: %w", os.ErrDeadlineExceeded)
		}, false},
		{"the breaker's deadline", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }, false},
	} {
		answered, err := l.doBatch(context.Background(), tc.call)
		if answered != tc.answered {
			t.Errorf("%s: answered %v (err %v), want %v", tc.name, answered, err, tc.answered)
		}
		if !answered && err == nil {
			t.Errorf("%s: not answered, and no error to say why", tc.name)
		}
	}
}
