package fleetlimit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// asyncFleet starts n servers sharing prefix with one charge-later limit "api" (Async
// 20ms) of rate and burst: warmFleet.
func asyncFleet(t *testing.T, addr, prefix string, n int, rate float64, burst int, counter *redistest.Counter) []*server {
	return warmFleet(t, addr, prefix, n, hybrid.Limit{Name: "api", Rate: rate, Burst: burst, Policy: breaker.FailClosed,
		MaxWait: time.Second, Mode: hybrid.ChargeLater(20 * time.Millisecond)}, counter)
}

// warmFleet starts n servers sharing prefix with one limit lim (named "api"), and waits
// until each admits a key it does not know without asking Redis (ReasonAsync): its first
// exchange with the fleet, of low keys or of marks, is answered.
func warmFleet(t *testing.T, addr, prefix string, n int, lim hybrid.Limit, counter *redistest.Counter) []*server {
	t.Helper()
	fleet := make([]*server, n)
	for i := range fleet {
		fleet[i] = newServer(t, addr, prefix, counter, breaker.Settings{Timeout: time.Second}, hybrid.Config{
			FleetSize: n, Limits: []hybrid.Limit{lim}})
	}
	ctx := context.Background()
	for i, s := range fleet {
		deadline := time.Now().Add(5 * time.Second)
		for probe := 0; ; probe++ {
			d, err := s.limiter.Allow(ctx, "api", fmt.Sprintf("probe-%d-%d", i, probe))
			if err != nil {
				t.Fatal(err)
			}
			if d.Reason == hybrid.ReasonAsync {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("server %d never admitted a new key without Redis: %+v", i, d)
			}
			time.Sleep(5 * time.Millisecond) // its next exchange
		}
	}
	return fleet
}

// TestAsyncFleet: 8 servers share one Redis with a charge-later limit (hybrid.ChargeLater).
//
// Cold keys: each of 100 keys gets 3 requests, at 3 random servers (a server holds one
// admission per key uncharged: a second one within Async asks Redis). Every one is
// admitted at once, without a round trip (ReasonAsync); once the servers close, every
// bucket holds burst − 3: each admission was charged, once.
//
// A key turning hot: 64 goroutines over the 8 servers ask for one key for a second. The
// fleet admits at most 2·burst + rate·T + S·c (c = ceil(burst/S), what each server may
// admit before it hears the key is low) and at least 90% of rate·T, and most of its
// decisions are not charge-later ones: the servers learnt the key is low.
func TestAsyncFleet(t *testing.T) {
	const servers = 8
	targets(t, func(t *testing.T, addr string, real bool) {
		ctx := context.Background()
		t.Run("cold keys", func(t *testing.T) {
			prefix := randomPrefix()
			const burst, perKey, keys = 40, 3, 100
			var counter redistest.Counter
			fleet := asyncFleet(t, addr, prefix, servers, 0.01, burst, &counter)
			before := counter.Trips.Load()
			sum := func(f func(hybrid.LimitStats) int64) (n int64) {
				for _, s := range fleet {
					n += f(s.limiter.Stats().Limits[0])
				}
				return n
			}
			takesBefore := sum(func(s hybrid.LimitStats) int64 { return s.Takes })
			rng := rand.New(rand.NewPCG(1, 2))
			for k := range keys {
				for _, i := range rng.Perm(servers)[:perKey] {
					s := fleet[i]
					d, err := s.limiter.Allow(ctx, "api", fmt.Sprintf("k%d", k))
					if err != nil || !d.Allowed || d.Reason != hybrid.ReasonAsync {
						t.Fatalf("key k%d: %+v, %v; want admitted without Redis", k, d, err)
					}
				}
			}
			t.Logf("%d requests, %d round trips meanwhile (charges, exchanges)", keys*perKey, counter.Trips.Load()-before)
			for _, s := range fleet {
				if err := s.limiter.Close(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// Not a take nor a refund for them: one charge each, and nothing owed.
			if takes := sum(func(s hybrid.LimitStats) int64 { return s.Takes }) - takesBefore; takes != 0 {
				t.Errorf("%d refills for keys admitted without Redis", takes)
			}
			charged := sum(func(s hybrid.LimitStats) int64 { return s.Charged })
			if owed := sum(func(s hybrid.LimitStats) int64 { return s.Owed }); charged != keys*perKey+servers || owed != 0 {
				t.Errorf("charged %d (owed %d), want the %d admissions and the %d probes that went in without Redis", charged, owed, keys*perKey, servers)
			}
			lim, _ := global.NewLimit("api", 0.01, burst)
			for k := range keys {
				g, err := fleet[0].store.Take(ctx, lim, fmt.Sprintf("k%d", k), 1, 1)
				if err != nil {
					t.Fatal(err)
				}
				// 0.01 tokens a second refill: the test's seconds add a few hundredths.
				if want := float64(burst - perKey - 1); g.Remaining < want-0.01 || g.Remaining > want+0.2 {
					t.Fatalf("bucket of k%d holds %.3f after a take of 1, want %v: the charges did not land once each", k, g.Remaining, want)
				}
			}
		})
		t.Run("hot key", func(t *testing.T) {
			prefix := randomPrefix()
			const rate, burst = 100, 40
			fleet := asyncFleet(t, addr, prefix, servers, rate, burst, nil)
			var admitted, async atomic.Int64
			run := time.Second
			elapsed := hammer(t, fleet, "hot", 64, run, func(d hybrid.Decision) {
				if d.Allowed {
					admitted.Add(1)
				}
				if d.Reason == hybrid.ReasonAsync {
					async.Add(1)
				}
			}).Seconds()
			c := (burst + servers - 1) / servers
			bound := 2*burst + rate*elapsed + float64(servers*c)
			t.Logf("admitted %d in %.2fs (%d without Redis); bound 2·burst + rate·T + S·c = %.0f", admitted.Load(), elapsed, async.Load(), bound)
			if a := float64(admitted.Load()); a > bound || a < 0.9*rate*run.Seconds() {
				t.Errorf("admitted %.0f, want at most %.0f and at least %.0f", a, bound, 0.9*rate*run.Seconds())
			}
			if a := async.Load(); a > int64(servers*c)+int64(rate*elapsed) {
				t.Errorf("%d admitted without Redis: the servers did not learn the key is low", a)
			}
		})
	})
}
