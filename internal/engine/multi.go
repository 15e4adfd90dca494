package engine

import (
	"time"

	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// Look answers, without spending or changing anything, whether a request of cost n for
// key under tier of lm would be denied now by what this server knows for certain: a cost
// above the tier's burst, or a pre-check bucket without n tokens (of a key that would
// not be re-shaped). It returns that denial and true, or false when the request may pass
// (from the lease, or after a refill). A caller that decides several items all or
// nothing looks at every item before it spends on any.
func (e *Engine) Look(now time.Time, lm *Limit, tier, key string, n int) (Decision, bool) {
	sh := lm.Shape(tier)
	if n > sh.cfg.Burst {
		return Decision{Source: SourceLease, Reason: ReasonExceedsBurst, RetryAfter: InfDuration, Servers: e.Servers()}, true
	}
	if n <= 0 {
		return Decision{}, false
	}
	var d Decision
	denied := false
	lm.keys.Peek(wire.KeyID(key), func(en *entry, _ time.Time) {
		if en.shape == sh && en.pre.TokensAt(now) < float64(n) {
			d, denied = lm.preDenied(en, now, n), true
		}
	})
	d.Servers = e.Servers()
	return d, denied
}

// Return undoes a decision d that admitted a request of cost n for key under lm: the
// tokens go back where they came from, and LimitStats.GivenBack counts it (the decision
// stays counted as it was made: the counters only grow). Leased tokens go back to the
// key's lease, or to Redis as a refund when the key is no longer held; the pre-check
// gets its n tokens back. Tokens a fallback admitted stay spent in the policy's local
// limiter, which is conservative. A decision that did not admit is left alone.
func (e *Engine) Return(now time.Time, lm *Limit, key string, n int, d Decision) {
	if !d.Allowed || d.Source >= NumSources || d.Reason >= NumReasons {
		return
	}
	id := wire.KeyID(key)
	fromLease := spends(d.Reason)
	slot := uint8(hashKey(id) % counterShards)
	back := false // the lease took its tokens back
	sh := lm.Shape("")
	lm.keys.Peek(id, func(en *entry, last time.Time) {
		slot = en.slot
		if en.shape != nil {
			sh = en.shape
		}
		if n <= 0 {
			return
		}
		t := later(now, last) // never before the entry's last use: the pre-check's clock must not go back
		// A negative cost gives tokens back: x/time/rate adds them, and caps the level
		// at the burst at its next use (TestPreCheckTakesTokensBack pins this).
		en.pre.AllowN(t, -n)
		back = fromLease && en.lease.unspend(t, n)
	})
	if fromLease && n > 0 && !back {
		e.queueRefund(lm, sh, id, n) // the key is gone, or its tokens expired
	}
	if fromLease && n > 0 {
		lm.stats.decisions[slot%counterShards].returned.Add(int64(n))
	}
	lm.stats.givenBack.Add(1)
}

// CountDenied counts a denial d of a request of cost n for key under lm that the driver
// made from Look, without Decide.
func (e *Engine) CountDenied(lm *Limit, key string, d Decision, n int) {
	lm.stats.count(uint8(hashKey(wire.KeyID(key))%counterShards), &d, n)
}
