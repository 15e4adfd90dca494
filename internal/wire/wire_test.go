package wire

import (
	"math"
	"reflect"
	"strings"
	"testing"
)

func TestBucketKey(t *testing.T) {
	tests := []struct {
		prefix, name, key, want string
	}{
		{"fl:", "api", "alice", "fl:{api:alice}"},
		{"", "api", "", "{api:}"},
		{"fl:", "api", strings.Repeat("k", MaxKeyLen), "fl:{api:" + strings.Repeat("k", MaxKeyLen) + "}"},
		{"fl:", "api", strings.Repeat("k", MaxKeyLen+1), "fl:{api#f39cdc2584758c99cf81c1f41d2572f5}"},
		{"x:", "api", "a}b", "x:{api#538c54fe17b56e2f2b4753732e0de804}"},
	}
	for _, tt := range tests {
		if got := BucketKey(tt.prefix, tt.name, tt.key); got != tt.want {
			t.Errorf("BucketKey(%q, %q, %q) = %q, want %q", tt.prefix, tt.name, tt.key, got, tt.want)
		}
	}
	if got := FleetKey("fl:", "web"); got != "fl:fleet:{web}" {
		t.Errorf("FleetKey = %q", got)
	}
}

// TestKeyID: a key's ID is the key itself when the Redis key carries it verbatim, else
// '{' and the Redis key's digest; it is short whatever the key, a valid ID, and gives
// back the very Redis key of the key.
func TestKeyID(t *testing.T) {
	long := strings.Repeat("k", MaxKeyLen+1)
	huge := strings.Repeat("x", 1<<20)
	for _, tt := range []struct {
		key, want string
	}{
		{"", ""},
		{"alice", "alice"},
		{"#f39cdc2584758c99cf81c1f41d2572f5", "#f39cdc2584758c99cf81c1f41d2572f5"},
		{strings.Repeat("k", MaxKeyLen), strings.Repeat("k", MaxKeyLen)},
		{long, "{f39cdc2584758c99cf81c1f41d2572f5"},
		{"a}b", "{538c54fe17b56e2f2b4753732e0de804"},
		{"{f39cdc2584758c99cf81c1f41d2572f5", "{" + KeyID("{f39cdc2584758c99cf81c1f41d2572f5")[1:]},
		{huge + "a", KeyID(huge + "a")},
	} {
		id := KeyID(tt.key)
		if id != tt.want {
			t.Errorf("KeyID(%.40q) = %q, want %q", tt.key, id, tt.want)
		}
		if len(id) > MaxKeyLen || !ValidID(id) {
			t.Errorf("KeyID(%.40q) = %q: not a valid short ID", tt.key, id)
		}
		if got, want := BucketKeyOfID("fl:", "api", id), BucketKey("fl:", "api", tt.key); got != want {
			t.Errorf("BucketKeyOfID(KeyID(%.40q)) = %q, want BucketKey's %q", tt.key, got, want)
		}
	}
	if KeyID(huge+"a") == KeyID(huge+"b") {
		t.Error("two long keys that differ in their last byte share an ID")
	}
	if KeyID("{f39cdc2584758c99cf81c1f41d2572f5") == KeyID(long) {
		t.Error("a key that looks like an ID shares the ID of the key it names")
	}
	for _, bad := range []string{"{", "{f39c", "{F39CDC2584758C99CF81C1F41D2572F5", "{f39cdc2584758c99cf81c1f41d2572f5}", long,
		"}f39cdc2584758c99cf81c1f41d2572f5", "{g39cdc2584758c99cf81c1f41d2572f5", "{f39cdc2584758c99cf81c1f41d2572f:"} {
		if ValidID(bad) {
			t.Errorf("ValidID(%q) = true", bad)
		}
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		parse   func(any) (any, error)
		reply   any
		want    any
		wantErr string // substring; "" means decoded
	}{
		{"bucket allowed", bucket, []any{int64(1), "99"}, BucketReply{Allowed: true, Tokens: 99}, ""},
		{"bucket denied", bucket, []any{int64(0), "0.5"}, BucketReply{Tokens: 0.5}, ""},
		{"bucket %.14g", bucket, []any{int64(0), "9.007199254741e+15"}, BucketReply{Tokens: 9.007199254741e+15}, ""},
		{"bucket short", bucket, []any{int64(1)}, nil, "want 2 values, got 1"},
		{"bucket not an array", bucket, int64(1), nil, "want {integer, string}, got int64"},
		{"bucket types", bucket, []any{"1", "99"}, nil, "want {integer, string}"},
		{"bucket tokens", bucket, []any{int64(1), "x"}, nil, `tokens "x" not a number`},
		{"take", take, []any{int64(5), "95", int64(0), int64(1700000000000), int64(0), int64(0), "12.5"},
			TakeReply{Granted: 5, Tokens: 95, NowMS: 1700000000000, Credit: 12.5}, ""},
		{"take replayed", take, []any{int64(0), "0.25", int64(75), int64(1), int64(1), int64(7), "0"},
			TakeReply{Tokens: 0.25, WaitMS: 75, NowMS: 1, Flag: 1, Version: 7}, ""},
		{"take overflowed wait", take, []any{int64(0), "0", math.MinInt64 + int64(0), int64(1), int64(0), int64(0), "0"},
			TakeReply{WaitMS: math.MinInt64, NowMS: 1}, ""},
		{"take long", take, []any{int64(5), "95", int64(0), int64(1), int64(0), int64(0), "0", int64(0)}, nil, "want 7 values, got 8"},
		{"take before versions", take, []any{int64(5), "95", int64(0), int64(1), int64(0)}, nil, "want 7 values, got 5"},
		{"take types", take, []any{int64(5), "95", "0", int64(1), int64(0), int64(0), "0"}, nil, "want {integer, string, integer, integer, integer, integer, string}"},
		{"take negative version", take, []any{int64(5), "95", int64(0), int64(1), int64(0), int64(-1), "0"}, nil, "want {integer, string, integer, integer, integer, integer, string}"},
		{"take tokens", take, []any{int64(5), int64(95), int64(0), int64(1), int64(0), int64(0), "0"}, nil, "tokens: want a string, got int64"},
		{"take credit", take, []any{int64(5), "95", int64(0), int64(1), int64(0), int64(0), int64(3)}, nil, "want a string, got int64"},
		{"refund", refund, []any{"100", int64(2), int64(3)}, RefundReply{Tokens: 100, Flag: 2, Version: 3}, ""},
		{"refund nil", refund, nil, nil, "got <nil>"},
		{"refund types", refund, []any{"100", "2", int64(0)}, nil, "want {string, integer, integer}"},
		{"refund negative version", refund, []any{"100", int64(2), int64(-1)}, nil, "want {string, integer, integer}"},
		{"refund before versions", refund, []any{"100", int64(2)}, nil, "want 3 values, got 2"},
		{"refunds of two keys", refunds2, []any{"100", int64(0), int64(1), "7.5", int64(2), int64(3)},
			[2]RefundReply{{Tokens: 100, Version: 1}, {Tokens: 7.5, Flag: 2, Version: 3}}, ""},
		{"refunds, the first key refused", refunds2, []any{"WRONGTYPE not a hash", int64(RefundRefused), int64(0), "7.5", int64(0), int64(3)},
			[2]RefundReply{{Flag: RefundRefused, Refused: "WRONGTYPE not a hash"}, {Tokens: 7.5, Version: 3}}, ""},
		{"refunds, refused without a message", refunds2, []any{int64(1), int64(RefundRefused), int64(0), "7.5", int64(0), int64(3)}, nil, "key 1: want {string, integer, integer}"},
		{"refunds, one key's values", refunds2, []any{"100", int64(0), int64(1)}, nil, "want 6 values, got 3"},
		{"refunds, the second key's types", refunds2, []any{"100", int64(0), int64(1), "7.5", "2", int64(3)}, nil, "key 2: want {string, integer, integer}"},
		{"heartbeat", heartbeat, int64(3), 3, ""},
		{"heartbeat zero", heartbeat, int64(0), nil, "0 live servers"},
		{"heartbeat string", heartbeat, "3", nil, "want an integer, got string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.parse(tt.reply)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// TestParseLow: luascript.Low's reply is an array of key IDs, every element a string.
func TestParseLow(t *testing.T) {
	for _, tt := range []struct {
		reply   any
		want    []string
		wantErr string // substring; "" means decoded
	}{
		{[]any{}, []string{}, ""},
		{[]any{"alice", "{0123456789abcdef0123456789abcdef"}, []string{"alice", "{0123456789abcdef0123456789abcdef"}, ""},
		{[]any{"alice", int64(1)}, nil, "element 1: want a string, got int64"},
		{[]any{nil}, nil, "element 0: want a string, got <nil>"},
		{"alice", nil, "want an array, got string"},
	} {
		got, err := ParseLow(tt.reply)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseLow(%#v) = %q, %v; want an error containing %q", tt.reply, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseLow(%#v) = %q, %v; want %q", tt.reply, got, err, tt.want)
		}
	}
}

// TestSeenArgs: a take's caller passes what it saw as two arguments, its instant never
// before 1970, and nothing when it saw nothing.
func TestSeenArgs(t *testing.T) {
	for _, tt := range []struct {
		seen Seen
		want []any
	}{
		{Seen{}, nil},
		{Seen{Level: 3, AtMS: 5}, nil},
		{Seen{Known: true, Level: -2.5, AtMS: 1700000000000}, []any{-2.5, int64(1700000000000)}},
		{Seen{Known: true, Level: 1, AtMS: 0}, []any{1.0, int64(0)}},
		{Seen{Known: true, Level: 1, AtMS: -5}, []any{1.0, int64(0)}},
	} {
		if got := tt.seen.Args(); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%+v.Args() = %#v, want %#v", tt.seen, got, tt.want)
		}
	}
}

// TestLowSets: the format of a charge-later limit's low keys: a key's set (pinned, and not
// its windowed shard's rule), one set for one shard, and the runs of luascript.Low a number
// of marks takes, MaxLowWrite a run and one for none.
func TestLowSets(t *testing.T) {
	ids := []string{"alice", "", "{0123456789abcdef0123456789abcdef"}
	for _, tt := range []struct {
		shards int
		want   []int
	}{
		{LowShards, []int{9, 2, 7}},
		{64, []int{49, 40, 21}},
		{1, []int{0, 0, 0}},
		{0, []int{0, 0, 0}},
	} {
		for i, id := range ids {
			if got := LowShard(id, tt.shards); got != tt.want[i] {
				t.Errorf("LowShard(%q, %d) = %d, want %d", id, tt.shards, got, tt.want[i])
			}
		}
	}
	for _, tt := range []struct{ keys, runs int }{
		{0, 1}, {1, 1}, {MaxLowWrite - 1, 1}, {MaxLowWrite, 1}, {MaxLowWrite + 1, 2}, {2 * MaxLowWrite, 2}, {2*MaxLowWrite + 1, 3},
	} {
		if got := LowRuns(tt.keys); got != tt.runs {
			t.Errorf("LowRuns(%d) = %d, want %d", tt.keys, got, tt.runs)
		}
	}
}

var (
	bucket   = erase(ParseBucket)
	take     = erase(ParseTake)
	refund   = erase(ParseRefund)
	refunds2 = erase(func(v any) ([2]RefundReply, error) {
		var out [2]RefundReply
		err := ParseRefunds(v, out[:])
		return out, err
	})
	heartbeat = erase(ParseHeartbeat)
)

// erase gives the decoders one type for the tables: the decoded value, or nil and the error.
func erase[T any](parse func(any) (T, error)) func(any) (any, error) {
	return func(v any) (any, error) {
		r, err := parse(v)
		if err != nil {
			return nil, err
		}
		return r, nil
	}
}

// replyFrom builds a reply of odd shapes from fuzz bytes: each byte picks the type of one
// element (integer, string, number string, nil, nested list, float), so the decoders meet
// every shape a broken or foreign server could send.
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

// FuzzParse: the decoders never panic, and either decode or say why not. A reply comes
// from outside the process: a broken, foreign or newer server may send anything.
func FuzzParse(f *testing.F) {
	f.Add([]byte{0, 1}, int64(1), "99")
	f.Add([]byte{0, 1, 0, 0, 0}, int64(5), "-0.5")
	f.Add([]byte{1, 0}, int64(-1), "nan")
	f.Add([]byte{0, 2, 0, 0, 0}, int64(1)<<62, "")
	f.Add([]byte{}, int64(0), "")
	f.Fuzz(func(t *testing.T, shape []byte, i int64, s string) {
		if len(shape) > 8 {
			return
		}
		reply := replyFrom(shape, i, s)
		for _, parse := range []func(any) (any, error){bucket, take, refund, refunds2, heartbeat} {
			for _, r := range []any{reply, i, s, nil} {
				if got, err := parse(r); (err == nil) == (got == nil) {
					t.Fatalf("reply %#v: %v, %v", r, got, err)
				}
			}
		}
	})
}
