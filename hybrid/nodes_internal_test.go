package hybrid

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/breaker"
)

// slotMaps is a Cluster's slot map as the nodes a client loads it from tell it: each
// load takes the next of maps (the last one stays), each map naming the master of every
// slot, or, for "", failing (a stalled node: the client keeps the map it holds).
type slotMaps struct {
	mu    sync.Mutex
	maps  []string
	loads int
}

func (s *slotMaps) load(context.Context) ([]redis.ClusterSlot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	addr := s.maps[min(s.loads, len(s.maps)-1)]
	s.loads++
	if addr == "" {
		return nil, errors.New("read: i/o timeout")
	}
	return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: addr}}}}, nil
}

// then makes the following loads give maps, in order.
func (s *slotMaps) then(maps ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maps, s.loads = maps, 0
}

// TestRouteAfterFailover: once a prune dropped a failed master, a slot map that still
// names it (loaded from a node that has not learnt of the failover yet) does not give it
// a breaker again unless a second load names it too.
func TestRouteAfterFailover(t *testing.T) {
	const (
		old = "10.0.0.1:6379"
		new = "10.0.0.2:6379"
		key = "{cold:client-1}"
	)
	tests := []struct {
		name  string
		loads []string // what the loads after the stale one give
		want  string   // the master route picks
	}{
		{"a fresher map names the new master", []string{new}, new},
		{"every map names the old master", []string{old}, old},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			n, maps := clusterNodes(t, breaker.Settings{Name: "redis"}, old)
			nd := n.split(ctx, 1, func(int) string { return key })[0].nd
			if nd.addr != old {
				t.Fatalf("before the failover: routed to %q, want %q", nd.addr, old)
			}
			if got, want := nd.brk.Settings().Name, "redis "+old; got != want {
				t.Errorf("breaker named %q, want %q", got, want)
			}

			// The failover: a map names the new master, and prune drops the old one.
			maps.then(new)
			n.prune(ctx)
			if _, ok := n.byAddr[old]; ok {
				t.Fatalf("prune kept %s, which the map no longer names", old)
			}
			// Then a load from a node that has not learnt of it yet stores a map
			// naming the old master again.
			maps.then(append([]string{old}, tt.loads...)...)
			if err := n.cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil }); err != nil {
				t.Fatal(err)
			}
			if c, err := n.cc.MasterForKey(ctx, key); err != nil || c.Options().Addr != old {
				t.Fatalf("the client's map is not the stale one: %v, %v", c, err)
			}

			// Two keys of that master in one call: the map is loaded once more, once.
			loads := maps.loads
			keys := []string{key, "{cold:client-2}"}
			parts := n.split(ctx, len(keys), func(i int) string { return keys[i] })
			if len(parts) != 1 || parts[0].nd.addr != tt.want {
				t.Errorf("routed to %+v, want one part to %q", parts, tt.want)
			}
			if got := maps.loads - loads; got != 1 {
				t.Errorf("split loaded the map %d times, want once for an address a prune dropped", got)
			}
			_, kept := n.byAddr[old]
			if kept != (tt.want == old) {
				t.Errorf("breaker of %s kept: %v, want %v", old, kept, tt.want == old)
			}
		})
	}
}

// TestDroppedMasterKeepsItsBreaker: a master a prune dropped after its breaker opened,
// named again by a map no fresh load confirms, gets back the breaker it had, still
// open: not a closed one that its keys' calls would each wait out to a timeout. Whether
// a map was loaded again cannot be told: ForEachMaster gives the map the client holds
// when a load fails, and a load may come from a node that has not learnt of the
// failover.
func TestDroppedMasterKeepsItsBreaker(t *testing.T) {
	const (
		old = "10.0.0.1:6379"
		new = "10.0.0.2:6379"
		key = "{cold:client-1}"
	)
	for _, tc := range []struct {
		name  string
		stale func(n *nodes, cc *redis.ClusterClient, maps *slotMaps) error
	}{
		{"a stale map held, then every load fails", func(n *nodes, cc *redis.ClusterClient, maps *slotMaps) error {
			maps.then(old, "")
			return cc.ForEachMaster(context.Background(), func(context.Context, *redis.Client) error { return nil })
		}},
		{"a prune's own load is stale", func(n *nodes, cc *redis.ClusterClient, maps *slotMaps) error {
			maps.then(old, new)
			n.prune(context.Background())
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			n, maps := clusterNodes(t, breaker.Settings{Name: "redis", FailureThreshold: 1}, old)
			nd := n.split(ctx, 1, func(int) string { return key })[0].nd
			_ = nd.brk.Do(ctx, func(context.Context) error { return errors.New("read: i/o timeout") })
			if nd.addr != old || nd.brk.State() != breaker.StateOpen {
				t.Fatalf("before the failover: %s, breaker %v; want %s, open", nd.addr, nd.brk.State(), old)
			}
			maps.then(new) // the failover: prune drops old
			n.prune(ctx)
			if _, ok := n.byAddr[old]; ok {
				t.Fatal("prune kept the old master")
			}
			if err := tc.stale(n, n.cc, maps); err != nil {
				t.Fatal(err)
			}
			got := n.split(ctx, 1, func(int) string { return key })[0].nd
			if got.addr != old {
				t.Fatalf("routed to %s, want %s: the map the client holds names it", got.addr, old)
			}
			if got != nd {
				t.Errorf("routed to %s with a new breaker (%v), want its old one, open", got.addr, got.brk.State())
			}
			if !n.masterOpen() {
				t.Error("masterOpen is false: recheck would not look for the failover again")
			}
		})
	}
}

