package hybrid

import (
	"context"
	"sync"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/engine"
)

// A Reservation holds tokens of a limit for one key that its holder may spend from a
// given instant on, for callers that schedule work instead of being turned away, as
// x/time/rate's Reservation does. Reserve and ReserveN make one; Delay says how long to
// wait before acting; Cancel gives the tokens back when the work will not be done.
//
// A reservation is served from what this server holds (its lease, as AllowN would
// serve the request: Delay 0) or, when that denies, as a claim on the refill of the
// key's bucket in Redis: one take that may leave the bucket below zero, down to minus
// the limit's burst, and whose Delay is the time until the bucket is back at zero. The
// fleet-wide bound then holds for the instants the holders act at: a reservation takes
// tokens the bucket has not refilled yet, so nobody else can have them. A request the
// bucket could not hold even then (more than a burst already claimed), one above the
// burst, or one Redis did not answer, is not OK.
//
// A Reservation is safe for concurrent use; its methods are cheap.
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

// OK reports whether the reservation holds its tokens. A reservation that is not OK
// holds nothing, and Cancel does nothing.
func (r *Reservation) OK() bool { return r.ok }

// Delay is how long from now the holder must wait before acting: 0 for tokens on hand,
// InfDuration for a reservation that is not OK.
func (r *Reservation) Delay() time.Duration { return r.DelayFrom(r.l.clock.Now()) }

// DelayFrom is Delay measured from t.
func (r *Reservation) DelayFrom(t time.Time) time.Duration {
	if !r.ok {
		return InfDuration
	}
	return max(r.act.Sub(t), 0)
}

// Decision is the decision that took the reservation's tokens: from this server's lease
// (Source lease or global, as AllowN's), or SourceGlobal with ReasonGranted for a claim
// on the bucket's refill. For a reservation that is not OK, the denial; for one ReserveN
// returned with an error, AllowN's answer.
func (r *Reservation) Decision() Decision {
	if r.final != nil {
		return *r.final
	}
	var out Decision
	out.set(r.lm, r.tier, &r.d)
	return out
}

// Cancel gives the reservation's tokens back, as CancelAt(now) does.
func (r *Reservation) Cancel() { r.CancelAt(r.l.clock.Now()) }

// CancelAt tells the limiter, at t, that the reserved action will not be done, and its
// tokens go back. Tokens on hand (Delay 0) go back to this server's lease, or to Redis as
// a refund if the lease no longer holds them, as an AllowMulti item's do. A claim on the
// bucket's refill goes back to the bucket (a refund, on the background goroutine, that
// the bucket adds only if its parameters did not change since) if t is before the
// instant to act; from then on its tokens count as used, as x/time/rate's do. A second
// Cancel does nothing.
func (r *Reservation) CancelAt(t time.Time) {
	if !r.ok || r.dry {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.canceled || r.claim != nil && !t.Before(r.act) {
		return
	}
	r.canceled = true
	if r.claim != nil {
		r.l.eng.CancelClaim(r.lm, r.claim, r.key, r.n)
		return
	}
	r.l.eng.Return(t, r.lm, r.key, r.n, r.d)
}

// Reserve is shorthand for ReserveN(ctx, limit, key, 1).
func (l *Limiter) Reserve(ctx context.Context, limit, key string) (*Reservation, error) {
	return l.ReserveN(ctx, limit, key, 1)
}

// ReserveN reserves n tokens for key under the named limit (see Reservation): from this
// server's lease as AllowN would, or else as a claim on the refill of the key's bucket
// in Redis, sent with the next refills, that waits at most the limit's MaxWait and
// never past ctx. The errors are AllowN's; a Redis failure is not one, the
// reservation is then not OK. A Windowed limit has no bucket to claim from: its
// reservation is OK only if the request is admitted now. One allocation when the lease
// serves it; a claim allocates its round trip's state too.
func (l *Limiter) ReserveN(ctx context.Context, limit, key string, n int) (*Reservation, error) {
	d, err := l.allowN(ctx, limit, "", key, n, nil)
	lm := l.eng.Limit(limit)
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
	// A claim on the bucket's refill: want n, all or nothing, down to minus the burst.
	sh := lm.Shape("")
	var cd engine.Decision
	if w := l.eng.Claim(l.clock.Now(), lm, key, n, &cd); w != nil {
		cd, _ = l.await(ctx, w)
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
