package breaker

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// laggyClock is the system clock of a process that is not scheduled for lag each time
// a timer fires: the timer's function runs, and then the clock reads lag later, as a
// CPU-starved process finds when it runs again.
type laggyClock struct {
	lag  time.Duration
	skew atomic.Int64
}

func (c *laggyClock) Now() time.Time { return time.Now().Add(time.Duration(c.skew.Load())) }

func (c *laggyClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, func() {
		c.skew.Add(int64(c.lag))
		f()
	}).Stop
}

// TestStarvedTimeoutsDoNotOpen: a store that never answers opens the breaker after
// FailureThreshold timeouts when Do sees each deadline on time; when Do sees them a
// whole budget late (the process was not running), they count as nothing, and the
// breaker stays closed.
func TestStarvedTimeoutsDoNotOpen(t *testing.T) {
	for _, tc := range []struct {
		name    string
		lag     time.Duration
		opens   bool
		starved int64
	}{
		{"on time", 0, true, 0},
		{"a little late", 5 * time.Millisecond, true, 0},
		{"a budget late", 10 * time.Millisecond, false, 5},
		{"far late", 200 * time.Millisecond, false, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, err := New(Settings{Timeout: 10 * time.Millisecond, FailureThreshold: 3, Clock: &laggyClock{lag: tc.lag}})
				if err != nil {
					t.Fatal(err)
				}
				stalled := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
				for range 5 {
					if err := b.Do(context.Background(), stalled); err == nil {
						t.Fatal("a stalled store answered")
					} else if errors.Is(err, ErrOpen) {
						break
					}
				}
				st := b.Stats()
				if opened := b.State() == StateOpen; opened != tc.opens || st.Starved != tc.starved {
					t.Fatalf("lag %v: open %v, starved %d; want open %v, starved %d (stats %+v)", tc.lag, opened, st.Starved, tc.opens, tc.starved, st)
				}
			})
		})
	}
}
