package sim

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
)

// TestBubbleLateProbe: a half-open probe whose answer comes after the breaker's Timeout
// but within its probe's own deadline closes the breaker in the simulator, as it does in
// a process (breaker.Settings.HalfOpenProbes); the probe's caller still sees ErrTimeout
// at Timeout.
func TestBubbleLateProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := &events{}
		b := newBubble(e)
		defer b.close()
		brk, err := breaker.New(breaker.Settings{Timeout: 10 * time.Millisecond, FailureThreshold: 1, OpenTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		var got []error
		done := func(err error) { got = append(got, err) }
		// a call never answered opens the breaker at its deadline
		b.call(brk, e.now+10*time.Millisecond, func(func()) {}, done)
		e.now += 10 * time.Millisecond
		b.expire()
		if s := brk.State(); s != breaker.StateOpen || len(got) != 1 || !errors.Is(got[0], breaker.ErrTimeout) {
			t.Fatalf("after an unanswered call: %v, outcomes %v; want open, one timeout", s, got)
		}
		e.now += time.Second + time.Millisecond // past the open time
		var answer func()
		b.call(brk, e.now+10*time.Millisecond, func(a func()) { answer = a }, done)
		if answer == nil {
			t.Fatal("the half-open breaker let no probe out")
		}
		e.now += 10 * time.Millisecond
		b.expire()
		if len(got) != 2 || !errors.Is(got[1], breaker.ErrTimeout) {
			t.Fatalf("the probe's caller at Timeout: outcomes %v, want a second timeout", got)
		}
		e.now += 30 * time.Millisecond // the answer, 40 ms after the probe went
		answer()
		if s := brk.State(); s != breaker.StateClosed {
			t.Errorf("after the probe's late answer: %v, want closed", s)
		}
	})
}
