package engine

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/internal/keystore"
	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// Flight is one refill on its way to Redis and back, and the requests waiting for it.
type Flight struct {
	lim       *Limit
	b         *bucket // the limit's kind
	shape     *Shape  // the key's shape when the refill started
	key       string  // the key's ID
	seq       uint64  // the lease's
	rseq      uint64  // Redis's: the take's sequence number, chosen when the trip is built
	want, min int
	floor     int // a claim's (Engine.Claim): how far below zero it may take the bucket; 0 for a refill
	seen      wire.Seen
	// lost: its take timed out, so Redis may have run it, and its answer may still come
	// (Engine.Late), which clears it; owed is then what the failure policy admitted to
	// its waiters, which that answer pays for first, and resend that its number is sent
	// again (Lease.Lost) so that a later take may read the grant instead. owed and
	// resend are written under the key's lock.
	lost   atomic.Bool
	owed   int
	resend bool
	again  bool // sent again under the number of a take whose answer was lost (Refill.Resend)
	// waiters, in the order they came. Appended under the key's store lock while the
	// key's entry holds the flight; taken by whoever detaches the flight from the entry
	// (its answer, its failure) or, once the entry was evicted, by its answer.
	waiters []*Waiter
}

// Waiter is a request waiting for a refill. The engine decides it when the refill is
// answered or fails, or when the driver gives up on it (GiveUp); Done is closed then.
type Waiter struct {
	lim  *Limit
	tier string
	key  string // the key's ID
	n    int
	ch   chan struct{} // closed once decided
	// claim: the waiter of a claim (Engine.Claim), which no policy decides and no
	// counter counts.
	claim bool

	mu sync.Mutex
	// The fields below are guarded by mu, which is taken before the key's store lock.
	decided bool
	d       Decision
}

// Done is closed once the request is decided.
func (w *Waiter) Done() <-chan struct{} { return w.ch }

// Decision returns the request's decision. It is valid once Done is closed.
func (w *Waiter) Decision() Decision {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.d
}

// Limit returns the limit the request is for.
func (w *Waiter) Limit() *Limit { return w.lim }

// counted counts w's decision in its limit's counters; it requires that w.mu is held and
// w decided.
func (w *Waiter) counted() { w.lim.stats.count(&w.d, w.n) }

// set decides w; it requires that w.mu is held and w undecided.
func (w *Waiter) set(d Decision) {
	w.decided, w.d = true, d
	close(w.ch)
}

// outcome is what decide found, filled in under the key's lock.
type outcome struct {
	d     Decision
	st    Step
	f     *Flight // a refill decide started, to send
	w     *Waiter // the request's waiter, when it must wait
	async int     // tokens admitted to be charged later (spill.charge)
	start bool    // the request started the low-key exchanges (laterSched.asyncStart)
	key   string  // the key's ID, as its entry holds it
	shape *Shape  // the key's shape
}

// refund queues the tokens the lease gives back.
func (o *outcome) refund(e *Engine, lm *Limit) {
	if o.st.Refund > 0 {
		e.queueRefund(lm, o.shape, o.key, o.st.Refund)
	}
}

// Decide decides a request of cost n for key under tier of lm ("" for the limit's own
// rate and burst; a tier the limit does not have is that one too) at now, writing the
// decision to d. now is Unix nanoseconds (time.Time.UnixNano of the driver's clock, whose
// instants must lie in its range, the years 1678 to 2261), where the engine's other
// methods take a time.Time: a lease hit subtracts and compares integers and builds no
// time.Time (docs/hot-path.md). A key decided under another shape than its last (another tier, or a
// configuration SetLimit replaced) is re-shaped first.
// On the common path (the lease holds enough unexpired tokens) it is one pass under the
// key's store lock, with no allocation. When the request must wait for a refill it
// returns a Waiter (and d is only provisional): the driver waits for Waiter.Done, or
// calls GiveUp once the limit's MaxWait has passed or its caller gave up. A negative n is
// denied (ReasonInvalidCost); after Drain requests are denied with ReasonClosed.
//
// The engine keeps key as its ID (wire.KeyID): a key longer than wire.MaxKeyLen, or with
// a brace, is held as the digest its Redis key carries, so a server holds a bounded
// number of bytes per key whatever the keys' length. Such a key costs a SHA-256 and an
// allocation per decision.
func (e *Engine) Decide(now int64, lm *Limit, tier, key string, n int, d *Decision) *Waiter {
	var w *Waiter
	*d, w = lm.kind.decide(now, tier, key, n) // by value: d must not escape through the interface
	return w
}

