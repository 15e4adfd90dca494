package breaker

import (
	"errors"
	"math"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/fleetlimit/fleetlimit/local"
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
		{FailLocalLimit(0, 2), ErrInvalidConfig, "fail-local"},
		{FailLocalLimit(-1, 2), ErrInvalidConfig, "fail-local(-1/s, burst 2)"},
		{FailLocalLimit(rate.Limit(math.NaN()), 2), ErrInvalidConfig, "fail-local(NaN/s, burst 2)"},
		{FailLocalLimit(5, 0), ErrInvalidConfig, "fail-local(5/s, burst 0)"},
		{Policy{kind: 9}, ErrInvalidConfig, "Kind(9)"},
	}
	for _, tt := range tests {
		err := tt.p.Validate()
		if (tt.want == nil) != (err == nil) || (tt.want != nil && !errors.Is(err, tt.want)) {
			t.Errorf("%v.Validate() = %v, want %v", tt.p, err, tt.want)
		}
		if err != nil && !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%v.Validate() = %v, want it to match ErrInvalidConfig", tt.p, err)
		}
		if got := tt.p.String(); got != tt.str {
			t.Errorf("String() = %q, want %q", got, tt.str)
		}
	}
	if FailLocal() != FailLocal() || FailOpen == FailClosed || FailLocal().Kind() != KindLocal {
		t.Error("policies do not compare as documented")
	}
}

// TestFallbackDecisions: what each policy answers during an outage.
func TestFallbackDecisions(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// A fleet-wide 1000/s, burst 100, over 200 servers: 5/s and burst 1 here.
	cfg := FallbackConfig{Rate: 1000, Burst: 100, Servers: 200, MaxCost: 1}
	tests := []struct {
		p    Policy
		want []bool // 4 requests at now, then 1 at now+200ms
	}{
		{FailOpen, []bool{true, true, true, true, true}},
		{FailClosed, []bool{false, false, false, false, false}},
		{FailLocal(), []bool{true, false, false, false, true}},
		{FailLocalLimit(1, 3), []bool{true, true, true, false, false}},
	}
	for _, tt := range tests {
		f, err := NewFallback(tt.p, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var got []bool
		for range 4 {
			got = append(got, f.AllowN(now, "k", 1))
		}
		got = append(got, f.AllowN(now.Add(200*time.Millisecond), "k", 1))
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("%v: decisions %v, want %v", tt.p, got, tt.want)
				break
			}
		}
		if f.Policy() != tt.p {
			t.Errorf("Policy() = %v", f.Policy())
		}
		f.Close()
		f.Close()
	}
	if _, err := NewFallback(Policy{}, cfg); !errors.Is(err, ErrNoPolicy) || !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("NewFallback(zero) = %v, want ErrNoPolicy and ErrInvalidConfig", err)
	}
	if _, err := NewFallback(FailLocal(), FallbackConfig{Rate: math.NaN(), Burst: 1}); !errors.Is(err, local.ErrInvalidConfig) {
		t.Errorf("NewFallback with a NaN rate = %v, want local.ErrInvalidConfig", err)
	}
}

func TestFallbackResize(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f, err := NewFallback(FailLocal(), FallbackConfig{Rate: 100, Burst: 100, Servers: 100, MaxCost: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// 1/s, burst 1 each; the fleet shrinks to 10 servers: 10/s, burst 10.
	if !f.AllowN(now, "k", 1) || f.AllowN(now, "k", 1) {
		t.Fatal("share of 100 servers is not burst 1")
	}
	if err := f.SetServersAt(now, 10); err != nil {
		t.Fatal(err)
	}
	if !f.AllowN(now.Add(time.Second), "k", 10) {
		t.Error("share of 10 servers did not refill to 10 in 1 s")
	}
	if r, b, ok := FailLocal().LocalLimit(100, 100, 10, 1); !ok || r != 10 || b != 10 {
		t.Errorf("LocalLimit = %v, %v, %v", r, b, ok)
	}
	// An explicit limit keeps its size, but never below the largest cost.
	if r, b, _ := FailLocalLimit(2, 1).LocalLimit(100, 100, 10, 4); r != 2 || b != 4 {
		t.Errorf("explicit LocalLimit = %v, %v", r, b)
	}
	if _, _, ok := FailOpen.LocalLimit(100, 100, 10, 1); ok {
		t.Error("FailOpen has a local limit")
	}
}
