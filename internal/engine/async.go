package engine

import (
	"sync"
	"time"
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

// lowKeys is the set of keys of one limit whose bucket the last answer this server had
// found below half its burst, each with the instant of that answer. A key stays low
// until an answer finds its bucket at half its burst or more (a refill's: a low key's
// requests go the exact way, which asks), or until lowMemory passed without an answer:
// a low key that was let go of at its expiry would be admitted again by every server at
// once. The set outlives the keys' entries, which a store lets go of when they are idle:
// a key seen once a second by each of 200 servers is low fleet-wide, and each of those
// servers must remember it between its requests.
type lowKeys struct {
	mu    sync.Mutex
	at    map[string]time.Time // guarded by mu
	sweep time.Time            // when the forgotten keys were last dropped; guarded by mu
}

// lowMemory is how long a server remembers a key low after the last answer that said so.
const lowMemory = 30 * time.Second

// maxLowKeys bounds the low keys one limit remembers; past it, the keys not yet low are
// not noted (their next requests are admitted, and charged: what a key forgets costs is
// an admission per server, as a new key does).
const maxLowKeys = 100_000

// low reports whether key is low at now.
func (s *lowKeys) low(key string, now time.Time) bool {
	s.mu.Lock()
	at, ok := s.at[key]
	s.mu.Unlock()
	return ok && now.Sub(at) < lowMemory
}

// note records what an answer at now said of key's bucket: remaining tokens, of shape
// sh. Below half the burst, the key is low; at half or more, it is not.
func (s *lowKeys) note(sh *Shape, key string, remaining float64, now time.Time) {
	low := remaining < float64(sh.cfg.Burst)/2
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.at[key]; ok || !low {
		if low {
			s.at[key] = now
		} else {
			delete(s.at, key)
		}
		return
	}
	if s.at == nil {
		s.at = make(map[string]time.Time)
	}
	if len(s.at) >= maxLowKeys && now.Sub(s.sweep) >= time.Second {
		s.sweep = now
		for k, at := range s.at {
			if now.Sub(at) >= lowMemory {
				delete(s.at, k)
			}
		}
	}
	if len(s.at) < maxLowKeys {
		s.at[key] = now
	}
}

// size returns the number of keys noted (forgotten ones included until a sweep).
func (s *lowKeys) size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.at)
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
	first := e.firstTick.Load()
	if first == 0 || t.UnixNano() < first+int64(sh.cfg.Async) {
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

// charged feeds the answer of an async charge back: the key's bucket holds remaining
// tokens (noted if low), and this server may admit the key without asking again.
func (lm *Limit) asyncCharged(sh *Shape, key string, remaining float64, now time.Time) {
	lm.low.note(sh, key, remaining, now)
	lm.keys.Peek(key, func(en *entry, _ time.Time) { en.charging = false })
}
