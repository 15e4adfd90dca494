package hybrid_test

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

func TestModeValues(t *testing.T) {
	for _, tt := range []struct {
		m    hybrid.Mode
		str  string
		same hybrid.Mode
	}{
		{hybrid.Exact(), "exact", hybrid.Mode{}},
		{hybrid.ChargeLater(100 * time.Millisecond), "charge-later(100ms)", hybrid.ChargeLater(100 * time.Millisecond)},
		{hybrid.Windowed(120 * time.Millisecond), "windowed(120ms)", hybrid.Windowed(120 * time.Millisecond)},
		{hybrid.ChargeLater(0), "exact", hybrid.Exact()},
		{hybrid.Windowed(0), "exact", hybrid.Exact()},
	} {
		if got := tt.m.String(); got != tt.str {
			t.Errorf("String() = %q, want %q", got, tt.str)
		}
		if tt.m != tt.same {
			t.Errorf("%v != %v", tt.m, tt.same)
		}
	}
	if hybrid.ChargeLater(time.Second) == hybrid.Windowed(time.Second) {
		t.Error("ChargeLater and Windowed of the same duration compare equal")
	}
}

// TestModeRefusals: every Limit a mode cannot run is refused by New and
// Reconfigure, and every change of kind at run time, and every change a Windowed limit
// cannot take, by Reconfigure, with an error that wraps ErrInvalidConfig
// and names the field.
func TestModeRefusals(t *testing.T) {
	_, c := redistest.Mini(t)
	s := newStore(t, c)
	win := hybrid.Limit{Name: "api", Rate: 10, Burst: 10, Policy: breaker.FailOpen, Mode: hybrid.Windowed(100 * time.Millisecond)}
	with := func(base hybrid.Limit, f func(*hybrid.Limit)) hybrid.Limit {
		f(&base)
		return base
	}
	check := func(t *testing.T, what string, err error, want string) {
		t.Helper()
		switch {
		case !errors.Is(err, hybrid.ErrInvalidConfig):
			t.Errorf("%s = %v, want an error wrapping ErrInvalidConfig", what, err)
		case !strings.Contains(err.Error(), `limit "api": `+want):
			t.Errorf("%s = %v, want it to say %q", what, err, want)
		}
	}

	for _, tt := range []struct {
		name string
		lim  hybrid.Limit
		want string
	}{
		{"ChargeLater under 1ms", with(win, func(l *hybrid.Limit) { l.Mode = hybrid.ChargeLater(500 * time.Microsecond) }), "Mode: ChargeLater(500µs) must be at least 1ms"},
		{"ChargeLater negative", with(win, func(l *hybrid.Limit) { l.Mode = hybrid.ChargeLater(-time.Second) }), "Mode: ChargeLater(-1s)"},
		{"Windowed under 1ms", with(win, func(l *hybrid.Limit) { l.Mode = hybrid.Windowed(500 * time.Microsecond) }), "Mode: Windowed(500µs) must be at least 1ms"},
		{"Windowed with tiers", with(win, func(l *hybrid.Limit) { l.Tiers = []hybrid.Tier{{Name: "paid", Rate: 20, Burst: 20}} }), "Tiers: a Windowed limit has no tiers"},
		{"Windowed burst too large", with(win, func(l *hybrid.Limit) { l.Rate, l.Burst = redisstore.MaxWindowBurst+1, redisstore.MaxWindowBurst+1 }),
			fmt.Sprintf("Burst %d: a Windowed limit counts at most %d per window", redisstore.MaxWindowBurst+1, redisstore.MaxWindowBurst)},
		{"Windowed with a lifetime", with(win, func(l *hybrid.Limit) { l.Lease.Lifetime = time.Second }), "Lease: a Windowed limit holds no leases"},
		{"Windowed with a refill interval", with(win, func(l *hybrid.Limit) { l.Lease.RefillInterval = time.Second }), "Lease: a Windowed limit holds no leases"},
		{"Windowed without prefetch", with(win, func(l *hybrid.Limit) { l.Lease.LowWatermark = -1 }), "Lease: a Windowed limit holds no leases"},
		{"window under 100ms", with(win, func(l *hybrid.Limit) { l.Rate, l.Burst, l.Mode = 1000, 1, hybrid.Windowed(time.Millisecond) }), "Burst/Rate 1/1000"},
		{"window over a day", with(win, func(l *hybrid.Limit) { l.Rate, l.Burst = 1e-6, 1 }), "Burst/Rate 1/1e-06"},
		{"report over half the window", with(win, func(l *hybrid.Limit) { l.Mode = hybrid.Windowed(time.Second) }), "Mode: Windowed(1s) is more than half the window"},
		{"report over 10s", with(win, func(l *hybrid.Limit) { l.Rate, l.Burst, l.Mode = 1.0/60, 1, hybrid.Windowed(11*time.Second) }), "Mode: Windowed(11s) reports further apart than 10s"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := hybrid.New(s, hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{tt.lim}})
			check(t, "New", err, tt.want)
			other := hybrid.Limit{Name: "other", Rate: 1, Burst: 1, Policy: breaker.FailOpen}
			l := newLimiter(t, s, hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{other}})
			check(t, "Reconfigure", l.Reconfigure([]hybrid.Limit{other, tt.lim}), tt.want)
			if got := l.Limits(); len(got) != 1 || got[0].Name != "other" {
				t.Errorf("a refused limit was added: %+v", got)
			}
		})
	}

	exact := hybrid.Limit{Name: "api", Rate: 10, Burst: 10, Policy: breaker.FailOpen}
	for _, tt := range []struct {
		name     string
		from, to hybrid.Limit
		want     string
	}{
		{"report interval", win, with(win, func(l *hybrid.Limit) { l.Mode = hybrid.Windowed(50 * time.Millisecond) }), "Mode: "},
		{"windowed to exact", win, with(win, func(l *hybrid.Limit) { l.Mode = hybrid.Exact() }), "Mode: "},
		{"windowed to charge-later", win, with(win, func(l *hybrid.Limit) { l.Mode = hybrid.ChargeLater(50 * time.Millisecond) }), "Mode: "},
		{"exact to windowed", exact, win, "Mode: "},
		{"exact to charge-later", exact, with(exact, func(l *hybrid.Limit) { l.Mode = hybrid.ChargeLater(50 * time.Millisecond) }), "Mode: a limit's kind cannot change at run time (charge-later, was exact)"},
		{"charge-later to exact", with(exact, func(l *hybrid.Limit) { l.Mode = hybrid.ChargeLater(50 * time.Millisecond) }), exact, "Mode: a limit's kind cannot change at run time (exact, was charge-later)"},
		{"rate", win, with(win, func(l *hybrid.Limit) { l.Rate, l.Version = 5, 1 }), "Rate: a Windowed limit's Rate and Burst cannot change at run time"},
		{"burst", win, with(win, func(l *hybrid.Limit) { l.Burst, l.Version = 20, 1 }), "Rate: a Windowed limit's Rate and Burst cannot change at run time"},
		{"lease", win, with(win, func(l *hybrid.Limit) { l.Lease.Lifetime = time.Second }), "Lease: a Windowed limit holds no leases"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := newLimiter(t, s, hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{tt.from}})
			before := l.Limits()
			check(t, "Reconfigure", l.Reconfigure([]hybrid.Limit{tt.to}), tt.want)
			if got := l.Limits(); !reflect.DeepEqual(got, before) {
				t.Errorf("a refused change changed the limit: %+v, was %+v", got, before)
			}
		})
	}
}
