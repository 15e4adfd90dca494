package sim

import (
	"cmp"
	"fmt"
	"math"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/engine"
	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
)

// LimitChange changes the limit's Rate and Burst during a run, as
// hybrid.Limiter.Reconfigure with the next Version does, and lets the fleet learn of it
// over Spread: server i of the Servers at the start applies it at At + Spread·i/Servers
// (a config reload that reaches servers one after another); a server that joins later
// applies it when it joins, if its instant At + Spread has passed. The first change is
// Version 1, the next 2, and so on. Only the hybrid strategies see it.
//
// Kind, when set, also changes the limit's kind: "exact", "charge-later" or "windowed",
// with Report its ChargeLater or Windowed duration (0: DefaultAsync, DefaultWindowed).
// A server applies it as a release that changes a limit's kind or window rolls out: its
// limit is removed and added anew, and while servers disagree each decides its requests
// on every representation the fleet's record holds (docs/limits.md). A windowed limit's
// window is Burst/Rate: a change of either changes the window. Shards, when set, is a
// windowed limit's number of shards from the change on (engine.LimitConfig.WindowShards):
// 1, the unsharded format a fleet on one Redis uses, to wire.WindowShards, a Cluster's,
// changes where the limit's keys are counted as a change of window does; of a
// charge-later limit, the sets it marks its low keys in (engine.LimitConfig.LowShards),
// which servers that disagree do not share.
type LimitChange struct {
	At     time.Duration
	Spread time.Duration
	Rate   float64
	Burst  int
	Kind   string
	Report time.Duration
	Shards int
}

// ChangeResult is how the hottest key (key 0) fared around one LimitChange: its
// admissions over sliding windows, against the bound each part of the run states.
//
// While servers disagree (windows that overlap [At, At+Spread]) the fleet admits at most
// 2·max(B_old, B_new) + max(r_old, r_new)·W in a window of length W: the bucket never
// holds more than the larger burst, and the tokens outside it (leases under either
// configuration) are at most the larger burst too. Once every server has the change
// (windows starting at At+Spread or later) it is the usual 2·B_new + r_new·W.
type ChangeResult struct {
	AtS      float64 `json:"at_s"`
	SpreadS  float64 `json:"spread_s"`
	OldRate  float64 `json:"old_rate"`
	OldBurst int     `json:"old_burst"`
	NewRate  float64 `json:"new_rate"`
	NewBurst int     `json:"new_burst"`
	// DuringOverBound is the largest count of admissions in a window that overlaps the
	// convergence interval, over its bound; DuringW the window length that gave it.
	DuringOverBound float64 `json:"during_over_bound"`
	DuringW         string  `json:"during_window"`
	// AfterOverBound is the same for the windows that start once every server has the
	// change (and before the next change).
	AfterOverBound float64 `json:"after_over_bound"`
	AfterW         string  `json:"after_window"`
	// DuringPerS is the key's admissions per second from At+settle to At+Spread, while
	// most servers may not have the change yet: the bucket runs on the highest Version
	// any server took with, so the fleet runs at the new rate from the first server on.
	// AfterPerS is the same from At+Spread+settle to the end (or to the next change).
	// settle, the time a lowered bucket takes to drain to its new level, is Spread/5,
	// at most 1 s.
	DuringPerS float64 `json:"during_per_s"`
	AfterPerS  float64 `json:"after_per_s"`
}

// changeWindows are the window lengths the change is checked over.
var changeWindows = []time.Duration{100 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second}

// checkChanges validates the scenario's limit changes.
func (sc *Scenario) checkChanges() error {
	prev := time.Duration(-1)
	for i, c := range sc.LimitChanges {
		switch {
		case c.At < 0 || c.Spread < 0:
			return fmt.Errorf("limit change %d: negative At or Spread", i)
		case c.At <= prev:
			return fmt.Errorf("limit change %d at %v: changes must be in order of At", i, c.At)
		case tokenbucket.Check(c.Rate, c.Burst) != nil:
			return fmt.Errorf("limit change %d: %v", i, tokenbucket.Check(c.Rate, c.Burst))
		case c.Burst < sc.Cost:
			return fmt.Errorf("limit change %d: burst %d below the cost %d", i, c.Burst, sc.Cost)
		case c.Kind != "" && c.Kind != kindExact && c.Kind != kindChargeLater && c.Kind != kindWindowed:
			return fmt.Errorf("limit change %d: Kind %q: one of %q, %q, %q", i, c.Kind, kindExact, kindChargeLater, kindWindowed)
		case c.Report < 0:
			return fmt.Errorf("limit change %d: negative Report", i)
		case c.Shards < 0:
			return fmt.Errorf("limit change %d: negative Shards", i)
		}
		prev = c.At
	}
	return nil
}

// changeAt is the instant server id applies change c.
func (sc *Scenario) changeAt(c LimitChange, id int) time.Duration {
	if id >= sc.Servers {
		return c.At + c.Spread
	}
	return c.At + time.Duration(float64(c.Spread)*float64(id)/float64(sc.Servers))
}

// The kinds a LimitChange names.
const (
	kindExact       = "exact"
	kindChargeLater = "charge-later"
	kindWindowed    = "windowed"
)

