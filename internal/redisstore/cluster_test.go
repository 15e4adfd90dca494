package redisstore_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// TestCluster runs against the real Redis Cluster named by REDIS_CLUSTER_ADDRS (.ci/run
// starts a 3-master one with .ci/redis-cluster.sh). The refills of many keys of one limit
// go out in one TakeBatch call (their refunds in one RefundBatch), and because the hash tag is per bucket, not per limit,
// those keys land on every master.
func TestCluster(t *testing.T) {
	c := redistest.Cluster(t, func(o *redis.ClusterOptions) {
		o.MaxRedirects = -1 // no timeout retries (see global.ConfigureCluster)
		o.MaxRetries = -1
	})
	ctx := context.Background()
	s := newStore(t, c)
	lim := redisstore.Limit{Name: lname(t), Rate: 1e-3, Burst: 20}

	var mu sync.Mutex
	var masters []string
	if err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		mu.Lock() // called concurrently
		defer mu.Unlock()
		masters = append(masters, m.Options().Addr)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(masters) < 3 {
		t.Fatalf("cluster has %d masters, want 3", len(masters))
	}

	const n = 64
	reqs := make([]redisstore.TakeRequest, n)
	for i := range reqs {
		reqs[i] = redisstore.TakeRequest{Limit: lim, Key: "user-" + strconv.Itoa(i), Want: 5, Min: 1}
	}
	out := make([]redisstore.TakeResult, n)
	if err := s.TakeBatch(ctx, reqs, out); err != nil {
		t.Fatalf("TakeBatch: %v", err)
	}
	perMaster := map[string]int{}
	for i, r := range out {
		if r.Err != nil || r.Granted != 5 || !near(r.Remaining, 15, 1e-2) {
			t.Fatalf("item %d: %+v, want 5 granted, 15 left", i, r)
		}
		key := s.Key(lim.Name, reqs[i].Key)
		// The slot is the whole bucket's tag, as CLUSTER KEYSLOT computes it.
		slot, err := c.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		tag := key[strings.IndexByte(key, '{')+1 : strings.LastIndexByte(key, '}')]
		if tagSlot, _ := c.ClusterKeySlot(ctx, tag).Result(); tagSlot != slot {
			t.Fatalf("key %q: slot %d, its tag %q: %d", key, slot, tag, tagSlot)
		}
		m, err := c.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		// The bucket really is on that master.
		if ex, err := m.Exists(ctx, key).Result(); err != nil || ex != 1 {
			t.Fatalf("key %q is not on its master %s: %d %v", key, m.Options().Addr, ex, err)
		}
		perMaster[m.Options().Addr]++
	}
	if len(perMaster) != len(masters) {
		t.Fatalf("one limit's %d buckets landed on %d of %d masters: %v", n, len(perMaster), len(masters), perMaster)
	}
	t.Logf("%d buckets of one limit over the masters: %v", n, perMaster)

	// A second batch: the same buckets, answered from every master in one call.
	if err := s.TakeBatch(ctx, reqs, out); err != nil {
		t.Fatal(err)
	}
	for i, r := range out {
		if r.Granted != 5 || !near(r.Remaining, 10, 1e-2) {
			t.Fatalf("second batch item %d: %+v", i, r)
		}
	}

	// The refunds of those buckets, from every master, in one RefundBatch call.
	refunds := make([]redisstore.RefundRequest, n)
	for i, r := range reqs {
		refunds[i] = redisstore.RefundRequest{Limit: lim, Key: r.Key, N: 5}
	}
	rout := make([]redisstore.RefundResult, n)
	if err := s.RefundBatch(ctx, refunds, rout); err != nil {
		t.Fatalf("RefundBatch: %v", err)
	}
	for i, r := range rout {
		if r.Err != nil || !near(r.Remaining, 15, 1e-2) {
			t.Fatalf("refund item %d: %+v, want 15 left", i, r)
		}
	}

	// The single calls work on the cluster too.
	if r, err := s.AllowN(ctx, lim, "single", 3); err != nil || !r.Allowed || !near(r.Remaining, 17, 1e-2) {
		t.Fatalf("AllowN: %+v %v", r, err)
	}
	if g, err := s.Take(ctx, lim, "single", 20, 1); err != nil || g.Granted != 17 {
		t.Fatalf("Take: %+v %v", g, err)
	}
	if err := s.Refund(ctx, lim, "single", 4); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Heartbeat(ctx, lim.Name, "s1", time.Minute); err != nil || n != 1 {
		t.Fatalf("Heartbeat: %d %v", n, err)
	}
	for _, r := range append(reqs, redisstore.TakeRequest{Key: "single"}) {
		_ = s.Reset(ctx, lim, r.Key)
	}
}

