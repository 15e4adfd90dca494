package hybrid_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// The hot-path benchmarks: a bare x/time/rate Limiter (the baseline: what a process-local
// limit costs) against hybrid.Limiter.Allow when the key's lease holds tokens. The limits
// are so large that nothing is denied and refills are rare; miniredis answers them.
// Run them in one go so the ratios compare like with like:
//
//	go test ./hybrid -run '^$' -bench 'BareRate|AllowLease' -benchmem -count 6

const benchKeys = 10_000

// benchLimiter's limit never runs dry, and the timed loops make no refill: these
// benchmarks measure the hot path, a lease that holds tokens. A batch lasts
// RefillInterval at the key's demand, an hour, and prefetch is off (LowWatermark -1), so
// after the warm-up no lease asks Redis again (redis/op reports it: 0). With a minute and
// prefetch on, the 10,000-key loop prefetched ~10,000 refills as demand estimates rose,
// and miniredis, which runs in this process, charged their Lua runs and garbage (143
// B/op) to the hot path. Refill cost is what global's benchmarks measure.
func benchLimiter(b testing.TB) *hybrid.Limiter {
	_, c := redistest.Mini(b)
	return newLimiter(b, newStore(b, c), hybrid.Config{
		FleetSize: 1,
		Limits: []hybrid.Limit{{Name: "bench", Rate: 1e12, Burst: 1 << 40, Policy: breaker.FailOpen,
			MaxKeys: 2 * benchKeys, Lease: hybrid.LeaseTuning{RefillInterval: time.Hour, Lifetime: 5 * time.Hour, LowWatermark: -1}, MaxWait: time.Second}},
	})
}

// warm sends rounds of requests for every key, so that each lease has seen demand and
// holds a batch before the timing starts, then collects the garbage miniredis made
// answering the refills, so that the timed loop does not pay for it.
func warm(b testing.TB, l *hybrid.Limiter, ks []string, rounds int) {
	ctx := context.Background()
	for range rounds {
		for _, k := range ks {
			if d, _ := l.Allow(ctx, "bench", k); !d.Allowed {
				b.Fatal("denied")
			}
		}
	}
	runtime.GC()
}

func keys() []string {
	k := make([]string, benchKeys)
	for i := range k {
		k[i] = "client-" + strconv.Itoa(i)
	}
	return k
}

// TestHotPathAllocatesNothing holds the benchmarks' hot paths to zero allocations (the
// benchmarks report them, but nothing fails on them): a lease hit, and all-or-nothing
// items served from leases, a windowed key served from its grants. A pointer passed
// through an interface on the way, or a closure that escapes, fails it.
func TestHotPathAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's instrumentation allocates")
	}
	l, w := benchLimiter(t), windowLimiterT(t)
	ctx := context.Background()
	items := []hybrid.Item{{Limit: "bench", Key: "a"}, {Limit: "bench", Key: "b"}, {Limit: "bench", Key: "c"}}
	warm(t, w, []string{"k"}, 1000) // seen often: served from grants of its window
	for _, tc := range []struct {
		name string
		fn   func()
	}{
		{"Allow, a lease hit", func() { l.Allow(ctx, "bench", "k") }},
		{"AllowN", func() { l.AllowN(ctx, "bench", "k", 2) }},
		{"AllowMulti", func() { l.AllowMulti(ctx, items) }},
		{"Allow, windowed", func() { w.Allow(ctx, "bench", "k") }},
	} {
		tc.fn() // the refills, before counting
		// AllocsPerRun counts the whole process's allocations, the Limiters' own
		// goroutines' too (a windowed limit's reports and reads go while the calls run,
		// the more often the slower the machine): a call's allocation shows in every
		// try, theirs in few. The fewest of five tries is the calls'.
		n := testing.AllocsPerRun(200, tc.fn)
		for try := 1; try < 5 && n != 0; try++ {
			n = min(n, testing.AllocsPerRun(200, tc.fn))
		}
		if n != 0 {
			t.Errorf("%s: %v allocations per call in each of five tries, want 0", tc.name, n)
		}
	}
}

