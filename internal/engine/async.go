package engine

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// A limit with Async set ("charge later") admits a request its lease cannot serve
// without asking Redis, when nothing this server knows says the key's bucket is low,
// and charges it to the bucket afterwards: within an Async of the first of them (at an
// instant drawn in its second half, see charge), one pipelined round trip carries the
// charges of all the keys admitted so (debt trips, each item a refund of
// -n, as FailLocal's debts are). The answers say how many tokens each bucket holds,
// and so do the answers of the refills: a bucket found holding less than its low level
// (Shape.lowLevel: a server's share of the burst, c = max(1, ceil(Burst/servers)), or
// a token a server in a fleet of fewer servers than c) marks its key low (see lowKeys),
// and a low key's requests go the exact way (the lease, waiting for a refill).
//
// A server holds at most one admission of a key uncharged at a time, of a cost of at
// most c; it admits none before its low-key exchange at half an Async after its first
// request its lease could not serve, none while its breaker is open, and none of a key whose lease took from the
// bucket within its lifetime (that lease serves the key). So the fleet's uncharged admissions of one key are at most S·c at any instant
// (S servers): that is what a key can exceed the exact bound 2·burst + rate·W by, and
// only until the charges of the servers that did not know it was low arrive. The
// charges themselves follow the bucket, as refunds of -n, down to -(burst +
// rate·DebtWindow).

// chargeLater is the spill of the charge-later kind (a bucket kind, see kind.go): one
// limit's low keys, and its part of the engine-wide schedule (laterSched).
type chargeLater struct {
	lm  *Limit
	low lowKeys
}

// chargeLater returns the limit's charge-later state, nil for a limit of another kind.
func (lm *Limit) chargeLater() *chargeLater {
	if b, ok := lm.kind.(*bucket); ok {
		c, _ := b.spill.(*chargeLater)
		return c
	}
	return nil
}

// laterSched is the engine-wide part of the charge-later kind: when the low-key
// exchanges and the charges go. Its atomics are read under a key's lock; the other
// fields are guarded by Engine.mu.
type laterSched struct {
	openSeen atomic.Bool // the breaker was open when Next last asked
	// asyncStart is the instant (Unix nanoseconds) of the first request of a
	// charge-later limit that its lease could not serve, 0 before it: the low-key
	// exchanges start from it. lowActive reports such a request since the last exchange.
	asyncStart atomic.Int64
	lowActive  atomic.Bool

	// uncharged counts the keys admitted uncharged and not charged yet, of every
	// charge-later limit (lowKeys.uncharged): at most maxDebtKeys, the bound of charges,
	// so that the charge of every admission uncharged finds room there. A charge
	// forgiven for want of room would free its key, to be admitted uncharged, and
	// forgiven, again and again.
	uncharged atomic.Int64

	charges  owed      // the charges of admissions made uncharged, owed to the buckets (debt.go)
	asyncAt  time.Time // when the queued charges are due; zero: none queued
	asyncDue bool      // charges are due: the debts go, whether Redis answered or not
	lowAt    time.Time // the next low-key exchange; zero: none planned
	lowDue   bool      // a low-key exchange is due
	lowOut   bool      // a low-key exchange is out
	lowNow   time.Time // the Tick that made it due
	lowLast  time.Time // when the last one was answered
	lowNews  bool      // a charge-later admission since the last one
	lowPhase float64   // this server's pace of the exchanges after the last, in [0.5, 1.5): servers started together drift apart
	lowFails int       // exchanges failed in a row
	// redisOff is Redis's clock minus this server's, in nanoseconds, as the last answered
	// take measured it (its Grant.At against the instant its answer was read; 0 before
	// one): a read of the low keys judges marks by Redis's clock, which set them.
	redisOff atomic.Int64
}

