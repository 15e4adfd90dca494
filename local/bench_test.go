package local

import (
	"strconv"
	"sync/atomic"
	"testing"

	"golang.org/x/time/rate"
)

// The benchmarks use a rate high enough that every call is allowed, so
// they measure the bookkeeping, not the denial path; the bare limiter is the
// baseline the keyed ones are compared with (run them together, with
// -count and benchstat).

const benchRate, benchBurst = rate.Limit(1e12), 1 << 30

func BenchmarkBareRateAllow(b *testing.B) {
	lim := rate.NewLimiter(benchRate, benchBurst)
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			lim.Allow()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				lim.Allow()
			}
		})
	})
}

func newBenchLimiter(b *testing.B, maxKeys int) *Limiter {
	b.Helper()
	l, err := NewLimiter(Config{Rate: benchRate, Burst: benchBurst, MaxKeys: maxKeys})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(l.Close)
	return l
}

func BenchmarkKeyedAllow(b *testing.B) {
	l := newBenchLimiter(b, 0)
	const key = "tenant-42"
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			l.Allow(key)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Allow(key)
			}
		})
	})
}

func BenchmarkKeyedAllow10k(b *testing.B) {
	const nkeys = 10_000
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "tenant-" + strconv.Itoa(i)
	}
	l := newBenchLimiter(b, 0)
	for _, k := range keys {
		l.Allow(k) // every key held: the benchmark measures hits
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			l.Allow(keys[i])
			if i++; i == nkeys {
				i = 0
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			i := int(next.Add(7919)) % nkeys // spread goroutines over the keys
			for pb.Next() {
				l.Allow(keys[i])
				if i++; i == nkeys {
					i = 0
				}
			}
		})
	})
}