func BenchmarkBareRateAllow(b *testing.B) {
	lim := rate.NewLimiter(rate.Limit(1e12), 1<<40)
	b.ReportAllocs()
	for b.Loop() {
		if !lim.Allow() {
			b.Fatal("denied")
		}
	}
}

func BenchmarkAllowLease(b *testing.B) {
	l := benchLimiter(b)
	warm(b, l, []string{"k"}, 1)
	allowLoop(b, l, []string{"k"})
}

// allowLoop times Allow over ks in turn on l, and reports the Redis round trips per
// decision.
func allowLoop(b *testing.B, l *hybrid.Limiter, ks []string) {
	ctx := context.Background()
	before := l.Stats()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if d, _ := l.Allow(ctx, "bench", ks[i]); !d.Allowed {
			b.Fatal("denied")
		}
		if i++; i == len(ks) {
			i = 0
		}
	}
	reportCalls(b, l, before)
}

// allowParallel is allowLoop's one key from GOMAXPROCS goroutines.
func allowParallel(b *testing.B, l *hybrid.Limiter) {
	ctx := context.Background()
	before := l.Stats()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if d, _ := l.Allow(ctx, "bench", "k"); !d.Allowed {
				b.Fatal("denied")
			}
		}
	})
	reportCalls(b, l, before)
}

// BenchmarkBareRateAllow10kKeys is the keyed baseline: a read-only map of 10,000 bare
// limiters (no LRU, no bound, no lock on the map).
func BenchmarkBareRateAllow10kKeys(b *testing.B) {
	ks := keys()
	m := make(map[string]*rate.Limiter, len(ks))
	for _, k := range ks {
		m[k] = rate.NewLimiter(rate.Limit(1e12), 1<<40)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if !m[ks[i]].Allow() {
			b.Fatal("denied")
		}
		if i++; i == len(ks) {
			i = 0
		}
	}
}

func BenchmarkAllowLease10kKeys(b *testing.B) {
	l := benchLimiter(b)
	ks := keys()
	warm(b, l, ks, 200)
	allowLoop(b, l, ks)
}

func BenchmarkBareRateAllowParallel(b *testing.B) {
	lim := rate.NewLimiter(rate.Limit(1e12), 1<<40)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !lim.Allow() {
				b.Fatal("denied")
			}
		}
	})
}

func BenchmarkAllowLeaseParallel(b *testing.B) {
	l := benchLimiter(b)
	warm(b, l, []string{"k"}, 1)
	allowParallel(b, l)
}

// BenchmarkBareRateAllow10kKeysParallel is AllowLease10kKeysParallel's baseline: the
// read-only map of 10,000 bare limiters of BareRateAllow10kKeys, from GOMAXPROCS
// goroutines, each starting at its own place in the keys.
func BenchmarkBareRateAllow10kKeysParallel(b *testing.B) {
	ks := keys()
	m := make(map[string]*rate.Limiter, len(ks))
	for _, k := range ks {
		m[k] = rate.NewLimiter(rate.Limit(1e12), 1<<40)
	}
	var next atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(7919)) % len(ks)
		for pb.Next() {
			if !m[ks[i]].Allow() {
				b.Fatal("denied")
			}
			if i++; i == len(ks) {
				i = 0
			}
		}
	})
}

func BenchmarkAllowLease10kKeysParallel(b *testing.B) {
	l := benchLimiter(b)
	ctx := context.Background()
	ks := keys()
	warm(b, l, ks, 200)
	var next atomic.Uint64
	before := l.Stats()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(7919)) % len(ks)
		for pb.Next() {
			if d, _ := l.Allow(ctx, "bench", ks[i]); !d.Allowed {
				b.Fatal("denied")
			}
			if i++; i == len(ks) {
				i = 0
			}
		}
	})
	reportCalls(b, l, before)
}

// reportCalls reports the Redis round trips per decision since before (the Stats taken
// when the timing started), so that the warm-up's refills are not counted.
func reportCalls(b *testing.B, l *hybrid.Limiter, before hybrid.Stats) {
	s := l.Stats()
	calls := s.RoundTrips + s.RefundCalls - before.RoundTrips - before.RefundCalls
	if n := decisions(s) - decisions(before); n > 0 {
		b.ReportMetric(float64(calls)/float64(n), "redis/op")
	}
}

