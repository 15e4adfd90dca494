package sim

import (
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// TestRollingDeploy rolls out a change of the limit's kind or window over 20 servers,
// one server after another over 2 s, with the hot key asking 3× its limit: servers that
// disagree count the key in two representations, and each decides on both (the fleet's
// record, docs/limits.md). Every window that overlaps the rollout holds the key within
// the larger configuration's bound, 2·max(B) + max(r)·W, and every window after it
// within the new one's; the key is not starved meanwhile.
func TestRollingDeploy(t *testing.T) {
	base := Scenario{Servers: 20, Duration: 8 * time.Second, Rate: 200, Burst: 100, Demand: 600,
		Policy: FailLocal, GoModel: true, Seed: 1}
	for _, tc := range []struct {
		name   string
		from   string // the kind before (kindExact, kindWindowed reporting every DefaultWindowed, kindChargeLater)
		shards int    // a windowed kind's shards before
		change LimitChange
	}{
		{"windowed-to-exact", kindWindowed, 0, LimitChange{Rate: 200, Burst: 100, Kind: kindExact}},
		{"exact-to-windowed", kindExact, 0, LimitChange{Rate: 200, Burst: 100, Kind: kindWindowed}},
		{"windowed-to-charge-later", kindWindowed, 0, LimitChange{Rate: 200, Burst: 100, Kind: kindChargeLater}},
		{"window-halved", kindWindowed, 0, LimitChange{Rate: 400, Burst: 100, Kind: kindWindowed, Report: 100 * time.Millisecond}},
		// the unsharded format to a Cluster's shards (a release that shards, or a fleet
		// moving to a Cluster): the same window, counted in other keys
		{"windowed-to-shards", kindWindowed, 0, LimitChange{Rate: 200, Burst: 100, Kind: kindWindowed, Shards: wire.WindowShards}},
		// a release that counts a Cluster's windowed limits in 64 shards, its marks in 16
		// sets, to this one's wire.WindowShards
		{"shards-64-to-60", kindWindowed, 64, LimitChange{Rate: 200, Burst: 100, Kind: kindWindowed, Shards: wire.WindowShards}},
		// a charge-later limit's low keys in one set to a Cluster's wire.LowShards: servers
		// that disagree do not read each other's marks
		{"low-keys-to-sets", kindChargeLater, 0, LimitChange{Rate: 200, Burst: 100, Kind: kindChargeLater, Shards: wire.LowShards}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := base
			sc.Name, sc.WindowShards = tc.name, tc.shards
			tc.change.At, tc.change.Spread = time.Second, 2*time.Second
			sc.LimitChanges = []LimitChange{tc.change}
			st := Hybrid
			switch tc.from {
			case kindWindowed:
				sc.Windowed, st = DefaultWindowed, HybridWindow
			case kindChargeLater:
				sc.Async, st = DefaultAsync, HybridAsync
			}
			res, err := Run(t, sc, st)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.LimitChanges) != 1 {
				t.Fatalf("%d limit changes measured, want 1", len(res.LimitChanges))
			}
			c := res.LimitChanges[0]
			t.Logf("worst window %.3f of the larger bound while servers disagree (%s), %.3f of the new one after (%s); %.0f/s, then %.0f/s",
				c.DuringOverBound, c.DuringW, c.AfterOverBound, c.AfterW, c.DuringPerS, c.AfterPerS)
			atMost(t, "admissions over the larger bound while servers disagree", c.DuringOverBound, 1)
			atMost(t, "admissions over the new bound once they agree", c.AfterOverBound, 1)
			// A request passes only if both representations admit it, until the old
			// one's record expires (up to 90 s after its last server went: the whole
			// run here): the key runs under the lower rate, at less than either would
			// alone, and is not starved.
			atLeast(t, "admitted / the lower rate once they agree", c.AfterPerS/min(c.OldRate, c.NewRate), 0.5)
		})
	}
}