// changedLimit is the limit of sc after its i-th change.
func changedLimit(sc *Scenario, i int) engine.LimitConfig {
	c := engineConfig(sc, 0).Limits[0]
	for j := range i + 1 {
		ch := sc.LimitChanges[j]
		c.Rate, c.Burst, c.Version = ch.Rate, ch.Burst, uint64(j+1)
		switch ch.Kind {
		case kindExact:
			c.Async, c.Windowed = 0, 0
		case kindChargeLater:
			c.Async, c.Windowed = cmp.Or(ch.Report, DefaultAsync), 0
		case kindWindowed:
			c.Async, c.Windowed = 0, cmp.Or(ch.Report, DefaultWindowed)
		}
		switch {
		case ch.Shards > 0 && c.Windowed > 0:
			c.WindowShards = ch.Shards
		case ch.Shards > 0 && c.Async > 0:
			c.LowShards = ch.Shards
		}
	}
	if c.PreRate > c.Rate || c.PreBurst > c.Burst {
		c.PreRate, c.PreBurst = 0, 0 // a pre-check tighter than the old limit may not be under the new
	}
	return c
}

// scheduleChanges applies sc's limit changes to the hybrid server s as they fall due:
// those whose instant has passed at once, the others as events.
func (h *hybridStrat) scheduleChanges(s *server, hs *hybridServer) {
	f := h.f
	for i, c := range f.sc.LimitChanges {
		cfg := changedLimit(f.sc, i)
		apply := func() {
			if !s.alive || hs.leaving {
				return
			}
			if err := h.change(s, hs, cfg); err != nil {
				f.fail(fmt.Errorf("sim: %s: %w", s.name, err))
			}
			h.wake(s, hs)
		}
		if at := f.sc.changeAt(c, s.id); at <= f.e.now {
			apply()
		} else {
			f.e.at(at, apply)
		}
	}
}

// change applies cfg to server s's limit: SetLimit for a change of its rate and burst;
// for one of its kind (or a windowed limit's window, rate or burst, which make its
// arrays), the limit removed and added anew, as a release that changes them does.
func (h *hybridStrat) change(s *server, hs *hybridServer, cfg engine.LimitConfig) error {
	if hs.lim.KeepsKind(cfg) {
		return hs.eng.SetLimit(s.clock(h.f.e.now), cfg)
	}
	if err := hs.eng.RemoveLimit(cfg.Name); err != nil {
		return err
	}
	if err := hs.eng.AddLimit(cfg); err != nil {
		return err
	}
	hs.lim = hs.eng.Limit(cfg.Name)
	return nil
}

// lateOverBound is the largest count of key 0's admissions in a window that ends at or
// after from (and by the end of the run), over 2·burst + servers·ceil(burst/servers) +
// rate·W, for windows W of 1 to 6 s; and that W.
func (r *recorder) lateOverBound(from time.Duration) (float64, string) {
	sc := r.sc
	slack := 2*float64(sc.Burst) + float64(sc.Servers)*math.Ceil(float64(sc.Burst)/float64(sc.Servers))
	worst, worstW := 0.0, ""
	for w := time.Second; w <= 6*time.Second; w += time.Second {
		bound := slack + sc.Rate*w.Seconds()
		eachWindow(r.hotAt, w, func(s time.Duration, n int) {
			if end := s + w; end < from || end > sc.Duration {
				return
			}
			if v := float64(n) / bound; v > worst {
				worst, worstW = v, w.String()
			}
		})
	}
	return worst, worstW
}

// eachWindow calls visit with each window of length w that starts at an instant of ats
// (sorted), and the instants in it, [start, start+w): the windows a count peaks in.
func eachWindow(ats []time.Duration, w time.Duration, visit func(start time.Duration, n int)) {
	j := 0
	for k, s := range ats {
		for j < len(ats) && ats[j] < s+w {
			j++
		}
		visit(s, j-k)
	}
}

// hotRate is key 0's admissions per second in [from, to); 0 for an empty interval.
func (r *recorder) hotRate(from, to time.Duration) float64 {
	if to <= from {
		return 0
	}
	n := 0
	for _, s := range r.hotAt {
		if s >= from && s < to {
			n++
		}
	}
	return float64(n) / (to - from).Seconds()
}

// changeResults measures the hottest key around each limit change, from its admission
// instants (in order).
func (r *recorder) changeResults() []ChangeResult {
	sc := r.sc
	var out []ChangeResult
	oldRate, oldBurst := sc.Rate, sc.Burst
	for i, c := range sc.LimitChanges {
		end := sc.Duration
		if i+1 < len(sc.LimitChanges) {
			end = sc.LimitChanges[i+1].At
		}
		cr := ChangeResult{AtS: c.At.Seconds(), SpreadS: c.Spread.Seconds(),
			OldRate: oldRate, OldBurst: oldBurst, NewRate: c.Rate, NewBurst: c.Burst}
		converged := c.At + c.Spread
		for _, w := range changeWindows {
			during := 2*float64(max(oldBurst, c.Burst)) + max(oldRate, c.Rate)*w.Seconds()
			after := 2*float64(c.Burst) + c.Rate*w.Seconds()
			eachWindow(r.hotAt, w, func(s time.Duration, n int) {
				switch {
				case s+w > c.At && s <= converged:
					if v := float64(n) / during; v > cr.DuringOverBound {
						cr.DuringOverBound, cr.DuringW = v, w.String()
					}
				case s > converged && s+w <= end:
					if v := float64(n) / after; v > cr.AfterOverBound {
						cr.AfterOverBound, cr.AfterW = v, w.String()
					}
				}
			})
		}
		settle := min(time.Second, c.Spread/5) // for the bucket to drain to the new level
		cr.DuringPerS = r.hotRate(c.At+settle, converged)
		cr.AfterPerS = r.hotRate(converged+settle, end)
		out = append(out, cr)
		oldRate, oldBurst = c.Rate, c.Burst
	}
	return out
}
