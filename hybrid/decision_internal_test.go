package hybrid

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/internal/engine"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
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

// TestDecisionSetOverwrites: set, which fills a caller's Decision in place, writes every
// field, as building a new one does: a field set forgets would carry the caller's last
// decision into this one.
func TestDecisionSetOverwrites(t *testing.T) {
	_, c := redistest.Mini(t)
	s, err := global.New(c)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(s, Config{FleetSize: 1, Limits: []Limit{
		{Name: "api", Rate: 10, Burst: 20, Policy: breaker.FailOpen},
		{Name: "dry", Rate: 10, Burst: 20, Policy: breaker.FailOpen, DryRun: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	for _, tc := range []struct {
		limit string
		d     engine.Decision
	}{
		{"api", engine.Decision{Allowed: true, Source: engine.SourceLease, Reason: engine.ReasonLease, Remaining: 7, Servers: 1}},
		{"api", engine.Decision{Source: engine.SourceGlobal, Reason: engine.ReasonGranted, RetryAfter: time.Second, Servers: 3}},
		{"api", engine.Decision{Allowed: true, Source: engine.SourceFallback, Reason: engine.ReasonTimeout, Servers: 1}},
		{"dry", engine.Decision{Source: engine.SourcePreCheck, Reason: engine.ReasonPreCheck, RetryAfter: time.Second, Servers: 1}},
	} {
		lm := l.eng.Limit(tc.limit)
		var out Decision
		v := reflect.ValueOf(&out).Elem()
		for i := range v.NumField() { // every field away from its zero value
			switch f := v.Field(i); f.Kind() {
			case reflect.Bool:
				f.SetBool(true)
			case reflect.String:
				f.SetString("stale")
			case reflect.Int, reflect.Int64:
				f.SetInt(-12345)
			case reflect.Uint8:
				f.SetUint(99)
			default:
				t.Fatalf("Decision.%s: a %v, which this test cannot fill", v.Type().Field(i).Name, f.Kind())
			}
		}
		out.set(lm, "", &tc.d)
		if want := decision(lm, "", &tc.d); out != want {
			t.Errorf("%s %+v: set gives %+v, want %+v", tc.limit, tc.d, out, want)
		}
	}
}

// TestDryRunAdmitsOnlyDenials: a DryRun limit turns a denial into an admission
// (WouldDeny, no RetryAfter), but never a call that was not decided: an invalid cost, a
// caller's context that ended, a closed Limiter stay not allowed, as on an enforced limit.
func TestDryRunAdmitsOnlyDenials(t *testing.T) {
	_, c := redistest.Mini(t)
	s, err := global.New(c)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(s, Config{FleetSize: 1, Limits: []Limit{
		{Name: "dry", Rate: 10, Burst: 20, Policy: breaker.FailOpen, DryRun: true}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	lm := l.eng.Limit("dry")
	for _, tc := range []struct {
		d     engine.Decision
		admit bool
	}{
		{engine.Decision{Source: engine.SourcePreCheck, Reason: engine.ReasonPreCheck, RetryAfter: time.Second, Servers: 1}, true},
		{engine.Decision{Source: engine.SourceGlobal, Reason: engine.ReasonGranted, RetryAfter: time.Second, Servers: 1}, true},
		{engine.Decision{Reason: engine.ReasonInvalidCost, RetryAfter: InfDuration}, false},
		{engine.Decision{Source: engine.SourceFallback, Reason: engine.ReasonCanceled, Servers: 1}, false},
		{engine.Decision{Reason: engine.ReasonClosed}, false},
	} {
		got := decision(lm, "", &tc.d)
		if got.Allowed != tc.admit || got.WouldDeny != tc.admit || tc.admit && got.RetryAfter != 0 {
			t.Errorf("%v: %+v; want admitted as WouldDeny: %v", Reason(tc.d.Reason), got, tc.admit)
		}
	}
}
