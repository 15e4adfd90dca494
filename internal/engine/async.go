package engine

import (
	"sync"
	"time"

	"github.com/fleetlimit/fleetlimit/global"
)

// A limit with Async set ("charge later") admits a request its lease cannot serve
// without asking Redis, when nothing this server knows says the key's bucket is low,
// and charges it to the bucket afterwards: every Async, one pipelined round trip
// carries the charges of all the keys admitted so (debt trips, each item a refund of
// -n, as FailLocal's debts are). The answers say how many tokens each bucket holds,
// and so do the answers of the refills: a bucket found below half its burst marks its
// key low on this server for as long as it takes to refill to half its burst, and a
// low key's requests go the exact way (the lease, waiting for a refill).
//
// A server holds at most one admission of a key uncharged at a time, of a cost of at
// most its share of the burst (max(1, ceil(Burst/servers))), and admits none before
// Async has passed since its first Tick. So the fleet's uncharged admissions of one key
// are at most S·c at any instant (S servers, c the share): that is what a key can
// exceed the exact bound 2·burst + rate·W by, and only while its bucket holds half its
// burst or until the charges of the servers that did not know it was low arrive. The
// charges themselves follow the bucket, as refunds of -n, down to -(burst +
// rate·DebtWindow).

// lowKeys is the set of keys of one limit that this server knows low: the last answer it
// had for the key found its bucket below half its burst, or the fleet's low-key set
// (lua.Low) says some server did and this server has had no answer saying otherwise for
// LowShare. A key stays low until an answer finds its bucket at half its burst or more
// (a refill's: a low key's requests go the exact way, which asks), until the fleet's
// set no longer marks a key this server only learnt from it, or until lowMemory passed
// without news: a low key that was let go of at an expiry would be admitted again by
// every server at once. The set outlives the keys' entries, which a store lets go of
// when they are idle: a key seen once a second by each of 200 servers is low
// fleet-wide, and each of those servers must remember it between its requests.
//
// The keys this server finds low go to the fleet's set with its next low-key exchange
// (a LowTrip, every LowEvery), and again every LowShare/2 while they stay low, so that
// a server that starts, or has not seen a key yet, learns of it before it admits it;
// a key the fleet marks that this server finds at half its burst or more is unmarked.
type lowKeys struct {
	mu      sync.Mutex
	keys    map[string]lowMark // guarded by mu
	marks   []global.KeyID     // keys to mark in the fleet's set; guarded by mu
	unmarks []global.KeyID     // keys to unmark there; guarded by mu
	sweep   time.Time          // when the forgotten keys were last dropped; guarded by mu
}

// lowMark is what a server knows of a key that was low: when it last heard so (its own
// answer, or the fleet's set), when the fleet last heard so (this server marked it, or
// learnt it from the set), when its own answer last found the bucket at half its burst
// or more, and whether the fleet's set is all it has heard.
type lowMark struct {
	at, shared, high time.Time
	learnt           bool
}

// Low-key timings and bounds.
const (
	// lowMemory is how long a server remembers a key low after the last news of it.
	lowMemory = 30 * time.Second
	// LowShare is how long the fleet's set keeps a mark (lua.Low's memory); a server
	// marks a key it still finds low again after half of it, and an answer of its own
	// that found the bucket at half its burst or more outweighs the set for that long.
	LowShare = 10 * time.Second
	// LowEvery is how often a warm server exchanges low keys with the fleet.
	LowEvery = time.Second
	// maxLowKeys bounds the low keys one limit remembers; past it, the keys not yet low
	// are not noted (their next requests are admitted, and charged: what a key forgets
	// costs an admission per server, as a new key does). maxLowMarks bounds the marks
	// and unmarks waiting for the next exchange.
	maxLowKeys  = 100_000
	maxLowMarks = 10_000
)

// low reports whether key is low at now.
func (s *lowKeys) low(key string, now time.Time) bool {
	s.mu.Lock()
	m, ok := s.keys[key]
	s.mu.Unlock()
	return ok && m.isLow(now)
}

func (m lowMark) isLow(now time.Time) bool { return m.at.After(m.high) && now.Sub(m.at) < lowMemory }

