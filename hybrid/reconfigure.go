package hybrid

import (
	"fmt"
	"slices"
	"time"
)

// Limits returns the Limiter's limits as they are now, defaults filled in, in the order
// they were added: what a configuration reload compares with.
func (l *Limiter) Limits() []Limit {
	var out []Limit
	for _, lm := range l.eng.Limits() {
		out = append(out, limitOf(lm.Config()))
	}
	return out
}

// Quota returns what a Decision under the named limit and tier ("" for the limit's own
// rate and burst) reports as its Quota and Window, as they are now: what a response
// that lists every limit a request counted against (httplimit's RateLimit-Policy)
// states for the limits that did not decide. ErrUnknownLimit or ErrUnknownTier if
// there is no such limit or tier. It allocates nothing.
func (l *Limiter) Quota(limit, tier string) (quota int, window time.Duration, err error) {
	lm := l.eng.Limit(limit)
	switch {
	case lm == nil:
		return 0, 0, ErrUnknownLimit
	case !lm.HasTier(tier):
		return 0, 0, ErrUnknownTier
	}
	sh := lm.Shape(tier)
	return sh.Burst(), sh.Window(), nil
}

// SetLimit changes the limit named lim.Name while the Limiter runs: its Rate, Burst,
// Tiers, pre-check, Policy, MaxWait and Lease, and a ChargeLater limit's duration.
// MaxKeys cannot change, nor a limit's kind (its Mode), nor a Windowed limit's report
// interval, Rate and Burst (Reconfigure without the limit, then with it). Nothing is dropped: requests being decided finish on the old
// configuration, later ones run on the new. Each key moves to it on its next request
// on this server; where its Rate, Burst or pre-check changed, that server gives back the
// tokens it leased for the key first, and the key's bucket in Redis takes the new Rate
// and Burst at its next refill, on Redis's clock, without gaining tokens.
//
// A change of Rate or Burst (the limit's or a tier's, or a tier added or removed) needs
// a higher Version than the current one: the servers of a fleet learn of a change at
// different instants, and each bucket keeps the highest Version it has seen, so a
// server still on the old configuration is answered on the new one by Redis
// (docs/limits.md states the bound that holds meanwhile). A lower Version is refused.
// The error wraps ErrInvalidConfig.
func (l *Limiter) SetLimit(lim Limit) error {
	c, err := engineLimit(lim)
	if err == nil {
		err = l.eng.SetLimit(l.clock.Now(), c)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// addLimit adds a limit to the running Limiter. Its name must be new. The error wraps
// ErrInvalidConfig.
func (l *Limiter) addLimit(lim Limit) error {
	if l.closed.Load() {
		return ErrClosed
	}
	c, err := engineLimit(lim)
	if err == nil {
		err = l.eng.AddLimit(c)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// removeLimit removes the named limit from the running Limiter (see Reconfigure).
func (l *Limiter) removeLimit(name string) error {
	if err := l.eng.RemoveLimit(name); err != nil {
		return fmt.Errorf("%w: %w", ErrUnknownLimit, err)
	}
	return nil
}

// Reconfigure makes the Limiter's limits those of limits, as a reloaded configuration
// file gives them: limits it lacks are added and decide at once; limits not in limits are
// removed: calls for them return ErrUnknownLimit from then on (a request deciding at that
// instant may be denied with ReasonClosed), the tokens this server leased for their keys
// are refunded, and their counters leave Stats; the others are changed with SetLimit's
// rules. Every limit is checked first, and nothing is changed if one is refused; the
// error wraps ErrInvalidConfig and names it. A change SetLimit refuses (a limit's kind)
// is two calls: without the limit, then with it.
func (l *Limiter) Reconfigure(limits []Limit) error {
	if len(limits) == 0 {
		return fmt.Errorf("%w: no limits", ErrInvalidConfig)
	}
	for i, lim := range limits {
		if slices.ContainsFunc(limits[:i], func(o Limit) bool { return o.Name == lim.Name }) {
			return fmt.Errorf("%w: limit %q configured twice", ErrInvalidConfig, lim.Name)
		}
		c, err := engineLimit(lim)
		if err == nil {
			err = l.eng.CheckLimit(c)
		}
		if err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	for _, lm := range l.eng.Limits() {
		if !slices.ContainsFunc(limits, func(o Limit) bool { return o.Name == lm.Name() }) {
			if err := l.removeLimit(lm.Name()); err != nil {
				return err
			}
		}
	}
	for _, lim := range limits {
		var err error
		if l.eng.Limit(lim.Name) == nil {
			err = l.addLimit(lim)
		} else {
			err = l.SetLimit(lim)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
