package hybridtest_test

import (
	"testing"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid/hybridtest"
	"github.com/fleetlimit/fleetlimit/internal/metricstest"
)

// TestBusyAgrees: the fixture's Limiter's counters agree with the Tally, and its breaker
// is open, as Busy promises. (internal/metricstest checks it decided through every tier.)
func TestBusyAgrees(t *testing.T) {
	l, seen := hybridtest.Busy(t)
	heard := seen.Counts()
	st := l.Stats()
	var counted int64
	for _, ls := range st.Limits {
		counted += metricstest.Allowed(ls) + metricstest.Denied(ls)
	}
	var total int64
	for _, n := range heard {
		total += n
	}
	if counted != total || st.Breaker != breaker.StateOpen {
		t.Errorf("Stats count %d decisions, the Tally %d; breaker %v (want open)", counted, total, st.Breaker)
	}
}
