package engine

import (
	"fmt"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/redisstore"
)

// kind is one kind of limit: the unit a limit's requests, its failure policy's
// admissions, its undone decisions and its keys' evictions go through. Each kind keeps
// its state in its own files, and nothing outside them asks which kind a limit is:
//
//   - exact (bucket, with spill exact): a token bucket in Redis served from leases;
//     decide.go, lease.go, debt.go;
//   - charge-later (bucket, with spill *chargeLater): the same bucket, and a request the
//     lease cannot serve is admitted at once and charged later; async.go;
//   - windowed (*windowed): counted windows in shared arrays in Redis, no bucket;
//     window.go, window_trip.go.
//
// A limit's kind is chosen once, when the limit is made (newKind), and never changes.
// Besides these per-limit calls, a kind with engine-wide work has a part the engine's
// schedule calls in a fixed order (Next): the bucket kinds' refills, refunds and debts,
// the windowed limits' reports, the charge-later limits' low-key exchanges.
type kind interface {
	// decide is Engine.Decide for a request of the limit. It returns the decision by
	// value: a pointer passed through an interface escapes, and the hot path must not
	// allocate.
	decide(now int64, tier, key string, n int) (Decision, *Waiter)
	// hit decides a request of cost n > 0 for the key of ID id only if the kind's common
	// path serves it now, on the key's state alone: it spends, and returns the decision
	// (not counted). Otherwise it changes nothing the full path would not and returns
	// false. StartMulti's one pass runs on it; a kind without such a path returns false.
	hit(now int64, tier, id string, n int) (Decision, bool)
	// unhit undoes a request hit served, demand included: it is to be decided again.
	unhit(now int64, tier, id string, n int)
	// admitFallback is called under the key's lock once the limit's failure policy
	// admitted n for the key of en and its pre-check spent them: it accounts for the
	// admission, or refuses it (ok false), the request to try again after retry.
	admitFallback(en *entry, t time.Time, n int) (ok bool, retry time.Duration)
	// fellBack is called with no lock held for such an admission of the key of ID key,
	// of shape sh, whose bucket's credit at this server's last grant was ref (hasRef:
	// there was one).
	fellBack(sh *Shape, key string, n int, ref float64, hasRef bool)
	// undo gives back at now what decision d, made at the instant at, took for a request
	// of tier and cost n > 0 for the key of ID id (Engine.Return), and returns the tokens
	// that went back where they came from.
	undo(now, at time.Time, tier, id string, n int, d Decision) int
	// claim is Engine.Claim for a key of ID id.
	claim(now time.Time, id string, n int) (Decision, *Waiter)
	// initKey makes the kind's state of a key new to this server.
	initKey(en *entry)
	// evicted lets go of a key's state: the key store evicted it, or Drain.
	evicted(en *entry)
}

// newKind is the kind c asks for, for the limit lm, and the least time its keys stay
// held without a request (the key store's idle timeout is at least that).
func newKind(lm *Limit, c LimitConfig, seed uint64) (kind, time.Duration) {
	switch kindOf(c) {
	case kindWindowed:
		return newWindowed(lm, c, seed), windowMemory // a key stays over that long
	case kindChargeLater:
		return &bucket{lm: lm, spill: &chargeLater{lm: lm, low: lowKeys{shards: max(c.LowShards, 1), total: &lm.e.cl.uncharged}}}, 0
	}
	return &bucket{lm: lm, spill: exact{}}, 0
}

// The kinds' names, as kindOf gives them.
const (
	kindExact       = "exact"
	kindChargeLater = "charge-later"
	kindWindowed    = "windowed"
)

// kindOf names the kind c asks for: the one rule newKind makes a limit by, and by which
// a change of kind is told (refused at run time).
func kindOf(c LimitConfig) string {
	switch {
	case c.Windowed > 0:
		return kindWindowed
	case c.Async > 0:
		return kindChargeLater
	}
	return kindExact
}

// checkKind reports what is wrong with the kind c asks for: its duration, or what the
// kind cannot do (checkWindowed).
func checkKind(c LimitConfig) error {
	switch {
	case c.Async != 0 && c.Async < time.Millisecond:
		return fmt.Errorf("limit %q: Mode: ChargeLater(%v) must be at least 1ms", c.Name, c.Async)
	case c.Windowed != 0 && c.Windowed < time.Millisecond:
		return fmt.Errorf("limit %q: Mode: Windowed(%v) must be at least 1ms", c.Name, c.Windowed)
	case c.Windowed > 0 && c.Async > 0:
		return fmt.Errorf("limit %q: Mode: Windowed and ChargeLater are two modes; choose one", c.Name)
	case c.LowShards < 0 || c.LowShards > redisstore.MaxWindowShards:
		return fmt.Errorf("limit %q: LowShards %d is not from 0 to %d", c.Name, c.LowShards, redisstore.MaxWindowShards)
	case c.Windowed > 0:
		return checkWindowed(c)
	}
	return nil
}

// KeepsKind reports whether SetLimit may give lm the configuration c as far as its kind
// goes: the same kind and, for a windowed limit, the same windows (checkKindChange). A
// change that does not is made by removing the limit and adding it again.
func (lm *Limit) KeepsKind(c LimitConfig) bool { return checkKindChange(c, lm.Config()) == nil }

// checkKindChange reports why c cannot replace oc, the configuration of a limit the
// engine runs, for the kind: a limit's kind is fixed when it is made, and a windowed
// limit's window is its fleet's arrays (checkWindowedChange).
func checkKindChange(c, oc LimitConfig) error {
	if k, ok := kindOf(c), kindOf(oc); k != ok {
		return fmt.Errorf("limit %q: Mode: a limit's kind cannot change at run time (%s, was %s): remove the limit and add it again", c.Name, k, ok)
	}
	if c.Windowed > 0 {
		return checkWindowedChange(c, oc)
	}
	if c.Async > 0 && max(c.LowShards, 1) != max(oc.LowShards, 1) {
		return fmt.Errorf("limit %q: a ChargeLater limit's sets of low keys (LowShards %d, was %d) cannot change at run time: remove the limit and add it again", c.Name, c.LowShards, oc.LowShards)
	}
	return nil
}
