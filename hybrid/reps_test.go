package hybrid_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// TestMixedFleet runs two servers that disagree on a limit's kind or window, as while a
// release that changes it rolls out, on miniredis and a real Redis: once both are Ready
// (each has read the fleet's record of representations), a request on either is decided
// on both representations, so a burst of requests for one key is held to the stricter
// configuration (each has burst 10: a bucket admits its 10, a window its 10), where
// servers that each counted only their own would admit both configurations' bursts.
func TestMixedFleet(t *testing.T) {
	const rate, burst = 10, 10
	exact, later := hybrid.Exact(), hybrid.ChargeLater(100*time.Millisecond)
	win := hybrid.Windowed(100 * time.Millisecond) // a window of Burst/Rate = 1s
	for _, tc := range []struct {
		name string
		a, b hybrid.Mode
		// rateB is b's rate: b's window is burst/rateB.
		rateB float64
		// windows: no bucket on either side, so the stricter bound is the windowed
		// kind's, 2·Burst + Rate·T, not a bucket's Burst + Rate·T.
		windows bool
	}{
		{"windowed-exact", win, exact, rate, false},
		{"exact-windowed", exact, win, rate, false},
		{"windowed-charge-later", win, later, rate, false},
		{"two-windows", win, win, 2 * rate, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			redistest.Run(t, func(t *testing.T, tg redistest.Target) {
				s := newStore(t, tg.Client)
				var logs syncBuffer
				mk := func(m hybrid.Mode, r float64) *hybrid.Limiter {
					l := newLimiter(t, s, hybrid.Config{FleetSize: 2, HeartbeatInterval: 10 * time.Millisecond, Limits: []hybrid.Limit{
						{Name: "api", Rate: r, Burst: burst, Mode: m, Policy: breaker.FailClosed, MaxWait: time.Second}},
						Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
					return l
				}
				a := mk(tc.a, rate)
				// a records its representation first; b reads it when it starts, and a
				// reads b's at its next record (every 30 heartbeat intervals: 300ms here).
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := a.Ready(ctx); err != nil {
					t.Fatal(err)
				}
				b := mk(tc.b, tc.rateB)
				if err := b.Ready(ctx); err != nil {
					t.Fatal(err)
				}
				if !waitMixed(ctx, a, "api") {
					t.Fatal("a never met b's representation")
				}
				// b read a's representation before it was Ready, and said so.
				said := 0
				for _, l := range logs.lines(t) {
					if l["limit"] == "api" && l["representations"] == 2.0 {
						said++
					}
				}
				if said < 1 {
					t.Errorf("no log line says the limit has 2 representations: %v", logs.lines(t))
				}
				start := time.Now()
				admitted := 0
				for i := range 40 {
					l := a
					if i%2 == 1 {
						l = b
					}
					d, err := l.Allow(ctx, "api", "k")
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed {
						admitted++
					}
				}
				// The stricter configuration's bound: a bucket's burst and its refill
				// over the run (and one token of rounding), or a window's.
				bound := burst + int(rate*time.Since(start).Seconds()) + 1
				if tc.windows {
					bound += burst
				}
				if admitted > bound || admitted < burst/2 {
					t.Fatalf("%d of 40 requests for one key admitted across two servers in %v, want %d to %d: each decided on both representations",
						admitted, time.Since(start), burst/2, bound)
				}
			})
		})
	}
}

// waitMixed waits until l's Stats show that it read another representation of limit in
// the fleet's record (within a heartbeat interval), or ctx ends.
func waitMixed(ctx context.Context, l *hybrid.Limiter, limit string) bool {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, st := range l.Stats().Limits {
			if st.Name == limit && st.Representations > 1 {
				return true
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}
