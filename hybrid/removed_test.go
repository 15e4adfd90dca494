package hybrid_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// gatedLimiter is a Limiter of limits on miniredis whose calls a heldCalls holds while
// on, ready, and its Store.
func gatedLimiter(t *testing.T, limits ...hybrid.Limit) (*hybrid.Limiter, *heldCalls, *global.Store) {
	t.Helper()
	_, c := redistest.Mini(t)
	g := &heldCalls{entered: make(chan struct{}, 1), release: make(chan struct{})}
	c.AddHook(g)
	s := newStore(t, c)
	l := newLimiter(t, s, hybrid.Config{FleetSize: 1, Limits: limits})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	return l, g, s
}

// TestRemovedWhileWaiting: a request whose limit Reconfigure removes while it waits for
// Redis finishes on the configuration it started under (its grant admits it), never
// with ErrClosed (the Limiter is open); AllowMulti neither panics nor spends what it does
// not admit, whether the removed limit is an enforced item's (ErrUnknownLimit: the
// request is not decided) or a DryRun one's (the request stands on the others).
func TestRemovedWhileWaiting(t *testing.T) {
	a := hybrid.Limit{Name: "a", Rate: 1e-6, Burst: 10, Policy: breaker.FailOpen, MaxWait: 2 * time.Second}
	b := hybrid.Limit{Name: "b", Rate: 1e-6, Burst: 10, Policy: breaker.FailOpen, MaxWait: 2 * time.Second}
	dry := b
	dry.DryRun = true
	for _, tc := range []struct {
		name    string
		limits  []hybrid.Limit
		call    func(l *hybrid.Limiter) (allowed bool, err error)
		wantErr error
	}{
		{"AllowN", []hybrid.Limit{a, b}, func(l *hybrid.Limiter) (bool, error) {
			d, err := l.Allow(context.Background(), "b", "k")
			return d.Allowed, err
		}, nil},
		{"AllowMulti", []hybrid.Limit{a, b}, func(l *hybrid.Limiter) (bool, error) {
			md, err := l.AllowMulti(context.Background(), []hybrid.Item{{Limit: "a", Key: "k", Cost: 1}, {Limit: "b", Key: "k", Cost: 1}})
			return md.Allowed, err
		}, hybrid.ErrUnknownLimit},
		{"AllowMulti, DryRun item", []hybrid.Limit{a, dry}, func(l *hybrid.Limiter) (bool, error) {
			md, err := l.AllowMulti(context.Background(), []hybrid.Item{{Limit: "a", Key: "k", Cost: 1}, {Limit: "b", Key: "k", Cost: 1}})
			return md.Allowed, err
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, g, s := gatedLimiter(t, tc.limits...)
			g.on.Store(true)
			type result struct {
				allowed bool
				err     error
			}
			done := make(chan result, 1)
			go func() {
				defer func() {
					if p := recover(); p != nil {
						done <- result{err: fmt.Errorf("panic: %v", p)}
					}
				}()
				allowed, err := tc.call(l)
				done <- result{allowed, err}
			}()
			<-g.entered // its refill is on its way to Redis: it waits
			if err := l.Reconfigure(tc.limits[:1]); err != nil {
				t.Fatal(err)
			}
			g.on.Store(false)
			close(g.release)
			r := <-done
			if !errors.Is(r.err, tc.wantErr) || tc.wantErr == nil && r.err != nil || tc.wantErr != nil && r.allowed {
				t.Fatalf("got allowed %v, %v; want %v", r.allowed, r.err, tc.wantErr)
			}
			if err := l.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			want := 10
			if tc.wantErr == nil && tc.name != "AllowN" {
				want = 9 // a admitted the request
			}
			if left := bucketLeft(t, s, "a", 10, "k"); left != want {
				t.Errorf("a's bucket holds %d after Close, want %d", left, want)
			}
		})
	}
}

// TestRemovedRacingHits: Allow calls served from a lease while Reconfigure removes
// their limit and adds it back get ErrUnknownLimit or a decision, never ErrClosed.
func TestRemovedRacingHits(t *testing.T) {
	a := hybrid.Limit{Name: "a", Rate: 1e6, Burst: 1e6, Policy: breaker.FailOpen, MaxWait: 2 * time.Second}
	b := hybrid.Limit{Name: "b", Rate: 10, Burst: 10, Policy: breaker.FailOpen, MaxWait: 2 * time.Second}
	_, c := redistest.Mini(t)
	l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{a, b}})
	var closed, calls atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, err := l.Allow(context.Background(), "a", "k")
			calls.Add(1)
			if errors.Is(err, hybrid.ErrClosed) {
				closed.Add(1)
			} else if err != nil && !errors.Is(err, hybrid.ErrUnknownLimit) {
				t.Errorf("Allow: %v", err)
			}
		}
	})
	// The Allow calls must run between the changes: each change waits for some.
	for range 300 {
		if err := l.Reconfigure([]hybrid.Limit{a, b}); err != nil {
			t.Fatal(err)
		}
		for n := calls.Load(); calls.Load() < n+3; {
			runtime.Gosched()
		}
		if err := l.Reconfigure([]hybrid.Limit{b}); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if n := closed.Load(); n > 0 {
		t.Errorf("%d Allow calls got ErrClosed from an open Limiter", n)
	}
}

// TestAllowMultiDryItemCanceled: a request its enforced items admit stays admitted,
// with no error, when its context ends while a DryRun item waits for Redis: the tokens
// are spent, and a DryRun item never decides the request.
func TestAllowMultiDryItemCanceled(t *testing.T) {
	warm := hybrid.LeaseTuning{RefillInterval: time.Hour, Lifetime: 5 * time.Hour, LowWatermark: -1} // a's lease serves every request
	a := hybrid.Limit{Name: "a", Rate: 1, Burst: 1000, Policy: breaker.FailOpen, MaxWait: 2 * time.Second, Lease: warm}
	d := hybrid.Limit{Name: "d", Rate: 1e-3, Burst: 10, Policy: breaker.FailOpen, MaxWait: 2 * time.Second, DryRun: true}
	l, g, _ := gatedLimiter(t, a, d)
	if dec, err := l.Allow(context.Background(), "a", "k"); err != nil || !dec.Allowed || dec.Remaining < 2 {
		t.Fatalf("Allow: %+v, %v; want a lease that holds more", dec, err)
	}
	g.on.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	type result struct {
		md  hybrid.MultiDecision
		err error
	}
	done := make(chan result, 1)
	go func() {
		md, err := l.AllowMulti(ctx, []hybrid.Item{{Limit: "a", Key: "k", Cost: 1}, {Limit: "d", Key: "k", Cost: 1}})
		done <- result{md, err}
	}()
	<-g.entered // d's refill: a was served from its lease
	cancel()
	r := <-done
	g.on.Store(false)
	close(g.release)
	if !r.md.Allowed || r.err != nil || r.md.Decision.Limit != "a" {
		t.Errorf("AllowMulti: %+v, %v; want a's admission, no error", r.md, r.err)
	}
}

// TestZeroReservation: a zero Reservation is not OK, its Delay is InfDuration and its
// Cancel does nothing, as x/time/rate's.
func TestZeroReservation(t *testing.T) {
	var r hybrid.Reservation
	if r.OK() || r.Delay() != hybrid.InfDuration {
		t.Errorf("zero Reservation: OK %v, Delay %v", r.OK(), r.Delay())
	}
	r.Cancel()
	if d := r.Decision(); d.Allowed {
		t.Errorf("zero Reservation's Decision: %+v", d)
	}
}
