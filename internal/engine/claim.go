package engine

import (
	"time"

	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// Claim asks, at now, for n tokens of key's bucket in lm for a reservation the lease
// could not serve (see hybrid.Reservation): a take of n, all or nothing, that may leave
// the bucket below zero, down to minus the burst, sent with the refills of the next
// TakeTrip. The claimed tokens are not leased: they belong to the reservation, whose
// holder acts once the bucket is back at zero.
//
// It returns a Waiter that the driver waits for as for Decide's, calling GiveUp once the
// limit's MaxWait passed or its caller left; or nil, with *d set, when the claim is
// refused at once: a limit of a kind with no bucket (windowed), n above the burst or
// below 1, the breaker open, the engine stopped. A claim's decision admits with
// RetryAfter the time until its holder may act (Source global, Reason granted); one that
// does not admit says why (RetryAfter: when the bucket could hold it, if Redis answered).
// A claim is counted in LimitStats.Reserved, not among the decisions: the request it
// serves was decided (denied) first. A claim given up before its answer gives its
// tokens back when the answer comes; CancelClaim gives back a claim's tokens later.
func (e *Engine) Claim(now time.Time, lm *Limit, key string, n int, d *Decision) *Waiter {
	var w *Waiter
	*d, w = lm.kind.claim(now, wire.KeyID(key), n)
	return w
}

// Claimable reports whether the denial d may still be served by a claim (Claim): a
// request that may pass later, of an engine not stopped.
func (d *Decision) Claimable() bool {
	return !d.Allowed && d.RetryAfter < InfDuration && d.Reason != ReasonClosed
}

// claim is Claim for a bucket kind: the take goes as a Flight of its own, beside the
// key's refill, never through the key's lease.
func (b *bucket) claim(now time.Time, id string, n int) (Decision, *Waiter) {
	lm, e := b.lm, b.lm.e
	sh := lm.Shape("")
	if n < 1 || n > sh.cfg.Burst {
		return Decision{Source: SourceLease, Reason: ReasonExceedsBurst, RetryAfter: InfDuration, Servers: e.Servers()}, nil
	}
	w := &Waiter{lim: lm, key: id, n: n, claim: true, ch: make(chan struct{})}
	f := &Flight{lim: lm, b: b, shape: sh, key: id, want: n, min: n, floor: sh.cfg.Burst, waiters: []*Waiter{w}}
	// What the key's lease heard of the bucket, if this server holds the key: a claim
	// that finds the bucket lost starts it empty too.
	lm.keys.Peek(id, func(en *entry, _ int64) { f.seen = en.lease.seen() })
	if e.send(now, f, w) {
		return w.d, nil // refused at once
	}
	return Decision{}, w
}

// claimed decides the waiter of claim f with its answer g (or the error that failed
// it): granted n, its holder acts once the bucket is back at zero (g.Wait); refused, it
// holds nothing. A claim its waiter gave up on gives its tokens back. self is a waiter
// the caller holds already (see decideFailed).
func (e *Engine) claimed(f *Flight, g Grant, err error, self *Waiter) {
	w := f.waiters[0]
	f.waiters = nil
	var d Decision
	switch {
	case err != nil:
		d = Decision{Source: SourceFallback, Reason: reasonFor(err)}
	case g.Granted == f.want:
		d = Decision{Allowed: true, RetryAfter: g.Wait, Source: SourceGlobal, Reason: ReasonGranted}
	default: // the bucket holds less than n minus its floor: RetryAfter says until when
		d = Decision{RetryAfter: g.Wait, Source: SourceGlobal}
	}
	d.Servers = e.Servers()
	if e.decideClaim(f, w, self, d, g.Granted) && w != self && e.decided != nil {
		e.decided(w)
	}
}

// decideClaim decides w, the waiter of claim f answered d with granted tokens, unless it
// was decided meanwhile (given up on: the tokens go back); it reports whether it did.
func (e *Engine) decideClaim(f *Flight, w, self *Waiter, d Decision, granted int) bool {
	if w != self {
		w.mu.Lock()
		defer w.mu.Unlock()
	}
	lm := w.lim
	if w.decided || !d.Allowed {
		if granted > 0 { // given up on, or (not reached: a claim is all or nothing) short
			lm.stats.claimsBack.Add(int64(granted))
			e.queueRefund(lm, f.shape, f.key, granted)
		}
		if w.decided {
			return false
		}
	} else {
		lm.stats.reserved.Add(int64(w.n))
	}
	w.set(d)
	return true
}

// CancelClaim gives back n tokens a granted claim took from key's bucket in lm, of
// shape sh: the reservation was canceled before its holder acted. Redis adds them back
// only if the bucket still has sh's parameters.
func (e *Engine) CancelClaim(lm *Limit, sh *Shape, key string, n int) {
	lm.stats.reserved.Add(-int64(n))
	lm.stats.claimsBack.Add(int64(n))
	e.queueRefund(lm, sh, wire.KeyID(key), n)
}