// lowKeys is what this server knows of one limit's keys for Async: the keys it knows
// low, the keys it admitted and has not charged yet, the marks and unmarks it owes the
// fleet's low-key set, and whether it has heard from that set since it started.
//
// A key is low when the last answer this server had for it (a refill's or a charge's)
// found its bucket below its low level (Shape.lowLevel), or when the fleet's low-key set
// (luascript.Low) says some server did and this server's own answers have not said
// otherwise for LowShare. A key stays low until an answer finds its low level or more
// in its bucket (a refill's: a low
// key's requests go the exact way, which asks), until the fleet's set no longer marks a
// key this server only learnt from it, or until lowMemory passed without news: a low key
// that was let go of at an expiry would be admitted again by every server at once. The
// set outlives the keys' entries, which a store lets go of when they are idle: a key
// seen once a second by each of 200 servers is low fleet-wide, and each of those servers
// must remember it between its requests.
//
// The keys this server finds low go to the fleet's set with its next low-key exchange
// (a LowTrip, see scheduleLow), and again when found low LowShare/2 after, so that a
// server that starts, or has not seen a key yet, learns of it before it admits it; a key
// this server finds holding its low level or more again is unmarked there.
//
// Its mutex is the innermost lock of the engine (see the package documentation).
type lowKeys struct {
	mu        sync.Mutex
	keys      map[string]lowMark  // the keys known low, and those found high after; guarded by mu
	learnt    map[string]int      // the keys known low from the fleet's sets only, and the set each was learnt from; guarded by mu
	uncharged map[string]struct{} // keys admitted and not charged yet; guarded by mu
	pend      map[string]bool     // keys to mark (true) or unmark (false) in the fleet's set, the last word of each; guarded by mu
	pendOrder []string            // pend's keys, in the order first queued (a key dropped from pend may stay, skipped); guarded by mu
	pendMarks int                 // the marks in pend; guarded by mu
	backlog   bool                // the last exchange left some of pend for the next (maxLowSend); guarded by mu
	sets      []lowSet            // by set of the fleet's (wire.LowShard), what this server heard from it; guarded by mu
	sweep     time.Time           // when the forgotten keys were last dropped; guarded by mu
	shards    int                 // the sets of the limit's marks (LimitConfig.LowShards, 0 or 1: one); fixed
	total     *atomic.Int64       // the engine's count of keys uncharged, every limit's (laterSched.uncharged); fixed
}

// lowSet is what a server heard from one set of the fleet's low keys: when it last
// answered an exchange, and whether one after the server's warm-up was answered.
type lowSet struct {
	heard time.Time
	warm  bool
}

// lowMark is what a server knows of a key that was low: when it last heard so (its own
// answer, or the fleet's set), when the fleet last heard so (this server marked it, or
// learnt it from the set), and when its own answer last found its low level or more in the
// bucket.
type lowMark struct{ at, shared, high time.Time }

// Low-key timings and bounds.
const (
	// lowMemory is how long a server remembers a key low after the last news of it.
	lowMemory = 30 * time.Second
	// LowShare is how long the fleet's set keeps a mark (luascript.Low's memory); a server
	// marks a key it still finds low again after half of it, and an answer of its own
	// that found its low level or more in the bucket outweighs the set for that long.
	LowShare = 10 * time.Second
	// LowEvery is how often a warm server exchanges low keys with the fleet while it
	// admits keys uncharged; LowShare/2 while marks wait, LowShare while its requests
	// ask more than their leases; never while they do not: each at the server's own
	// pace, ×[0.5, 1.5) (scheduleLow).
	LowEvery = time.Second
	// lowStale is how long a server's knowledge of a set of the fleet's low keys lasts
	// without an answer from it: past it, it admits none of the set's keys uncharged until
	// the set answers again. A server that asks more than its leases exchanges at least
	// every 1.5·LowShare.
	lowStale = 2 * LowShare
	// maxLowKeys bounds the low keys one limit remembers; past it, the keys not yet low
	// are not noted (their next requests are admitted, and charged: what a key forgets
	// costs an admission per server, as a new key does). maxLowMarks bounds the marks
	// and unmarks waiting for the next exchange. maxLowReply is the most keys luascript.Low
	// answers. maxLowSend is the most marks and unmarks of one limit an exchange carries,
	// about 3 ms of Redis's time (wire.MaxLowWrite): many more would keep the exchange
	// past the breaker's timeout, to fail and go again whole; the rest go with the next
	// exchanges, a LowEvery apart.
	maxLowKeys  = 100_000
	maxLowMarks = 10_000
	maxLowReply = wire.MaxLowReply
	maxLowSend  = 2 * wire.MaxLowWrite
)

