package hybrid

import (
	"cmp"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// nodes holds the breakers of the Redis nodes the Limiter calls, so that a node that
// fails costs only the keys it holds. A plain client (one node, or Sentinel) has one:
// Config.Breaker. A Redis Cluster has one per master, made with Config.Breaker's
// settings and named after the master's address, and each call goes through the breaker
// of the master that serves its key's hash slot; a call for which the client knows no
// master (its slot map cannot be loaded) goes through Config.Breaker.
//
// A master's breaker lives as long as the master: when a slot is seen served by another
// node (a failover, a resharding), the breakers of addresses that are no longer masters
// are dropped, and kept aside: an address a later map names again gets its breaker back,
// in the state it was in (open, for a master that failed), since whether that map was
// loaded fresh cannot be told.
type nodes struct {
	all *node                // Config.Breaker's: a plain client's, or a Cluster's when no master is known
	cc  *redis.ClusterClient // nil: a plain client

	mu      sync.Mutex
	byAddr  map[string]*node   // guarded by mu
	gone    map[string]dropped // guarded by mu: the nodes a prune dropped, by address, until a map names them again
	drops   uint64             // guarded by mu: the prunes' drops so far, the order of gone's
	retired breaker.Stats      // guarded by mu: the counters of the nodes gone forgot (goneMax), as they were then
	masters atomic.Pointer[[]*node]
	slots   [wire.Slots]atomic.Pointer[node] // the master each slot's last call went to

	nextCheck time.Time   // the Limiter's goroutine's: when recheck may look again
	pruneDue  atomic.Bool // a call found its slot served by another master: prune after the trip
}

// recheckEvery is how often, while a master's breaker is open, the Limiter looks at the
// Cluster's slot map for a failover (recheck).
const recheckEvery = 100 * time.Millisecond

// reloadTimeout bounds a load of the slot map on the Limiter's goroutine (prune), which
// no trip runs beside: the client asks its nodes in random order, and a dead or stalled
// one would hold the goroutine for its dial or read timeout. A load that runs out of
// time leaves the map the client holds, and recheck looks again recheckEvery later.
// go-redis bounds a dial by the context; a read by it only with ContextTimeoutEnabled,
// else by ReadTimeout (100 ms with global.ConfigureCluster).
const reloadTimeout = recheckEvery / 2

// goneMax bounds the nodes remembered as dropped, with their breakers: the stale maps of
// a failover pass within seconds, and a process sees few failovers in that time; past
// it, the one dropped first is forgotten.
const goneMax = 64

// dropped is a node a prune dropped, and the number of its drop among the nodes': the
// oldest goes first when gone is full.
type dropped struct {
	nd *node
	at uint64
}

// node is one Redis node and its breaker.
type node struct {
	addr string // "" for nodes.all
	brk  *breaker.Breaker
}

func newNodes(brk *breaker.Breaker, client redis.Scripter) *nodes {
	n := &nodes{all: &node{brk: brk}, byAddr: map[string]*node{}, gone: map[string]dropped{}}
	n.cc, _ = client.(*redis.ClusterClient)
	n.masters.Store(&[]*node{})
	return n
}

// route returns the node whose breaker guards a call on the Redis key key (any key with
// the same hash tag). When it finds the slot served by another master than its last
// call's, it marks a prune due, which settle runs once the trip's calls are made: a load
// of the map before them could route a call elsewhere than its breaker. It may load the
// client's slot map (I/O): it runs on the Limiter's goroutine, never under a lock.
//
// When the client's map names a master the last prune dropped and the map was not
// loaded again for this call (reloaded false), route does nothing and reports it stale
// (split loads the map again); past that load, the address is a master again, with the
// breaker it had.
func (n *nodes) route(ctx context.Context, key string, reloaded bool) (nd *node, stale bool) {
	if n.cc == nil {
		return n.all, false
	}
	addr, ok := n.master(ctx, key)
	if !ok {
		return n.all, false
	}
	slot := &n.slots[wire.Slot(key)]
	if nd := slot.Load(); nd != nil && nd.addr == addr {
		return nd, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.gone[addr].nd != nil && !reloaded {
		return nil, true
	}
	nd = n.byAddr[addr]
	if nd == nil {
		// A master dropped and named again gets back the breaker it had, open if it
		// failed: whether the map was loaded again cannot be told (ForEachMaster gives
		// the map held when a load fails, and a load may come from a node that missed
		// the failover); the calls go where the map says, guarded by what is known of
		// that address.
		if nd = n.revive(addr); nd == nil {
			st := n.all.brk.Settings()
			if st.Name != "" {
				st.Name += " "
			}
			st.Name += addr
			b, err := breaker.New(st)
			if err != nil { // not reached: the settings made Config.Breaker
				return n.all, false
			}
			nd = &node{addr: addr, brk: b}
			n.byAddr[addr] = nd
		}
		list := append(append([]*node(nil), *n.masters.Load()...), nd)
		n.masters.Store(&list)
	}
	// Under n.mu, as prune clears the slots of the nodes it drops: a slot never points
	// to a node that is not in byAddr.
	if old := slot.Swap(nd); old != nil && old != nd {
		n.pruneDue.Store(true)
	}
	return nd, false
}

// master returns the address of the master that serves key's slot in the client's
// map, false if the map cannot be loaded.
func (n *nodes) master(ctx context.Context, key string) (string, bool) {
	c, err := n.cc.MasterForKey(ctx, key)
	if err != nil {
		return "", false
	}
	return c.Options().Addr, true
}

// prune drops the breakers of the nodes that are no longer masters, by the client's
// slot map reloaded now (I/O: on the Limiter's goroutine only; ForEachMaster reloads
// it), and forgets the slots that went to them.
func (n *nodes) prune(ctx context.Context) {
	var mu sync.Mutex
	live := map[string]bool{}
	ctx, cancel := context.WithTimeout(ctx, reloadTimeout)
	defer cancel()
	if n.cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		live[c.Options().Addr] = true
		mu.Unlock()
		return nil
	}) != nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var kept []*node
	for addr := range live {
		if nd := n.revive(addr); nd != nil {
			kept = append(kept, nd)
		}
	}
	for _, nd := range *n.masters.Load() {
		if live[nd.addr] {
			kept = append(kept, nd)
			continue
		}
		n.drop(nd)
		for i := range n.slots {
			n.slots[i].CompareAndSwap(nd, nil)
		}
	}
	n.masters.Store(&kept)
}