// TestGoneForgetsTheOldest: the nodes remembered as dropped are bounded by goneMax;
// past it, the one dropped first is forgotten, and the others keep their breakers.
func TestGoneForgetsTheOldest(t *testing.T) {
	brk, err := breaker.New(breaker.Settings{Name: "redis"})
	if err != nil {
		t.Fatal(err)
	}
	n := newNodes(brk, nil)
	n.mu.Lock()
	defer n.mu.Unlock()
	addr := func(i int) string { return fmt.Sprintf("10.0.%d.%d:6379", i/256, i%256) }
	for i := range goneMax + 1 {
		nd := &node{addr: addr(i), brk: brk} // every node has a breaker
		n.byAddr[nd.addr] = nd
		n.drop(nd)
	}
	if len(n.gone) != goneMax || len(n.byAddr) != 0 {
		t.Fatalf("%d gone, %d masters; want %d and none", len(n.gone), len(n.byAddr), goneMax)
	}
	if _, ok := n.gone[addr(0)]; ok {
		t.Error("the node dropped first is still remembered")
	}
	for i := 1; i <= goneMax; i++ {
		if d, ok := n.gone[addr(i)]; !ok || d.nd.addr != addr(i) {
			t.Fatalf("node %d dropped after the first: forgotten", i)
		}
	}
}

// TestPruneAfterTheCalls: a slot found served by another master marks a prune due, and
// the prune runs once the trip's calls are made (settle), not while it is routed: a
// load of the map between routing a call and making it could send the call to another
// node than the one whose breaker guards it.
func TestPruneAfterTheCalls(t *testing.T) {
	const (
		a   = "10.0.0.1:6379"
		b   = "10.0.0.2:6379"
		key = "{cold:client-1}"
	)
	ctx := context.Background()
	n, maps := clusterNodes(t, breaker.Settings{}, a)
	if parts := n.split(ctx, 1, func(int) string { return key }); parts[0].nd.addr != a {
		t.Fatalf("routed to %q, want %q", parts[0].nd.addr, a)
	}
	if n.pruneDue.Load() {
		t.Fatal("a first route marked a prune due")
	}
	// The slot moves to b (a resharding, a failover), and the client's map says so.
	maps.then(b)
	if err := n.cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil }); err != nil {
		t.Fatal(err)
	}
	loads := maps.loads
	parts := n.split(ctx, 1, func(int) string { return key })
	if parts[0].nd.addr != b {
		t.Fatalf("routed to %q, want %q", parts[0].nd.addr, b)
	}
	if maps.loads != loads {
		t.Errorf("split loaded the map %d times before the calls", maps.loads-loads)
	}
	if !n.pruneDue.Load() {
		t.Fatal("a slot served by another master marked no prune due")
	}
	n.settle(ctx)
	if _, ok := n.byAddr[a]; ok || n.pruneDue.Load() {
		t.Errorf("after settle: breaker of %s kept %v, prune still due %v", a, ok, n.pruneDue.Load())
	}
}

// TestOutcomeOfSeveralParts: a trip of several parts (masters) is answered once any is,
// and also when none is: each part's items carry its own error, so that one master's
// breaker open does not make another's timed-out call, which may have run, read as
// refused. A trip of one part is answered only if it was.
func TestOutcomeOfSeveralParts(t *testing.T) {
	timeout := fmt.Errorf("%w: node 2", breaker.ErrTimeout)
	for _, tc := range []struct {
		name     string
		parts    []part
		answered bool
		err      error
	}{
		{"one part, answered", []part{{answered: true}}, true, nil},
		{"one part, not answered", []part{{err: timeout}}, false, timeout},
		{"two, one answered", []part{{answered: true}, {err: timeout}}, true, timeout},
		{"two, none answered", []part{{err: breaker.ErrOpen}, {err: timeout}}, true, breaker.ErrOpen},
	} {
		answered, err := outcome(tc.parts)
		if answered != tc.answered || err != tc.err {
			t.Errorf("%s: answered %v, %v; want %v, %v", tc.name, answered, err, tc.answered, tc.err)
		}
	}
}