// admit reports whether key, of a limit with Async, may be admitted uncharged at now:
// this server heard from the key's set of the fleet's since it started, and within
// lowStale, knows the key not low, and holds no admission of it uncharged, and the
// engine's count of keys uncharged (total) is below maxDebtKeys. If so the key counts as
// uncharged, here and in total, until charged. A set whose master
// does not answer thus costs its keys their uncharged admissions once lowStale has
// passed, and no other key.
func (s *lowKeys) admit(key string, now time.Time) bool {
	set := wire.LowShard(key, s.shards) // shards is fixed: hashed outside the lock
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.fresh(set, now) {
		return false
	}
	if m, ok := s.keys[key]; ok && m.isLow(now) {
		return false
	}
	if _, ok := s.uncharged[key]; ok {
		return false
	}
	if s.total.Add(1) > maxDebtKeys {
		s.total.Add(-1)
		return false
	}
	if s.uncharged == nil {
		s.uncharged = make(map[string]struct{})
	}
	s.uncharged[key] = struct{}{}
	return true
}

// charged records that key's admission was charged (or will never be): it may be
// admitted uncharged again, and no longer counts in total.
func (s *lowKeys) charged(key string) {
	s.mu.Lock()
	if _, ok := s.uncharged[key]; ok {
		delete(s.uncharged, key)
		s.total.Add(-1)
	}
	s.mu.Unlock()
}

func (m lowMark) isLow(now time.Time) bool { return m.at.After(m.high) && now.Sub(m.at) < lowMemory }

// set returns what this server heard from set i of the fleet's. It requires that s.mu is
// held.
func (s *lowKeys) set(i int) *lowSet {
	if s.sets == nil {
		s.sets = make([]lowSet, max(s.shards, 1))
	}
	return &s.sets[i]
}

// fresh reports whether the server heard from set i of the fleet's after its warm-up,
// and within lowStale of now. It requires that s.mu is held.
func (s *lowKeys) fresh(i int, now time.Time) bool {
	st := s.set(i)
	return st.warm && now.Sub(st.heard) < lowStale
}

// note records what an answer at now said of key's bucket: remaining tokens, of shape
// sh. Below its low level (Shape.lowLevel), the key is low (and marked for the fleet
// if the fleet has not heard so for LowShare/2). At that level or more it is not (and
// unmarked in the fleet's set if it may be marked there; a mark not sent yet is
// dropped).
func (s *lowKeys) note(sh *Shape, key string, remaining float64, now time.Time) {
	low := remaining < float64(sh.lowLevel())
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.keys[key]
	delete(s.learnt, key) // this server's own answer
	if !low {
		if ok {
			if now.Sub(m.shared) < LowShare {
				s.queue(key, false)
			} else if s.pend[key] {
				s.unqueue(key) // a mark that waited this long: the set has no mark of it to undo
			}
			m.high, m.shared = now, time.Time{}
			s.keys[key] = m
		}
		return
	}
	if !ok && !s.room(now) {
		return
	}
	m.at = now
	if now.Sub(m.shared) >= LowShare/2 && s.queue(key, true) {
		m.shared = now
	}
	s.keys[key] = m
}

