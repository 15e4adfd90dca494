package e2e_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// TestHeapAfterKeyBurst: 1,000,000 one-shot keys as fast as 64 goroutines send them to
// one server (MaxKeys 10,000), on a redis-server of the test's own; for the bucket,
// whose every new key costs a round trip, 100,000 (its store is as full either way).
// Within seconds of the burst, the heap a windowed limit holds is at most twice a
// bucket's: its queue holds one count per key and window and goes as the reports go, its
// record of evicted keys still owing empties as their counts are answered, and what
// stays is the key store, as for a bucket. The bucket's heap is read a second after its
// burst, its evicted keys' refunds sent; the windowed one's every report interval until
// it is within the bound, or 10 s passed.
func TestHeapAfterKeyBurst(t *testing.T) {
	if testing.Short() {
		t.Skip("a million keys per kind")
	}
	srv := redistest.StartServer(t)
	held := map[string]uint64{}
	for _, k := range []struct {
		name string
		mode hybrid.Mode
		keys int
	}{
		{"bucket", hybrid.Exact(), 100_000},
		{"windowed", hybrid.Windowed(50 * time.Millisecond), 1_000_000},
	} {
		keys := k.keys
		lim := hybrid.Limit{Name: "api", Rate: 10, Burst: 10, Policy: breaker.FailClosed, Mode: k.mode,
			MaxWait: time.Second, MaxKeys: 10_000}
		before := heapInUse()
		s := newServer(t, srv.Addr, k.name+":", nil, breaker.Settings{Timeout: time.Second}, hybrid.Config{
			FleetSize: 4, Limits: []hybrid.Limit{lim}})
		start := time.Now()
		var wg sync.WaitGroup
		for g := range 64 {
			wg.Go(func() {
				for i := g; i < keys; i += 64 {
					if _, err := s.limiter.Allow(context.Background(), "api", fmt.Sprintf("%s-%d", k.name, i)); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		took := time.Since(start)
		heldNow := func() uint64 { h := heapInUse(); return h - min(before, h) }
		if k.name == "bucket" {
			time.Sleep(time.Second) // the reference: a settled store, no condition to wait for
			held[k.name] = heldNow()
		} else {
			for held[k.name] = heldNow(); held[k.name] > 2*held["bucket"] && time.Since(start)-took < 10*time.Second; held[k.name] = heldNow() {
				time.Sleep(50 * time.Millisecond) // a report interval: its queue drains as reports go
			}
		}
		drained := time.Since(start) - took
		t.Logf("%s: %d keys in %v (%.0f/s), %.1f MB held %v later", k.name, keys, took.Round(time.Millisecond),
			float64(keys)/took.Seconds(), float64(held[k.name])/1e6, drained.Round(time.Millisecond))
		if err := s.limiter.Close(context.Background()); err != nil {
			t.Log(err)
		}
		runtime.KeepAlive(s)
	}
	if held["windowed"] > 2*held["bucket"] {
		t.Errorf("windowed holds %d bytes, more than twice the bucket's %d", held["windowed"], held["bucket"])
	}
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestWindowedRedisMemory: a windowed limit at the shortest window (100 ms, reports every
// 50 ms), 1,000 keys for 3 s on a redis-server of the test's own. Its arrays never
// exceed the stated bound, (4 + ⌈1 s / W⌉) arrays of 1.5 MB, and reach at least half of
// it (the formula is what it costs, not a loose ceiling); once the limiter is closed and
// the arrays' deadlines pass, nothing of it is left in Redis.
func TestWindowedRedisMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("3 s of load")
	}
	srv := redistest.StartServer(t)
	ctx := context.Background()
	const rate, burst, keys = 1000, 100, 1000
	s := newServer(t, srv.Addr, "mem:", nil, breaker.Settings{Timeout: time.Second}, hybrid.Config{FleetSize: 4,
		Limits: []hybrid.Limit{{Name: "api", Rate: rate, Burst: burst, Policy: breaker.FailClosed, Mode: hybrid.Windowed(50 * time.Millisecond)}}})
	w := time.Duration(wire.WindowMicros(rate, burst)) * time.Microsecond
	arrays := 4 + int((time.Second+w-1)/w)
	bound := int64(arrays) * 3 * (1 << 18) * 2
	c := srv.Client()
	var peak int64
	measure := func() {
		var sum int64
		for _, k := range c.Keys(ctx, "mem:win:*").Val() {
			sum += c.StrLen(ctx, k).Val()
		}
		peak = max(peak, sum)
	}
	deadline := time.Now().Add(3 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		if _, err := s.limiter.Allow(ctx, "api", fmt.Sprintf("k%d", i%keys)); err != nil {
			t.Fatal(err)
		}
		if i%2000 == 0 {
			measure()
		}
	}
	measure()
	t.Logf("peak %.1f MB in arrays, bound %.1f MB (%d arrays of 1.5 MB)", float64(peak)/1e6, float64(bound)/1e6, arrays)
	if peak > bound || peak < bound/2 {
		t.Errorf("peak %d bytes in arrays, want within [bound/2, bound] = [%d, %d]", peak, bound/2, bound)
	}
	if err := s.limiter.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range c.Keys(ctx, "mem:*").Val() {
		d := c.PTTL(ctx, k).Val()
		if d == -2 { // expired since it was listed
			continue
		}
		limit := 3*w + time.Second + 100*time.Millisecond
		switch k {
		case "mem:marks:{api}": // marks are kept 30 s
			limit = 31 * time.Second
		case "mem:reps": // the fleet's record of representations: two records, 60 s
			limit = time.Minute
		}
		if d < 0 || d > limit {
			t.Errorf("%s: TTL %v after Close, want at most %v", k, d, limit)
		}
	}
}
