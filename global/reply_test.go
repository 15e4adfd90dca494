package global

import (
	"errors"
	"testing"
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