// learn records the keys set shard of the fleet's sets marks low, at now: each is low
// here unless this server's own answer found it holding its low level or more within
// LowShare. A key of that set this server knew low from the sets only, and that the set
// no longer marks, is not, unless the answer was cut at maxLowReply keys.
func (s *lowKeys) learn(shard int, ids []redisstore.KeyID, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.set(shard).heard = now
	if s.learnt == nil {
		s.learnt = make(map[string]int)
	}
	marked := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		k := string(id)
		marked[k] = struct{}{}
		m, ok := s.keys[k]
		if !ok && !s.room(now) || ok && now.Sub(m.high) < LowShare {
			continue
		}
		if !ok || !m.isLow(now) {
			s.learnt[k] = shard
		}
		m.at, m.shared = now, now
		s.keys[k] = m
	}
	if len(ids) >= maxLowReply {
		return
	}
	for k, from := range s.learnt {
		if _, ok := marked[k]; !ok && from == shard {
			delete(s.learnt, k)
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
				delete(s.learnt, k)
			}
		}
	}
	return len(s.keys) < maxLowKeys
}

// queue notes that key is to be marked (or unmarked) in the fleet's set at the next
// exchange, and reports whether it was: a key found low and high again in between is
// sent once, as it was last found, whatever the exchanges' pace. Marks and unmarks are
// bounded apart, maxLowMarks each; a word past its bound is not noted, and the other
// word of the key, out of date, is dropped. It requires that s.mu is held.
func (s *lowKeys) queue(key string, mark bool) bool {
	old, ok := s.pend[key]
	if ok && old == mark {
		return true
	}
	if n := s.pendMarks; mark && n >= maxLowMarks || !mark && len(s.pend)-n >= maxLowMarks {
		s.unqueue(key)
		return false
	}
	if !ok {
		if s.pend == nil {
			s.pend = make(map[string]bool)
		}
		s.pendOrder = append(s.pendOrder, key)
	} else if old {
		s.pendMarks--
	}
	if mark {
		s.pendMarks++
	}
	s.pend[key] = mark
	return true
}

// unqueue drops key's word for the next exchange, if any. It requires that s.mu is held.
func (s *lowKeys) unqueue(key string) {
	if mark, ok := s.pend[key]; ok {
		if mark {
			s.pendMarks--
		}
		delete(s.pend, key)
	}
}

// exchanges appends to out the limit's part of a LowTrip, and forgets the marks and
// unmarks it sends: an exchange with each of the limit's sets, carrying the marks and
// unmarks of that set's keys (wire.LowShard), the first maxLowSend of them in the order
// queued (the others wait for the next exchange: backlog). Each server reads every set
// at each exchange, as it reads the one set of a limit on one Redis, so that a mark
// reaches the fleet as soon whatever the sets; a set with nothing to write is only read
// (LowExchange.ReadOnly), a plain command's work.
func (s *lowKeys) exchanges(out []LowExchange, limit string, cl *chargeLater) []LowExchange {
	s.mu.Lock()
	defer s.mu.Unlock()
	first, shards := len(out), max(s.shards, 1)
	for i := range shards {
		out = append(out, LowExchange{LowSet: redisstore.LowSet{Limit: limit, Shards: shards, Shard: i}, cl: cl})
	}
	sent, left := 0, s.pendOrder[:0] // left overwrites only what was read
	for _, k := range s.pendOrder {
		w, ok := s.pend[k]
		switch {
		case !ok:
			continue // dropped, or sent already (a key queued again after a drop)
		case sent == maxLowSend:
			left = append(left, k)
			continue
		}
		x := &out[first+wire.LowShard(k, shards)]
		if w {
			x.Mark = append(x.Mark, redisstore.KeyID(k))
			s.pendMarks--
		} else {
			x.Unmark = append(x.Unmark, redisstore.KeyID(k))
		}
		delete(s.pend, k)
		sent++
	}
	clear(s.pendOrder[len(left):]) // let go of the keys sent
	s.pendOrder, s.backlog = left, len(left) > 0
	return out
}

// requeue puts back the marks and unmarks of an exchange that failed, but for the keys
// found since, whose last word is newer.
func (s *lowKeys) requeue(mark, unmark []redisstore.KeyID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, ids := range [][]redisstore.KeyID{mark, unmark} {
		for _, id := range ids {
			if _, ok := s.pend[string(id)]; !ok {
				s.queue(string(id), i == 0)
			}
		}
	}
}

