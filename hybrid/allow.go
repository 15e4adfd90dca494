package hybrid

import (
	"context"
	"errors"
	"time"

	"golang.org/x/time/rate"

	"github.com/fleetlimit/fleetlimit/breaker"
)

// initEntry makes the state of a key new to this server: a full pre-check bucket and an
// empty lease. A zero rate.Limiter holds no tokens, and filling it by starting its history
// one fill time in the past fails for slow rates (a burst of 5 at one a day needs five
// days; slower ones overflow a time.Duration). Instead: burst set, then an infinite rate
// for one nanosecond fills it (x/time/rate caps the tokens at the burst), then the real
// rate from now on.
func (lm *limit) initEntry(e *entry, key string, now time.Time) {
	before := now.Add(-time.Nanosecond)
	e.pre.SetBurstAt(before, lm.preBurst)
	e.pre.SetLimitAt(before, rate.Inf)
	e.pre.SetLimitAt(now, lm.preRate)
	h := hashKey(key)
	e.lease = NewLease(lm.seed ^ h)
	e.flight = nil
	e.slot = uint8(h % counterShards)
}

// hashKey is FNV-1a, to give each key its own jitter seed.
func hashKey(key string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	return h
}

// Allow is shorthand for AllowN(ctx, limit, key, 1).
func (l *Limiter) Allow(ctx context.Context, limit, key string) (Decision, error) {
	return l.AllowN(ctx, limit, key, 1)
}

// AllowN decides whether a request of cost n for key may proceed under the named limit,
// taking its n tokens atomically (all or none). It waits for Redis only when this server
// holds no tokens for the key, at most the limit's Timeout and never past ctx.
//
// The error is non-nil only for a misuse (ErrUnknownLimit, ErrInvalidCost), after Close
// (ErrClosed), or when ctx ends while waiting (ctx.Err()); the Decision then denies. A
// Redis failure is not an error: the limit's policy decides, and the Decision says so.
// Cost 0 is allowed and spends nothing.
func (l *Limiter) AllowN(ctx context.Context, limit, key string, n int) (Decision, error) {
	lm := l.lookup(limit)
	switch {
	case lm == nil:
		return Decision{RetryAfter: InfDuration}, ErrUnknownLimit
	case n < 0:
		return Decision{Reason: ReasonInvalidCost, RetryAfter: InfDuration}, ErrInvalidCost
	case l.closed.Load():
		return Decision{Reason: ReasonClosed}, ErrClosed
	}
	d, f, ok := l.pass(lm, key, n, true)
	switch {
	case !ok:
		return Decision{Reason: ReasonClosed}, ErrClosed
	case f == nil:
		return d, nil
	}
	return l.wait(ctx, lm, key, n, f)
}

// pass runs decide for one request under the key's lock and does what the step asks
// outside it (queue a refund, send a refill). f is the refill to wait for, nil once the
// request is decided; ok is false when the Limiter is closed.
func (l *Limiter) pass(lm *limit, key string, n int, first bool) (d Decision, f *flight, ok bool) {
	var o outcome
	if !lm.keys.Update(l.now(), key, func(e *entry, t time.Time) {
		lm.decide(&o, e, t, key, n, first)
	}) {
		return o.d, nil, false
	}
	o.d.Servers = int(l.servers.Load())
	if o.st.Refund > 0 {
		l.queueRefund(lm, key, o.st.Refund)
	}
	if o.st.Refill.Want > 0 {
		l.send(o.f)
	}
	if o.st.Action != Wait {
		l.stats.count(o.slot, o.d.Source)
		return o.d, nil, true
	}
	return o.d, o.f, true
}

// outcome is what decide found, filled in under the key's lock.
type outcome struct {
	d    Decision
	st   Step
	f    *flight
	slot uint8 // the key's counter shard
}

// lookup finds the named limit: a scan for a few limits (no hashing), else the map.
func (l *Limiter) lookup(name string) *limit {
	if l.byName != nil {
		return l.byName[name]
	}
	for _, lm := range l.list {
		if lm.cfg.Name == name {
			return lm
		}
	}
	return nil
}