func decisions(s hybrid.Stats) int64 { return s.PreCheck + s.Lease + s.Global + s.Fallback }

// BenchmarkAllowMulti is one all-or-nothing call of three items (per key, per tenant,
// global), each served from its lease: compare with BareRateAllow in the same run.
func BenchmarkAllowMulti(b *testing.B) {
	_, c := redistest.Mini(b)
	big := func(name string) hybrid.Limit {
		return hybrid.Limit{Name: name, Rate: 1e12, Burst: 1 << 40, Policy: breaker.FailOpen,
			Lease: hybrid.LeaseTuning{RefillInterval: time.Hour, Lifetime: 5 * time.Hour, LowWatermark: -1}, MaxWait: time.Second}
	}
	l := newLimiter(b, newStore(b, c), hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{big("key"), big("tenant"), big("global")}})
	ctx := context.Background()
	items := []hybrid.Item{{Limit: "key", Key: "k1", Cost: 1}, {Limit: "tenant", Key: "t1", Cost: 1}, {Limit: "global", Key: "all", Cost: 1}}
	for range 3 {
		if d, _ := l.AllowMulti(ctx, items); !d.Allowed {
			b.Fatal("denied")
		}
	}
	runtime.GC()
	before := l.Stats()
	b.ReportAllocs()
	for b.Loop() {
		if d, _ := l.AllowMulti(ctx, items); !d.Allowed {
			b.Fatal("denied")
		}
	}
	reportCalls(b, l, before)
}

// windowLimiter is benchLimiter's with a Windowed limit: windows of an hour, a burst that
// never runs dry, so that after the warm-up a key is served from the grants its server
// holds (the common path of a key it sees often).
func windowLimiter(b *testing.B) *hybrid.Limiter { return windowLimiterT(b) }

func windowLimiterT(b testing.TB) *hybrid.Limiter {
	_, c := redistest.Mini(b)
	return newLimiter(b, newStore(b, c), hybrid.Config{
		FleetSize: 1,
		Limits: []hybrid.Limit{{Name: "bench", Rate: float64(1<<30) / 3600, Burst: 1 << 30, Policy: breaker.FailOpen,
			MaxKeys: 2 * benchKeys, MaxWait: time.Second, Mode: hybrid.Windowed(120 * time.Millisecond)}},
	})
}

// BenchmarkAllowWindowed is AllowLease's loop on a Windowed limit: compare with
// BareRateAllow and AllowLease in the same run.
//
//	go test ./hybrid -run '^$' -bench 'BareRate|AllowLease|AllowWindowed' -benchmem -count 6
func BenchmarkAllowWindowed(b *testing.B) {
	l := windowLimiter(b)
	warm(b, l, []string{"k"}, 1000)
	allowLoop(b, l, []string{"k"})
}

func BenchmarkAllowWindowed10kKeys(b *testing.B) {
	l := windowLimiter(b)
	ks := keys()
	warm(b, l, ks, 20)
	allowLoop(b, l, ks)
}

func BenchmarkAllowWindowedParallel(b *testing.B) {
	l := windowLimiter(b)
	warm(b, l, []string{"k"}, 1000)
	allowParallel(b, l)
}

// BenchmarkAllowAsync is BenchmarkAllowLease for a ChargeLater limit: a key this server
// holds a lease for is served from it, as the exact kind's is.
func BenchmarkAllowAsync(b *testing.B) {
	_, c := redistest.Mini(b)
	l := newLimiter(b, newStore(b, c), hybrid.Config{
		FleetSize: 1,
		Limits: []hybrid.Limit{{Name: "bench", Rate: 1e12, Burst: 1 << 40, Policy: breaker.FailOpen, Mode: hybrid.ChargeLater(100 * time.Millisecond),
			MaxKeys: 2 * benchKeys, Lease: hybrid.LeaseTuning{RefillInterval: time.Hour, Lifetime: 5 * time.Hour, LowWatermark: -1}, MaxWait: time.Second}},
	})
	warm(b, l, []string{"k"}, 1000)
	allowLoop(b, l, []string{"k"})
}
