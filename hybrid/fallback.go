package hybrid

import (
	"fmt"
	"time"

	"golang.org/x/time/rate"

	"github.com/fleetlimit/fleetlimit/breaker"
)

// newFallback builds the limit's failure policy: for FailLocal, a per-key local limit of
// this server's share of the fleet limit (rate / servers, burst max(ceil(burst /
// servers), MaxCost)), resized when the live server count changes.
func newFallback(c Limit, servers int) (*breaker.Fallback, error) {
	fb, err := breaker.NewFallback(c.Policy, breaker.FallbackConfig{
		Rate: c.Rate, Burst: c.Burst, Servers: servers, MaxCost: c.MaxCost, MaxKeys: c.MaxKeys,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: limit %q: %w", ErrInvalidConfig, c.Name, err)
	}
	return fb, nil
}

// fallback decides a request by the limit's failure policy, after the pre-check and the
// lease could not (Redis did not answer, or the breaker is open). A request the policy
// admits still spends its pre-check tokens.
func (l *Limiter) fallback(lm *limit, key string, n int, why Reason) Decision {
	now := l.now()
	servers := int(l.servers.Load())
	d := Decision{Source: SourceFallback, Reason: why, Servers: servers}
	slot := uint8(hashKey(key) % counterShards)
	d.Allowed = lm.fallback.AllowN(now, key, n)
	if !d.Allowed {
		r, _, ok := lm.cfg.Policy.LocalLimit(lm.cfg.Rate, lm.cfg.Burst, servers, lm.cfg.MaxCost)
		if !ok { // FailClosed: this server's share of the refill
			r = rate.Limit(lm.cfg.Rate / float64(servers))
		}
		d.RetryAfter = durationFor(float64(n), float64(r))
	}
	if d.Allowed && n > 0 {
		pre := true
		lm.keys.Update(now, key, func(e *entry, t time.Time) {
			slot = e.slot
			if pre = e.pre.AllowN(t, n); !pre {
				d = lm.preDenied(e, t, n)
			}
		})
		if !pre {
			d.Servers = servers
			l.stats.count(slot, SourcePreCheck)
			return d
		}
	}
	l.stats.count(slot, SourceFallback)
	return d
}

// durationFor is the time n tokens take at r per second (InfDuration if never, or if
// it would not fit in a Duration, about 292 years).
func durationFor(n, r float64) time.Duration {
	secs := n / r
	if !(secs < 9e9) {
		return InfDuration
	}
	return time.Duration(secs * float64(time.Second))
}
