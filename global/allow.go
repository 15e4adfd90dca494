package global

import (
	"context"
	"math"
	"strconv"
	"time"

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
	reply, err := lua.Bucket.Run(ctx, s.c, []string{bucketKey(s.prefix, lim.Name, key)}, lim.Burst, lim.Rate, n).Slice()
	if err != nil {
		return Result{}, wrap("allow", err)
	}
	return parseResult(reply, lim, n)
}

// parseResult decodes lua.Bucket's reply for a request of cost n.
func parseResult(reply []any, lim Limit, n int) (Result, error) {
	if len(reply) != 2 {
		return Result{}, unexpected("allow", "want 2 values")
	}
	allowed, ok1 := reply[0].(int64)
	left, ok2 := reply[1].(string)
	if !ok1 || !ok2 {
		return Result{}, unexpected("allow", "want {integer, string}")
	}
	tokens, err := strconv.ParseFloat(left, 64)
	if err != nil {
		return Result{}, unexpected("allow", "tokens not a number")
	}
	r := Result{Allowed: allowed == 1, Remaining: tokens, ResetAfter: tokensTime(float64(lim.Burst)-tokens, lim.Rate)}
	if !r.Allowed {
		r.RetryAfter = tokensTime(float64(n)-tokens, lim.Rate)
	}
	return r, nil
}

// tokensTime is how long refilling need tokens takes at rate, rounded up to the
// millisecond (the scripts' clock), 0 when none are needed, and capped at the longest
// time.Duration.
func tokensTime(need, rate float64) time.Duration {
	if !(need > 0) {
		return 0
	}
	ms := math.Ceil(need / rate * 1000)
	if ms >= float64(math.MaxInt64/int64(time.Millisecond)) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(ms) * time.Millisecond
}
