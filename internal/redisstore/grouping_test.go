package redisstore

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// TestGroupingOf: a refund call spans any keys on one Redis, keys of one slot on a
// Cluster, and one key on a client that shards by key some other way (a Ring), where a
// call of several keys would run on the first key's shard only.
func TestGroupingOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    redis.Scripter
		want grouping
	}{
		{"client", redis.NewClient(&redis.Options{}), anyKeys},
		{"failover client", redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}}), anyKeys},
		{"cluster", redis.NewClusterClient(&redis.ClusterOptions{}), slotKeys},
		{"ring", redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1", "b": "127.0.0.1:2"}}), oneKey},
	} {
		if got := groupingOf(tc.c); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
		// The group of a key: one for every key, its slot, or none it shares.
		a, b := "fl:{api:a}", "fl:{api:b}"
		want := map[grouping][2]int{anyKeys: {0, 0}, slotKeys: {wire.Slot(a), wire.Slot(b)}, oneKey: {-1, -1}}[tc.want]
		if ga, gb := tc.want.of(a), tc.want.of(b); [2]int{ga, gb} != want {
			t.Errorf("%s: groups %d, %d; want %v", tc.name, ga, gb, want)
		}
		if c, ok := tc.c.(interface{ Close() error }); ok {
			_ = c.Close()
		}
	}
}