// TestBreakerCountsSurviveFailover: the folded breaker counters (Stats.BreakerStats, the
// metrics' breaker series) never go back: a failed master's counts stay in them after a
// failover drops its breaker, and after the dropped breakers past goneMax are forgotten;
// the folded state is the masters' of now.
func TestBreakerCountsSurviveFailover(t *testing.T) {
	const old, promoted, key = "10.0.0.1:6379", "10.0.0.2:6379", "{cold:client-1}"
	ctx := context.Background()
	n, maps := clusterNodes(t, breaker.Settings{Name: "redis", FailureThreshold: 3}, old)
	nd := n.split(ctx, 1, func(int) string { return key })[0].nd
	for range 5 {
		_ = nd.brk.Do(ctx, func(context.Context) error { return nil })
	}
	for range 3 {
		_ = nd.brk.Do(ctx, func(context.Context) error { return errors.New("down") })
	}
	st, before, _ := n.stats()
	if st != breaker.StateOpen || before.Successes != 5 || before.Failures != 3 || before.Opened != 1 {
		t.Fatalf("the master failed: %v %+v", st, before)
	}
	maps.then(promoted)
	n.prune(ctx)
	st, after, _ := n.stats()
	before.InFlight, after.InFlight = 0, 0 // a count of now, not a counter: a call may be ending
	if st != breaker.StateClosed || after != before {
		t.Errorf("after the failover: %v %+v; want closed and the counts %+v", st, after, before)
	}
	// More dropped masters than gone keeps: the first ones forgotten, their counts kept.
	for i := range goneMax + 2 {
		b, err := breaker.New(breaker.Settings{})
		if err != nil {
			t.Fatal(err)
		}
		_ = b.Do(ctx, func(context.Context) error { return nil })
		n.mu.Lock()
		n.drop(&node{addr: fmt.Sprintf("10.1.0.%d:6379", i), brk: b})
		n.mu.Unlock()
	}
	if _, s, _ := n.stats(); s.Successes != before.Successes+goneMax+2 || s.Failures != before.Failures {
		t.Errorf("after %d more drops: %+v; want %d successes, %d failures", goneMax+2, s, before.Successes+goneMax+2, before.Failures)
	}
}

// TestStatsDuringFailover: a master dropped and revived over and over (the slot map
// flapping between two masters) is counted once in every Stats taken meanwhile: its
// calls neither double (read in the masters' list and among the dropped) nor vanish.
func TestStatsDuringFailover(t *testing.T) {
	const old, new, key = "10.0.0.1:6379", "10.0.0.2:6379", "{cold:client-1}"
	ctx := context.Background()
	n, maps := clusterNodes(t, breaker.Settings{Name: "redis"}, old)
	nd := n.split(ctx, 1, func(int) string { return key })[0].nd
	for range 5 {
		_ = nd.brk.Do(ctx, func(context.Context) error { return nil })
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for !stop.Load() {
			for _, m := range []string{new, old} {
				maps.then(m)
				n.prune(ctx)
			}
		}
	})
	seen := map[int64]int{}
	for range 200_000 {
		_, sum, _ := n.stats()
		seen[sum.Calls]++
	}
	stop.Store(true)
	wg.Wait()
	if len(seen) != 1 || seen[5] == 0 {
		t.Errorf("calls read (value: times) %v, want 5 every time", seen)
	}
}

// clusterNodes returns the nodes of a Limiter whose breakers have settings st, over a
// Cluster client (closed when the test ends) whose slot map, every slot on one master,
// maps gives: first, until the test sets others (slotMaps.then).
func clusterNodes(t *testing.T, st breaker.Settings, first string) (*nodes, *slotMaps) {
	t.Helper()
	maps := &slotMaps{maps: []string{first}}
	cc := redis.NewClusterClient(&redis.ClusterOptions{ClusterSlots: maps.load})
	t.Cleanup(func() { cc.Close() })
	brk, err := breaker.New(st)
	if err != nil {
		t.Fatal(err)
	}
	return newNodes(brk, cc), maps
}