// note records what an answer at now said of key's bucket: remaining tokens, of shape
// sh. Below half the burst, the key is low (and marked for the fleet if the fleet has
// not heard so for LowShare/2); at half or more, it is not (and unmarked in the fleet's
// set if it may be marked there).
func (s *lowKeys) note(sh *Shape, key string, remaining float64, now time.Time) {
	low := remaining < float64(sh.cfg.Burst)/2
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.keys[key]
	if !low {
		if ok {
			if now.Sub(m.shared) < LowShare && len(s.unmarks) < maxLowMarks {
				s.unmarks = append(s.unmarks, global.KeyID(key))
			}
			m.high, m.shared = now, time.Time{}
			s.keys[key] = m
		}
		return
	}
	if !ok && !s.room(now) {
		return
	}
	m.at, m.learnt = now, false
	if now.Sub(m.shared) >= LowShare/2 {
		m.shared = now
		if len(s.marks) < maxLowMarks {
			s.marks = append(s.marks, global.KeyID(key))
		}
	}
	s.keys[key] = m
}

// learn records the keys the fleet's set marks low, at now: each is low here unless this
// server's own answer found it at half its burst or more within LowShare; a key this
// server knew low from the set only, and that the set no longer marks, is not.
func (s *lowKeys) learn(ids []global.KeyID, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	marked := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		k := string(id)
		marked[k] = struct{}{}
		m, ok := s.keys[k]
		if !ok && !s.room(now) || ok && now.Sub(m.high) < LowShare {
			continue
		}
		if !ok || !m.isLow(now) {
			m.learnt = true
		}
		m.at, m.shared = now, now
		s.keys[k] = m
	}
	for k, m := range s.keys {
		if _, ok := marked[k]; !ok && m.learnt {
			delete(s.keys, k)
		}
	}
}

// room reports whether a new key can be noted, first dropping the forgotten keys (at
// most once a second) if the set is full. It requires that s.mu is held.
func (s *lowKeys) room(now time.Time) bool {
	if s.keys == nil {
		s.keys = make(map[string]lowMark)
	}
	if len(s.keys) >= maxLowKeys && now.Sub(s.sweep) >= time.Second {
		s.sweep = now
		for k, m := range s.keys {
			if now.Sub(m.at) >= lowMemory && now.Sub(m.high) >= LowShare {
				delete(s.keys, k)
			}
		}
	}
	return len(s.keys) < maxLowKeys
}

// takeMarks returns the keys to mark and to unmark in the fleet's set, and forgets them.
func (s *lowKeys) takeMarks() (mark, unmark []global.KeyID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	mark, unmark = s.marks, s.unmarks
	s.marks, s.unmarks = nil, nil
	return mark, unmark
}

// size returns the number of keys noted (forgotten ones included until a sweep).
func (s *lowKeys) size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

// LowExchange is one limit's part of a LowTrip: the keys this server found low, to mark
// in the fleet's set, and those it found at half their burst or more, to unmark there
// (global.Store.Low with memory LowShare), and, written by the driver, the keys the set
// marks (Got) or the error.
type LowExchange struct {
	Limit  string
	Mark   []global.KeyID
	Unmark []global.KeyID
	Got    []global.KeyID
	Err    error

	lim *Limit
}

// asyncMin returns the shortest Async of the engine's limits, 0 if none has one.
func (e *Engine) asyncMin() time.Duration {
	var m time.Duration
	for _, lm := range e.Limits() {
		if a := lm.Config().Async; a > 0 && (m == 0 || a < m) {
			m = a
		}
	}
	return m
}

// scheduleLow plans the low-key exchanges (Tick): the first at a quarter of the shortest
// Async after the first Tick, the next at half of it (the first whose answer makes the
// server warm: every server started with it has marked the keys it found low by then),
// then every LowEvery while this server admits keys uncharged or finds keys low, and
// every LowShare otherwise. It requires that e.mu is held, and reports whether one is
// due now.
func (e *Engine) scheduleLow(now time.Time, async time.Duration) bool {
	if async == 0 || e.stopped || e.lowOut {
		return false
	}
	if e.lowAt.IsZero() && !e.lowDue {
		e.lowAt = time.Unix(0, e.firstTick.Load()).Add(async / 4)
	}
	if e.lowAt.IsZero() || now.Before(e.lowAt) {
		return false
	}
	if e.warm.Load() && !e.lowNews && now.Sub(e.lowLast) < LowShare && !e.hasLowMarks() {
		// Nothing admitted uncharged nor found low since the last exchange: the fleet's
		// news can wait, up to LowShare.
		e.lowAt = now.Add(LowEvery)
		return false
	}
	e.lowDue, e.lowAt, e.lowNews = true, time.Time{}, false
	return true
}