// revive puts the node a prune dropped at addr, if any, back in the masters' map
// (byAddr), its breaker in the state it was in, and returns it (nil if none); the
// caller adds it to the list of masters. It requires that n.mu is held.
func (n *nodes) revive(addr string) *node {
	nd := n.gone[addr].nd
	if nd != nil {
		delete(n.gone, addr)
		n.byAddr[addr] = nd
	}
	return nd
}

// drop takes nd out of the masters' map (byAddr) and into gone, which forgets the node
// dropped first once it holds goneMax; the caller drops nd's slots and its place in the
// list of masters. It requires that n.mu is held.
func (n *nodes) drop(nd *node) {
	delete(n.byAddr, nd.addr)
	if len(n.gone) >= goneMax {
		oldest := ""
		for addr, d := range n.gone {
			if oldest == "" || d.at < n.gone[oldest].at {
				oldest = addr
			}
		}
		addCounts(&n.retired, n.gone[oldest].nd.brk.Stats())
		delete(n.gone, oldest)
	}
	n.drops++
	n.gone[nd.addr] = dropped{nd, n.drops}
}

// settle runs the prune a trip's routes marked due (route), once its calls are made. It
// runs on the Limiter's goroutine only.
func (n *nodes) settle(ctx context.Context) {
	if n.pruneDue.Swap(false) {
		n.prune(ctx)
	}
}

