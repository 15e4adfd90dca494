package hybrid

import (
	"fmt"
	"slices"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/quota"
)

func init() {
	quota.Of = func(l any, limit, tier string) (int, time.Duration, error) {
		return l.(*Limiter).quotaOf(limit, tier)
	}
}

// Limits returns the Limiter's limits as they are now, MaxWait and MaxCost's defaults
// filled in; a pre-check left to its default (PreRate and PreBurst 0: the limit's own
// rate and burst) stays 0, so that a Limits() passed back to Reconfigure with a new Rate
// or Burst moves the pre-check with them.
func (l *Limiter) Limits() []Limit {
	var out []Limit
	for _, lm := range l.eng.Limits() {
		out = append(out, limitOf(lm.Config()))
	}
	return out
}

// quotaOf returns the Quota and Window a Decision under the named limit and tier reports,
// for headers that list limits that did not decide (quota.Of).
func (l *Limiter) quotaOf(limit, tier string) (burst int, window time.Duration, err error) {
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

// setLimit changes the limit named lim.Name (see Reconfigure). The error wraps
// ErrInvalidConfig.
func (l *Limiter) setLimit(lim Limit) error {
	c, err := l.engineLimit(lim)
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
	c, err := l.engineLimit(lim)
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
// gives them: new limits are added, missing ones removed (their calls then return
// ErrUnknownLimit and their leased tokens are refunded), the others changed in any field
// but their Mode's kind, a Windowed limit's interval, Rate and Burst, and MaxKeys.
// Requests being decided finish on the old configuration. A change of Rate or Burst (a
// tier's too) needs a higher Version, so that the fleet agrees on it (docs/limits.md).
// Nothing changes if one is refused; the error wraps ErrInvalidConfig. A change refused
// is two calls: without the limit, then with it. To change one limit, pass Limits() with
// that one changed. Calls at once are made one after the other; after Close, Reconfigure
// changes nothing and returns ErrClosed.
func (l *Limiter) Reconfigure(limits []Limit) error {
	l.reconfMu.Lock()
	defer l.reconfMu.Unlock()
	if l.closed.Load() {
		return ErrClosed
	}
	if len(limits) == 0 {
		return fmt.Errorf("%w: no limits", ErrInvalidConfig)
	}
	for i, lim := range limits {
		if slices.ContainsFunc(limits[:i], func(o Limit) bool { return o.Name == lim.Name }) {
			return fmt.Errorf("%w: limit %q configured twice", ErrInvalidConfig, lim.Name)
		}
		c, err := l.engineLimit(lim)
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
			err = l.setLimit(lim)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