// pending reports whether marks or unmarks wait, whether some of them had no room in
// the last exchange (backlog), whether the limit is warm (it heard from each of the
// fleet's sets after its warm-up), and whether what it heard from one went stale by now.
func (s *lowKeys) pending(now time.Time) (marks, backlog, warm, stale bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	warm = true
	for i := range max(s.shards, 1) {
		warm, stale = warm && s.set(i).warm, stale || !s.fresh(i, now)
	}
	return len(s.pend) > 0, s.backlog && len(s.pend) > 0, warm, warm && stale
}

// setWarm records that set shard of the fleet's answered an exchange after the server's
// warm-up.
func (s *lowKeys) setWarm(shard int) {
	s.mu.Lock()
	s.set(shard).warm = true
	s.mu.Unlock()
}

// LowExchange is one limit's part of a LowTrip with one of its sets (LowSet: set Shard
// of the limit's Shards, LowShards): the keys of that set this server found low, to mark
// there, and those it found holding their low level or more, to unmark there, with
// ReadAt Redis's clock as this server estimates it (redisstore.Store.LowBatch with
// memory LowShare), and, written by the driver once the call returned, the keys the set
// marks (Got) or the error.
type LowExchange struct {
	redisstore.LowSet
	Got []redisstore.KeyID
	Err error

	cl *chargeLater
}

// asyncMin returns the shortest Async of the engine's limits, 0 if none has one.
func (e *Engine) asyncMin() time.Duration {
	var m time.Duration
	for _, lm := range e.Limits() {
		if a := lm.Config().Async; lm.chargeLater() != nil && (m == 0 || a < m) {
			m = a
		}
	}
	return m
}

// scheduleLow plans the low-key exchanges (Tick). The first comes at a quarter of the
// shortest Async after the first request of a limit with Async that its lease could not
// serve and that it could have admitted uncharged (asyncStart), the next at half of it
// (the first whose answer makes a limit warm: every server started with it has marked
// the keys it found low by then). After that, at this server's pace (lowPace, ×[0.5,
// 1.5)): every LowEvery while it admits keys uncharged or has a limit not warm (one
// added since); LowShare/2 after the last while marks or unmarks wait; LowShare after the
// last, or at once if its knowledge went stale (lowStale), if a request asked more than
// its lease since; and not at all otherwise. A server whose leases serve every request, or
// that serves none, has no use for the fleet's low keys, and the fleet learns a key low
// from the servers that admit it uncharged: they find it so themselves. An exchange no
// set answered (or, before every set is warm, one some set did not) goes again a quarter
// of an Async later, then twice as late each time, up to LowEvery; once warm, one some
// set answered keeps the pace (the others' marks wait for it). It requires that e.mu is held, and reports whether one is due now.
func (e *Engine) scheduleLow(now time.Time, async time.Duration) bool {
	if async == 0 || e.stopped {
		e.cl.lowAt, e.cl.lowDue = time.Time{}, false
		return false
	}
	if e.cl.lowOut {
		return false
	}
	if e.cl.lowAt.IsZero() && !e.cl.lowDue {
		start := e.cl.asyncStart.Load()
		if start == 0 {
			return false // no request has asked more than its lease yet
		}
		e.cl.lowAt = time.Unix(0, start).Add(async / 4)
	}
	asked := e.cl.lowActive.Load()
	if asked && e.cl.lowFails == 0 && now.Before(e.cl.lowAt) && !e.cl.lowLast.IsZero() && now.Sub(e.cl.lowLast) >= lowStale {
		e.cl.lowAt = now // asked, with stale knowledge: the exchange is due now
	}
	if e.cl.lowAt.IsZero() || now.Before(e.cl.lowAt) {
		return false
	}
	marks, backlog, warm, stale := e.lowState(now)
	since := now.Sub(e.cl.lowLast)
	due := !warm || e.cl.lowNews || backlog || marks && since >= e.lowPace(LowShare/2) ||
		asked && (stale || since >= e.lowPace(LowShare))
	if !due {
		// Nothing admitted uncharged since the last exchange, and every limit warm: the
		// fleet's news and this server's marks can wait.
		e.cl.lowAt = now.Add(e.lowPace(LowEvery))
		return false
	}
	e.cl.lowDue, e.cl.lowAt, e.cl.lowNews = true, time.Time{}, false
	e.cl.lowActive.Store(false)
	return true
}