// decide runs the pre-check and the lease for one request, under the key's lock. On the
// common path (the lease holds enough unexpired tokens) it is one pass: the pre-check
// takes its tokens, the lease gives its own. Otherwise the pre-check is only looked at
// first, and spends only if the lease allows, so a request the lease denies or makes wait
// costs the pre-check nothing: for one server the default pre-check (the fleet's own
// rate and burst) then never denies what the global bucket alone would allow.
func (lm *limit) decide(o *outcome, e *entry, t time.Time, key string, n int, first bool) {
	c := lm.lease.Load()
	o.slot = e.slot
	if e.lease.CanServe(c, t, n) {
		if !e.pre.AllowN(t, n) {
			o.d = lm.preDenied(e, t, n)
			return
		}
		e.lease.acquire(c, t, n, &o.st)
	} else {
		if n > 0 && e.pre.TokensAt(t) < float64(n) {
			o.d = lm.preDenied(e, t, n)
			return
		}
		if first {
			e.lease.acquire(c, t, n, &o.st)
		} else {
			o.st = e.lease.Recheck(c, t, n)
		}
		if o.st.Action == Allow {
			e.pre.AllowN(t, n)
		}
	}
	st := &o.st
	if st.Refill.Want > 0 {
		o.f = &flight{lim: lm, key: key, seq: st.Refill.Seq, want: st.Refill.Want, min: st.Refill.Min, done: make(chan struct{})}
		e.flight = o.f
	} else if st.Action == Wait {
		o.f = e.flight
	}
	o.d = Decision{Allowed: st.Action == Allow, Remaining: st.Remaining, RetryAfter: st.RetryAfter, Source: SourceLease, Reason: st.Reason}
	if !first && st.Action != Wait {
		o.d.Source = SourceGlobal
		if o.d.Allowed {
			o.d.Reason = ReasonGranted
		}
	}
}

// preDenied is the decision of an empty pre-check bucket.
func (lm *limit) preDenied(e *entry, t time.Time, n int) Decision {
	d := Decision{Source: SourcePreCheck, Reason: ReasonPreCheck, RetryAfter: InfDuration}
	if n <= lm.preBurst {
		d.RetryAfter = durationFor(float64(n)-e.pre.TokensAt(t), float64(lm.preRate))
	}
	return d
}

// wait waits for the refill f (and any that follow it) until the request is decided, the
// limit's Timeout passes, or ctx ends.
func (l *Limiter) wait(ctx context.Context, lm *limit, key string, n int, f *flight) (Decision, error) {
	var expired <-chan time.Time // the timer starts only if a flight is still on its way
	for {
		if f == nil { // cannot happen: a Wait always has a flight; be safe
			return l.fallback(lm, key, n, ReasonUnavailable), nil
		}
		select {
		case <-f.done: // already answered (the breaker was open: failed at once)
		default:
			if expired == nil {
				timer := time.NewTimer(lm.cfg.Timeout)
				defer timer.Stop()
				expired = timer.C
			}
		}
		select {
		case <-f.done:
		case <-expired:
			return l.fallback(lm, key, n, ReasonTimeout), nil
		case <-ctx.Done():
			l.stats.canceled.Add(1)
			return Decision{Source: SourceFallback, Reason: ReasonCanceled, Servers: int(l.servers.Load())}, ctx.Err()
		}
		if f.err != nil {
			if errors.Is(f.err, ErrClosed) {
				return Decision{Reason: ReasonClosed}, ErrClosed
			}
			return l.fallback(lm, key, n, reasonFor(f.err)), nil
		}
		d, next, ok := l.pass(lm, key, n, false)
		switch {
		case !ok:
			return Decision{Reason: ReasonClosed}, ErrClosed
		case next == nil:
			return d, nil
		}
		f = next
	}
}

// reasonFor names the failure of a refill.
func reasonFor(err error) Reason {
	switch {
	case errors.Is(err, breaker.ErrOpen):
		return ReasonBreakerOpen
	case errors.Is(err, breaker.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return ReasonTimeout
	}
	return ReasonUnavailable
}
