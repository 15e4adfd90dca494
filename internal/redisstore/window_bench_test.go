package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// BenchmarkWindowsReport measures what a windowed limit's report costs the client: one
// trip of 256 keys' counts, as package engine builds a server's report on one Redis
// (unsharded, the default width), against a redis-server of the benchmark's own:
//
//	go test ./internal/redisstore -run '^$' -bench WindowsReport -benchmem -count 5
//
// Each key's op is in its own window (its phase spreads the keys over two windows:
// two BITFIELDs); one key in eight is over its limit, its op a demand count and its
// mark MarkOver, and one in sixteen more is low (MarkLow); the trip reads the marks of
// the last 275 ms (the engine's read and its overlap), asks Redis's time, and trims the
// set once a second, as the engine does. ns/op is per trip; client-ns/admission is this
// process's CPU (user and system) per key counted: Redis runs in a process of its own, so
// it is what building, sending and reading the trip costs the client.
//
// On 2 shared cores (medians of 10 runs interleaved with the code before, 3 s each):
// 1.19 µs of client CPU an admission, 129 KB and 411 allocations a trip when go-redis's
// BitField and ZAdd copied and boxed the arguments; 0.72 µs, 12 KB and 193 with them in
// pooled arrays. No allocation is per op or mark written: what is left is per trip, and
// two per mark read (go-redis's ZRANGEBYSCORE reply). Most of the CPU left is go-redis's:
// its encoder, at about 30 ns an argument and 7.5 arguments a key (a key's two INCRBY
// u16 <offset> <n>), its reply parsing, and the round trip's syscalls.
func BenchmarkWindowsReport(b *testing.B) {
	const keys = 256
	srv := redistest.StartServer(b)
	c := srv.Client()
	s, err := redisstore.New(c)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	lim := redisstore.Limit{Name: "bench", Rate: 100, Burst: 100} // windows of 1 s
	w := wire.WindowMicros(lim.Rate, lim.Burst)
	ids := make([]redisstore.KeyID, keys)
	phases := make([]int64, keys)
	for i := range ids {
		ids[i] = redisstore.IDOf("user-" + strconv.Itoa(i))
		phases[i] = wire.WindowPhase(string(ids[i]), w)
	}
	trip := redisstore.WindowTrip{Limit: lim, Width: 1 << 18, Memory: 30 * time.Second}
	var tidied time.Time
	// fill makes the trip of now: every key's op in its window, the marks recorded at now.
	fill := func(now time.Time) {
		us := now.UnixMicro()
		trip.Ops, trip.Marks, trip.Got = trip.Ops[:0], trip.Marks[:0], trip.Got[:0]
		for i, id := range ids {
			win := wire.WindowIndex(us, phases[i], w)
			switch {
			case i%8 == 0:
				trip.Ops = append(trip.Ops, redisstore.WindowOp{ID: id, Win: win, N: 3, Demand: true})
				trip.Marks = append(trip.Marks, redisstore.WindowMark{ID: id, Flags: wire.MarkOver, Win: win})
			case i%16 == 1:
				trip.Ops = append(trip.Ops, redisstore.WindowOp{ID: id, Win: win, N: 1 + i%4})
				trip.Marks = append(trip.Marks, redisstore.WindowMark{ID: id, Flags: wire.MarkLow, Win: win})
			default:
				trip.Ops = append(trip.Ops, redisstore.WindowOp{ID: id, Win: win, N: 1 + i%4})
			}
		}
		trip.At, trip.Read, trip.Since, trip.Clock = now, true, now.Add(-275*time.Millisecond), true
		trip.Tidy = now.Sub(tidied) >= time.Second
		if trip.Tidy {
			tidied = now
		}
	}
	fill(time.Now()) // the connection dialled, the set of marks made
	if err := s.Windows(ctx, &trip); err != nil {
		b.Fatal(err)
	}
	if len(trip.Got) == 0 {
		b.Fatal("the trip read no marks back")
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, ok := processCPU()
	for b.Loop() {
		fill(time.Now())
		if err := s.Windows(ctx, &trip); err != nil {
			b.Fatal(err)
		}
	}
	if cpu1, _ := processCPU(); ok {
		b.ReportMetric(float64(cpu1-cpu0)/float64(b.N*keys), "client-ns/admission")
	}
}