// lowState reports whether a limit with Async has marks or unmarks to send, whether
// one has some the last exchange had no room for, whether every limit with Async is
// warm, and whether one's knowledge went stale by now.
func (e *Engine) lowState(now time.Time) (marks, backlog, warm, stale bool) {
	warm = true
	for _, lm := range e.Limits() {
		if cl := lm.chargeLater(); cl != nil {
			m, b, w, st := cl.low.pending(now)
			marks, backlog, warm, stale = marks || m, backlog || b, warm && w, stale || st
		}
	}
	return marks, backlog, warm, stale
}

// lowDue reports whether a low-key exchange is due. It requires that e.mu is held.
func (e *Engine) lowDue() bool { return e.cl.lowDue }

// lowTrip returns the low-key exchange of every charge-later limit. It requires that
// e.mu is held.
func (e *Engine) lowTrip() *Trip {
	now := e.cl.lowNow
	t := &Trip{Kind: LowTrip}
	for _, lm := range e.Limits() {
		if cl := lm.chargeLater(); cl != nil {
			t.Lows = cl.low.exchanges(t.Lows, lm.name, cl)
		}
	}
	for i := range t.Lows {
		t.Lows[i].ReadAt = now.Add(time.Duration(e.cl.redisOff.Load()))
	}
	e.cl.lowDue, e.cl.lowOut = false, true
	t.warms = !now.Before(time.Unix(0, e.cl.asyncStart.Load()).Add(e.asyncMin() / 2))
	return t
}

// lowDone takes the answer of a low-key exchange: the keys the fleet's sets mark are low
// here too, and a set that answered an exchange after the server's warm-up is warm (a
// limit, once all its sets are); the marks of a set whose exchange failed go again with
// the next. The next exchange comes LowEvery later once every limit is warm, a quarter of
// an Async later until then.
func (e *Engine) lowDone(now time.Time, t *Trip) {
	ok := t.Answered // each exchange's Got or Err holds its answer
	all, some := ok, false
	for _, x := range t.Lows {
		if !ok || x.Err != nil {
			x.cl.low.requeue(x.Mark, x.Unmark)
			all = false
			continue
		}
		some = true
		x.cl.low.learn(x.Shard, x.Got, now)
		if t.warms {
			x.cl.low.setWarm(x.Shard)
		}
	}
	e.mu.Lock()
	e.cl.lowOut = false
	e.cl.lowPhase = 0.5 + uniform(&e.rng)
	next := e.lowPace(LowEvery)
	if some {
		// Heard from the fleet: a set that did not answer goes stale alone (admit), and
		// asking again at once would not make its master answer.
		e.cl.lowLast = now
	}
	_, _, warm, _ := e.lowState(now)
	switch {
	case all:
		e.cl.lowFails = 0
		if !warm {
			next = max(e.asyncMin()/4, time.Millisecond)
		}
	case some && warm:
		// The sets that did not answer keep their marks for the next exchange, at the
		// usual pace: asking them sooner would not make their masters answer.
		e.cl.lowFails = 0
	default:
		// Due again (lowNews), a quarter of an Async later, then twice as late each time.
		e.cl.lowNews = true
		next = min(max(e.asyncMin()/4, time.Millisecond)<<min(e.cl.lowFails, 16), LowEvery)
		e.cl.lowFails++
	}
	e.cl.lowAt = now.Add(next)
	e.mu.Unlock()
}

// lowPace is d at this server's pace of the exchanges (lowPhase): the servers of a fleet
// started together make their warm-up exchanges together, and would make every later one
// together too, the Redis work of all of them at once. It requires that e.mu is held.
func (e *Engine) lowPace(d time.Duration) time.Duration {
	if e.cl.lowPhase == 0 {
		return d
	}
	return time.Duration(float64(d) * e.cl.lowPhase)
}

