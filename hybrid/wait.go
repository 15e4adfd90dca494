package hybrid

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Errors of Wait and WaitN.
var (
	// ErrWouldExceedDeadline is returned by WaitN, without waiting, when the denial's
	// RetryAfter ends after ctx's deadline: the request could not pass in time.
	ErrWouldExceedDeadline = errors.New("hybrid: wait would exceed the context deadline")
	// ErrNeverAllowed is returned by WaitN for a request that can never pass: its cost
	// is above the limit's burst or the pre-check's, or its tokens would take longer
	// than a time.Duration holds (about 292 years) to come.
	ErrNeverAllowed = errors.New("hybrid: request can never be allowed")
)

// minRetry is the shortest pause between two tries of WaitN, so that a denial with a
// RetryAfter of a few nanoseconds (a token due almost now) does not spin.
const minRetry = 100 * time.Microsecond

// Wait is shorthand for WaitN(ctx, limit, key, 1).
func (l *Limiter) Wait(ctx context.Context, limit, key string) (Decision, error) {
	return l.WaitN(ctx, limit, key, 1)
}

// WaitN blocks until a request of cost n for key may proceed under the named limit, and
// returns the decision that admitted it. It reserves the tokens as ReserveN does and
// sleeps until the reservation's instant to act: at once for tokens this server holds,
// else for as long as the key's bucket needs to refill what it claimed. When no
// reservation can be made (the bucket has more than a burst claimed, or Redis does not
// answer and the limit's policy denies), it sleeps for the denial's RetryAfter and tries
// again, until admitted or ctx ends.
//
// It does not sleep at all when it cannot succeed: it returns ErrNeverAllowed for a cost
// no bucket can hold, and ErrWouldExceedDeadline when the reservation's delay or the
// denial's RetryAfter ends after ctx's deadline (as x/time/rate's Wait does; the deadline
// is read as an instant of the Limiter's Clock), giving a reservation back first. It
// returns ctx.Err() when ctx ends while it sleeps, giving its reservation back, and
// AllowN's errors as they are. With every error the Decision is the last denial (or
// AllowN's answer). OnDecision hears of the decision WaitN returns.
//
// Denials under contention carry a jittered RetryAfter (see docs/design.md, pacing), so
// the waiters of a fleet do not wake together. A limit that fails closed makes WaitN
// wait through a Redis outage, until ctx ends.
func (l *Limiter) WaitN(ctx context.Context, limit, key string, n int) (Decision, error) {
	d, err := l.waitN(ctx, limit, key, n)
	if l.onDecision != nil && !errors.Is(err, ErrUnknownLimit) {
		l.onDecision(key, d)
	}
	return d, err
}

func (l *Limiter) waitN(ctx context.Context, limit, key string, n int) (Decision, error) {
	for {
		r, err := l.ReserveN(ctx, limit, key, n)
		if err != nil {
			return r.Decision(), err
		}
		d := r.Decision()
		if r.OK() {
			delay := r.Delay()
			if delay == 0 {
				return d, nil
			}
			if deadline, ok := ctx.Deadline(); ok && deadline.Sub(l.clock.Now()) < delay {
				r.Cancel()
				return Decision{Limit: d.Limit, Tier: d.Tier, Quota: d.Quota, Window: d.Window, Servers: d.Servers, RetryAfter: delay},
					fmt.Errorf("%w: the reservation acts in %v", ErrWouldExceedDeadline, delay)
			}
			if err := l.sleep(ctx, delay); err != nil {
				r.Cancel()
				return Decision{Limit: d.Limit, Tier: d.Tier, Quota: d.Quota, Window: d.Window, Servers: d.Servers, Reason: ReasonCanceled, Source: SourceFallback}, err
			}
			return d, nil
		}
		if d.RetryAfter >= InfDuration {
			return d, fmt.Errorf("%w: cost %d for limit %q (%v)", ErrNeverAllowed, n, limit, d.Reason)
		}
		pause := max(d.RetryAfter, minRetry)
		if deadline, ok := ctx.Deadline(); ok && deadline.Sub(l.clock.Now()) < pause {
			return d, fmt.Errorf("%w: retry after %v", ErrWouldExceedDeadline, d.RetryAfter)
		}
		if err := l.sleep(ctx, pause); err != nil {
			return d, err
		}
	}
}

// sleep waits d on the Limiter's clock, or until ctx ends (its error).
func (l *Limiter) sleep(ctx context.Context, d time.Duration) error {
	woke := make(chan struct{})
	stop := l.clock.AfterFunc(d, func() { close(woke) })
	defer stop()
	select {
	case <-woke:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