// bucket is the kinds of limit whose keys each have a token bucket in Redis, served from
// leases: exact and charge-later, which differ only in what they do with a request the
// lease cannot serve (spill). Its keys' entries hold the pre-check, the lease, the
// refill in flight and the requests waiting for it.
type bucket struct {
	lm    *Limit
	spill spill
}

// spill is what a bucket kind does with a request its lease cannot serve, before it asks
// Redis, and with what Redis answers of a key's bucket.
type spill interface {
	// trusts reports whether such a request, of cost n for the key of en (shape sh), is
	// admitted now and charged later, and whether it was the first of the engine to ask
	// more than its lease (the driver must be woken); it requires the key's lock.
	trusts(en *entry, sh *Shape, t time.Time, n int) (ok, started bool)
	// charge queues the charge of n tokens of key (shape sh) that trusts admitted at now.
	charge(sh *Shape, key string, n int, now time.Time)
	// note records what an answer at now (a refill's) said of key's bucket: remaining.
	note(sh *Shape, key string, remaining float64, now time.Time)
	// undo takes back the charge of n tokens of key (shape sh) that trusts admitted, for
	// a caller that gives the admission back, and returns the tokens given back.
	undo(sh *Shape, key string, n int) int
}

// exact is the spill of the exact kind: every request the lease cannot serve asks Redis.
type exact struct{}

func (exact) trusts(*entry, *Shape, time.Time, int) (bool, bool) { return false, false }
func (exact) charge(*Shape, string, int, time.Time)              {}
func (exact) note(*Shape, string, float64, time.Time)            {}
func (exact) undo(*Shape, string, int) int                       { return 0 }

// decide is Decide for a bucket kind.
func (b *bucket) decide(now int64, tier, key string, n int) (Decision, *Waiter) {
	lm, e := b.lm, b.lm.e
	var o outcome
	if !b.decideLocked(&o, now, wire.KeyID(key), tier, n) {
		return Decision{Reason: ReasonClosed, Servers: e.Servers()}, nil
	}
	o.d.Servers = e.Servers()
	o.refund(e, lm)
	var t time.Time // now as a time.Time, for the slow steps that take one
	if o.async > 0 || o.f != nil {
		t = timeAt(now)
	}
	if o.async > 0 {
		b.spill.charge(o.shape, o.key, o.async, t)
	}
	if o.start {
		e.wake() // the driver's next Tick plans the first low-key exchange
	}
	if o.f != nil && e.send(t, o.f, o.w) && o.w != nil {
		// The refill failed at once (breaker open, stopped): the policy decided o.w.
		return o.w.d, nil
	}
	if o.w != nil {
		return o.d, o.w
	}
	lm.stats.count(&o.d, n)
	return o.d, nil
}

// decideLocked is hitKey, or decideKey if the lease cannot serve the request alone, for
// a new request for the key of ID id, under its store lock (Acquire, Touch and Release:
// keystore.Store.Update without the closure and the call a function value costs); it
// reports false, deciding nothing, once the store is closed. A hit leaves o with its
// decision alone, which decide's steps after the lock pass over.
//
// The lock is released by a defer only past the hit (missLocked), so that a panic there
// does not leave the shard locked: hitKey is arithmetic on the key's own fields, with no
// index, division by an integer or pointer that can be nil, and cannot panic, and the
// defer cost a hit 50 to 65 instructions.
func (b *bucket) decideLocked(o *outcome, now int64, id, tier string, n int) bool {
	keys := b.lm.keys
	sh, ke, ok := keys.Acquire(now, id)
	if !ok {
		return false
	}
	en, t := &ke.Val, ke.Touch(now)
	if b.hitKey(&o.d, en, t, tier, n) {
		keys.Release(sh)
		return true
	}
	b.missLocked(o, sh, en, t, tier, n)
	return true
}

