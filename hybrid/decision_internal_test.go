package hybrid

import (
	"fmt"
	"testing"

	"github.com/fleetlimit/fleetlimit/internal/engine"
)

// TestDecisionValuesAreTheEngines: Source, Reason and InfDuration are the engine's
// values under names for users, so a Decision converts field by field; every value the
// engine gives has a name here.
func TestDecisionValuesAreTheEngines(t *testing.T) {
	sources := []struct {
		got  Source
		want engine.Source
	}{{SourcePreCheck, engine.SourcePreCheck}, {SourceLease, engine.SourceLease}, {SourceGlobal, engine.SourceGlobal}, {SourceFallback, engine.SourceFallback}}
	if len(sources) != int(engine.NumSources)-1 {
		t.Fatalf("%d sources here, %d in the engine", len(sources), engine.NumSources-1)
	}
	for _, s := range sources {
		if uint8(s.got) != uint8(s.want) {
			t.Errorf("%v = %d, the engine's is %d", s.got, s.got, s.want)
		}
	}
	reasons := []struct {
		got  Reason
		want engine.Reason
	}{
		{0, engine.ReasonNone}, {ReasonLease, engine.ReasonLease},
		{ReasonPaced, engine.ReasonPaced}, {ReasonExceedsBurst, engine.ReasonExceedsBurst},
		{reasonInvalidCost, engine.ReasonInvalidCost}, {ReasonPreCheck, engine.ReasonPreCheck},
		{ReasonGranted, engine.ReasonGranted}, {ReasonBreakerOpen, engine.ReasonBreakerOpen},
		{ReasonTimeout, engine.ReasonTimeout}, {ReasonUnavailable, engine.ReasonUnavailable},
		{reasonCanceled, engine.ReasonCanceled}, {reasonClosed, engine.ReasonClosed}, {ReasonAsync, engine.ReasonAsync},
	}
	// every reason but ReasonRefill, the engine's for a request that waits: never final
	if len(reasons) != int(engine.NumReasons)-1 {
		t.Fatalf("%d reasons here, %d in the engine", len(reasons), engine.NumReasons)
	}
	for _, r := range reasons {
		if uint8(r.got) != uint8(r.want) {
			t.Errorf("%v = %d, the engine's is %d", r.got, r.got, r.want)
		}
		if r.got.String() == fmt.Sprintf("Reason(%d)", r.got) {
			t.Errorf("reason %d has no name", r.got)
		}
	}
	if InfDuration != engine.InfDuration {
		t.Errorf("InfDuration %v, the engine's %v", InfDuration, engine.InfDuration)
	}
}
