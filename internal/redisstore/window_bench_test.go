package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/internal/wire"
	"github.com/redis/go-redis/v9"
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
	srv := redistest.StartServer(b)
	benchReport(b, srv.Client(), 1)
}

// BenchmarkWindowsReportCluster is BenchmarkWindowsReport on the Redis Cluster of
// REDIS_CLUSTER_ADDRS, the keys in wire.WindowShards shards as hybrid.Limiter counts
// them there: a batch of a trip per shard with work, a round trip per master.
//
// On 2 shared cores and the 3 masters of .ci/redis-cluster.sh (3 runs of 2 s): about
// 5 µs of client CPU an admission, 1.8 ms, 195 KB and 3,950 allocations a batch of 64
// trips; with a round trip per shard (go-redis's Cluster TxPipeline, one slot each,
// all at once) 11 µs and 3.4 ms. What the shards add is go-redis's, per shard: its
// untyped commands and replies (the trip's commands sent between MULTI and EXEC, each
// answered QUEUED, and EXEC's answer read untyped).
func BenchmarkWindowsReportCluster(b *testing.B) {
	c := redistest.Cluster(b, func(o *redis.ClusterOptions) {
		o.MaxRedirects = -1
		o.MaxRetries = -1
	})
	benchReport(b, c, wire.WindowShards)
}

func benchReport(b *testing.B, c redis.UniversalClient, shards int) {
	const keys = 256
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
	width := 1 << 18
	if shards > 1 {
		width = 1 << 12
	}
	trips := make([]redisstore.WindowTrip, shards)
	for k := range trips {
		trips[k] = redisstore.WindowTrip{Limit: lim, Width: width, Memory: 30 * time.Second, Shards: shards, Shard: k}
	}
	errs := make([]error, shards)
	var tidied time.Time
	// fill makes the trips of now: every key's op in its window and shard, the marks
	// recorded at now in their shards'.
	fill := func(now time.Time) {
		us := now.UnixMicro()
		tidy := now.Sub(tidied) >= time.Second
		if tidy {
			tidied = now
		}
		for k := range trips {
			t := &trips[k]
			t.Ops, t.Marks, t.Got = t.Ops[:0], t.Marks[:0], t.Got[:0]
			t.At, t.Since, t.Clock, t.Tidy = now, now.Add(-275*time.Millisecond), k == 0, tidy
			t.Read = k%wire.WindowMarksGroup(shards) == 0
		}
		for i, id := range ids {
			win := wire.WindowIndex(us, phases[i], w)
			t, m := &trips[wire.WindowShard(string(id), shards)], &trips[wire.WindowMarksShard(string(id), shards)]
			switch {
			case i%8 == 0:
				t.Ops = append(t.Ops, redisstore.WindowOp{ID: id, Win: win, N: 3, Demand: true})
				m.Marks = append(m.Marks, redisstore.WindowMark{ID: id, Flags: wire.MarkOver, Win: win})
			case i%16 == 1:
				t.Ops = append(t.Ops, redisstore.WindowOp{ID: id, Win: win, N: 1 + i%4})
				m.Marks = append(m.Marks, redisstore.WindowMark{ID: id, Flags: wire.MarkLow, Win: win})
			default:
				t.Ops = append(t.Ops, redisstore.WindowOp{ID: id, Win: win, N: 1 + i%4})
			}
		}
	}
	fill(time.Now()) // the connections dialled, the sets of marks made
	if err := s.WindowsBatch(ctx, trips, errs); err != nil {
		b.Fatal(err)
	}
	got := 0
	for k := range trips {
		got += len(trips[k].Got)
	}
	if got == 0 {
		b.Fatal("the trips read no marks back")
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, ok := processCPU()
	for b.Loop() {
		fill(time.Now())
		if err := s.WindowsBatch(ctx, trips, errs); err != nil {
			b.Fatal(err)
		}
	}
	if cpu1, _ := processCPU(); ok {
		b.ReportMetric(float64(cpu1-cpu0)/float64(b.N*keys), "client-ns/admission")
	}
}