// missLocked is decideKey for decideLocked, which holds the lock of shard sh: it releases
// it, by a defer.
func (b *bucket) missLocked(o *outcome, sh *keystore.Shard[entry], en *entry, t int64, tier string, n int) {
	defer b.lm.keys.Release(sh) // a panic must not leave the shard locked
	b.decideKey(o, en, timeAt(t), tier, n, nil)
}

// hitKey is decideKey's common path on its own, for a new request: the key on its
// shape, a lease whose tokens on hand serve the request with nothing else to do
// (Lease.serves), and a pre-check that has its tokens. It reports false, changing
// nothing, for any other request, and otherwise writes the decision to d (a zero one),
// all but its Servers. It requires the key's lock.
func (b *bucket) hitKey(d *Decision, en *entry, t int64, tier string, n int) bool {
	sh := b.lm.cur.Load().of(tier)
	if en.shape != sh {
		return false
	}
	c := sh.lease.Load()
	lt, ok := en.lease.serves(c, t, n)
	if !ok || !en.pre.AllowN(t, n) {
		return false
	}
	d.Allowed, d.Source, d.Reason = true, SourceLease, ReasonLease
	d.Remaining = en.lease.hit(c, lt, n)
	return true
}

// decideKey runs the pre-check and the lease for one request under the key's lock; w is
// the request's waiter when it waited for a refill already (a recheck), nil for a new
// request. On the common path (the lease holds enough unexpired tokens) it is one pass:
// the pre-check takes its tokens, the lease gives its own. Otherwise the pre-check is
// only looked at first, and spends only if the lease allows, so a request the lease
// denies or makes wait costs the pre-check nothing: for one server the default
// pre-check (the fleet's own rate and burst) then never denies what the global bucket
// alone would allow.
func (b *bucket) decideKey(o *outcome, en *entry, t time.Time, tier string, n int, w *Waiter) {
	lm := b.lm
	ns := t.UnixNano() // the pre-check's instant
	sh := lm.cur.Load().of(tier)
	if en.shape != sh {
		lm.reshape(en, sh, ns)
	}
	c := sh.lease.Load()
	o.key, o.shape = en.key, sh
	if en.lease.CanServe(c, t, n) {
		if !en.pre.AllowN(ns, n) {
			o.d = lm.preDenied(en, ns, n)
			return
		}
		en.lease.acquire(c, t, n, &o.st)
		b.decided(o, en, sh, tier, n, w)
		return
	}
	// A cost above the burst can never pass: the lease says so, whatever the
	// pre-check holds.
	if n > 0 && n <= c.Burst && en.pre.TokensAt(ns) < float64(n) {
		o.d = lm.preDenied(en, ns, n)
		return
	}
	var trusted bool
	if w == nil {
		trusted, o.start = b.spill.trusts(en, sh, t, n)
	}
	if trusted {
		en.pre.AllowN(ns, n)
		o.async = n
		// Remaining: nothing here says the key is low, the likeliest is a full bucket.
		o.d = Decision{Allowed: true, Remaining: c.Burst - n, Source: SourceLease, Reason: ReasonAsync}
		return
	}
	if w == nil {
		en.lease.acquire(c, t, n, &o.st)
	} else {
		o.st = en.lease.Recheck(c, t, n)
	}
	if o.st.Action == Allow {
		en.pre.AllowN(ns, n)
	}
	b.decided(o, en, sh, tier, n, w)
}

// decided turns the lease's answer o.st to a request of cost n for the key of en (shape
// sh) into o's decision: a refill it started, the request's wait for one, or, after a
// wait (w), a grant. It requires the key's lock.
func (b *bucket) decided(o *outcome, en *entry, sh *Shape, tier string, n int, w *Waiter) {
	lm := b.lm
	st := &o.st
	o.d = Decision{Allowed: st.Action == Allow, Remaining: st.Remaining, RetryAfter: st.RetryAfter, Source: SourceLease, Reason: st.Reason}
	if st.Refill.Want > 0 {
		o.f = &Flight{lim: lm, b: b, shape: sh, key: en.key, seq: st.Refill.Seq, rseq: st.Refill.Resend, again: st.Refill.Resend != 0, want: st.Refill.Want, min: st.Refill.Min, seen: en.lease.seen()}
		en.flight = o.f
	}
	switch {
	case st.Action == Wait:
		lm.join(o, en, tier, n, w)
	case w != nil: // decided after waiting for a refill
		o.d.Source = SourceGlobal
		if o.d.Allowed {
			o.d.Reason = ReasonGranted
		}
	}
}

