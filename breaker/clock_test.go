package breaker

import (
	"context"
	"errors"
	"io"
	"os"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/sysclock"
)

// manualClock is a Clock that moves only when the test advances it. Its
// timers run f on a goroutine of their own, as the Clock contract says.
type manualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*manualTimer // pending, in no particular order
}

type manualTimer struct {
	at time.Time
	f  func()
}

func newManualClock() *manualClock {
	// Far from the system clock, and from a synctest bubble's: a deadline
	// that fired by either would be decades late.
	return &manualClock{now: time.Date(2101, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{at: c.now.Add(d), f: f}
	if d <= 0 {
		go f()
		return func() bool { return false }
	}
	c.timers = append(c.timers, t)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		i := slices.Index(c.timers, t)
		if i < 0 {
			return false // started, or stopped before
		}
		c.timers = slices.Delete(c.timers, i, i+1)
		return true
	}
}

// advance moves the clock by d and starts the timers that are due.
func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*manualTimer
	c.timers = slices.DeleteFunc(c.timers, func(t *manualTimer) bool {
		if t.at.After(c.now) {
			return false
		}
		due = append(due, t)
		return true
	})
	c.mu.Unlock()
	for _, t := range due {
		go t.f()
	}
}

// skip moves the clock by d without starting the timers that fall due: what a call
// that sees its deadline pass before Do's timer does (a socket's own deadline) finds.
func (c *manualClock) skip(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *manualClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// TestDoFollowsClock: with a clock of its own, Do returns ErrTimeout exactly
// when that clock passes the call's deadline, not a nanosecond before, and
// no system-clock time passes meanwhile (the test runs in a synctest bubble,
// whose clock moves only if a goroutine waits on a system timer). The
// caller's deadline is read on the same clock, and the MinCountedTimeout
// rule (by default half the Timeout) holds as with the system clock.
func TestDoFollowsClock(t *testing.T) {
	const timeout = 10 * time.Millisecond
	tests := []struct {
		name     string
		deadline time.Duration // the caller's, from the clock's now; 0: none
		wantAt   time.Duration // when Do returns ErrTimeout
		counted  bool          // the timeout counts as a store failure
	}{
		{name: "no caller deadline", wantAt: timeout, counted: true},
		{name: "caller deadline longer than Timeout", deadline: time.Hour, wantAt: timeout, counted: true},
		{name: "caller deadline about Timeout", deadline: 9 * time.Millisecond, wantAt: 9 * time.Millisecond, counted: true},
		{name: "caller deadline at MinCountedTimeout", deadline: timeout / 2, wantAt: timeout / 2, counted: true},
		{name: "caller deadline just under MinCountedTimeout", deadline: timeout/2 - time.Nanosecond, wantAt: timeout/2 - time.Nanosecond},
		{name: "caller deadline shorter than MinCountedTimeout", deadline: 2 * time.Millisecond, wantAt: 2 * time.Millisecond},
		{name: "caller deadline already passed", deadline: -time.Millisecond, wantAt: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				clock := newManualClock()
				b, _ := newTestBreaker(t, Settings{Timeout: timeout, FailureThreshold: 1, Clock: clock})
				s := &store{}
				release := s.stallUntilReleased()
				defer release()

				ctx := context.Background()
				if tt.deadline != 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithDeadline(ctx, clock.Now().Add(tt.deadline))
					defer cancel()
				}
				bubbleStart := time.Now()
				result := make(chan error, 1)
				go func() { result <- b.Do(ctx, s.call) }()
				synctest.Wait()

				if tt.wantAt > 0 {
					clock.advance(tt.wantAt - time.Nanosecond)
					synctest.Wait()
					select {
					case err := <-result:
						t.Fatalf("Do returned %v a nanosecond before its deadline", err)
					default:
					}
					clock.advance(time.Nanosecond)
				}
				synctest.Wait()
				var err error
				select {
				case err = <-result:
				default:
					t.Fatalf("Do has not returned at its deadline, %v on the clock", tt.wantAt)
				}
				if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Do = %v, want ErrTimeout", err)
				}
				if d := time.Since(bubbleStart); d != 0 {
					t.Errorf("%v passed on the system clock, want none", d)
				}
				want := StateClosed
				if tt.counted {
					want = StateOpen
				}
				if got := b.State(); got != want {
					t.Errorf("after the timeout: %v, want %v (stats %+v)", got, want, b.Stats())
				}
				if st := b.Stats(); st.Timeouts != 1 || st.Abandoned != 1 {
					t.Errorf("stats %+v, want 1 timeout, abandoned", st)
				}
			})
		})
	}
}

// TestDoCleansUp: a call that answers in time leaves no timer behind on the
// clock, and its context is cancelled once Do returns.
func TestDoCleansUp(t *testing.T) {
	clock := newManualClock()
	b, _ := newTestBreaker(t, Settings{Clock: clock})
	for _, want := range []error{nil, io.EOF} {
		var callCtx context.Context
		err := b.Do(context.Background(), func(ctx context.Context) error {
			callCtx = ctx
			return want
		})
		if err != want {
			t.Fatalf("Do = %v, want %v", err, want)
		}
		if n := clock.pending(); n != 0 {
			t.Errorf("%d timers left on the clock after Do returned", n)
		}
		if err := callCtx.Err(); err != context.Canceled {
			t.Errorf("call's context after Do returned: %v, want context.Canceled", err)
		}
	}
}

