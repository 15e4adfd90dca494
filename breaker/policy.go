package breaker

import (
	"fmt"

	"golang.org/x/time/rate"

	"github.com/fleetlimit/fleetlimit/internal/fallback"
	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
)

// ErrNoPolicy is wrapped by the error a limit whose Policy is the zero Policy
// gets (from hybrid.New or Limiter.Reconfigure), and matches ErrInvalidConfig
// too. There is no default failure policy:
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

// A Policy says what a limit does with a request while its store (Redis)
// cannot answer: the breaker is open, the call timed out or failed. See
// docs/failure-policies.md for when to choose which.
//
// The zero Policy is invalid: every limit must choose one. Policies are
// comparable values: FailOpen, FailClosed and FailLocal() each compare
// equal to themselves.
type Policy struct {
	kind     fallback.Kind
	explicit bool       // FailLocalLimit's: rate and burst are checked, zeros too
	rate     rate.Limit // explicit local limit; 0 means the fleet share
	burst    int
}

// The engine checks a Policy and reads its parts through package fallback, which
// decides by them.
func init() {
	fallback.Of = func(p any) fallback.Spec {
		q := p.(Policy)
		return fallback.Spec{Kind: q.kind, Rate: q.rate, Burst: q.burst}
	}
	fallback.Validate = func(p any) error { return p.(Policy).validate() }
}

var (
	// FailOpen admits every request while the store cannot answer: a
	// limiter outage must not become an API outage. For abuse and fairness
	// limits.
	FailOpen = Policy{kind: fallback.Open}

	// FailClosed denies every request while the store cannot answer. For
	// limits that protect something that must never be overrun, when
	// denying is cheaper than overrunning.
	FailClosed = Policy{kind: fallback.Closed}
)

// FailLocal decides requests by a per-key local limit while the store
// cannot answer: this server's share of the fleet-wide limit, rate/servers
// with a burst of max(ceil(burst/servers), largest cost), so that a small
// burst over many servers never rounds down to 0 and the largest request
// can still pass. For limits that protect something fragile (a partner
// quota) where failing closed costs too much.
func FailLocal() Policy { return Policy{kind: fallback.Local} }

// FailLocalLimit is FailLocal with an explicit local limit of r tokens per
// second and burst tokens per key on each server, instead of the fleet
// share; the burst is raised to the limit's largest cost (MaxCost) if below
// it, so that every request can still pass.
func FailLocalLimit(r rate.Limit, burst int) Policy {
	return Policy{kind: fallback.Local, explicit: true, rate: r, burst: burst}
}

// String describes the policy, as in "fail-open" or
// "fail-local(5/s, burst 2)".
func (p Policy) String() string {
	if p.explicit {
		if p.rate == rate.Inf {
			return fmt.Sprintf("fail-local(inf/s, burst %d)", p.burst) // not MaxFloat64's digits
		}
		return fmt.Sprintf("fail-local(%v/s, burst %d)", float64(p.rate), p.burst)
	}
	return p.kind.String()
}

// validate returns nil for a usable policy, and otherwise an error wrapping
// ErrInvalidConfig: wrapping ErrNoPolicy too for the zero Policy, and saying
// what is wrong with a FailLocalLimit whose rate is not positive (or NaN) or
// whose burst is less than 1: FailLocalLimit(0, 0), a limit read from a
// configuration that left both out, say, is an error, not FailLocal().
func (p Policy) validate() error {
	switch p.kind {
	case fallback.Open, fallback.Closed:
		return nil
	case fallback.Local:
		if !p.explicit {
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
	case fallback.None:
		return fmt.Errorf("%w: choose FailOpen, FailClosed or FailLocal for every limit", ErrNoPolicy)
	}
	return fmt.Errorf("%w: unknown kind %d", ErrInvalidConfig, p.kind)
}
