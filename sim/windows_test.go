package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// TestWindowRedisMatches runs random windowed-limit trips (counts and take-backs in a few
// windows, demand counts, marks with their tidying, reads from an instant) through the
// simulator's windowRedis and through redisstore.Store.Windows, on miniredis and on a real
// Redis, and requires the same answers: every count, every mark read (key, flags,
// window, time) in order, Redis's time where asked. The arrays of windows long past are
// counted, then dropped by their deadline, in both. Half the trips are of the unsharded
// format, half of one shard of 4, each shard's keys its own.
func TestWindowRedisMatches(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		name := fmt.Sprintf("wm%d", rand.Uint64()%1e9)
		s, err := redisstore.New(tg.Client, redisstore.Prefix(keyPrefix))
		if err != nil {
			t.Fatal(err)
		}
		lim := redisstore.Limit{Name: name, Rate: 200, Burst: 20} // windows of 100 ms
		w := wire.WindowMicros(lim.Rate, lim.Burst)
		model := newWindowRedis()
		rng := rand.New(rand.NewPCG(7, 11))
		keys := []string{"a", "b", "c", "d", string(redisstore.IDOf(string(make([]byte, 80))))}
		base := time.Now().Truncate(time.Millisecond)
		for step := range 300 {
			// the real Redis's clock runs on; miniredis's is set to it
			at := base.Add(time.Duration(step) * time.Millisecond)
			if tg.Mini != nil {
				tg.Mini.SetTime(at)
			} else {
				at = time.Now()
			}
			trip := redisstore.WindowTrip{Limit: lim, Width: 1 << 8, Memory: 200 * time.Millisecond, Clock: rng.IntN(4) == 0, At: at}
			ks := keys
			if step%2 == 1 {
				trip.Shards, trip.Shard = 4, rng.IntN(4)
				ks = slices.DeleteFunc(slices.Clone(keys), func(k string) bool { return wire.WindowShard(k, 4) != trip.Shard })
				if len(ks) == 0 {
					ks = nil
				}
			}
			for range rng.IntN(6) * min(1, len(ks)) {
				k := ks[rng.IntN(len(ks))]
				win := wire.WindowIndex(at.UnixMicro(), wire.WindowPhase(k, w), w) + int64(rng.IntN(3)) - 1
				if rng.IntN(10) == 0 {
					win -= 100 // past its deadline: the array goes once counted
				}
				trip.Ops = append(trip.Ops, redisstore.WindowOp{ID: redisstore.KeyID(k), Win: win, N: rng.IntN(9) - 2, Demand: rng.IntN(5) == 0})
			}
			for range rng.IntN(3) * min(1, len(ks)) {
				k := ks[rng.IntN(len(ks))]
				trip.Marks = append(trip.Marks, redisstore.WindowMark{ID: redisstore.KeyID(k), Flags: 1 + rng.IntN(7), Win: int64(rng.IntN(4))})
			}
			trip.Tidy = rng.IntN(3) == 0
			if trip.Read = rng.IntN(2) == 0; trip.Read && rng.IntN(3) > 0 {
				trip.Since = at.Add(-time.Duration(rng.IntN(150)) * time.Millisecond)
			}
			mine := trip
			mine.Ops = slices.Clone(trip.Ops)
			model.run(at, &mine)
			if err := s.Windows(ctx, &trip); err != nil {
				t.Fatal(err)
			}
			for i := range trip.Ops {
				if trip.Ops[i].Count != mine.Ops[i].Count {
					t.Fatalf("step %d op %d %+v: Redis counts %d, the model %d", step, i, trip.Ops[i], trip.Ops[i].Count, mine.Ops[i].Count)
				}
			}
			if len(trip.Got) != len(mine.Got) {
				t.Fatalf("step %d: Redis read %v, the model %v", step, trip.Got, mine.Got)
			}
			for i := range trip.Got {
				a, b := trip.Got[i], mine.Got[i]
				if a.ID != b.ID || a.Flags != b.Flags || a.Win != b.Win || !a.At.Equal(b.At) {
					t.Fatalf("step %d mark %d: Redis %+v, the model %+v", step, i, a, b)
				}
			}
			if tg.Mini != nil && trip.Clock && !trip.Now.Equal(mine.Now) {
				t.Fatalf("step %d: TIME %v, the model %v", step, trip.Now, mine.Now)
			}
		}
		// every key the trips wrote expires
		keys, err = tg.Client.Keys(ctx, "*"+name+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if d := tg.Client.PTTL(ctx, k).Val(); d == -1 {
				t.Errorf("%s has no TTL", k)
			}
		}
	})
}
