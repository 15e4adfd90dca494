package redisstore_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/internal/storeerr"
)

func keyStore(t testing.TB) *redisstore.Store {
	_, c := redistest.Mini(t)
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestKeyForms(t *testing.T) {
	s := keyStore(t)
	long := strings.Repeat("k", redisstore.MaxKeyLen+1)
	for _, tc := range []struct {
		name, key, want string
	}{
		{"api", "alice", "fl:{api:alice}"},
		{"api", "", "fl:{api:}"},
		{"api", "2001:db8::1", "fl:{api:2001:db8::1}"},
		{"api", strings.Repeat("k", redisstore.MaxKeyLen), "fl:{api:" + strings.Repeat("k", redisstore.MaxKeyLen) + "}"},
		{"api", long, "fl:{api#" + digest(long) + "}"},
		{"api", "a}b", "fl:{api#" + digest("a}b") + "}"},
		{"api", "{x}", "fl:{api#" + digest("{x}") + "}"},
	} {
		got := s.Key(tc.name, tc.key)
		if got != tc.want {
			t.Errorf("Key(%q, %q) = %q, want %q", tc.name, tc.key, got, tc.want)
		}
		checkKeyShape(t, got, tc.name)
	}
	if s.Key("api", long) == s.Key("api", long+"x") {
		t.Error("two long keys share a bucket")
	}
	// A verbatim key cannot look like a hashed one: names have no '#' or ':'.
	if a, b := s.Key("a", "#"+digest(long)), s.Key("a", long); a == b {
		t.Errorf("a verbatim and a hashed key share %q", a)
	}
}

// digest is the documented hashed form: the first 16 bytes of SHA-256, in hex.
func digest(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16])
}

// checkKeyShape: the key is prefix + "{" + tag + "}" with no other brace, so the Redis
// Cluster hash tag is exactly the bucket, and it is short.
func checkKeyShape(t testing.TB, k, name string) {
	t.Helper()
	if !strings.HasPrefix(k, "fl:{"+name) || !strings.HasSuffix(k, "}") {
		t.Fatalf("key %q: want fl:{%s...}", k, name)
	}
	inner := k[len("fl:{") : len(k)-1]
	if strings.ContainsAny(inner, "{}") {
		t.Fatalf("key %q: a brace inside the tag would move the hash tag", k)
	}
	if len(k) > len("fl:{}:")+redisstore.MaxNameLen+redisstore.MaxKeyLen {
		t.Fatalf("key %q is %d bytes: unbounded", k, len(k))
	}
	hashed := strings.HasPrefix(inner, name+"#")
	if !hashed && !strings.HasPrefix(inner, name+":") {
		t.Fatalf("key %q: neither verbatim nor hashed form", k)
	}
}

func TestPrefixOption(t *testing.T) {
	_, c := redistest.Mini(t)
	s, err := redisstore.New(c, redisstore.Prefix("staging:fl:"))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Key("api", "bob"); got != "staging:fl:{api:bob}" {
		t.Fatalf("Key = %q", got)
	}
	for _, bad := range []string{"a{", "b}", "with space", strings.Repeat("p", 33), "tab\t"} {
		if _, err := redisstore.New(c, redisstore.Prefix(bad)); err == nil {
			t.Errorf("Prefix(%q) accepted", bad)
		}
	}
}

func FuzzKey(f *testing.F) {
	s := keyStore(f)
	for _, k := range []string{"", "alice", "{", "}", "}{", "a{b}c", strings.Repeat("x", 200), "\x00\xff", "2001:db8::1"} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		k := s.Key("lim", key)
		checkKeyShape(t, k, "lim")
		if id := redisstore.IDOf(key); len(id) > redisstore.MaxKeyLen || (id != redisstore.KeyID(key)) != (k != "fl:{lim:"+key+"}") {
			t.Fatalf("IDOf(%q) = %q for bucket %q", key, id, k)
		}
		if s.Key("lim", key) != k {
			t.Fatal("Key is not deterministic")
		}
		if s.Key("lim", key+"x") == k {
			t.Fatalf("keys %q and %q share bucket %q", key, key+"x", k)
		}
	})
}

// TestTakeID: a take named by a key's ID (TakeOne, TakeBatch) spends from the key's own
// bucket, whatever the key's length; an ID that IDOf cannot return is refused before
// any call.
func TestTakeID(t *testing.T) {
	s := keyStore(t)
	ctx := context.Background()
	lim := redisstore.Limit{Name: "api", Rate: 0.001, Burst: 10}
	long := strings.Repeat("k", 1<<20)
	for _, key := range []string{"", "alice", "a{b}", long} {
		if _, err := s.Take(ctx, lim, key, 3, 1); err != nil {
			t.Fatal(err)
		}
		g, err := s.TakeOne(ctx, redisstore.TakeRequest{Limit: lim, ID: redisstore.IDOf(key), Want: 10, Min: 1})
		if err != nil {
			t.Fatal(err)
		}
		if g.Granted != 7 {
			t.Errorf("key %.20q: TakeOne by ID after a take of 3 granted %d, want the 7 left in the key's bucket", key, g.Granted)
		}
		out := make([]redisstore.TakeResult, 1)
		if err := s.TakeBatch(ctx, []redisstore.TakeRequest{{Limit: lim, ID: redisstore.IDOf(key), Want: 1, Min: 1}}, out); err != nil || out[0].Granted != 0 {
			t.Errorf("key %.20q: TakeBatch by ID on the empty bucket: %+v %v, want 0 granted", key, out[0], err)
		}
	}
	for _, bad := range []redisstore.KeyID{"{", "{abc", redisstore.KeyID(long)} {
		if _, err := s.TakeOne(ctx, redisstore.TakeRequest{Limit: lim, ID: bad, Want: 1, Min: 1}); !errors.Is(err, storeerr.ErrInvalidLimit) {
			t.Errorf("TakeOne by ID %.20q: %v, want ErrInvalidLimit", bad, err)
		}
	}
}