// hit is kind.hit for a bucket kind: the first branch of decideKey, a lease that serves
// the request and a pre-check that has its tokens, and nothing else.
func (b *bucket) hit(now int64, tier, id string, n int) (Decision, bool) {
	lm, e := b.lm, b.lm.e
	var o outcome
	if !b.hitLocked(&o, now, id, tier, n) {
		return Decision{}, false
	}
	o.d.Servers = e.Servers()
	o.refund(e, lm)
	if o.f != nil {
		e.send(timeAt(now), o.f, nil) // a refill ahead of need: nobody waits for it
	}
	return o.d, true
}

// hitLocked is hit's part under the key's store lock: it reports whether the lease
// and the pre-check served the request, and fills in o if they did. Its lock goes by a
// defer only past hitKey, as decideLocked's does.
func (b *bucket) hitLocked(o *outcome, now int64, id, tier string, n int) bool {
	lm := b.lm
	ksh, ke, ok := lm.keys.Acquire(now, id)
	if !ok {
		return false
	}
	en, t := &ke.Val, ke.Touch(now)
	if b.hitKey(&o.d, en, t, tier, n) {
		lm.keys.Release(ksh)
		return true
	}
	return b.hitMissLocked(o, ksh, en, t, tier, n)
}

// hitMissLocked is the rest of hitLocked, which holds the lock of shard ksh: a request
// the lease serves that hitKey left to acquire (tokens to refund, a refill to start). It
// releases the lock, by a defer.
func (b *bucket) hitMissLocked(o *outcome, ksh *keystore.Shard[entry], en *entry, t int64, tier string, n int) bool {
	lm := b.lm
	defer lm.keys.Release(ksh) // a panic must not leave the shard locked
	sh := lm.cur.Load().of(tier)
	c := sh.lease.Load()
	tt := timeAt(t)
	if n <= 0 || en.shape != sh || !en.lease.CanServe(c, tt, n) || !en.pre.AllowN(t, n) {
		return false
	}
	o.key, o.shape = en.key, sh
	en.lease.acquire(c, tt, n, &o.st)
	b.decided(o, en, sh, tier, n, nil)
	return true
}

// unhit undoes what hit did at now for a request of tier and cost n for the key of ID
// id, its demand included: the request is decided again, on the full path. Tokens the
// lease no longer holds (they expired meanwhile) go back to Redis under the shape they
// were leased under: the key's, or its tier's when the key is gone.
func (b *bucket) unhit(now int64, tier, id string, n int) {
	back := false
	var sh *Shape // the key's; its tier's when the key is gone (looked up only then)
	b.lm.keys.Peek(id, func(en *entry, last int64) {
		sh = en.shape
		t := now
		if last-now > 0 {
			t = last // the pre-check's clock must not go back
		}
		en.pre.AllowN(t, -n)
		back = en.lease.unhit(timeAt(t), n)
	})
	if !back {
		if sh == nil {
			sh = b.lm.Shape(tier)
		}
		b.lm.e.queueRefund(b.lm, sh, id, n)
	}
}

// join makes the request wait for the key's refill in flight, as waiter w (a new one if
// nil); it requires that the key's lock is held.
func (lm *Limit) join(o *outcome, en *entry, tier string, n int, w *Waiter) {
	if en.flight == nil {
		// The lease waits for a refill its entry no longer holds; it cannot happen,
		// but a request must not wait for nothing: the policy decides it.
		en.lease.Failed(en.lease.seq)
		o.d = Decision{Source: SourceFallback, Reason: ReasonUnavailable}
		return
	}
	if w == nil {
		w = &Waiter{lim: lm, tier: tier, key: en.key, n: n, ch: make(chan struct{})}
	}
	en.flight.waiters = append(en.flight.waiters, w)
	o.w = w
}

