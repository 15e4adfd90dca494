package redisstore_test

import (
	"errors"
	"math"
	"testing"

	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/storeerr"
)

func TestCheckCost(t *testing.T) {
	lim := redisstore.Limit{Name: "c", Rate: 1, Burst: 5}
	for _, tc := range []struct {
		n  int
		ok bool
	}{{-1, false}, {0, false}, {1, true}, {5, true}, {6, false}} {
		err := lim.CheckCost(tc.n)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, storeerr.ErrInvalidLimit)) {
			t.Errorf("CheckCost(%d) = %v, want ok=%v", tc.n, err, tc.ok)
		}
	}
}

func TestLimitTTL(t *testing.T) {
	for _, tc := range []struct {
		lim  redisstore.Limit
		want int64
	}{
		{redisstore.Limit{Name: "a", Rate: 10, Burst: 100}, 11000},
		{redisstore.Limit{Name: "a", Rate: 3, Burst: 7}, 3334},
		{redisstore.Limit{Name: "a", Rate: 1e-4, Burst: 100}, 1_000_001_000},
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
		lim := redisstore.Limit{Name: name, Rate: rate, Burst: burst}
		if err := lim.Validate(); err != nil {
			if !errors.Is(err, storeerr.ErrInvalidLimit) {
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
