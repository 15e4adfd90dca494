package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// inspectFlags are inspect's own flags.
type inspectFlags struct {
	prefix, limit, key string
	rate               float64
	burst, width       int
	shards             int // a windowed limit's: 1 on one Redis, wire.WindowShards on a Cluster, as hybrid.Limiter counts
}

// inspect prints what Redis holds for the limit and key: the bucket's hash and expiry,
// and with rate and burst, the windowed limit's counts around now.
func inspect(ctx context.Context, c redis.UniversalClient, f inspectFlags, w io.Writer) error {
	if f.limit == "" || f.key == "" {
		return fmt.Errorf("%w: inspect needs -limit and -key", errUsage)
	}
	store, err := global.New(c, global.Prefix(f.prefix))
	if err != nil {
		return err
	}
	key := store.Key(f.limit, f.key)
	h, err := c.HGetAll(ctx, key).Result()
	if err != nil {
		return fmt.Errorf("HGETALL %s: %w", key, err)
	}
	ttl, err := c.PTTL(ctx, key).Result()
	if err != nil {
		return fmt.Errorf("PTTL %s: %w", key, err)
	}
	fmt.Fprintf(w, "bucket %s\n", key)
	if len(h) == 0 {
		fmt.Fprintln(w, "  none: no server took from it within its lifetime (it is full)")
	} else {
		fmt.Fprintf(w, "  expires in %v\n", ttl.Round(time.Millisecond))
		names := make([]string, 0, len(h))
		for k := range h {
			names = append(names, k)
		}
		slices.Sort(names)
		for _, k := range names {
			fmt.Fprintf(w, "  %-24s %s\n", k, h[k])
		}
	}
	if f.rate <= 0 || f.burst <= 0 {
		return nil
	}
	lim, err := global.NewLimit(f.limit, f.rate, f.burst)
	if err != nil {
		return err
	}
	now, err := c.Time(ctx).Result()
	if err != nil {
		return fmt.Errorf("TIME: %w", err)
	}
	id := redisstore.IDOf(f.key)
	wus := wire.WindowMicros(f.rate, f.burst)
	phase := wire.WindowPhase(string(id), wus)
	cur := wire.WindowIndex(now.UnixMicro(), phase, wus)
	shards := max(f.shards, 1)
	trip := redisstore.WindowTrip{Limit: redisstore.Limit(lim), Width: redisstore.ShardWidth(f.width, shards),
		Shards: shards, Shard: wire.WindowShard(string(id), shards)}
	for win := cur - 1; win <= cur; win++ {
		trip.Ops = append(trip.Ops, redisstore.WindowOp{ID: id, Win: win}) // N 0: a read
	}
	if err := redisstore.Of(store).Windows(ctx, &trip); err != nil {
		return err
	}
	fmt.Fprintf(w, "windowed, windows of %v:\n", time.Duration(wus)*time.Microsecond)
	for _, op := range trip.Ops {
		end := time.UnixMicro(wire.WindowStart(op.Win+1, phase, wus))
		fmt.Fprintf(w, "  window %d (ends %s): %d of %d\n", op.Win, end.Format(time.RFC3339Nano), op.Count, f.burst)
	}
	return nil
}