// preDenied is the decision of an empty pre-check bucket, for a key with a shape.
func (lm *Limit) preDenied(en *entry, t int64, n int) Decision {
	d := Decision{Source: SourcePreCheck, Reason: ReasonPreCheck, RetryAfter: InfDuration}
	if n <= en.shape.preBurst {
		d.RetryAfter = tokenbucket.Duration(float64(n)-en.pre.TokensAt(t), en.shape.preRate)
	}
	return d
}

// GiveUp ends the wait of w at now, for why: ReasonTimeout when the limit's MaxWait has
// passed (the limit's policy decides it), ReasonCanceled when its caller gave up (denied,
// counted as canceled). A claim's waiter is denied for why, and not counted. If the
// engine decided w first, GiveUp returns that decision.
func (e *Engine) GiveUp(now time.Time, w *Waiter, why Reason) Decision {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.decided {
		return w.d
	}
	if w.claim {
		w.set(Decision{Source: SourceFallback, Reason: why, Servers: e.Servers()})
		return w.d
	}
	if why == ReasonCanceled {
		w.set(Decision{Source: SourceFallback, Reason: ReasonCanceled, Servers: e.Servers()})
		w.counted()
		return w.d
	}
	w.set(e.fallback(now, w.lim, w.tier, w.key, w.n, why))
	return w.d
}

// recheck decides w again after the refill of b it waited for was answered: served,
// denied, or waiting for the next refill. It reports whether w is decided now.
func (e *Engine) recheck(now time.Time, b *bucket, w *Waiter) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.decided { // the driver gave up on it
		return false
	}
	lm := w.lim
	var o outcome
	if !lm.keys.Update(now.UnixNano(), w.key, func(en *entry, t int64) {
		b.decideKey(&o, en, lastOf(now, t), w.tier, w.n, w)
	}) {
		w.set(Decision{Reason: ReasonClosed, Servers: e.Servers()})
		return true
	}
	o.d.Servers = e.Servers()
	o.refund(e, lm)
	if o.f != nil && e.send(now, o.f, w) && o.w != nil {
		return true // failed at once: decided by the policy
	}
	if o.w != nil {
		return false // waits for the next refill
	}
	lm.stats.count(&o.d, w.n)
	w.set(o.d)
	return true
}

// fallback decides a request for the key of ID key under tier by the limit's failure
// policy (the tier's current shape's), after the pre-check and the lease could not
// (Redis did not answer, or the breaker is open). A request the policy admits still
// spends its pre-check tokens, and its limit's kind accounts for it (admitFallback,
// fellBack).
func (e *Engine) fallback(now time.Time, lm *Limit, tier, key string, n int, why Reason) Decision {
	return e.fallbackOn(now, lm, lm.Shape(tier), tier, key, n, why)
}

// fallbackOn is fallback by the shape sh, read for tier before. A SetLimit that
// replaced sh since may have closed its fallback, which then denies everything: a
// denial is asked again of the tier's shape in force, once.
func (e *Engine) fallbackOn(now time.Time, lm *Limit, sh *Shape, tier, key string, n int, why Reason) Decision {
	servers := e.Servers()
	d := Decision{Source: SourceFallback, Reason: why, Servers: servers}
	d.Allowed = sh.fallback.AllowN(now, key, n)
	if !d.Allowed {
		if cur := lm.Shape(tier); cur != sh {
			sh = cur
			d.Allowed = sh.fallback.AllowN(now, key, n)
		}
	}
	if !d.Allowed {
		r, _, ok := sh.fallback.LocalLimit(servers)
		if !ok { // FailClosed: this server's share of the refill
			r = rate.Limit(sh.cfg.Rate / float64(servers))
		}
		d.RetryAfter = tokenbucket.Duration(float64(n), float64(r))
	}
	ref, hasRef := 0.0, false
	if d.Allowed && n > 0 {
		lm.keys.Update(now.UnixNano(), key, func(en *entry, ns int64) {
			t := lastOf(now, ns)
			ref, hasRef = en.credit, en.hasCredit
			if en.shape != sh {
				lm.reshape(en, sh, ns)
			}
			if !en.pre.AllowN(ns, n) {
				d = lm.preDenied(en, ns, n)
				d.Servers = servers
			} else if ok, retry := lm.kind.admitFallback(en, t, n); !ok {
				en.pre.AllowN(ns, -n) // refused: its pre-check tokens go back
				d = Decision{Source: SourceFallback, Reason: why, Servers: servers, RetryAfter: retry}
			}
		})
		if d.Allowed {
			lm.kind.fellBack(sh, key, n, ref, hasRef)
		}
	}
	lm.stats.count(&d, n)
	return d
}

