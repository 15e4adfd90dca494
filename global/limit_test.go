package global_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/fleetlimit/fleetlimit/global"
)

func TestLimitValidation(t *testing.T) {
	cases := []struct {
		name    string
		lim     global.Limit
		wantErr string // substring of the error; "" means valid
	}{
		{"ok", global.Limit{Name: "api", Rate: 10, Burst: 100}, ""},
		{"ok fractional rate", global.Limit{Name: "api.v2_x-y/z", Rate: 1e-4, Burst: 1}, ""},
		{"ok large", global.Limit{Name: "big", Rate: 1e12, Burst: 1 << 40}, ""},
		{"empty name", global.Limit{Name: "", Rate: 1, Burst: 1}, "limit name is empty"},
		{"rate 0", global.Limit{Name: "a", Rate: 0, Burst: 1}, "rate 0 must be > 0"},
		{"rate negative", global.Limit{Name: "a", Rate: -3, Burst: 1}, "rate -3 must be > 0"},
		{"rate NaN", global.Limit{Name: "a", Rate: math.NaN(), Burst: 1}, "rate NaN is not a finite number"},
		{"rate +Inf", global.Limit{Name: "a", Rate: math.Inf(1), Burst: 1}, "rate +Inf is not a finite number"},
		{"rate -Inf", global.Limit{Name: "a", Rate: math.Inf(-1), Burst: 1}, "rate -Inf is not a finite number"},
		{"burst 0", global.Limit{Name: "a", Rate: 1, Burst: 0}, "burst 0 must be at least 1"},
		{"burst negative", global.Limit{Name: "a", Rate: 1, Burst: -5}, "burst -5 must be at least 1"},
		{"burst beyond 2^53", global.Limit{Name: "a", Rate: 1e9, Burst: 1<<53 + 1}, "exceeds 2^53"},
		{"refill too slow for a TTL", global.Limit{Name: "a", Rate: 1e-300, Burst: 100}, "too long for a bucket TTL"},
		// 1e13 ms to refill: an exact Lua integer, but past a time.Duration (waits wrapped).
		{"refill longer than a Duration", global.Limit{Name: "a", Rate: 1e-10, Burst: 1}, "too long for a bucket TTL"},
		{"name with brace", global.Limit{Name: "a{b", Rate: 1, Burst: 1}, "not allowed"},
		{"name with close brace", global.Limit{Name: "a}b", Rate: 1, Burst: 1}, "not allowed"},
		{"name with colon", global.Limit{Name: "a:b", Rate: 1, Burst: 1}, "not allowed"},
		{"name with hash", global.Limit{Name: "a#b", Rate: 1, Burst: 1}, "not allowed"},
		{"name with space", global.Limit{Name: "a b", Rate: 1, Burst: 1}, "not allowed"},
		{"name not ASCII", global.Limit{Name: "é", Rate: 1, Burst: 1}, "not allowed"},
		{"name too long", global.Limit{Name: strings.Repeat("n", global.MaxNameLen+1), Rate: 1, Burst: 1}, "longer than 64"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lim, err := global.NewLimit(tc.lim.Name, tc.lim.Rate, tc.lim.Burst)
			if verr := tc.lim.Validate(); (verr == nil) != (err == nil) {
				t.Fatalf("NewLimit and Validate disagree: %v / %v", err, verr)
			}
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("NewLimit(%+v) = %v, want valid", tc.lim, err)
				}
				if lim != tc.lim {
					t.Fatalf("NewLimit returned %+v, want %+v", lim, tc.lim)
				}
				return
			}
			if err == nil {
				t.Fatalf("NewLimit(%+v) is valid, want an error containing %q", tc.lim, tc.wantErr)
			}
			if !errors.Is(err, global.ErrInvalidLimit) {
				t.Errorf("error %v does not wrap ErrInvalidLimit", err)
			}
			if !strings.Contains(err.Error(), tc.wantErr) || !strings.HasPrefix(err.Error(), "global: ") {
				t.Errorf("error %q, want it to start with \"global: \" and contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestCheckCost(t *testing.T) {
	lim := global.Limit{Name: "c", Rate: 1, Burst: 5}
	for _, tc := range []struct {
		n  int
		ok bool
	}{{-1, false}, {0, false}, {1, true}, {5, true}, {6, false}} {
		err := lim.CheckCost(tc.n)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, global.ErrInvalidLimit)) {
			t.Errorf("CheckCost(%d) = %v, want ok=%v", tc.n, err, tc.ok)
		}
	}
}

func TestLimitTTL(t *testing.T) {
	for _, tc := range []struct {
		lim  global.Limit
		want int64
	}{
		{global.Limit{Name: "a", Rate: 10, Burst: 100}, 11000},
		{global.Limit{Name: "a", Rate: 3, Burst: 7}, 3334},
		{global.Limit{Name: "a", Rate: 1e-4, Burst: 100}, 1_000_001_000},
	} {
		if got := tc.lim.TTL(); got != tc.want {
			t.Errorf("%+v.TTL() = %d ms, want %d", tc.lim, got, tc.want)
		}
	}
}

// FuzzLimit: Validate never panics, and a valid limit has a finite TTL that Redis can
// hold exactly and costs 1..Burst.
func FuzzLimit(f *testing.F) {
	f.Add("api", 10.0, 100)
	f.Add("", 0.0, 0)
	f.Add("x", math.SmallestNonzeroFloat64, 1)
	f.Add("y", math.MaxFloat64, 1<<53)
	f.Add("z{", math.NaN(), -1)
	f.Fuzz(func(t *testing.T, name string, rate float64, burst int) {
		lim := global.Limit{Name: name, Rate: rate, Burst: burst}
		if err := lim.Validate(); err != nil {
			if !errors.Is(err, global.ErrInvalidLimit) {
				t.Fatalf("error %v does not wrap ErrInvalidLimit", err)
			}
			return
		}
		if ttl := lim.TTL(); ttl < 1000 || ttl >= 1<<53 {
			t.Fatalf("%+v: TTL %d ms", lim, ttl)
		}
		if lim.CheckCost(1) != nil || lim.CheckCost(burst) != nil || lim.CheckCost(burst+1) == nil {
			t.Fatalf("%+v: cost bounds wrong", lim)
		}
	})
}
