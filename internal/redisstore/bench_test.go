package redisstore_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// BenchmarkRedis measures the Redis tier's calls against a real Redis (REDIS_ADDR,
// skipped when none answers), side by side with a bare PING round trip in the same run:
//
//	go test ./internal/redisstore -run '^$' -bench Redis -benchmem -count 5
//
// The bucket never runs dry (burst 1e9, rate 1e9/s), so every call does the full work.
func BenchmarkRedis(b *testing.B) {
	c := redistest.Real(b, func(o *redis.Options) { o.PoolSize = 64 })
	s, err := redisstore.New(c)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	lim := redisstore.Limit{Name: lname(b), Rate: 1e9, Burst: 1e9}
	if _, err := s.Take(ctx, lim, "warm", 1, 1); err != nil { // scripts cached, pool warm
		b.Fatal(err)
	}
	_, _ = s.AllowN(ctx, lim, "warm", 1)
	b.Cleanup(func() { _ = c.Del(ctx, s.Key(lim.Name, "k"), s.Key(lim.Name, "warm")).Err() })

	calls := []struct {
		name string
		f    func() error
	}{
		{"Ping", func() error { return c.Ping(ctx).Err() }},
		{"AllowN", func() error { _, err := s.AllowN(ctx, lim, "k", 1); return err }},
		{"Take", func() error { _, err := s.Take(ctx, lim, "k", 10, 1); return err }},
	}
	for _, bc := range calls {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := bc.f(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, bc := range calls {
		b.Run(bc.name+"Parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := bc.f(); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
	// 16 keys' refills in one pipelined round trip; ns/op is per batch.
	reqs := make([]redisstore.TakeRequest, 16)
	for i := range reqs {
		reqs[i] = redisstore.TakeRequest{Limit: lim, Key: "batch" + strconv.Itoa(i), Want: 10, Min: 1}
	}
	out := make([]redisstore.TakeResult, len(reqs))
	b.Run("TakeBatch16", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := s.TakeBatch(ctx, reqs, out); err != nil {
				b.Fatal(err)
			}
		}
	})
	// The same 16 keys counted in a windowed limit's round trip (one BITFIELD of two
	// INCRBY per key), and 256 keys; ns/op is per trip.
	wlim := redisstore.Limit{Name: lim.Name, Rate: 1e4, Burst: 1e4}
	for _, n := range []int{16, 256} {
		trip := redisstore.WindowTrip{Limit: wlim, Width: 1 << 18}
		for i := range n {
			trip.Ops = append(trip.Ops, redisstore.WindowOp{ID: redisstore.IDOf("batch" + strconv.Itoa(i)), N: 1})
		}
		// client-µs/admission is this process's CPU per key counted: Redis runs in a
		// process of its own, so it is what building, sending and reading the trip costs
		// the client.
		b.Run("Windows"+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			cpu0, ok := processCPU()
			for b.Loop() {
				win := nowWin(wlim)
				for i := range trip.Ops {
					trip.Ops[i].Win = win
				}
				if err := s.Windows(ctx, &trip); err != nil {
					b.Fatal(err)
				}
			}
			if cpu1, _ := processCPU(); ok {
				b.ReportMetric(float64(cpu1-cpu0)/1e3/float64(b.N*n), "client-µs/admission")
			}
		})
	}
}