// admitFallback: a bucket kind takes every admission of its policy; fellBack owes it to
// the bucket if the policy's admissions are (chargesDebt). No wake: debts go out with
// the driver's next round (a tick, a refill); they cannot go while Redis does not answer
// anyway.
func (b *bucket) admitFallback(*entry, time.Time, int) (bool, time.Duration) { return true, 0 }

func (b *bucket) fellBack(sh *Shape, key string, n int, ref float64, hasRef bool) {
	if sh.chargesDebt() {
		b.lm.e.owe(b.lm, sh, key, n, ref, hasRef)
	}
}

// initKey: a bucket key's state is the entry's own fields, which initEntry makes.
func (b *bucket) initKey(*entry) {}

// evicted refunds the key's lease; the answer of a refill still in flight will be
// refunded too (it no longer finds its flight).
func (b *bucket) evicted(en *entry) {
	en.flight = nil
	b.lm.drain(en, en.shape)
}

// drain lets go of en's lease, its bucket that of shape sh: its tokens on hand are
// refunded, and a resend it abandons is recorded for the lost take's late answer
// (Engine.abandon). It requires the key's lock.
func (lm *Limit) drain(en *entry, sh *Shape) {
	n, abandoned := en.lease.Drain()
	if n > 0 {
		lm.e.queueRefund(lm, sh, en.key, n)
	}
	if abandoned != 0 {
		lm.e.abandon(abandoned)
	}
}

// undo gives back what d took: leased tokens go back to the key's lease, or to Redis as
// a refund, under the key's shape (its tier's when the key is gone), when the key is no
// longer held or its tokens expired; an admission to be charged later takes its charge
// back (spill.undo); the pre-check gets its n tokens back. Tokens a fallback admitted
// stay spent in the policy's local limiter, which is conservative.
func (b *bucket) undo(now, _ time.Time, tier, id string, n int, d Decision) int {
	lm := b.lm
	fromLease := spends(d.Reason)
	back := false // the lease took its tokens back
	sh := lm.Shape(tier)
	lm.keys.Peek(id, func(en *entry, last int64) {
		if en.shape != nil {
			sh = en.shape
		}
		t := lastOf(now, last) // never before the entry's last use: the pre-check's clock must not go back
		// A negative cost gives tokens back: x/time/rate adds them, and caps the level
		// at the burst at its next use (TestPreCheckTakesTokensBack pins this).
		en.pre.AllowN(t.UnixNano(), -n)
		back = fromLease && en.lease.unspend(t, n)
	})
	if d.Reason == ReasonAsync {
		return b.spill.undo(sh, id, n)
	}
	if !fromLease {
		return 0
	}
	if !back {
		lm.e.queueRefund(lm, sh, id, n) // the key is gone, or its tokens expired
	}
	return n
}

// reasonFor names the failure of a refill.
func reasonFor(err error) Reason {
	switch {
	case errors.Is(err, errClosed):
		return ReasonClosed
	case errors.Is(err, breaker.ErrOpen):
		return ReasonBreakerOpen
	case errors.Is(err, breaker.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return ReasonTimeout
	}
	return ReasonUnavailable
}

// errClosed fails the refills of a stopped engine.
var errClosed = errors.New("engine stopped")

// decideFailed decides w, whose refill failed with err: by the limit's policy, or
// closed. It reports whether w was still waiting. self is a waiter the caller holds
// already (its lock, or the only reference), nil if none.
func (e *Engine) decideFailed(now time.Time, w, self *Waiter, err error) bool {
	if w != self {
		w.mu.Lock()
		defer w.mu.Unlock()
	}
	if w.decided {
		return false
	}
	why := reasonFor(err)
	if why == ReasonClosed {
		w.set(Decision{Reason: ReasonClosed, Servers: e.Servers()})
		return true
	}
	w.set(e.fallback(now, w.lim, w.tier, w.key, w.n, why))
	return true
}
