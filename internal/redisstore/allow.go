package redisstore

import (
	"context"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/luascript"
	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// Result is global.Result, the answer of AllowN.
type Result struct {
	Allowed                bool
	Remaining              float64
	RetryAfter, ResetAfter time.Duration
}

// AllowN is global.Store.AllowN: one call of the source article's script
// (lua.BucketSource).
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
	reply, err := luascript.Bucket.Run(ctx, s.c, []string{wire.BucketKey(s.prefix, lim.Name, key)}, lim.Burst, lim.Rate, n).Result()
	if err != nil {
		return Result{}, wrap("allow", err)
	}
	return parseResult(reply, lim, n)
}

// parseResult decodes luascript.Bucket's reply for a request of cost n. Its times are rounded
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
