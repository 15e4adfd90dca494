package hybrid

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Errors of WaitN.
var (
	// ErrWouldExceedDeadline is returned by WaitN when the request cannot pass before
	// ctx's deadline.
	ErrWouldExceedDeadline = errors.New("hybrid: wait would exceed the context deadline")
	// ErrNeverAllowed is returned by WaitN for a request that can never pass (a cost
	// above the burst).
	ErrNeverAllowed = errors.New("hybrid: request can never be allowed")
)

// minRetry is the shortest pause between two tries of WaitN, so that a denial with a
// RetryAfter of a few nanoseconds (a token due almost now) does not spin.
const minRetry = 100 * time.Microsecond

// WaitN blocks until a request of cost n for key may proceed under the named limit, and
// returns the decision that admitted it: it reserves the tokens as ReserveN does and
// sleeps until the instant to act, or for a denial's RetryAfter and tries again. It
// returns at once with ErrNeverAllowed or ErrWouldExceedDeadline when it cannot succeed
// in time, and ctx.Err() when ctx ends (at once, taking nothing, if it has ended).
func (l *Limiter) WaitN(ctx context.Context, limit, key string, n int) (Decision, error) {
	d, err := l.waitN(ctx, limit, key, n)
	if l.onDecision != nil && !errors.Is(err, ErrUnknownLimit) {
		l.onDecision(key, d)
	}
	return d, err
}

func (l *Limiter) waitN(ctx context.Context, limit, key string, n int) (Decision, error) {
	if err := ctx.Err(); err != nil { // as x/time/rate's: a context that ended takes nothing
		return Decision{Limit: limit, Reason: reasonCanceled, Source: SourceFallback}, err
	}
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
				return Decision{Limit: d.Limit, Tier: d.Tier, Quota: d.Quota, Window: d.Window, Servers: d.Servers, Reason: interrupted(err), Source: SourceFallback}, err
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
			if errors.Is(err, ErrClosed) {
				d.Reason = reasonClosed
			}
			return d, err
		}
	}
}

// sleep waits d on the Limiter's clock, or until ctx ends (its error) or the Limiter
// closes (ErrClosed): a WaitN that sleeps toward its reservation's instant does not act
// after Close, and gives its tokens back (its caller cancels the reservation).
func (l *Limiter) sleep(ctx context.Context, d time.Duration) error {
	woke := make(chan struct{})
	stop := l.clock.AfterFunc(d, func() { close(woke) })
	defer stop()
	select {
	case <-woke:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-l.stop:
		return ErrClosed
	}
}

// interrupted is the Reason of a WaitN that sleep ended with err.
func interrupted(err error) Reason {
	if errors.Is(err, ErrClosed) {
		return reasonClosed
	}
	return reasonCanceled
}
