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
		{"name too long", global.Limit{Name: strings.Repeat("n", 65), Rate: 1, Burst: 1}, "longer than 64"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lim, err := global.NewLimit(tc.lim.Name, tc.lim.Rate, tc.lim.Burst)
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
