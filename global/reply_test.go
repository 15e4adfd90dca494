package global

import (
	"errors"
	"math"
	"testing"
	"time"
)

// replyFrom builds a reply of odd shapes from fuzz bytes: each byte picks the type of
// one element (integer, string, number string, nil, nested list, float), so the
// decoders meet every shape a broken or foreign server could send.
func replyFrom(shape []byte, i int64, s string) []any {
	out := make([]any, 0, len(shape))
	for _, b := range shape {
		switch b % 6 {
		case 0:
			out = append(out, i)
		case 1:
			out = append(out, s)
		case 2:
			out = append(out, "1e308")
		case 3:
			out = append(out, nil)
		case 4:
			out = append(out, []any{i, s})
		case 5:
			out = append(out, float64(i))
		}
	}
	return out
}

// FuzzReplies: the reply decoders never panic, and anything they cannot decode is an
// error of class ErrRedis; what they decode stays in range.
func FuzzReplies(f *testing.F) {
	f.Add([]byte{0, 1}, int64(1), "99")
	f.Add([]byte{0, 1, 0, 0, 0}, int64(5), "-0.5")
	f.Add([]byte{0, 1, 0, 0, 0}, int64(-1), "nan")
	f.Add([]byte{0, 1}, int64(0), "inf")
	f.Add([]byte{0, 2, 0, 0, 0}, int64(1)<<62, "")
	f.Add([]byte{}, int64(0), "")
	lim := Limit{Name: "fuzz", Rate: 10, Burst: 100}
	f.Fuzz(func(t *testing.T, shape []byte, i int64, s string) {
		if len(shape) > 8 {
			return
		}
		reply := replyFrom(shape, i, s)
		if r, err := parseResult(reply, lim, 1); err != nil {
			if !errors.Is(err, ErrRedis) {
				t.Fatalf("allow reply %#v: error %v is not ErrRedis", reply, err)
			}
		} else if r.RetryAfter < 0 || r.ResetAfter < 0 {
			t.Fatalf("allow reply %#v: negative durations %+v", reply, r)
		}
		if _, _, err := parseGrant(reply); err != nil && !errors.Is(err, ErrRedis) {
			t.Fatalf("take reply %#v: error %v is not ErrRedis", reply, err)
		}
	})
}

// TestWaitFor: the take script's wait converts to a Duration, and one too long for a
// Duration (a very slow rate; Redis turns a Lua number past 2^63 into garbage, seen as
// negative) reads as the longest one, never as a negative or wrapped wait.
func TestWaitFor(t *testing.T) {
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
		if got := waitFor(tt.ms); got != tt.want || got < 0 {
			t.Errorf("waitFor(%d) = %v, want %v", tt.ms, got, tt.want)
		}
	}
}
