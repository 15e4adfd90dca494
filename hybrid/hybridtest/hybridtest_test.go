package hybridtest_test

import (
	"testing"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid/hybridtest"
)

// TestBusyMakesEveryKind: the fixture's Limiter has decided through every tier, its
// counters agree with the Tally, and its breaker is open, as Busy promises.
func TestBusyMakesEveryKind(t *testing.T) {
	l, seen := hybridtest.Busy(t)
	heard := seen.Counts()
	for _, k := range hybridtest.BusyOutcomes {
		if heard[k] == 0 {
			t.Errorf("no decision %+v; heard %v", k, heard)
		}
	}
	st := l.Stats()
	var counted int64
	for _, ls := range st.Limits {
		counted += ls.Allowed() + ls.Denied()
	}
	var total int64
	for _, n := range heard {
		total += n
	}
	if counted != total || st.Breaker != breaker.StateOpen {
		t.Errorf("Stats count %d decisions, the Tally %d; breaker %v (want open)", counted, total, st.Breaker)
	}
	if len(hybridtest.Metrics) == 0 {
		t.Error("no metrics listed")
	}
}