// recheck looks, while a master's breaker is open, at most once per recheckEvery, for a
// failover: it reloads the client's slot map and drops the breakers of the addresses
// the map no longer lists as masters (prune). The reload is prune's own, done before it
// reads the map: a reload in the background could store a map read before prune's
// after it. Without recheck, the keys of a failed master stay with its open breaker
// after a replica took over: no call goes to them, so the client has no reason to
// reload its map, and its half-open probe goes to the address that failed. It reports whether a master's breaker is open, for
// the Limiter to wake by then. It runs on the Limiter's goroutine only.
func (n *nodes) recheck(ctx context.Context, now time.Time) bool {
	if n.cc == nil || !n.masterOpen() {
		return false
	}
	if !now.Before(n.nextCheck) {
		n.nextCheck = now.Add(recheckEvery)
		n.prune(ctx)
	}
	return true
}

// masterOpen reports whether a master's breaker is open.
func (n *nodes) masterOpen() bool {
	for _, nd := range *n.masters.Load() {
		if nd.brk.State() == breaker.StateOpen {
			return true
		}
	}
	return false
}

// keyOpen reports whether the breaker that guards the bucket of limit and id (a key's
// ID) is open: a refill for it would be refused. A slot no call went to yet is guarded
// by Config.Breaker. It does no I/O.
func (n *nodes) keyOpen(limit, id string) bool {
	nd := n.all
	if n.cc != nil {
		if s := n.slots[wire.Slot(wire.BucketKeyOfID("", limit, id))].Load(); s != nil {
			nd = s
		}
	}
	return nd.brk.State() == breaker.StateOpen
}

// anyOpen reports whether any breaker is open: Config.Breaker or a master's.
func (n *nodes) anyOpen() bool {
	return n.all.brk.State() == breaker.StateOpen || n.masterOpen()
}

// anyRefusing reports whether a breaker refuses calls now: open, or half-open with its
// probes in flight (refusing reports which).
func (n *nodes) anyRefusing() bool {
	refusing := false
	n.forEach(func(nd *node) { refusing = refusing || nd.refusing() })
	return refusing
}

// refusing reports whether nd's breaker refuses calls now: it is open, or half-open with
// as many calls in flight as it lets probes through (its probes, or calls that outlived
// their Do).
func (nd *node) refusing() bool {
	switch nd.brk.State() {
	case breaker.StateOpen:
		return true
	case breaker.StateHalfOpen:
		return nd.brk.Stats().InFlight >= int64(max(nd.brk.Settings().HalfOpenProbes, 1))
	}
	return false
}

// forEach calls f with Config.Breaker's node, then the masters' in the order they were
// first called, and returns how many it called f with. It allocates nothing: the
// Limiter's loop calls it on every pass.
func (n *nodes) forEach(f func(*node)) int {
	f(n.all)
	masters := *n.masters.Load()
	for _, nd := range masters {
		f(nd)
	}
	return 1 + len(masters)
}

// part is the items of one call that one node's breaker guards, and what the call said.
type part struct {
	nd       *node
	idx      []int // the items' indexes in the trip; nil: every item
	answered bool
	err      error
	late     *lateTake // a take trip's part whose answers may come after Do gave up
}

// split routes each of count items (key(i) is item i's Redis key, or any key with its
// hash tag) to its node: one part per node, in the order the nodes are first met. With
// one node, the part has every item (idx nil).
func (n *nodes) split(ctx context.Context, count int, key func(i int) string) []part {
	if n.cc == nil {
		return []part{{nd: n.all}}
	}
	var parts []part
	reloaded := false
	for i := 0; i < count; i++ {
		nd, stale := n.route(ctx, key(i), reloaded)
		if stale {
			// The client loads its slot map from one node at random, and for a moment
			// after a failover a node may not know of it: its map names the failed
			// master again after a fresher one dropped it. Load the map once more, and
			// route every item again on it.
			reloaded = true
			n.prune(ctx)
			parts, i = parts[:0], -1
			continue
		}
		j := 0
		for j < len(parts) && parts[j].nd != nd {
			j++
		}
		if j == len(parts) {
			parts = append(parts, part{nd: nd})
		}
		parts[j].idx = append(parts[j].idx, i)
	}
	if len(parts) == 1 {
		parts[0].idx = nil
	}
	return parts
}

