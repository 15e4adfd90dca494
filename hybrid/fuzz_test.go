package hybrid_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// FuzzAllowN feeds the limiter keys and costs from outside: any bytes as a key, any cost.
// Nothing panics, only a negative cost is an error, and with the clocks frozen no key is
// ever admitted more than its burst, whatever its bytes (long keys are hashed into the
// bucket key, braces cannot break its hash tag).
func FuzzAllowN(f *testing.F) {
	for _, seed := range []struct {
		key string
		n   int
	}{{"k", 1}, {"", 1}, {"{tag}", 2}, {"a}b{c", 3}, {string(make([]byte, 300)), 1}, {"\xff\x00", 0}, {"k", -1}, {"k", 1 << 40}} {
		f.Add(seed.key, seed.n)
	}
	m, c := redistest.Mini(f)
	frozen := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m.SetTime(frozen)
	const burst = 5
	l := newLimiter(f, newStore(f, c), hybrid.Config{
		FleetSize: 1,
		Clock:     clockAt(func() time.Time { return frozen }),
		Limits:    []hybrid.Limit{{Name: "api", Rate: 1e-9, Burst: burst, Policy: breaker.FailClosed, MaxWait: time.Second}},
	})
	var mu sync.Mutex
	admitted := map[string]int{}
	f.Fuzz(func(t *testing.T, key string, n int) {
		d, err := l.AllowN(context.Background(), "api", key, n)
		switch {
		case n < 0:
			if !errors.Is(err, hybrid.ErrInvalidCost) || d.Allowed {
				t.Fatalf("AllowN(%q, %d) = %+v, %v; want ErrInvalidCost", key, n, d, err)
			}
			return
		case err != nil:
			t.Fatalf("AllowN(%q, %d): %v", key, n, err)
		case n > burst && d.Allowed:
			t.Fatalf("AllowN(%q, %d) allowed a cost above the burst", key, n)
		case d.Source == hybrid.SourceFallback:
			t.Fatalf("AllowN(%q, %d) went to fallback on a healthy Redis: %+v", key, n, d)
		}
		if d.Allowed {
			mu.Lock()
			admitted[key] += n
			got := admitted[key]
			mu.Unlock()
			if got > burst {
				t.Fatalf("key %q: %d tokens admitted with the clocks frozen, burst %d", key, got, burst)
			}
		}
	})
}