// hasLowMarks reports whether a limit has keys to mark or unmark in the fleet's set.
func (e *Engine) hasLowMarks() bool {
	for _, lm := range e.Limits() {
		lm.low.mu.Lock()
		n := len(lm.low.marks) + len(lm.low.unmarks)
		lm.low.mu.Unlock()
		if n > 0 {
			return true
		}
	}
	return false
}

// lowTrip returns the low-key exchange of every limit with Async. It requires that e.mu
// is held.
func (e *Engine) lowTrip(now time.Time) *Trip {
	t := &Trip{Kind: LowTrip}
	for _, lm := range e.Limits() {
		if lm.Config().Async > 0 {
			mark, unmark := lm.low.takeMarks()
			t.Lows = append(t.Lows, LowExchange{Limit: lm.name, Mark: mark, Unmark: unmark, lim: lm})
		}
	}
	e.lowDue, e.lowOut = false, true
	t.warms = !now.Before(time.Unix(0, e.firstTick.Load()).Add(e.asyncMin() / 2))
	return t
}

// lowDone takes the answer of a low-key exchange: the keys the fleet marks are low here
// too, and a server whose exchange after its first Async was answered is warm. The next
// exchange comes LowEvery later once warm, a quarter of an Async later until then.
func (e *Engine) lowDone(now time.Time, t *Trip) {
	ok := t.Err == nil
	for _, x := range t.Lows {
		if x.Err != nil || !ok {
			ok = false
			continue
		}
		x.lim.low.learn(x.Got, now)
	}
	if ok && t.warms {
		e.warm.Store(true)
	}
	e.mu.Lock()
	e.lowOut, e.lowLast = false, now
	next := LowEvery
	if !e.warm.Load() {
		next = max(e.asyncMin()/4, time.Millisecond)
	}
	e.lowAt = now.Add(next)
	e.mu.Unlock()
}

// asyncShare is the largest cost a server admits of one key of shape sh without asking
// Redis: its share of the burst, at least 1.
func (sh *Shape) asyncShare() int {
	c := sh.lease.Load()
	servers := max(c.Servers, 1)
	return max(1, (sh.cfg.Burst+servers-1)/servers)
}

// trusts reports whether the request of cost n for the key of entry en, of shape sh, is
// admitted now and charged later; it requires that the key's lock is held.
func (lm *Limit) trusts(en *entry, sh *Shape, t time.Time, n int) bool {
	if sh.cfg.Async <= 0 || en.charging || en.flight != nil || n <= 0 || n > sh.asyncShare() {
		return false
	}
	e := lm.e
	if !e.warm.Load() {
		return false // a server that just started knows no key as low yet
	}
	if e.open != nil && e.open() {
		return false // its charge could not go: the policy decides
	}
	return !lm.low.low(en.key, t)
}

// oweAsync queues the charge of n tokens the async admission of key (shape sh) at now
// admitted, due at now + Async if no charge is due earlier.
func (e *Engine) oweAsync(lm *Limit, sh *Shape, key string, n int, now time.Time) {
	e.mu.Lock()
	if e.finished {
		e.mu.Unlock()
		lm.stats.forgiven.Add(int64(n))
		return
	}
	e.addDebt(lm, sh, key, n, 0, false, true)
	lm.stats.owed.Add(int64(n))
	e.lowNews = true
	wake := false
	if !e.asyncDue && e.asyncAt.IsZero() {
		e.asyncAt = now.Add(sh.cfg.Async)
		wake = true // the driver's next tick must come by then
	}
	e.mu.Unlock()
	if wake {
		e.wake()
	}
}

// asyncCharged feeds the answer of an async charge back: the key's bucket holds remaining
// tokens (noted if low), and this server may admit the key without asking again.
func (lm *Limit) asyncCharged(sh *Shape, key string, remaining float64, now time.Time) {
	lm.low.note(sh, key, remaining, now)
	lm.keys.Peek(key, func(en *entry, _ time.Time) { en.charging = false })
}