// asyncShare is the largest cost a server admits of one key of shape sh without asking
// Redis: its share of the burst, at least 1.
func (sh *Shape) asyncShare() int {
	return shareOf(sh.cfg.Burst, max(sh.lease.Load().Servers, 1))
}

// shareOf is a server's share of burst over servers, at least 1: c = ceil(burst/servers).
func shareOf(burst, servers int) int { return max(1, (burst+servers-1)/servers) }

// lowLevel is the fewest tokens a charge-later key's bucket holds and is not low:
// one server's share c (asyncShare), so that one more server can be served from it, or
// one token a server if the fleet's servers are fewer than c, so that each server's one
// uncharged admission of a token can be. A small fleet's share is most of the burst: a
// key is not low merely for having been used.
func (sh *Shape) lowLevel() int {
	servers := max(sh.lease.Load().Servers, 1) // one load: both from one fleet size
	return min(shareOf(sh.cfg.Burst, servers), servers)
}

// trusts reports whether the request of cost n for the key of entry en, of shape sh,
// which its lease cannot serve, is admitted now and charged later, and if so counts the
// key uncharged; it requires that the key's lock is held. It also records, for the
// low-key exchanges, that a request of a charge-later limit asked more than its lease and
// could have been admitted so (a cost within the server's share), and reports whether
// that request was the first (started: the driver must be woken to plan them). The
// breaker's state is the one the driver's loop last saw (Engine.open is not called
// under a key's lock).
func (c *chargeLater) trusts(en *entry, sh *Shape, t time.Time, n int) (ok, started bool) {
	if n <= 0 || n > sh.asyncShare() {
		return false, false
	}
	if e := c.lm.e; !e.cl.lowActive.Load() {
		started = e.cl.asyncStart.CompareAndSwap(0, t.UnixNano())
		e.cl.lowActive.Store(true)
	}
	if en.flight != nil || c.lm.e.cl.openSeen.Load() {
		return false, started
	}
	if en.lease.tookWithin(t, sh.lease.Load().Lifetime) || en.lease.lifeFrom(t) > 0 {
		return false, started // its lease is in use here: it serves the key, at no extra call
	}
	return c.low.admit(en.key, t), started
}

// note records what a refill's answer said of the key's bucket (lowKeys.note).
func (c *chargeLater) note(sh *Shape, key string, remaining float64, now time.Time) {
	c.low.note(sh, key, remaining, now)
}

// charge queues the charge of n tokens the admission of key (shape sh) at now admitted,
// due at an instant drawn in [now + Async/2, now + Async) if no charge is due earlier.
func (c *chargeLater) charge(sh *Shape, key string, n int, now time.Time) {
	lm, e := c.lm, c.lm.e
	e.mu.Lock()
	added, ok := 0, false
	if !e.finished {
		added, ok = e.cl.charges.add(lm, sh, key, n, 0, false, &e.debtSeq, c)
	}
	if !ok {
		if e.finished {
			lm.stats.forgiven.Add(int64(n))
		}
		e.mu.Unlock()
		c.low.charged(key) // forgiven: nothing will charge it
		return
	}
	lm.stats.owed.Add(int64(added))
	e.cl.lowNews = true
	wake := false
	if e.stopped {
		// Admitted while the server shuts down (Close waits for lingering takes after
		// Stop): no Tick will make it due, so it is due now, as Stop made the others.
		e.cl.asyncDue, e.cl.asyncAt = true, time.Time{}
	} else if !e.cl.asyncDue && e.cl.asyncAt.IsZero() {
		// Due at an instant drawn anew for every batch in the second half of an Async:
		// servers that admit together (started at once, or serving requests spread
		// evenly over them) would otherwise send their batches together every Async, a
		// burst of scripts in which Redis keeps the last past its timeout.
		e.cl.asyncAt = now.Add(time.Duration(float64(sh.cfg.Async) * (0.5 + 0.5*uniform(&e.rng))))
		wake = true // the driver's next tick must come by then
	}
	e.mu.Unlock()
	if wake {
		e.wake()
	}
}

