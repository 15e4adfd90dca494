package hybrid

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
)

// TestDoBatchDeadlineIsNoAnswer: a batch call that returns once the breaker's deadline
// passed, with that deadline as its error, has no answers (what it sent may have run in
// Redis): answered is false, so the engine sends a refund or debt trip again with its
// sequence numbers instead of owing its items again as if Redis had refused them. A
// call that returned answers, with item errors or none (one node's read deadline
// among them), is answered.
func TestDoBatchDeadlineIsNoAnswer(t *testing.T) {
	// The calls that answer do so at once, but on a goroutine of the breaker's, which a
	// loaded machine may start late: they get ten seconds. Those that wait for the
	// deadline get 50ms.
	answers, err := breaker.New(breaker.Settings{Name: "answers", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	deadlines, err := breaker.New(breaker.Settings{Name: "deadlines", Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		call     func(ctx context.Context) error
		answered bool
	}{
		{"answers", func(context.Context) error { return nil }, true},
		{"an item's Redis error", func(context.Context) error { return errors.New("ERR wrong number of arguments") }, true},
		{"one node's read deadline", func(context.Context) error {
			return fmt.Errorf("global: redis unavailable: read: %w", os.ErrDeadlineExceeded)
		}, true},
		{"the breaker's deadline", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }, false},
		{"a read deadline at the breaker's", func(ctx context.Context) error {
			<-ctx.Done()
			return fmt.Errorf("global: redis unavailable: read: %w", os.ErrDeadlineExceeded)
		}, false},
	} {
		brk := deadlines
		if tc.answered {
			brk = answers
		}
		answered, err := doBatch(context.Background(), brk, tc.call)
		if answered != tc.answered {
			t.Errorf("%s: answered %v (err %v), want %v", tc.name, answered, err, tc.answered)
		}
		if !answered && err == nil {
			t.Errorf("%s: not answered, and no error to say why", tc.name)
		}
	}

	// The race itself: the call returns at the very instant its deadline passes, so the
	// breaker finds both ready and reads the call's result one time in two. A manual
	// clock fires the deadline from inside the call.
	clk := &manualClock{}
	brk, err := breaker.New(breaker.Settings{Name: "race", Timeout: time.Hour, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		answered, err := doBatch(context.Background(), brk, func(ctx context.Context) error {
			clk.fire()
			<-ctx.Done()
			return ctx.Err()
		})
		if answered || err == nil {
			t.Fatalf("try %d: a call that returned its passed deadline was answered %v (err %v)", i, answered, err)
		}
	}
}

// manualClock is a breaker.Clock whose timers fire when fire is called.
type manualClock struct {
	mu sync.Mutex
	fs []func()
}

func (*manualClock) Now() time.Time { return time.Unix(0, 0) }

func (c *manualClock) AfterFunc(_ time.Duration, f func()) func() bool {
	c.mu.Lock()
	c.fs = append(c.fs, f)
	c.mu.Unlock()
	return func() bool { return false }
}

// fire runs the timers set so far, at once.
func (c *manualClock) fire() {
	c.mu.Lock()
	fs := c.fs
	c.fs = nil
	c.mu.Unlock()
	for _, f := range fs {
		f()
	}
}
