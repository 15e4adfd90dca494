package tokenbucket

import (
	"math"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

func TestInfDurationIsRates(t *testing.T) {
	if InfDuration != rate.InfDuration {
		t.Fatalf("InfDuration = %v, x/time/rate's is %v", InfDuration, rate.InfDuration)
	}
}

func TestCheck(t *testing.T) {
	tests := []struct {
		name    string
		rate    float64
		burst   int
		wantErr string // substring; "" means valid
	}{
		{"ok", 10, 100, ""},
		{"ok slow", 1e-4, 1, ""},
		{"ok large", 1e12, 1 << 40, ""},
		{"ok burst 2^53", 1e9, MaxBurst, ""},
		{"rate 0", 0, 1, "rate 0 must be > 0 tokens per second"},
		{"rate negative", -3, 1, "rate -3 must be > 0"},
		{"rate NaN", math.NaN(), 1, "rate NaN is not a finite number"},
		{"rate +Inf", math.Inf(1), 1, "rate +Inf is not a finite number"},
		{"rate -Inf", math.Inf(-1), 1, "rate -Inf is not a finite number"},
		{"burst 0", 1, 0, "burst 0 must be at least 1"},
		{"burst negative", 1, -5, "burst -5 must be at least 1"},
		{"burst past 2^53", 1e9, MaxBurst + 1, "exceeds 2^53"},
		{"refill beyond every TTL", 1e-300, 100, "too long for a bucket TTL"},
		// 1e13 ms to refill: an exact float64, but past a time.Duration.
		{"refill longer than a Duration", 1e-10, 1, "too long for a bucket TTL"},
		{"smallest rate that fits", 1 / (float64(math.MaxInt64/int64(time.Millisecond)) - 1001) * 1000, 1, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Check(tt.rate, tt.burst)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Check(%v, %d) = %v, want nil", tt.rate, tt.burst, err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Check(%v, %d) = %v, want an error containing %q", tt.rate, tt.burst, err, tt.wantErr)
			}
			if err == nil && FromMillis(TTLMillis(float64(tt.burst), tt.rate)) == InfDuration {
				t.Fatalf("Check(%v, %d) passed a TTL that does not fit a Duration", tt.rate, tt.burst)
			}
		})
	}
}

func TestCheckBurst(t *testing.T) {
	for _, tt := range []struct {
		burst int
		ok    bool
	}{{1, true}, {MaxBurst, true}, {0, false}, {-1, false}, {MaxBurst + 1, false}, {math.MaxInt, false}} {
		if err := CheckBurst(tt.burst); (err == nil) != tt.ok {
			t.Errorf("CheckBurst(%d) = %v, want ok %v", tt.burst, err, tt.ok)
		}
	}
}

func TestDuration(t *testing.T) {
	tests := []struct {
		tokens, rate float64
		want         time.Duration
	}{
		{1, 1, time.Second},
		{1, 10, 100 * time.Millisecond},
		{5, 1000, 5 * time.Millisecond},
		{1, 3, 333333333}, // rounded down to the nanosecond, as x/time/rate
		{0, 10, 0},
		{-4, 10, 0},
		{1, math.Inf(1), 0},
		{1, 0, InfDuration},
		{0, 0, InfDuration}, // a rate that never refills: never, even for no tokens
		{-1, 0, InfDuration},
		{1, -1, InfDuration},
		{1, math.NaN(), InfDuration},
		{math.NaN(), 1, InfDuration},
		{math.Inf(1), 1, InfDuration},
		{math.Inf(-1), 1, InfDuration},
		{1, 1e-300, InfDuration},
		{9.3e9, 1, InfDuration},         // 9.3e9 s is past 292 years
		{9.2e9, 1, 9_200_000_000 * 1e9}, // just inside
		{1 << 53, 1 << 53, time.Second}, // large but exact
		{1, math.SmallestNonzeroFloat64, InfDuration},
		{1 << 63, 1e9, InfDuration}, // exactly 2^63 ns: one past the longest Duration
	}
	for _, tt := range tests {
		if got := Duration(tt.tokens, tt.rate); got != tt.want {
			t.Errorf("Duration(%v, %v) = %v, want %v", tt.tokens, tt.rate, got, tt.want)
		}
	}
}

