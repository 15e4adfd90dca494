package breaker

import (
	"fmt"
	"time"

	"golang.org/x/time/rate"

	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
	"github.com/fleetlimit/fleetlimit/local"
)

// ErrNoPolicy is wrapped by the error Validate returns for the zero Policy,
// and matches ErrInvalidConfig too. There is no default failure policy:
// whether a limit fails open, fails closed or falls back to a local limit is
// a decision to make per limit (the source article lists choosing one by
// default as a common mistake).
var ErrNoPolicy error = &subError{msg: "breaker: no failure policy chosen", class: ErrInvalidConfig}

// subError is a sentinel that also matches the broader sentinel class.
type subError struct {
	msg   string
	class error
}

func (e *subError) Error() string { return e.msg }

func (e *subError) Unwrap() error { return e.class }

// Kind is what a Policy does with requests while the store cannot answer.
type Kind uint8

const (
	// KindNone is the zero Policy's kind: no policy chosen, invalid.
	KindNone Kind = iota
	// KindOpen admits every request.
	KindOpen
	// KindClosed denies every request.
	KindClosed
	// KindLocal decides by a conservative limit of this process's own.
	KindLocal
)

// String returns "none", "fail-open", "fail-closed" or "fail-local".
func (k Kind) String() string {
	switch k {
	case KindNone:
		return "none"
	case KindOpen:
		return "fail-open"
	case KindClosed:
		return "fail-closed"
	case KindLocal:
		return "fail-local"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// A Policy says what a limit does with a request while its store (Redis)
// cannot answer: the breaker is open, the call timed out or failed. See
// docs/failure-policies.md for when to choose which.
//
// The zero Policy is invalid: every limit must choose one. Policies are
// comparable values: FailOpen, FailClosed and FailLocal() each compare
// equal to themselves.
type Policy struct {
	kind  Kind
	rate  rate.Limit // explicit local limit; 0 means the fleet share
	burst int
}

var (
	// FailOpen admits every request while the store cannot answer: a
	// limiter outage must not become an API outage. For abuse and fairness
	// limits.
	FailOpen = Policy{kind: KindOpen}

	// FailClosed denies every request while the store cannot answer. For
	// limits that protect something that must never be overrun, when
	// denying is cheaper than overrunning.
	FailClosed = Policy{kind: KindClosed}
)

// FailLocal decides requests by a per-key local limit while the store
// cannot answer: this server's share of the fleet-wide limit, rate/servers
// with a burst of max(ceil(burst/servers), largest cost), as
// local.FallbackLimit computes it. For limits that protect something
// fragile (a partner quota) where failing closed costs too much.
func FailLocal() Policy { return Policy{kind: KindLocal} }

// FailLocalLimit is FailLocal with an explicit local limit of r tokens per
// second and burst tokens per key on each server, instead of the fleet
// share.
func FailLocalLimit(r rate.Limit, burst int) Policy {
	return Policy{kind: KindLocal, rate: r, burst: burst}
}

// Kind returns what the policy does.
func (p Policy) Kind() Kind { return p.kind }

// String describes the policy, as in "fail-open" or
// "fail-local(5/s, burst 2)".
func (p Policy) String() string {
	if p.kind == KindLocal && p.rate != 0 {
		return fmt.Sprintf("fail-local(%v/s, burst %d)", float64(p.rate), p.burst)
	}
	return p.kind.String()
}

// Validate returns nil for a usable policy, and otherwise an error wrapping
// ErrInvalidConfig: wrapping ErrNoPolicy too for the zero Policy, and saying
// what is wrong with a FailLocalLimit whose rate is not positive (or NaN) or
// whose burst is less than 1.
func (p Policy) Validate() error {
	switch p.kind {
	case KindOpen, KindClosed:
		return nil
	case KindLocal:
		if p.rate == 0 && p.burst == 0 {
			return nil
		}
		err := tokenbucket.CheckBurst(p.burst) // rate.Inf admits everything, as in package local
		if p.rate != rate.Inf {
			err = tokenbucket.Check(float64(p.rate), p.burst)
		}
		if err != nil {
			return fmt.Errorf("%w: FailLocalLimit(%v, %d): %w", ErrInvalidConfig, float64(p.rate), p.burst, err)
		}
		return nil
	case KindNone:
		return fmt.Errorf("%w: choose FailOpen, FailClosed or FailLocal for every limit", ErrNoPolicy)
	}
	return fmt.Errorf("%w: unknown kind %d", ErrInvalidConfig, p.kind)
}

// LocalLimit returns the per-server, per-key limit a FailLocal policy
// applies for a fleet-wide limit of globalRate tokens per second and
// globalBurst tokens, on a fleet of servers whose largest request costs
// maxCost: the explicit FailLocalLimit, or local.FallbackLimit. ok is false
// for other kinds.
func (p Policy) LocalLimit(globalRate float64, globalBurst, servers, maxCost int) (r rate.Limit, burst int, ok bool) {
	if p.kind != KindLocal {
		return 0, 0, false
	}
	if p.rate != 0 || p.burst != 0 {
		return p.rate, max(p.burst, maxCost), true
	}
	r, burst = local.FallbackLimit(globalRate, globalBurst, servers, maxCost)
	return r, burst, true
}

// FallbackConfig describes the limit a Fallback stands in for.
type FallbackConfig struct {
	Rate    float64 // fleet-wide tokens per second
	Burst   int     // fleet-wide bucket size
	Servers int     // live servers sharing the limit; below 1 counts as 1
	MaxCost int     // the largest n passed to AllowN; below 1 counts as 1
	MaxKeys int     // keys the local limiter holds; 0 means local.DefaultMaxKeys
}

// A Fallback decides requests by a Policy while the store cannot answer.
// It is safe for simultaneous use by multiple goroutines.
type Fallback struct {
	policy Policy
	cfg    FallbackConfig
	lim    *local.Limiter // FailLocal only
}

// NewFallback returns the Fallback of policy p for the limit cfg, or an
// error if p is not valid (ErrInvalidConfig; also ErrNoPolicy for the zero
// Policy) or its local limit cannot be built (local.ErrInvalidConfig).
func NewFallback(p Policy, cfg FallbackConfig) (*Fallback, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	f := &Fallback{policy: p, cfg: cfg}
	if r, burst, ok := p.LocalLimit(cfg.Rate, cfg.Burst, cfg.Servers, cfg.MaxCost); ok {
		lim, err := local.NewLimiter(local.Config{Rate: r, Burst: burst, MaxKeys: cfg.MaxKeys})
		if err != nil {
			return nil, fmt.Errorf("breaker: %v fallback: %w", p, err)
		}
		f.lim = lim
	}
	return f, nil
}

// Policy returns the policy the Fallback applies.
func (f *Fallback) Policy() Policy { return f.policy }

// AllowN decides a request for n tokens of key at instant now: FailOpen
// admits it, FailClosed denies it, FailLocal takes n tokens from key's
// local bucket if it has them.
func (f *Fallback) AllowN(now time.Time, key string, n int) bool {
	switch f.policy.kind {
	case KindOpen:
		return true
	case KindLocal:
		return f.lim.AllowN(now, key, n)
	}
	return false
}

// SetServersAt resizes a FailLocal fallback that uses the fleet share to a
// fleet of n servers from instant now on (see local.Limiter.SetLimitAt).
// It does nothing for other policies.
func (f *Fallback) SetServersAt(now time.Time, n int) error {
	if f.lim == nil || f.policy.rate != 0 {
		return nil
	}
	r, burst := local.FallbackLimit(f.cfg.Rate, f.cfg.Burst, n, f.cfg.MaxCost)
	return f.lim.SetLimitAt(now, r, burst)
}

// Close releases the local buckets of a FailLocal fallback, whose AllowN
// then denies; it does nothing for other policies. Close is idempotent.
func (f *Fallback) Close() {
	if f.lim != nil {
		f.lim.Close()
	}
}
