package engine

import (
	"time"

	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// look answers, without spending or changing anything, whether a request of cost n for
// key under tier of lm would be denied now by what this server knows for certain: a cost
// above the tier's burst, or a pre-check bucket without n tokens (of a key that would
// not be re-shaped). It returns that denial and true, or false when the request may pass
// (from the lease, or after a refill). A caller that decides several items all or
// nothing looks at every item before it spends on any.
func (e *Engine) look(now int64, lm *Limit, tier, key string, n int) (Decision, bool) {
	sh := lm.Shape(tier)
	if n > sh.cfg.Burst {
		return Decision{Source: SourceLease, Reason: ReasonExceedsBurst, RetryAfter: InfDuration, Servers: e.Servers()}, true
	}
	if n <= 0 {
		return Decision{}, false
	}
	var d Decision
	denied := false
	lm.keys.Peek(wire.KeyID(key), func(en *entry, _ int64) {
		if en.shape == sh && en.pre.TokensAt(now) < float64(n) {
			d, denied = lm.preDenied(en, now, n), true
		}
	})
	d.Servers = e.Servers()
	return d, denied
}

// Return undoes at now a decision d, made at the instant at, that admitted a request of
// tier and cost n for key under lm: the tokens go back where they came from, and
// LimitStats.GivenBack counts it (the decision stays counted as it was made: the counters
// only grow); where the tokens go is the limit's kind's (kind.undo: a windowed limit's
// go back only to the window the decision was counted in). A decision that did not admit
// is left alone.
func (e *Engine) Return(now, at time.Time, lm *Limit, tier, key string, n int, d Decision) {
	if !d.Allowed || d.Source >= NumSources || d.Reason >= NumReasons {
		return
	}
	if n > 0 {
		id := wire.KeyID(key)
		if r := lm.kind.undo(now, at, tier, id, n, d); r > 0 {
			lm.stats.gaveBack(r)
		}
	}
	lm.stats.givenBack.Add(1)
}

// MultiItem is one (limit, tier, key, cost) of an all-or-nothing request. Multi.Add
// copies its fields one by one: a field added here must be copied there too
// (TestMultiAddCopiesEveryField).
type MultiItem struct {
	Limit *Limit
	Tier  string
	Key   string
	N     int
}

// Multi is an all-or-nothing request over several items, as the engine decides it: the
// request is admitted only if every item admits it, and a denial spends nothing anywhere.
// The driver adds the items (Add) and calls Engine.StartMulti, then, while it returns a Waiter
// (an item waits for a refill), waits for it as for a single request (its Decision, or
// GiveUp at the limit's MaxWait) and hands that decision to Engine.ResumeMulti. A Multi
// is one request's state: not for concurrent use, and not reused before it is done.
//
// The rule: first every item is looked at without spending (Look; items on the same
// limit, tier and key with their costs summed): one that would certainly deny denies the
// request. Then the items are decided in order, as Decide decides them; at the first
// denial the tokens of the items before it go back at once (Return). The common case,
// every item served from its lease, is decided in one pass that ends as those two would
// (Engine.hits), makes no Redis call and, with at most 8 items, no allocation. Each key is touched under its own lock, one at a time, and no lock is held
// across items, so concurrent requests with overlapping items cannot deadlock.
type Multi struct {
	// The items, the first 8 held in the Multi itself: a Multi on the driver's stack
	// stays there (a slice into it would not).
	n         int
	items     [8]MultiItem
	moreItems []MultiItem

	// Allowed reports whether every item admitted the request; Denied is the index of
	// the item that denied it, -1 when admitted. Decision is the denying item's
	// decision, or, when admitted, that of the item with the fewest tokens remaining;
	// Item its index. RetryAfter, when denied, is the longest RetryAfter among the items
	// known to deny (InfDuration: never).
	Allowed    bool
	Denied     int
	Item       int
	Decision   Decision
	RetryAfter time.Duration

	// The decisions of the items admitted so far, items 0 to next-1: the first 8 in
	// small, the others in more (a slice into small would make every Multi escape).
	next  int
	small [8]Decision
	more  []Decision
	// at is the instant m started at (StartMulti), when the items it decided without
	// waiting were decided: the instant of their decisions, for a give-back (Return).
	// An item decided after a wait was decided later; a windowed one then gives back
	// nothing if its window changed in between, which is conservative. Unix nanoseconds.
	at int64

	// users is the number of items the driver added, set when m is first started; the
	// items after them are the companions' (reps.go), orig[i-users] the item item i
	// was added for.
	users int
	orig  []int
}

// Add adds an item to m, before StartMulti.
func (m *Multi) Add(it MultiItem) {
	if m.n < len(m.items) {
		// Field by field: copied whole, the item is read with 16-byte loads from the
		// caller's temporary just written with 8-byte stores, which a CPU does not
		// forward from its store buffer: each load waits for them to reach the cache.
		p := &m.items[m.n]
		p.Limit, p.Tier, p.Key, p.N = it.Limit, it.Tier, it.Key, it.N
	} else {
		m.moreItems = append(m.moreItems, it)
	}
	m.n++
}

// Len is the number of items (with, once started, those of the limits' companions); At
// returns item i, in place: valid until the next Add, and not to be changed.
func (m *Multi) Len() int { return m.n }
func (m *Multi) At(i int) *MultiItem {
	if i < len(m.items) {
		return &m.items[i]
	}
	return &m.moreItems[i-len(m.items)]
}

// taken returns the decision of admitted item i.
func (m *Multi) taken(i int) Decision {
	if i < len(m.small) {
		return m.small[i]
	}
	return m.more[i-len(m.small)]
}

// StartMulti decides m as far as it can at now (Unix nanoseconds, as Decide's): it
// returns (nil, true) once m is decided, or the Waiter of the item that waits for a
// refill and false.
func (e *Engine) StartMulti(now int64, m *Multi) (*Waiter, bool) {
	m.at = now
	m.expand()
	w, done := e.startMulti(now, m)
	if done {
		m.finish()
	}
	return w, done
}

// startMulti is StartMulti on m's items, companions' included.
func (e *Engine) startMulti(now int64, m *Multi) (*Waiter, bool) {
	if e.hits(now, m) {
		return nil, true
	}
	m.reset()
	// Look before spending: an item that would certainly deny denies the request. Items
	// on the same (limit, tier, key) are looked at with their costs summed, since they
	// spend from one bucket; a request that can never pass reports that item.
	for i := range m.n {
		it := m.At(i)
		cost, repeat := it.N, false
		for j := range m.n {
			if o := m.At(j); j != i && o.Limit == it.Limit && o.Tier == it.Tier && o.Key == it.Key {
				cost += o.N
				repeat = repeat || j < i
			}
		}
		if repeat {
			continue // looked at with its first occurrence
		}
		d, denied := e.look(now, it.Limit, it.Tier, it.Key, cost)
		if !denied {
			continue
		}
		it.Limit.stats.count(&d, it.N) // a denial look made, without Decide
		if m.Denied < 0 || (d.RetryAfter >= InfDuration && m.Decision.RetryAfter < InfDuration) {
			m.Denied, m.Item, m.Decision = i, i, d
		}
		m.RetryAfter = max(m.RetryAfter, d.RetryAfter)
	}
	if m.Denied >= 0 {
		return nil, true
	}
	return e.spend(now, m)
}

// reset makes m undecided.
func (m *Multi) reset() {
	m.Allowed, m.Denied, m.Item, m.Decision, m.RetryAfter = false, -1, 0, Decision{}, 0
	m.next, m.more = 0, m.more[:0]
}

// hits decides m in one pass when its common case holds, every item served by its
// kind's common path (kind.hit: for a bucket, a lease hit), and reports whether it did.
// That pass ends as the look and the spend would have: each pre-check and lease had the
// tokens, the items are decided in order on the same states, and each decision is
// counted once m is admitted. At the first item that is not a hit, the items before it
// are undone (kind.unhit, uncounted) and m takes the full path: the look decides a
// certain denial before anything is spent, and the spend the rest.
func (e *Engine) hits(now int64, m *Multi) bool {
	if m.n > len(m.small) {
		return false
	}
	m.reset()
	for i := range m.n {
		it := m.At(i)
		d, ok := it.Limit.kind.hit(now, it.Tier, wire.KeyID(it.Key), it.N)
		if !ok {
			for j := i - 1; j >= 0; j-- {
				jt := m.At(j)
				jt.Limit.kind.unhit(now, jt.Tier, wire.KeyID(jt.Key), jt.N)
			}
			return false
		}
		e.took(now, m, &d)
	}
	for i := range m.n {
		it := m.At(i)
		it.Limit.stats.count(&m.small[i], it.N)
	}
	m.Allowed = true
	return true
}

// ResumeMulti goes on with m after the item that waited was decided d (the Waiter's
// decision, or GiveUp's), at now (Unix nanoseconds).
func (e *Engine) ResumeMulti(now int64, m *Multi, d Decision) (*Waiter, bool) {
	w, done := (*Waiter)(nil), e.took(now, m, &d)
	if !done {
		w, done = e.spend(now, m)
	}
	if done {
		m.finish()
	}
	return w, done
}

// spend decides m's items from m.next on, until one waits or m is decided.
func (e *Engine) spend(now int64, m *Multi) (*Waiter, bool) {
	for m.next < m.n {
		it := m.At(m.next)
		var d Decision
		if w := e.Decide(now, it.Limit, it.Tier, it.Key, it.N, &d); w != nil {
			return w, false
		}
		if e.took(now, m, &d) {
			return nil, true
		}
	}
	m.Allowed = true
	return nil, true
}

// took applies the decision *d of item m.next and reports whether it decided m (a
// denial, whose items before it give their tokens back).
func (e *Engine) took(now int64, m *Multi, d *Decision) bool {
	i := m.next
	if !d.Allowed {
		t, at := timeAt(now), timeAt(m.at)
		for j := i - 1; j >= 0; j-- {
			it := m.At(j)
			e.Return(t, at, it.Limit, it.Tier, it.Key, it.N, m.taken(j))
		}
		m.Denied, m.Item, m.Decision, m.RetryAfter = i, i, *d, d.RetryAfter
		return true
	}
	if i < len(m.small) {
		m.small[i] = *d
	} else {
		m.more = append(m.more, *d)
	}
	if i == 0 || d.Remaining < m.Decision.Remaining {
		m.Item, m.Decision = i, *d
	}
	m.next++
	return false
}
