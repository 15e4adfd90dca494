package global

import (
	"context"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
	"github.com/fleetlimit/fleetlimit/internal/wire"
	"github.com/fleetlimit/fleetlimit/lua"
)

// Result is the answer of one per-request decision (AllowN).
type Result struct {
	// Allowed reports whether the request may go ahead; its cost has been spent.
	Allowed bool
	// Remaining is the number of tokens left in the bucket after the decision. It may be
	// fractional; round it down for a header such as X-RateLimit-Remaining.
	Remaining float64
	// RetryAfter is 0 when allowed; otherwise how long until the bucket holds the
	// request's cost, if nobody else spends meanwhile (a Retry-After header).
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again if nothing is spent.
	ResetAfter time.Duration
}

// AllowN decides one request of cost n against the fleet-wide bucket of lim and key,
// with one call of the source article's script (lua.Bucket): Redis's clock, one atomic
// step, no race between servers. Being denied is a Result with Allowed false, not an
// error. Errors wrap ErrInvalidLimit (no call made), ErrUnavailable, ErrRedis, or
// ErrInvalidConfig (a Store built with RetryingClient cannot run this non-idempotent
// script).
func (s *Store) AllowN(ctx context.Context, lim Limit, key string, n int) (Result, error) {
	if err := lim.Validate(); err != nil {
		return Result{}, err
	}
	if err := lim.CheckCost(n); err != nil {
		return Result{}, err
	}
	if s.retrying {
		return Result{}, errRetrying
	}
	reply, err := lua.Bucket.Run(ctx, s.c, []string{wire.BucketKey(s.prefix, lim.Name, key)}, lim.Burst, lim.Rate, n).Result()
	if err != nil {
		return Result{}, wrap("allow", err)
	}
	return parseResult(reply, lim, n)
}

// parseResult decodes lua.Bucket's reply for a request of cost n. Its times are rounded
// up to the millisecond, as the scripts' clock counts.
func parseResult(reply any, lim Limit, n int) (Result, error) {
	b, err := wire.ParseBucket(reply)
	if err != nil {
		return Result{}, unexpected("allow", err.Error())
	}
	r := Result{Allowed: b.Allowed, Remaining: b.Tokens, ResetAfter: tokensTime(float64(lim.Burst)-b.Tokens, lim.Rate)}
	if !r.Allowed {
		r.RetryAfter = tokensTime(float64(n)-b.Tokens, lim.Rate)
	}
	return r, nil
}

// tokensTime is how long refilling need tokens takes at rate, in whole milliseconds
// rounded up: 0 when none are needed, tokenbucket.InfDuration when it does not fit a Duration.
func tokensTime(need, rate float64) time.Duration {
	return tokenbucket.FromMillis(tokenbucket.WaitMillis(need, rate))
}
