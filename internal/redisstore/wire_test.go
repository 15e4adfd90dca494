package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// TestWireFormat pins what servers of two versions of the library share in Redis: the
// key bytes of buckets and fleets, the fields of a bucket's hash and the format of their
// values, and the TTL rule. A fleet that deploys a new version beside the old one keeps one
// bucket per (limit, key) only while these hold; a change here is a breaking change.
func TestWireFormat(t *testing.T) {
	t.Run("keys", func(t *testing.T) {
		def := keyStore(t)
		_, c := redistest.Mini(t)
		staging := newStore(t, c, redisstore.Prefix("staging:fl:"))
		tests := []struct {
			s         *redisstore.Store
			name, key string
			want      string
		}{
			{def, "api", "alice", "fl:{api:alice}"},
			{def, "api", "", "fl:{api:}"},
			{def, "api.v2", "2001:db8::1", "fl:{api.v2:2001:db8::1}"},
			{def, "api", strings.Repeat("k", 64), "fl:{api:" + strings.Repeat("k", 64) + "}"},
			// Longer than 64 bytes, or with a brace: the first 16 bytes of SHA-256, in hex.
			{def, "api", strings.Repeat("k", 65), "fl:{api#f39cdc2584758c99cf81c1f41d2572f5}"},
			{def, "api", "a}b", "fl:{api#538c54fe17b56e2f2b4753732e0de804}"},
			{def, "api", "{x}", "fl:{api#d3ebeaf9670d728f594bccba06375837}"},
			{staging, "api", "alice", "staging:fl:{api:alice}"},
			{staging, "api", "{", "staging:fl:{api#021fb596db81e6d02bf3d2586ee3981f}"},
		}
		for _, tt := range tests {
			if got := tt.s.Key(tt.name, tt.key); got != tt.want {
				t.Errorf("Key(%q, %q) = %q, want %q", tt.name, tt.key, got, tt.want)
			}
		}
		if redisstore.DefaultPrefix != "fl:" || redisstore.MaxKeyLen != 64 {
			t.Errorf("DefaultPrefix %q, MaxKeyLen %d; want \"fl:\", 64", redisstore.DefaultPrefix, redisstore.MaxKeyLen)
		}
	})

	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		prefix := lname(t) + ":" // unique on a shared Redis; the rest of each key is pinned
		s := newStore(t, tg.Client, redisstore.Prefix(prefix), redisstore.ServerID("srv-1"))
		lim := redisstore.Limit{Name: "api", Rate: 10, Burst: 100}
		if lim.TTL() != 11000 {
			t.Fatalf("TTL %d ms, want ceil(100/10*1000)+1000 = 11000", lim.TTL())
		}
		key := prefix + "{api:alice}"
		tol := 0.5 // a real Redis refills while the test runs: 10 tokens/s
		if tg.Mini != nil {
			tg.Mini.SetTime(t0)
			tol = 0
		}
		start := redisMillis(t, tg)

		var grant redisstore.Grant
		var takeSeq, refundSeq uint64
		steps := []struct {
			name   string
			call   func() error
			tokens float64  // the bucket's tokens after the call
			fields []string // every field of the hash, besides tokens and ts
		}{
			{"seed script", func() error {
				_, err := s.AllowN(ctx, lim, "alice", 1)
				return err
			}, 99, nil},
			{"take", func() (err error) {
				takeSeq = s.NextSeq() + 1
				grant, err = s.Take(ctx, lim, "alice", 10, 1)
				return err
			}, 89, []string{"c", "p", "t:srv-1"}},
			{"refund", func() error {
				refundSeq = s.NextSeq() + 1
				return s.Refund(ctx, lim, "alice", 5)
			}, 94, []string{"c", "p", "r:srv-1", "t:srv-1"}},
		}
		for _, st := range steps {
			if err := st.call(); err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
			h, err := tg.Client.HGetAll(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for f := range h {
				if f != "tokens" && f != "ts" {
					names = append(names, f)
				}
			}
			if _, ok := h["tokens"]; !ok || len(names) != len(st.fields) || len(h) != len(st.fields)+2 {
				t.Fatalf("%s: hash %q holds %v, want tokens, ts and %v", st.name, key, h, st.fields)
			}
			now := redisMillis(t, tg)
			if got := number(t, h["tokens"]); got < st.tokens-tol || got > st.tokens+tol {
				t.Errorf("%s: tokens %q, want %v", st.name, h["tokens"], st.tokens)
			}
			if ts := integer(t, h["ts"]); ts < start || ts > now {
				t.Errorf("%s: ts %q, want Redis TIME in ms, in [%d, %d]", st.name, h["ts"], start, now)
			}
			for _, f := range st.fields {
				rec := strings.Split(h[f], " ")
				switch {
				case f == "t:srv-1" && len(rec) == 5: // seq granted tokens wait now
					if integer(t, rec[0]) != int64(takeSeq) || integer(t, rec[1]) != 10 ||
						number(t, rec[2]) != grant.Remaining || integer(t, rec[3]) != 0 ||
						integer(t, rec[4]) != grant.Now.UnixMilli() {
						t.Errorf("%s: %s = %q, want \"%d 10 %v 0 %d\"", st.name, f, h[f], takeSeq, grant.Remaining, grant.Now.UnixMilli())
					}
				case f == "c" && len(rec) == 2: // credit now
					if number(t, rec[0]) != grant.Credit && st.name == "take" || integer(t, rec[1]) < grant.Now.UnixMilli() || integer(t, rec[1]) > now {
						t.Errorf("%s: %s = %q, want \"%v <now ms>\"", st.name, f, h[f], grant.Credit)
					}
				case f == "p" && len(rec) == 4: // version capacity rate now
					if integer(t, rec[0]) != int64(lim.Version) || integer(t, rec[1]) != int64(lim.Burst) ||
						number(t, rec[2]) != lim.Rate || integer(t, rec[3]) < grant.Now.UnixMilli() || integer(t, rec[3]) > now {
						t.Errorf("%s: %s = %q, want \"%d %d %v <now ms>\"", st.name, f, h[f], lim.Version, lim.Burst, lim.Rate)
					}
				case f == "r:srv-1" && len(rec) == 3: // seq tokens now
					if integer(t, rec[0]) != int64(refundSeq) || !near(number(t, rec[1]), 94, tol) ||
						integer(t, rec[2]) < grant.Now.UnixMilli() || integer(t, rec[2]) > now {
						t.Errorf("%s: %s = %q, want \"%d 94 <now ms>\"", st.name, f, h[f], refundSeq)
					}
				default:
					t.Errorf("%s: field %s = %q: not a take or refund record", st.name, f, h[f])
				}
			}
			checkPTTL(t, tg, key, lim.TTL())
		}

		if n, err := s.Heartbeat(ctx, "web", "srv-1", 30*time.Second); err != nil || n != 1 {
			t.Fatalf("Heartbeat = %d, %v", n, err)
		}
		fleet := prefix + "fleet:{web}"
		score, err := tg.Client.ZScore(ctx, fleet, "srv-1").Result()
		if err != nil {
			t.Fatalf("fleet key %q: %v", fleet, err)
		}
		if until := int64(score) - 30000; until < start || until > redisMillis(t, tg) {
			t.Errorf("fleet member srv-1 scored %v, want Redis TIME in ms + 30000", score)
		}
		checkPTTL(t, tg, fleet, 30000)
	})
}

// redisMillis is the Redis server's clock (TIME), in ms.
func redisMillis(t *testing.T, tg redistest.Target) int64 {
	t.Helper()
	now, err := tg.Client.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}

// checkPTTL: key lives want ms (exactly on miniredis, whose TTLs stand still without
// ClockTTL; on a real Redis, at most a second less).
func checkPTTL(t *testing.T, tg redistest.Target, key string, want int64) {
	t.Helper()
	d, err := tg.Client.PTTL(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	got := d.Milliseconds()
	if got > want || got < want-1000 || tg.Mini != nil && got != want {
		t.Errorf("PTTL %s = %d ms, want %d", key, got, want)
	}
}

// number parses a stored number, as a Lua number is read back (the strings differ between
// Redis versions and miniredis: deps.md §0.4).
func number(t *testing.T, s string) float64 {
	t.Helper()
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("%q is not a number", s)
	}
	return f
}

// integer parses a stored integer (milliseconds, sequence numbers, counts).
func integer(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("%q is not an integer: %v", s, err)
	}
	return n
}
