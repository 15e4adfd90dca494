package hybrid

import (
	"context"
	"sync"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/engine"
)

// A Reservation holds tokens of a limit for one key that its holder may spend from a
// given instant on, as x/time/rate's does: Delay says how long to wait; Cancel gives the
// tokens back until that instant. It is served from this server's lease or as a claim
// on the bucket's refill, so the fleet-wide bound holds at the instants the holders act.
// Safe for concurrent use.
type Reservation struct {
	l     *Limiter
	lm    *engine.Limit
	key   string
	tier  string
	n     int
	ok    bool
	act   time.Time       // when the holder may act
	d     engine.Decision // the decision that took the tokens
	claim *engine.Shape   // for a claim on the bucket's refill: the key's shape
	dry   bool            // OK because a DryRun limit admits what it denies: holds nothing

	final *Decision // AllowN's answer, reported as it is: ReserveN's error's, or a DryRun admission's

	mu       sync.Mutex
	canceled bool
}

// OK reports whether the reservation holds its tokens.
func (r *Reservation) OK() bool { return r.ok }

// Delay is how long from now the holder must wait before acting (InfDuration if not OK).
func (r *Reservation) Delay() time.Duration {
	if !r.ok { // a zero Reservation too, as in x/time/rate
		return InfDuration
	}
	return r.delayFrom(r.l.clock.Now())
}

// delayFrom is Delay measured from t.
func (r *Reservation) delayFrom(t time.Time) time.Duration {
	if !r.ok {
		return InfDuration
	}
	return max(r.act.Sub(t), 0)
}

// Decision is the decision that took the reservation's tokens, or the denial.
func (r *Reservation) Decision() Decision {
	if r.final != nil {
		return *r.final
	}
	if r.lm == nil { // a zero Reservation
		return Decision{}
	}
	var out Decision
	out.set(r.lm, r.tier, &r.d)
	return out
}

// Cancel tells the limiter that the reserved action will not be done: its tokens go
// back if the instant to act has not come yet; later they count as used (a reservation
// of tokens on hand may act at once, so its Cancel gives nothing back). After the
// Limiter's Close nothing goes back (Close has sent its last refunds): a claim's tokens
// stay spent, counted among LimitStats' refunds lost, so cancel pending reservations
// before closing.
func (r *Reservation) Cancel() {
	if !r.ok { // a zero Reservation too, as in x/time/rate
		return
	}
	r.cancelAt(r.l.clock.Now())
}

// cancelAt is Cancel at instant t.
func (r *Reservation) cancelAt(t time.Time) {
	if !r.ok || r.dry {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// As x/time/rate's CancelAt: once the instant to act has passed, the holder may have
	// acted, and the tokens count as used. A claim's bucket was charged for the instant to
	// act itself: at it, nothing goes back either.
	if r.canceled || r.act.Before(t) || r.claim != nil && !t.Before(r.act) {
		return
	}
	r.canceled = true
	if r.claim != nil {
		r.l.eng.CancelClaim(r.lm, r.claim, r.key, r.n)
		return
	}
	r.l.eng.Return(t, r.act, r.lm, r.tier, r.key, r.n, r.d) // r.act: the instant of its decision
}

// ReserveN reserves n tokens for key under the named limit (see Reservation), waiting for
// Redis at most the limit's MaxWait and never past ctx. The errors are AllowN's; when
// Redis does not answer the reservation is not OK. A Windowed limit's reservation is OK
// only if the request is admitted now.
func (l *Limiter) ReserveN(ctx context.Context, limit, key string, n int) (*Reservation, error) {
	var d Decision
	start := l.clock.Now()
	err := l.allowN(&d, ctx, limit, "", key, n, nil)
	lm := l.eng.Limit(limit)
	if err == nil && lm == nil { // removed (Reconfigure) since allowN found it
		err = ErrUnknownLimit
	}
	if err != nil {
		return &Reservation{l: l, lm: lm, key: key, n: n, final: &d}, err
	}
	r := &Reservation{l: l, lm: lm, key: key, n: n, act: l.clock.Now()}
	r.d = engine.Decision{Allowed: d.Allowed, Remaining: d.Remaining, RetryAfter: d.RetryAfter,
		Source: engine.Source(d.Source), Reason: engine.Reason(d.Reason), Servers: d.Servers}
	if d.WouldDeny { // a DryRun limit's: admitted, nothing taken, nothing to give back
		r.ok, r.dry, r.final = true, true, &d
		return r, nil
	}
	if d.Allowed {
		r.ok = true
		return r, nil
	}
	if !r.d.Claimable() {
		return r, nil // it can never pass
	}
	// A claim on the bucket's refill: want n, all or nothing, down to minus the burst. It
	// waits for Redis what the lease's decision left of MaxWait, which bounds the whole
	// call; with nothing left, the reservation is not OK, as a claim that ran out would be.
	left := lm.Config().MaxWait - l.clock.Now().Sub(start)
	if left <= 0 {
		return r, nil
	}
	sh := lm.Shape("")
	var cd engine.Decision
	if w := l.eng.Claim(l.clock.Now(), lm, key, n, &cd); w != nil {
		var err error
		if cd, err = l.await(ctx, w, left); err != nil {
			return r, err // ctx ended while the claim waited, as AllowN's wait would
		}
	}
	if cd.Reason == engine.ReasonClosed { // Close ran while the claim waited
		return r, ErrClosed
	}
	if !cd.Allowed {
		if cd.Source == engine.SourceGlobal { // Redis answered: when the bucket could hold it
			r.d.RetryAfter = cd.RetryAfter
		}
		return r, nil
	}
	r.ok, r.claim = true, sh
	r.act = l.clock.Now().Add(cd.RetryAfter)
	r.d = engine.Decision{Allowed: true, Remaining: 0, Source: engine.SourceGlobal, Reason: engine.ReasonGranted, Servers: cd.Servers}
	return r, nil
}
