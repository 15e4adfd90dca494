package redisstore

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/storeerr"
)

// TestGrantWait: the take script's wait converts to a Duration, and one too long for a
// Duration (a very slow rate; Redis turns a Lua number past 2^63 into garbage, seen as
// negative) reads as the longest one, never as a negative or wrapped wait.
func TestGrantWait(t *testing.T) {
	const max = time.Duration(math.MaxInt64)
	tests := []struct {
		ms   int64
		want time.Duration
	}{
		{0, 0},
		{400, 400 * time.Millisecond},
		{math.MaxInt64 / int64(time.Millisecond), time.Duration(math.MaxInt64/int64(time.Millisecond)) * time.Millisecond},
		{math.MaxInt64/int64(time.Millisecond) + 1, max},
		{-1, max},
		{math.MinInt64, max},
	}
	for _, tt := range tests {
		g, _, err := parseGrant([]any{int64(0), "0", tt.ms, int64(1), int64(0), int64(0), "0"})
		if err != nil || g.Wait != tt.want {
			t.Errorf("wait %d ms: Grant.Wait = %v, %v; want %v", tt.ms, g.Wait, err, tt.want)
		}
	}
}

// TestReplyOfWrongType: a reply the library does not understand, even one that is not
// an array, is ErrRedis (Redis answered, the store is there), never ErrUnavailable.
func TestReplyOfWrongType(t *testing.T) {
	lim := Limit{Name: "wrong", Rate: 10, Burst: 100}
	for _, reply := range []any{int64(1), "99", nil, []any{}} {
		_, err1 := parseResult(reply, lim, 1)
		_, _, err2 := parseGrant(reply)
		_, _, err3 := parseRefund(reply)
		for _, err := range []error{err1, err2, err3} {
			if !errors.Is(err, storeerr.ErrRedis) || storeerr.IsUnavailable(err) {
				t.Errorf("reply %#v: %v, want storeerr.ErrRedis", reply, err)
			}
		}
	}
}