// run calls call for each part, through its node's breaker, all at once, and returns
// when every part has an outcome.
func run(parts []part, call func(p *part)) {
	if len(parts) == 1 {
		call(&parts[0])
		return
	}
	var wg sync.WaitGroup
	for i := range parts {
		wg.Go(func() { call(&parts[i]) })
	}
	wg.Wait()
}

// outcome folds the parts' outcomes into the trip's: answered if any part was, or if
// there are several (the items of a part not answered carry its error: one master's
// breaker open says nothing of another's call that timed out, and may have run), with
// the first part's error that has one.
func outcome(parts []part) (answered bool, err error) {
	answered = len(parts) > 1
	for _, p := range parts {
		answered = answered || p.answered
		err = cmp.Or(err, p.err)
	}
	return answered, err
}

// each calls f for the k-th of n items of part p, with i its index in the trip.
func each(p *part, n int, f func(k, i int)) {
	for k := range n {
		i := k
		if p.idx != nil {
			i = p.idx[k]
		}
		f(k, i)
	}
}

// pick returns the items of in that part p holds (all of them for idx nil).
func pick[T any](in []T, p *part) []T {
	if p.idx == nil {
		return in
	}
	sub := make([]T, len(p.idx))
	for k, i := range p.idx {
		sub[k] = in[i]
	}
	return sub
}

// stats returns the breakers' state and counters folded (see Stats.Breaker), and each
// master's on a Cluster. The state is the masters' alone; the counters are every
// breaker's the Limiter has had, the dropped masters' too (a failover's), so that they
// never go back, as a metric's counters must not. It holds n.mu over both readings, the
// masters' and the dropped ones': a failover between the two (prune, revive) would count
// a breaker twice or not at all.
func (n *nodes) stats() (state breaker.State, sum breaker.Stats, masters []NodeStats) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.forEach(func(nd *node) {
		st, bs := nd.brk.State(), nd.brk.Stats()
		if nd != n.all {
			masters = append(masters, NodeStats{Addr: nd.addr, Breaker: st, BreakerStats: bs})
		}
		if st == breaker.StateOpen || st == breaker.StateHalfOpen && state != breaker.StateOpen {
			state = st
		}
		addCounts(&sum, bs)
		sum.InFlight += bs.InFlight
	})
	for _, d := range n.gone {
		bs := d.nd.brk.Stats()
		addCounts(&sum, bs)
		sum.InFlight += bs.InFlight // its abandoned calls, until they end
	}
	addCounts(&sum, n.retired)
	return state, sum, masters
}

// addCounts adds bs's counters to sum (MaxInFlight: the larger), all but InFlight, which
// is a count of now.
func addCounts(sum *breaker.Stats, bs breaker.Stats) {
	sum.Calls += bs.Calls
	sum.Successes += bs.Successes
	sum.Failures += bs.Failures
	sum.Timeouts += bs.Timeouts
	sum.Excluded += bs.Excluded
	sum.Starved += bs.Starved
	sum.Rejected += bs.Rejected
	sum.Overloaded += bs.Overloaded
	sum.Abandoned += bs.Abandoned
	sum.MaxInFlight = max(sum.MaxInFlight, bs.MaxInFlight)
	sum.Opened += bs.Opened
	sum.HalfOpened += bs.HalfOpened
	sum.Closed += bs.Closed
}
