package fallback_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"golang.org/x/time/rate"

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

func TestShare(t *testing.T) {
	tests := []struct {
		rate                    float64
		burst, servers, maxCost int
		wantRate                rate.Limit
		wantBurst               int
	}{
		{1000, 100, 200, 1, 5, 1}, // 100/200 rounds up, never to 0
		{1000, 100, 200, 3, 5, 3}, // the largest request must fit
		{1000, 100, 1, 1, 1000, 100},
		{1000, 100, 3, 1, 1000.0 / 3, 34},
		{1000, 100, 100, 1, 10, 1},
		{1000, 100, 0, 0, 1000, 100},                        // servers and cost below 1 count as 1
		{1000, 0, 200, 1, 5, 1},                             // an empty burst still admits one
		{1000, math.MaxInt, 10, 1, 100, math.MaxInt/10 + 1}, // no overflow
	}
	for _, tt := range tests {
		r, b := fallback.Share(tt.rate, tt.burst, tt.servers, tt.maxCost)
		if math.Abs(float64(r-tt.wantRate)) > 1e-9 || b != tt.wantBurst {
			t.Errorf("Share(%v, %d, %d, %d) = %v, %d; want %v, %d",
				tt.rate, tt.burst, tt.servers, tt.maxCost, r, b, tt.wantRate, tt.wantBurst)
		}
	}

	// At N = 200 with burst 100 the share admits, at its pace.
	r, b := fallback.Share(1000, 100, 200, 1)
	l, err := local.NewLimiter(local.Config{Rate: r, Burst: b})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	allowed := 0
	for i := range 1000 { // 1 s in 1 ms steps
		if l.AllowN(start.Add(time.Duration(i)*time.Millisecond), "k", 1) {
			allowed++
		}
	}
	if allowed < 5 || allowed > 6 {
		t.Errorf("the share of 1 server of 200 allowed %d in 1 s, want 5 or 6 (1 burst + 5/s)", allowed)
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
	for _, p := range []breaker.Policy{breaker.FailOpen, breaker.FailClosed} {
		if _, _, ok := fallback.Of(p).LocalLimit(100, 100, 10, 1); ok {
			t.Errorf("%v has a local limit", p)
		}
	}
}

// TestResizeSlowestRate: a fleet that grows past what a tiny rate can be shared by (its
// share's refill of the burst, kept at MaxCost, longer than a bucket's TTL) gets the
// slowest rate a bucket holds, not the share of the fleet before.
func TestResizeSlowestRate(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f, err := fallback.New(fallback.Of(breaker.FailLocal()), fallback.Config{Rate: 1e-6, Burst: 9000, Servers: 1, MaxCost: 9000})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.SetServersAt(now, 4); err != nil {
		t.Fatalf("SetServersAt(4): %v", err)
	}
	if !f.AllowN(now, "k", 9000) {
		t.Fatal("the burst of 9000 is not there")
	}
	// One server's share (1e-6/s) refills a token in 1e6 s; the slowest rate a bucket
	// holds for a burst of 9000 takes about 1.025e6 s.
	if f.AllowN(now.Add(1010000*time.Second), "k", 1) {
		t.Error("a fleet of 4 refills at one server's share")
	}
	if !f.AllowN(now.Add(1030000*time.Second), "k", 1) {
		t.Error("a fleet of 4 does not refill at the slowest rate a bucket holds")
	}
}

// TestSame: two Fallbacks decide alike when their policy (a FailLocalLimit's own rate
// and burst included), limit, largest cost and key cap are the same, the key cap's 0
// being its default; the live server count does not matter.
func TestSame(t *testing.T) {
	base := fallback.Config{Rate: 100, Burst: 100, Servers: 10, MaxCost: 1}
	with := func(f func(*fallback.Config)) fallback.Config { c := base; f(&c); return c }
	for _, tc := range []struct {
		name string
		p    breaker.Policy
		cfg  fallback.Config
		same bool
	}{
		{"the same", breaker.FailLocal(), base, true},
		{"another server count", breaker.FailLocal(), with(func(c *fallback.Config) { c.Servers = 20 }), true},
		{"MaxKeys named at its default", breaker.FailLocal(), with(func(c *fallback.Config) { c.MaxKeys = 100_000 }), true},
		{"another policy", breaker.FailOpen, base, false},
		{"a FailLocalLimit", breaker.FailLocalLimit(5, 5), base, false},
		{"another MaxCost", breaker.FailLocal(), with(func(c *fallback.Config) { c.MaxCost = 5 }), false},
		{"another MaxKeys", breaker.FailLocal(), with(func(c *fallback.Config) { c.MaxKeys = 10 }), false},
		{"another burst", breaker.FailLocal(), with(func(c *fallback.Config) { c.Burst = 50 }), false},
		{"another rate", breaker.FailLocal(), with(func(c *fallback.Config) { c.Rate = 50 }), false},
	} {
		a, err := fallback.New(fallback.Of(breaker.FailLocal()), base)
		if err != nil {
			t.Fatal(err)
		}
		b, err := fallback.New(fallback.Of(tc.p), tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := a.Same(b); got != tc.same {
			t.Errorf("%s: Same %v, want %v", tc.name, got, tc.same)
		}
		a.Close()
		b.Close()
	}
}

// TestResizeExplicit: SetServersAt leaves an explicit local limit (FailLocalLimit) as it
// is, whatever the fleet's size, and moves only the fleet share of a FailLocal.
func TestResizeExplicit(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// A fleet-wide 1000/s, burst 100: one server's share is 1000/s, burst 100.
	cfg := fallback.Config{Rate: 1000, Burst: 100, Servers: 200, MaxCost: 1}
	for _, tc := range []struct {
		p    breaker.Policy
		want int // admitted at now after SetServersAt(now, 1), of 200
	}{
		{breaker.FailLocalLimit(1, 3), 3},
		{breaker.FailLocal(), 100},
	} {
		f, err := fallback.New(fallback.Of(tc.p), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.SetServersAt(now, 1); err != nil {
			t.Fatalf("%v: SetServersAt(1): %v", tc.p, err)
		}
		got := 0
		for range 200 {
			if f.AllowN(now, "k", 1) {
				got++
			}
		}
		if got != tc.want {
			t.Errorf("%v: admitted %d at once on a fleet of 1, want %d", tc.p, got, tc.want)
		}
		f.Close()
	}
}
