package breaker

import (
	"errors"
	"math"
	"testing"

	"golang.org/x/time/rate"
)

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