// TestRefundBatchClusterSlots: on a Redis Cluster a RefundBatch puts the refunds of
// buckets that share a hash slot in one script call, and no others: three buckets of one
// slot, two of another and two of slots of their own go out as four calls, and each
// bucket gets its refund.
func TestRefundBatchClusterSlots(t *testing.T) {
	c := redistest.Cluster(t, func(o *redis.ClusterOptions) {
		o.MaxRedirects = -1
		o.MaxRetries = -1
	})
	ctx := context.Background()
	hook := &countingHook{}
	c.AddHook(hook)
	s := newStore(t, c)
	lim := redisstore.Limit{Name: lname(t), Rate: 1e-3, Burst: 20}
	slot := func(key string) int { return wire.Slot(s.Key(lim.Name, key)) }
	// Keys whose buckets share the slot of "a", and of "b": CRC16 collisions.
	same := func(of string, n int) []string {
		keys := []string{of}
		for i := 0; len(keys) < n; i++ {
			if k := of + strconv.Itoa(i); slot(k) == slot(of) {
				keys = append(keys, k)
			}
		}
		return keys
	}
	keys := append(append(same("a", 3), same("b", 2)...), "c", "d")
	slots := map[int]bool{}
	for _, k := range keys {
		slots[slot(k)] = true
	}
	if len(slots) != 4 {
		t.Fatalf("keys %v lie in %d slots, want 4", keys, len(slots))
	}
	refunds := make([]redisstore.RefundRequest, len(keys))
	for i, k := range keys {
		if g, err := s.Take(ctx, lim, k, 10, 10); err != nil || g.Granted != 10 {
			t.Fatalf("take %s: %+v %v", k, g, err)
		}
		refunds[i] = redisstore.RefundRequest{Limit: lim, Key: k, N: 1 + i}
	}
	out := make([]redisstore.RefundResult, len(refunds))
	if err := s.RefundBatch(ctx, refunds, out); err != nil { // the script loaded on every master
		t.Fatal(err)
	}
	for i := range refunds {
		refunds[i].N = 1
	}
	hook.pipelines = nil
	if err := s.RefundBatch(ctx, refunds, out); err != nil {
		t.Fatal(err)
	}
	if calls := countOf(slices.Concat(hook.pipelines...), "evalsha"); calls != len(slots) {
		t.Fatalf("pipelines %v: %d calls, want one a slot (%d)", hook.pipelines, calls, len(slots))
	}
	for i, r := range out {
		if want := float64(10 + 1 + i + 1); r.Err != nil || !near(r.Remaining, want, 1e-2) {
			t.Errorf("bucket %s: %+v, want %v left", keys[i], r, want)
		}
	}
	for _, k := range keys {
		_ = s.Reset(ctx, lim, k)
	}
}

// TestLowSetsCluster: a charge-later limit's low keys in wire.LowShards sets land on
// every master of the Cluster; one LowBatch marks each key in its set and reads the
// others, whatever the sets' slots, and a batch that only reads finds the marks.
func TestLowSetsCluster(t *testing.T) {
	c := redistest.Cluster(t, func(o *redis.ClusterOptions) {
		o.MaxRedirects = -1
		o.MaxRetries = -1
	})
	ctx := context.Background()
	s := newStore(t, c)
	lim := lname(t)
	nodes := map[string]bool{}
	for i := range wire.LowShards {
		n, err := c.MasterForKey(ctx, wire.LowKey(redisstore.DefaultPrefix, lim, wire.LowShards, i))
		if err != nil {
			t.Fatal(err)
		}
		nodes[n.Options().Addr] = true
	}
	if masters := c.ClusterShards(ctx).Val(); len(nodes) != len(masters) {
		t.Fatalf("%d sets on %d masters of %d", wire.LowShards, len(nodes), len(masters))
	}
	sets := make([]redisstore.LowSet, wire.LowShards)
	want := make([][]redisstore.KeyID, wire.LowShards)
	for i := range sets {
		sets[i] = redisstore.LowSet{Limit: lim, Shards: wire.LowShards, Shard: i, ReadAt: time.Now()}
		want[i] = []redisstore.KeyID{}
	}
	for k := range 40 {
		id := redisstore.KeyID("key" + strconv.Itoa(k))
		i := wire.LowShard(string(id), wire.LowShards)
		if k%2 == 0 { // half the sets' keys: some sets only read
			sets[i].Mark = append(sets[i].Mark, id)
			want[i] = append(want[i], id)
		}
	}
	got, errs := make([][]redisstore.KeyID, len(sets)), make([]error, len(sets))
	if err := s.LowBatch(ctx, sets, time.Minute, got, errs); err != nil {
		t.Fatal(err)
	}
	for i := range sets {
		slices.Sort(got[i])
		slices.Sort(want[i])
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("set %d: %q, want %q", i, got[i], want[i])
		}
		sets[i].Mark = nil // now every set is only read
	}
	if err := s.LowBatch(ctx, sets, time.Minute, got, errs); err != nil {
		t.Fatal(err)
	}
	for i := range sets {
		slices.Sort(got[i])
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("set %d read: %q, want %q", i, got[i], want[i])
		}
	}
}