// undo takes back the charge of n tokens of key (shape sh) that an admission uncharged
// queued, for a caller that gives the admission back (Engine.Return): off the
// queued charges while it waits there, and then, its charge gone, the key may be
// admitted uncharged again; a charge already sent (it is answered, or goes again, under
// its number) is made good by a refund of n. It returns the tokens refunded: a charge
// taken off the queue moved no token of a lease's or the bucket's.
func (c *chargeLater) undo(sh *Shape, key string, n int) int {
	lm, e := c.lm, c.lm.e
	e.mu.Lock()
	x, left := e.cl.charges.settle(lm, key, n)
	e.mu.Unlock()
	if x > 0 {
		lm.stats.owed.Add(-int64(x))
		if left == 0 {
			c.low.charged(key)
		}
	}
	if x < n {
		e.queueRefund(lm, sh, key, n-x)
	}
	return n - x
}

// charged takes the answer of a charge of key (the bucket's shape sh, nil if the limit
// no longer has it): answered, the bucket held remaining; either way, the key may be
// admitted uncharged again.
func (c *chargeLater) charged(sh *Shape, key string, answered bool, remaining float64, now time.Time) {
	if answered && sh != nil {
		c.low.note(sh, key, remaining, now)
	}
	c.low.charged(key)
}

// noteOpen records the breaker's state for the charge-later admissions, which do not
// call it (Next, under e.mu).
func (e *Engine) noteOpen() {
	if e.open != nil && e.asyncMin() > 0 {
		e.cl.openSeen.Store(e.open())
	}
}

// tickLater makes the charges due at now if their time came, and plans the low-key
// exchanges (scheduleLow); it reports whether either is due. It requires e.mu.
func (e *Engine) tickLater(now time.Time) bool {
	due := false
	if !e.cl.asyncAt.IsZero() && !now.Before(e.cl.asyncAt) {
		e.cl.asyncDue, due = true, true
		e.cl.asyncAt = time.Time{}
	}
	if e.scheduleLow(now, e.asyncMin()) {
		e.cl.lowNow, due = now, true
	}
	return due
}

// laterNextTick is the earliest of t and when tickLater next has work. It requires e.mu.
func (e *Engine) laterNextTick(t time.Time) time.Time {
	if !e.cl.asyncAt.IsZero() && e.cl.asyncAt.Before(t) {
		t = e.cl.asyncAt
	}
	if !e.cl.lowAt.IsZero() && !e.stopped && e.cl.lowAt.Before(t) {
		t = e.cl.lowAt
	}
	return t
}

// stopLater ends the low-key exchanges and makes the charges due now (Stop), those a
// failed charge trip held back too: no Tick ends their wait (debtRetry) after Stop, and
// the shutdown's trips are their last chance. FailLocal's debts no longer wait for a
// trip Redis answered (debtsMayGo), nor for a spread after one: Close sends them once
// the breaker lets a probe through. It requires e.mu.
func (e *Engine) stopLater() {
	e.cl.lowDue, e.cl.lowAt = false, time.Time{}
	e.debtHoldUntil, e.debtSpreadUntil = time.Time{}, time.Time{}
	if e.cl.charges.len() > 0 || len(e.debtRetry) > 0 {
		e.cl.asyncDue, e.cl.asyncAt = true, time.Time{}
	}
}

// dueCharges returns the charges if they are due, nil if not. It requires e.mu.
func (e *Engine) dueCharges() *owed {
	if e.cl.asyncDue {
		return &e.cl.charges
	}
	return nil
}

// chargesSent ends the charges' turn once none is left to send (debtTrip): the next
// admission uncharged waits its Async again. It requires e.mu.
func (e *Engine) chargesSent() {
	if e.cl.charges.len() == 0 && len(e.debtRetry) == 0 {
		e.cl.asyncDue = false
	}
}

// forgiveCharges drops every charge not sent (Finish), counted in LimitStats.Forgiven,
// and returns their tokens. It requires e.mu.
func (e *Engine) forgiveCharges() int { return e.cl.charges.forgive() }
