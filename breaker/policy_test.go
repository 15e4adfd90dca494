package breaker

import (
	"errors"
	"math"
	"testing"

	"golang.org/x/time/rate"

	"github.com/fleetlimit/fleetlimit/internal/fallback"
)

// TestPolicyValidate: the zero Policy is no policy; FailOpen, FailClosed and FailLocal()
// are valid; FailLocalLimit needs a positive rate (rate.Inf included) and a burst of at
// least 1; a Policy of an unknown kind is invalid.
func TestPolicyValidate(t *testing.T) {
	tests := []struct {
		p    Policy
		want error
		str  string
	}{
		{Policy{}, ErrNoPolicy, "none"},
		{FailOpen, nil, "fail-open"},
		{FailClosed, nil, "fail-closed"},
		{FailLocal(), nil, "fail-local"},
		{FailLocalLimit(5, 2), nil, "fail-local(5/s, burst 2)"},
		{FailLocalLimit(0, 2), ErrInvalidConfig, "fail-local(0/s, burst 2)"},
		{FailLocalLimit(0, 0), ErrInvalidConfig, "fail-local(0/s, burst 0)"}, // not FailLocal()
		{FailLocalLimit(-1, 2), ErrInvalidConfig, "fail-local(-1/s, burst 2)"},
		{FailLocalLimit(rate.Limit(math.NaN()), 2), ErrInvalidConfig, "fail-local(NaN/s, burst 2)"},
		{FailLocalLimit(5, 0), ErrInvalidConfig, "fail-local(5/s, burst 0)"},
		{FailLocalLimit(rate.Inf, 2), nil, "fail-local(inf/s, burst 2)"}, // rate.Inf: admits everything, as in package local
		{FailLocalLimit(rate.Inf, 0), ErrInvalidConfig, "fail-local(inf/s, burst 0)"},
		{Policy{kind: 9}, ErrInvalidConfig, "Kind(9)"},
	}
	for _, tt := range tests {
		err := tt.p.validate()
		if (tt.want == nil) != (err == nil) || (tt.want != nil && !errors.Is(err, tt.want)) {
			t.Errorf("%v.validate() = %v, want %v", tt.p, err, tt.want)
		}
		if err != nil && !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%v.validate() = %v, want it to match ErrInvalidConfig", tt.p, err)
		}
		if got := tt.p.String(); got != tt.str {
			t.Errorf("String() = %q, want %q", got, tt.str)
		}
	}
	if FailLocal() != FailLocal() || FailOpen == FailClosed || FailLocal() == FailLocalLimit(1, 1) || FailLocal() == FailLocalLimit(0, 0) {
		t.Error("policies do not compare as documented")
	}
}

// TestPolicySpec: the engine reads a Policy through package fallback as its kind and
// explicit local limit (none for FailLocal(): the fleet share), and validates it as
// validate does.
func TestPolicySpec(t *testing.T) {
	for _, tc := range []struct {
		p    Policy
		want fallback.Spec
	}{
		{FailOpen, fallback.Spec{Kind: fallback.Open}},
		{FailClosed, fallback.Spec{Kind: fallback.Closed}},
		{FailLocal(), fallback.Spec{Kind: fallback.Local}},
		{FailLocalLimit(5, 2), fallback.Spec{Kind: fallback.Local, Rate: 5, Burst: 2}},
	} {
		if got := fallback.Of(tc.p); got != tc.want {
			t.Errorf("fallback.Of(%v) = %+v, want %+v", tc.p, got, tc.want)
		}
		if err := fallback.Validate(tc.p); err != nil {
			t.Errorf("fallback.Validate(%v) = %v", tc.p, err)
		}
	}
	if err := fallback.Validate(Policy{}); !errors.Is(err, ErrNoPolicy) {
		t.Errorf("fallback.Validate(Policy{}) = %v, want ErrNoPolicy", err)
	}
}