// TestCallContext: the context a call gets carries the caller's values; with
// the system clock it carries Do's deadline, with another clock only the
// caller's (an instant of that clock would mean nothing to a socket); either
// way it is done with context.DeadlineExceeded at Do's deadline, and
// cancelled once Do returns.
func TestCallContext(t *testing.T) {
	const timeout = 10 * time.Millisecond
	type key struct{}
	tests := []struct {
		name         string
		manual       bool
		deadline     time.Duration // the caller's, from now; 0: none
		wantDeadline time.Duration // from now; 0: none
	}{
		{name: "system clock", wantDeadline: timeout},
		{name: "system clock, caller deadline shorter", deadline: 3 * time.Millisecond, wantDeadline: 3 * time.Millisecond},
		{name: "system clock, caller deadline longer", deadline: time.Hour, wantDeadline: timeout},
		{name: "manual clock", manual: true},
		{name: "manual clock, caller deadline shorter", manual: true, deadline: 3 * time.Millisecond, wantDeadline: 3 * time.Millisecond},
		{name: "manual clock, caller deadline longer", manual: true, deadline: time.Hour, wantDeadline: time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var clock Clock = sysclock.Clock{}
				manual := newManualClock()
				if tt.manual {
					clock = manual
				}
				b, _ := newTestBreaker(t, Settings{Timeout: timeout, Clock: clock})
				now := clock.Now()
				ctx := context.WithValue(context.Background(), key{}, "v")
				if tt.deadline != 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithDeadline(ctx, now.Add(tt.deadline))
					defer cancel()
				}
				got := make(chan context.Context, 1)
				err := b.Do(ctx, func(ctx context.Context) error {
					if tt.manual {
						manual.advance(timeout) // Do's deadline is at most Timeout away
					}
					<-ctx.Done()
					got <- ctx
					return ctx.Err()
				})
				callCtx := <-got
				if errAtDone := callCtx.Err(); !errors.Is(err, ErrTimeout) || errAtDone != context.DeadlineExceeded {
					t.Errorf("Do = %v, call's context ended with %v; want ErrTimeout, DeadlineExceeded", err, errAtDone)
				}
				if v := callCtx.Value(key{}); v != "v" {
					t.Errorf("call's context value %v, want the caller's", v)
				}
				dl, ok := callCtx.Deadline()
				if tt.wantDeadline == 0 {
					if ok {
						t.Errorf("call's deadline %v, want none", dl)
					}
				} else if !ok || dl.Sub(now) != tt.wantDeadline {
					t.Errorf("call's deadline %v (set: %v), want now+%v", dl.Sub(now), ok, tt.wantDeadline)
				}
			})
		})
	}
}

// TestProbeUnderShortCallerDeadline: a half-open probe made under a caller deadline
// shorter than the Timeout gets no longer than that deadline: it is not left to run on to
// the probe's own deadline. Shorter than MinCountedTimeout, its timeout counts as nothing,
// so the next call is let through as a probe at once.
func TestProbeUnderShortCallerDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := newManualClock()
		b, ch := newTestBreaker(t, Settings{Timeout: 10 * time.Millisecond, FailureThreshold: 1, OpenTimeout: time.Second, Clock: clock})
		s, release := halfOpenStalled(b)
		defer release()
		ctx, cancel := context.WithDeadline(context.Background(), clock.Now().Add(3*time.Millisecond))
		defer cancel()
		result := make(chan error, 1)
		go func() { result <- b.Do(ctx, s.call) }()
		synctest.Wait()
		clock.advance(3 * time.Millisecond)
		synctest.Wait()
		select {
		case err := <-result:
			if !errors.Is(err, ErrTimeout) {
				t.Fatalf("probe under a 3ms deadline = %v, want ErrTimeout", err)
			}
		default:
			t.Fatal("the probe's Do has not returned at its caller's deadline")
		}
		if st := b.Stats(); st.Excluded != 1 || st.Failures != 1 || st.InFlight != 1 {
			t.Errorf("stats %+v, want the probe excluded, the first failure only, its stalled call in flight", st)
		}
		release()
		if err := b.Do(context.Background(), s.call); err != nil {
			t.Fatalf("the next call = %v, want it let through as a probe", err)
		}
		if got := b.State(); got != StateClosed {
			t.Errorf("after the second probe answered: %v, want closed (changes %v)", got, ch.list())
		}
	})
}

// TestTimeoutSeenByTheCall: a call may report its deadline passed before Do's timer
// fires (a client that sets its socket's deadline from the context's). Once the whole
// budget has passed on the clock, such an error is Do's timeout: ErrTimeout, counted in
// Timeouts and as a failure; before that, it is the store's error, as it is.
func TestTimeoutSeenByTheCall(t *testing.T) {
	const timeout = 10 * time.Millisecond
	for _, tc := range []struct {
		name    string
		took    time.Duration
		timeout bool
	}{
		{"at the deadline", timeout, true},
		{"past it", timeout + time.Millisecond, true},
		{"a nanosecond before it", timeout - time.Nanosecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newManualClock()
			b, _ := newTestBreaker(t, Settings{Timeout: timeout, FailureThreshold: 1, Clock: clock})
			err := b.Do(context.Background(), func(context.Context) error {
				clock.skip(tc.took)
				return os.ErrDeadlineExceeded
			})
			if !errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, ErrTimeout) != tc.timeout {
				t.Fatalf("Do = %v, want the call's error, ErrTimeout %v", err, tc.timeout)
			}
			var timeouts int64
			if tc.timeout {
				timeouts = 1
			}
			if st := b.Stats(); st.Timeouts != timeouts || st.Failures != 1 || b.State() != StateOpen {
				t.Errorf("stats %+v, state %v; want %d timeouts, 1 failure, open", st, b.State(), timeouts)
			}
		})
	}
}
