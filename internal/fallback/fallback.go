// Package fallback is what a limit's failure policy (a breaker.Policy) does with a request
// while Redis cannot answer: admit it, deny it, or decide by a conservative local limit.
// The engine holds one Fallback per limit and tier; users choose the policy in package
// breaker, which makes a Policy's parts known here through Of.
package fallback

import (
	"fmt"
	"time"

	"golang.org/x/time/rate"

	"github.com/fleetlimit/fleetlimit/internal/keystore"
	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
	"github.com/fleetlimit/fleetlimit/local"
)

// Kind is what a policy does with requests while the store cannot answer.
type Kind uint8

const (
	// None is the zero Policy's kind: no policy chosen, invalid.
	None Kind = iota
	// Open admits every request.
	Open
	// Closed denies every request.
	Closed
	// Local decides by a conservative limit of this process's own.
	Local
)

// String returns "none", "fail-open", "fail-closed" or "fail-local".
func (k Kind) String() string {
	switch k {
	case None:
		return "none"
	case Open:
		return "fail-open"
	case Closed:
		return "fail-closed"
	case Local:
		return "fail-local"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Spec is what a policy is made of: its kind and, for FailLocalLimit, its explicit local
// limit (Rate 0 and Burst 0: the fleet share).
type Spec struct {
	Kind  Kind
	Rate  rate.Limit
	Burst int
}

// Of returns the Spec of a breaker.Policy. Package breaker sets it when it is initialized;
// a Policy is passed as any because breaker imports this package.
var Of func(policy any) Spec

// Validate returns nil for a breaker.Policy a limit can run, and otherwise an error
// wrapping breaker.ErrInvalidConfig (and breaker.ErrNoPolicy for the zero Policy). Package
// breaker sets it, as it sets Of.
var Validate func(policy any) error

// Share returns the per-server share of a fleet-wide limit of r tokens per second and
// burst tokens, for a fleet of servers: r/servers, and a burst of max(⌈burst/servers⌉,
// maxCost), so that a small burst over many servers never rounds down to 0 (which
// x/time/rate treats as "deny everything") and the largest single request can still
// pass. A servers or maxCost below 1 counts as 1.
func Share(r float64, burst, servers, maxCost int) (rate.Limit, int) {
	servers = max(servers, 1)
	maxCost = max(maxCost, 1)
	share := burst / servers
	if burst%servers > 0 {
		share++
	}
	return rate.Limit(r / float64(servers)), max(share, maxCost)
}

// LocalLimit returns the per-server, per-key limit a Local policy applies for a fleet-wide
// limit of globalRate tokens per second and globalBurst tokens, on a fleet of servers
// whose largest request costs maxCost: the explicit limit, or the fleet Share. ok is
// false for other kinds.
func (s Spec) LocalLimit(globalRate float64, globalBurst, servers, maxCost int) (r rate.Limit, burst int, ok bool) {
	if s.Kind != Local {
		return 0, 0, false
	}
	if s.Rate != 0 || s.Burst != 0 {
		return s.Rate, max(s.Burst, maxCost), true
	}
	r, burst = Share(globalRate, globalBurst, servers, maxCost)
	return r, burst, true
}

// Config describes the limit a Fallback stands in for.
type Config struct {
	Rate    float64 // fleet-wide tokens per second
	Burst   int     // fleet-wide bucket size
	Servers int     // live servers sharing the limit; below 1 counts as 1
	MaxCost int     // the largest n passed to AllowN; below 1 counts as 1
	MaxKeys int     // keys the local limiter holds; 0 means local's default (100,000)
}

// A Fallback decides requests by a policy while the store cannot answer. It is safe for
// simultaneous use by multiple goroutines.
type Fallback struct {
	spec Spec
	cfg  Config
	lim  *local.Limiter // Local only
}

// Same reports whether f and o decide alike: the same policy, for the same limit and
// largest cost (the live server count aside, which SetServersAt moves), so that o's keys'
// local buckets can stand for f's.
func (f *Fallback) Same(o *Fallback) bool {
	a, b := f.cfg, o.cfg
	return f.spec == o.spec && a.Rate == b.Rate && a.Burst == b.Burst && a.MaxCost == b.MaxCost &&
		keystore.MaxKeys(a.MaxKeys) == keystore.MaxKeys(b.MaxKeys)
}

// New returns the Fallback of a valid policy's spec s for the limit cfg, or an error if its
// local limit cannot be built (local.ErrInvalidConfig).
func New(s Spec, cfg Config) (*Fallback, error) {
	f := &Fallback{spec: s, cfg: cfg}
	if r, burst, ok := s.LocalLimit(cfg.Rate, cfg.Burst, cfg.Servers, cfg.MaxCost); ok {
		lim, err := local.NewLimiter(local.Config{Rate: r, Burst: burst, MaxKeys: cfg.MaxKeys})
		if err != nil {
			return nil, fmt.Errorf("%v fallback: %w", s.Kind, err)
		}
		f.lim = lim
	}
	return f, nil
}

// Kind returns what the Fallback does.
func (f *Fallback) Kind() Kind { return f.spec.Kind }

// LocalLimit is the per-key limit of a Local fallback on a fleet of servers (see
// Spec.LocalLimit); ok is false for other kinds.
func (f *Fallback) LocalLimit(servers int) (r rate.Limit, burst int, ok bool) {
	return f.spec.LocalLimit(f.cfg.Rate, f.cfg.Burst, servers, f.cfg.MaxCost)
}

// AllowN decides a request for n tokens of key at instant now: Open admits it, Closed
// denies it, Local takes n tokens from key's local bucket if it has them.
func (f *Fallback) AllowN(now time.Time, key string, n int) bool {
	switch f.spec.Kind {
	case Open:
		return true
	case Local:
		return f.lim.AllowN(now, key, n)
	}
	return false
}

// SetServersAt resizes a Local fallback that uses the fleet share to a fleet of n servers
// from instant now on (see local.Limiter.SetLimitAt). It does nothing for other policies.
func (f *Fallback) SetServersAt(now time.Time, n int) error {
	if f.lim == nil || f.spec.Rate != 0 {
		return nil
	}
	r, burst := Share(f.cfg.Rate, f.cfg.Burst, n, f.cfg.MaxCost)
	if tokenbucket.Check(float64(r), burst) != nil {
		// A share too slow to refill its burst within a bucket's TTL (a tiny rate over
		// many servers, its burst kept at MaxCost): the slowest rate a bucket holds,
		// rather than the share of fewer servers.
		r = rate.Limit(tokenbucket.MinRate(burst))
	}
	return f.lim.SetLimitAt(now, r, burst)
}

// Close releases the local buckets of a Local fallback, whose AllowN then denies; it does
// nothing for other policies. Close is idempotent.
func (f *Fallback) Close() {
	if f.lim != nil {
		f.lim.Close()
	}
}
