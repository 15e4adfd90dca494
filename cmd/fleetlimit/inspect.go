package main

import (
	"context"
	"fmt"
	"io"
	"math"
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
	if (f.rate > 0) != (f.burst > 0) {
		return fmt.Errorf("%w: -rate and -burst go together (a windowed limit's), or neither", errUsage)
	}
	if _, err := global.NewLimit(f.limit, 1, 1); err != nil {
		return fmt.Errorf("%w: -limit: %w", errUsage, err) // a name no limit can have
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
		fmt.Fprintln(w, "  none: no server took from it within its lifetime (a bucket limit's is full; a windowed limit has none)")
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
	width, shard := redisstore.ShardWidth(f.width, shards), wire.WindowShard(string(id), shards)
	fmt.Fprintf(w, "windowed, windows of %v:\n", time.Duration(wus)*time.Microsecond)
	for win := cur - 1; win <= cur; win++ {
		key := wire.WindowKey(f.prefix, lim.Name, shards, shard, wus, win)
		n, err := windowCount(ctx, c, key, string(id), width, wire.WindowBits(f.burst))
		if err != nil {
			return err
		}
		end := time.UnixMicro(wire.WindowStart(win+1, phase, wus))
		fmt.Fprintf(w, "  window %d (ends %s): %d of %d\n", win, end.Format(time.RFC3339Nano), n, f.burst)
	}
	return nil
}

// windowCount reads the count of the key whose ID is id in the window array key, without
// writing: the lesser of its two counters (rows 0 and 1 of width, of bits each, unsigned
// and big-endian as BITFIELD keeps them), by GETRANGE. A BITFIELD INCRBY of 0, which a
// limiter's trip reads a count with, would make the array (a megabyte) where it is
// missing, and fails on a replica or under a read-only ACL. A missing array, or bytes
// past its end, read as 0.
func windowCount(ctx context.Context, c redis.UniversalClient, key, id string, width, bits int) (int64, error) {
	count := int64(math.MaxInt64)
	for row := range wire.DemandRow { // the count rows
		off := int64(wire.WindowCounter(id, row, width) * bits / 8)
		b, err := c.GetRange(ctx, key, off, off+int64(bits/8)-1).Bytes()
		if err != nil {
			return 0, fmt.Errorf("GETRANGE %s: %w", key, err)
		}
		var v int64
		for i := range bits / 8 {
			v <<= 8
			if i < len(b) {
				v |= int64(b[i])
			}
		}
		count = min(count, v)
	}
	return count, nil
}
