package breaker

import (
	"context"
	"sync"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/sysclock"
)

// A Clock tells the time and runs functions after a duration. A Breaker reads
// the time and sets its deadlines through its Clock only (Settings.Clock).
// A nil Settings.Clock is the system clock (time.Now and time.AfterFunc); a
// test or a simulator passes a clock of its own, such as a manual clock that
// moves only when told to. The two methods are all a timer needs, so code
// that drives a Breaker can put its own timers (a wake-up, a wait's timeout,
// a sleep that ends early when a context does) on the same Clock.
//
// gobreaker, which counts the failures under a Breaker, reads time.Now itself
// and cannot be given a Clock: the open period (Settings.OpenTimeout) follows
// the system clock whatever the Clock. Code that needs all of it on one
// virtual clock runs in a testing/synctest bubble, where the system clock is
// the bubble's.
//
// A Clock must be safe for simultaneous use by multiple goroutines.
type Clock interface {
	// Now returns the current instant.
	Now() time.Time

	// AfterFunc calls f, on a goroutine of its own, once d has passed on
	// the clock; d <= 0 means at once. stop cancels that call: it reports
	// true if it stopped f from running, and false if f has already been
	// started or stopped, as time.Timer.Stop does. stop does not wait for
	// a started f to return.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// isSystem reports whether c's instants are those of the system clock, which
// anyone can compare with time.Now (a net.Conn deadline, go-redis).
func isSystem(c Clock) bool {
	switch c.(type) {
	case sysclock.Clock, *sysclock.Clock:
		return true
	}
	return false
}

// callCtx is the context a guarded call runs under: the caller's context
// (its values, and its deadline), done when Do's deadline passes on Do's
// clock, when the caller's context is done, or when Do returns.
type callCtx struct {
	context.Context
	deadline time.Time // Do's deadline, set only when it is a system-clock instant
	done     chan struct{}

	mu  sync.Mutex
	err error // guarded by mu; set once, when done is closed
}

func newCallCtx(parent context.Context) *callCtx {
	return &callCtx{Context: parent, done: make(chan struct{})}
}

// Deadline returns Do's deadline when it is an instant of the system clock,
// and otherwise the caller's deadline: an instant of another clock would
// mean nothing to whoever compares it with time.Now.
func (c *callCtx) Deadline() (time.Time, bool) {
	if !c.deadline.IsZero() {
		return c.deadline, true
	}
	return c.Context.Deadline()
}

func (c *callCtx) Done() <-chan struct{} { return c.done }

func (c *callCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// end makes the context done with err, unless it already is.
func (c *callCtx) end(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
		close(c.done)
	}
	c.mu.Unlock()
}

// expire ends the context at Do's deadline.
func (c *callCtx) expire() { c.end(context.DeadlineExceeded) }
