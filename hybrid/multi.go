package hybrid

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/engine"
)

// Item is one (limit, tier, key, cost) of an AllowMulti call.
type Item struct {
	Limit string
	// Tier is the key's tier of the limit ("" for the limit's own), as for AllowTier.
	Tier string
	Key  string
	// Cost is the item's tokens, at least 0.
	Cost int
}

// MultiDecision is the answer to an AllowMulti call: a plain value.
type MultiDecision struct {
	// Allowed reports whether every item was admitted, and so the request.
	Allowed bool
	// Denied is the index of the item that denied the request, -1 when it was allowed.
	Denied int
	// Decision is the denying item's decision, or when allowed that of the item with the
	// fewest tokens remaining.
	Decision Decision
	// RetryAfter, when denied, is the longest RetryAfter of the items known to deny.
	RetryAfter time.Duration
}

// AllowMulti decides a request that counts against several items at once, all or nothing:
// it is admitted only if every item admits it, and a denial spends nothing. Errors are
// AllowN's, for the first item that has one; an empty items is ErrInvalidCost.
func (l *Limiter) AllowMulti(ctx context.Context, items []Item) (md MultiDecision, err error) {
	err = l.allowMulti(&md, ctx, items, l.onDecision)
	return md, err
}

// allowMulti is AllowMulti writing its decision to *out (as allowN does, to spare a
// copy) and telling hook (nil: nobody) of it, once.
func (l *Limiter) allowMulti(out *MultiDecision, ctx context.Context, items []Item, hook func(string, Decision)) (err error) {
	if len(items) == 0 {
		*out = MultiDecision{Denied: -1, RetryAfter: InfDuration}
		return fmt.Errorf("%w: no items", ErrInvalidCost)
	}
	if l.closed.Load() {
		*out = MultiDecision{Denied: 0, Decision: Decision{Reason: reasonClosed}}
		return ErrClosed
	}
	// Every item must be valid before anything is looked at or counted.
	dry := false
	var m engine.Multi
	for i := range items {
		it := &items[i]
		lm := l.eng.Limit(it.Limit)
		switch {
		case lm == nil:
			*out = MultiDecision{Denied: i, RetryAfter: InfDuration, Decision: Decision{RetryAfter: InfDuration, Limit: it.Limit, Tier: it.Tier}}
			return ErrUnknownLimit
		case it.Tier != "" && !lm.HasTier(it.Tier):
			*out = MultiDecision{Denied: i, RetryAfter: InfDuration, Decision: Decision{RetryAfter: InfDuration, Limit: it.Limit, Tier: it.Tier}}
			return ErrUnknownTier
		case it.Cost < 0:
			d := engine.Decision{Reason: engine.ReasonInvalidCost, RetryAfter: InfDuration}
			*out = MultiDecision{Denied: i, RetryAfter: InfDuration, Decision: decision(lm, it.Tier, &d)}
			return ErrInvalidCost
		}
		dry = dry || lm.Shape(it.Tier).DryRun()
		m.Add(engine.MultiItem{Limit: lm, Tier: it.Tier, Key: it.Key, N: it.Cost})
	}
	if dry {
		*out, err = l.allowMultiDry(ctx, items, hook)
		return err
	}
	return l.decideMulti(out, ctx, &m, hook)
}

// decideMulti decides m, its items added, waiting as AllowMulti does, writes the
// decision to *out and tells hook (nil: nobody) of it. The items' refills go one after
// another, and an item waits for Redis until its limit's MaxWait from the call's start,
// not a MaxWait of its own after the items before it: the call waits at most the
// largest MaxWait of its limits.
func (l *Limiter) decideMulti(out *MultiDecision, ctx context.Context, m *engine.Multi, hook func(string, Decision)) (err error) {
	start := l.nanos()
	now := start
	w, done := l.eng.StartMulti(start, m)
	for !done {
		left := max(w.Limit().Config().MaxWait-time.Duration(now-start), 0)
		d, werr := l.await(ctx, w, left)
		err = cmp.Or(err, werr)
		now = l.nanos()
		w, done = l.eng.ResumeMulti(now, m, d)
	}
	it := m.At(m.Item)
	out.Allowed, out.Denied, out.RetryAfter = m.Allowed, m.Denied, m.RetryAfter
	if m.Decision.Reason == engine.ReasonClosed {
		var cerr error
		out.Decision, cerr = l.closedDecision(it.Limit.Name(), it.Tier)
		return cerr
	}
	out.Decision.set(it.Limit, it.Tier, &m.Decision)
	if hook != nil {
		hook(it.Key, out.Decision)
	}
	return err
}

// allowMultiDry is AllowMulti for items some of which are of DryRun limits: the others
// are decided all or nothing first; if they admit the request (or there are none), each
// DryRun item is decided on its own, as AllowN would, so that it counts what enforcing
// it would have seen and never blocks the request. The answer is the others', unless a
// DryRun item would have denied: its Decision (WouldDeny) is then the one reported, as
// the limit closest to its end.
func (l *Limiter) allowMultiDry(ctx context.Context, items []Item, hook func(string, Decision)) (MultiDecision, error) {
	// hook hears one decision, the one reported: heard keeps the key of each decided.
	var key string
	decided := false
	heard := func(k string, _ Decision) { key, decided = k, true }
	var enforced []Item
	var at, dry []int // enforced[k] is items[at[k]]; dry, the DryRun items' indices
	for i, it := range items {
		// A limit Reconfigure removed meanwhile is enforced: AllowMulti answers ErrUnknownLimit.
		if lm := l.eng.Limit(it.Limit); lm != nil && lm.Shape(it.Tier).DryRun() {
			dry = append(dry, i)
		} else {
			enforced, at = append(enforced, it), append(at, i)
		}
	}
	out := MultiDecision{Allowed: true, Denied: -1}
	var err error
	if len(enforced) > 0 {
		err = l.allowMulti(&out, ctx, enforced, heard)
		if !out.Allowed || err != nil {
			if out.Denied >= 0 {
				out.Denied = at[out.Denied]
			}
			if hook != nil && decided {
				hook(key, out.Decision)
			}
			return out, err
		}
	}
	reported := key
	first := len(enforced) == 0
	for _, i := range dry {
		it := items[i]
		var d Decision
		derr := l.allowN(&d, ctx, it.Limit, it.Tier, it.Key, it.Cost, heard)
		if derr != nil && len(enforced) > 0 {
			// The request stands on the enforced items, admitted and spent: a DryRun
			// item that could not be decided (the context ended, its limit removed)
			// changes nothing.
			continue
		}
		if derr != nil {
			// Nothing stands on enforced items: an item that could not be decided fails
			// the request, as AllowN on its limit would (a DryRun limit does not turn a
			// canceled or closed decision into an admission).
			out.Allowed, out.Denied, out.Decision = false, i, d
			if hook != nil && decided {
				hook(it.Key, d)
			}
			return out, derr
		}
		if first || d.WouldDeny && !out.Decision.WouldDeny || !out.Decision.WouldDeny && d.Remaining < out.Decision.Remaining {
			out.Decision, first, reported = d, false, it.Key
		}
	}
	if hook != nil && decided {
		hook(reported, out.Decision)
	}
	return out, err
}
