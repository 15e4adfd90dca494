package fallback_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/internal/fallback"
	"github.com/fleetlimit/fleetlimit/local"
)

// TestDecisions: what each policy answers during an outage.
func TestDecisions(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// A fleet-wide 1000/s, burst 100, over 200 servers: 5/s and burst 1 here.
	cfg := fallback.Config{Rate: 1000, Burst: 100, Servers: 200, MaxCost: 1}
	tests := []struct {
		p    breaker.Policy
		kind fallback.Kind
		want []bool // 4 requests at now, then 1 at now+200ms
	}{
		{breaker.FailOpen, fallback.Open, []bool{true, true, true, true, true}},
		{breaker.FailClosed, fallback.Closed, []bool{false, false, false, false, false}},
		{breaker.FailLocal(), fallback.Local, []bool{true, false, false, false, true}},
		{breaker.FailLocalLimit(1, 3), fallback.Local, []bool{true, true, true, false, false}},
	}
	for _, tt := range tests {
		f, err := fallback.New(fallback.Of(tt.p), cfg)
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
		if f.Kind() != tt.kind || f.Kind().String() != tt.p.String() && tt.p != breaker.FailLocalLimit(1, 3) {
			t.Errorf("%v: Kind() = %v, want %v", tt.p, f.Kind(), tt.kind)
		}
		f.Close()
		f.Close()
	}
	if _, err := fallback.New(fallback.Of(breaker.FailLocal()), fallback.Config{Rate: math.NaN(), Burst: 1}); !errors.Is(err, local.ErrInvalidConfig) {
		t.Errorf("New with a NaN rate = %v, want local.ErrInvalidConfig", err)
	}
}

func TestResize(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f, err := fallback.New(fallback.Of(breaker.FailLocal()), fallback.Config{Rate: 100, Burst: 100, Servers: 100, MaxCost: 1})
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
	if r, b, ok := f.LocalLimit(10); !ok || r != 10 || b != 10 {
		t.Errorf("LocalLimit = %v, %v, %v", r, b, ok)
	}
	// An explicit limit keeps its size, but never below the largest cost.
	if r, b, _ := fallback.Of(breaker.FailLocalLimit(2, 1)).LocalLimit(100, 100, 10, 4); r != 2 || b != 4 {
		t.Errorf("explicit LocalLimit = %v, %v", r, b)
	}
	if _, _, ok := fallback.Of(breaker.FailOpen).LocalLimit(100, 100, 10, 1); ok {
		t.Error("FailOpen has a local limit")
	}
}