// TestMillis: the scripts' millisecond arithmetic, rounded up as take.lua rounds.
func TestMillis(t *testing.T) {
	tests := []struct {
		name    string
		f       func(tokens, rate float64) float64
		a, rate float64
		want    float64
	}{
		{"WaitMillis", WaitMillis, 1, 10, 100},
		{"WaitMillis", WaitMillis, 0.5, 10, 50},
		{"WaitMillis", WaitMillis, 1, 3, 334},
		{"WaitMillis", WaitMillis, 0.0001, 1000, 1},
		{"WaitMillis", WaitMillis, 0, 10, 0},
		{"WaitMillis", WaitMillis, -2, 10, 0},
		{"WaitMillis", WaitMillis, 0, 0, 0},           // no tokens to wait for, whatever the rate
		{"WaitMillis", WaitMillis, 1, 0, math.Inf(1)}, // never: FromMillis reads it as InfDuration
		{"TTLMillis", TTLMillis, 100, 10, 11000},      // the source article's example
		{"TTLMillis", TTLMillis, 1, 3, 1334},
		{"TTLMillis", TTLMillis, 10000, 100000, 1100},
		{"TTLMillis", TTLMillis, 1, 1e9, 1001},
	}
	for _, tt := range tests {
		if got := tt.f(tt.a, tt.rate); got != tt.want {
			t.Errorf("%s(%v, %v) = %v, want %v", tt.name, tt.a, tt.rate, got, tt.want)
		}
	}
}

func TestFromMillis(t *testing.T) {
	maxMS := float64(math.MaxInt64 / int64(time.Millisecond))
	tests := []struct {
		ms   float64
		want time.Duration
	}{
		{0, 0},
		{400, 400 * time.Millisecond},
		{1.9, time.Millisecond}, // a fraction of a millisecond is dropped
		{maxMS, time.Duration(maxMS) * time.Millisecond},
		{maxMS + 1, InfDuration},
		{-1, InfDuration},
		{math.MinInt64, InfDuration},
		{math.NaN(), InfDuration},
		{math.Inf(1), InfDuration},
		{math.Inf(-1), InfDuration},
	}
	for _, tt := range tests {
		if got := FromMillis(tt.ms); got != tt.want {
			t.Errorf("FromMillis(%v) = %v, want %v", tt.ms, got, tt.want)
		}
	}
}

// FuzzDurations: whatever the numbers (they come from Redis replies and user
// configuration), no Duration is negative, and more tokens never take less time.
func FuzzDurations(f *testing.F) {
	f.Add(1.0, 10.0, 0.5)
	f.Add(math.MaxFloat64, 1e-300, -1.0)
	f.Add(-0.0, math.Inf(1), math.NaN())
	f.Fuzz(func(t *testing.T, tokens, r, ms float64) {
		d := Duration(tokens, r)
		if d < 0 {
			t.Fatalf("Duration(%v, %v) = %v", tokens, r, d)
		}
		if more := Duration(tokens*2, r); tokens > 0 && !math.IsInf(tokens*2, 0) && more < d {
			t.Fatalf("Duration(%v, %v) = %v, but twice the tokens take %v", tokens, r, d, more)
		}
		if got := FromMillis(ms); got < 0 {
			t.Fatalf("FromMillis(%v) = %v", ms, got)
		}
		if got := FromMillis(WaitMillis(tokens, r)); got < 0 {
			t.Fatalf("FromMillis(WaitMillis(%v, %v)) = %v", tokens, r, got)
		}
	})
}

// TestMinRate: MinRate is the least rate Check accepts for a burst: it passes, and the
// next float below it does not.
func TestMinRate(t *testing.T) {
	for _, burst := range []int{1, 7, 9000, 1 << 30, MaxBurst} {
		r := MinRate(burst)
		if err := Check(r, burst); err != nil {
			t.Errorf("burst %d: Check(MinRate = %g) = %v", burst, r, err)
		}
		if below := math.Nextafter(r, 0); Check(below, burst) == nil {
			t.Errorf("burst %d: Check(%g), below MinRate %g, passes", burst, below, r)
		}
	}
}
