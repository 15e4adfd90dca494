package sim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	mserver "github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
)

// limiterRun is what a fleet of real hybrid.Limiters did.
type limiterRun struct {
	requests, admitted int64
	stats              hybrid.Stats // summed over the fleet
}

// runLimiters runs sc's fleet with the production stack — one hybrid.Limiter, global.Store,
// breaker and go-redis client per server, one miniredis — inside a synctest bubble: every
// request is a goroutine calling Limiter.Allow at its arrival instant, and every Redis
// command waits sc.RTT (a miniredis hook sleeping on the bubble's clock). During
// sc.Outage the hook drops every script unexecuted and unanswered, as the simulator's
// Redis does: callers hear nothing and time out. Only the hot-key shape (one key, uniform
// balancer) is supported.
func runLimiters(t *testing.T, sc Scenario) limiterRun {
	sc, err := sc.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	var out limiterRun
	synctest.Test(t, func(t *testing.T) {
		base := time.Now() // the bubble's clock moves only when every goroutine waits
		down := func() bool {
			since := time.Since(base)
			return since >= sc.Outage.Start && since < sc.Outage.End
		}
		m := miniredis.NewMiniRedis()
		m.ClockTTL(true)    // TIME and TTLs follow the bubble's clock (SetTime is never called)
		c0, err := m.Dial() // starts the server without a listener
		if err != nil {
			t.Fatal(err)
		}
		c0.Close()
		m.Server().SetPreHook(func(_ *mserver.Peer, cmd string, _ ...string) bool {
			// Only the scripts a client sends: the hook also sees the commands a script
			// runs, under miniredis's lock, where sleeping would stall every connection.
			if cmd != "EVALSHA" && cmd != "EVAL" {
				return false
			}
			if down() {
				return true // handled: not run, and no reply is written
			}
			time.Sleep(sc.RTT)
			return false
		})
		ctx := context.Background()
		lims := make([]*hybrid.Limiter, sc.Servers)
		for i := range lims {
			c := redis.NewClient(&redis.Options{
				Addr:                     "127.0.0.1:6379", // never dialled: the Dialer is
				Dialer:                   func(context.Context, string, string) (net.Conn, error) { return m.Dial() },
				MaxRetries:               -1,
				ReadTimeout:              time.Second,
				MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
			})
			defer c.Close()
			store, err := global.New(c, global.ServerID(fmt.Sprintf("srv%d", i)))
			if err != nil {
				t.Fatal(err)
			}
			brk, err := breaker.New(breaker.Settings{Timeout: sc.Deadline, IsFailure: global.IsUnavailable})
			if err != nil {
				t.Fatal(err)
			}
			lims[i], err = hybrid.New(store, hybrid.Config{
				Limits:    []hybrid.Limit{{Name: "x", Rate: sc.Rate, Burst: sc.Burst, Policy: policyOf(sc.Policy), Timeout: sc.Deadline}},
				FleetSize: sc.Servers,
				Breaker:   brk,
				Seed:      uint64(i + 1),
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		rng := rand.New(rand.NewPCG(sc.Seed, 7))
		var wg sync.WaitGroup
		var admitted atomic.Int64
		for i := 0; ; i++ {
			at := time.Duration((float64(i) + rng.Float64()) / sc.Demand * float64(time.Second))
			if at >= sc.Duration {
				break
			}
			time.Sleep(time.Until(base.Add(at)))
			lim := lims[rng.IntN(len(lims))]
			out.requests++
			wg.Go(func() {
				d, err := lim.Allow(ctx, "x", "hot")
				if err != nil {
					t.Error(err)
				}
				if d.Allowed && time.Since(base) <= sc.Duration {
					admitted.Add(1)
				}
			})
		}
		wg.Wait()
		for _, l := range lims {
			if err := l.Close(ctx); err != nil {
				t.Error(err)
			}
			s := l.Stats()
			out.stats.PreCheck += s.PreCheck
			out.stats.Lease += s.Lease
			out.stats.Global += s.Global
			out.stats.Fallback += s.Fallback
			out.stats.Takes += s.Takes
			out.stats.RoundTrips += s.RoundTrips
			out.stats.RefundCalls += s.RefundCalls
		}
		out.admitted = admitted.Load()
		m.Close()
	})
	return out
}

// TestSimTracksLimiter runs small fleets twice: with the simulator's hybrid strategy and
// with real hybrid.Limiters in a synctest bubble. The simulator repeats the Limiter's
// orchestration around the library's lease core; if the two drift apart (a change to the
// Limiter not carried into sim/hybrid.go), admissions, Redis calls or the decisions that
// waited for Redis stop agreeing.
func TestSimTracksLimiter(t *testing.T) {
	cases := []Scenario{
		{Name: "hot", Servers: 10, Duration: 2 * time.Second, Rate: 2000, Burst: 200, Demand: 3000, Policy: FailLocal},
		{Name: "abusive", Servers: 20, Duration: 5 * time.Second, Rate: 20, Burst: 20, Demand: 2000, Policy: FailLocal},
		{Name: "wide", Servers: 50, Duration: 2 * time.Second, Rate: 10000, Burst: 1000, Demand: 15000, Policy: FailLocal},
		// Redis stops answering for a second, under each policy: the breakers, the
		// fallback and the recovery must match too.
		{Name: "outage fail-local", Servers: 10, Duration: 3 * time.Second, Rate: 2000, Burst: 200, Demand: 3000,
			Outage: Window{Start: time.Second, End: 2 * time.Second}, Policy: FailLocal},
		{Name: "outage fail-closed", Servers: 10, Duration: 3 * time.Second, Rate: 2000, Burst: 200, Demand: 3000,
			Outage: Window{Start: time.Second, End: 2 * time.Second}, Policy: FailClosed},
		{Name: "outage fail-open", Servers: 10, Duration: 3 * time.Second, Rate: 2000, Burst: 200, Demand: 3000,
			Outage: Window{Start: time.Second, End: 2 * time.Second}, Policy: FailOpen},
	}
	for _, sc := range cases {
		sc.Jitter = -1 // the Limiters' Redis answers after exactly RTT
		t.Run(sc.Name, func(t *testing.T) {
			sim, err := Run(t, sc, Hybrid)
			if err != nil {
				t.Fatal(err)
			}
			prod := runLimiters(t, sc)
			calls := float64(prod.stats.Takes+prod.stats.RefundCalls) / float64(prod.requests)
			t.Logf("simulator: %d of %d admitted, %.4f calls/request, %d decided after a refill",
				sim.Admitted, sim.Requests, sim.RedisCallsPerRequest, sim.Sources["global"])
			t.Logf("Limiters:  %d of %d admitted, %.4f calls/request, %d decided after a refill (takes %d, refunds %d, round trips %d)",
				prod.admitted, prod.requests, calls, prod.stats.Global, prod.stats.Takes, prod.stats.RefundCalls, prod.stats.RoundTrips)
			if sim.Requests != prod.requests {
				t.Fatalf("requests: simulator %d, Limiters %d", sim.Requests, prod.requests)
			}
			if d := math.Abs(float64(sim.Admitted-prod.admitted)) / float64(prod.admitted); d > 0.03 {
				t.Errorf("admitted: simulator %d, Limiters %d (%.1f%% apart, want <= 3%%)", sim.Admitted, prod.admitted, 100*d)
			}
			if r := sim.RedisCallsPerRequest / calls; r < 0.8 || r > 1.25 {
				t.Errorf("Redis calls per request: simulator %.4f, Limiters %.4f (ratio %.2f, want 0.8-1.25)", sim.RedisCallsPerRequest, calls, r)
			}
			if r := float64(sim.Sources["global"]) / float64(prod.stats.Global); r < 0.8 || r > 1.25 {
				t.Errorf("decisions after a refill: simulator %d, Limiters %d (want within 0.8-1.25x)", sim.Sources["global"], prod.stats.Global)
			}
			if sc.Outage.End > sc.Outage.Start {
				t.Logf("decided by the policy: simulator %d, Limiters %d", sim.Sources["fallback"], prod.stats.Fallback)
				if r := float64(sim.Sources["fallback"]) / float64(prod.stats.Fallback); prod.stats.Fallback == 0 || r < 0.8 || r > 1.25 {
					t.Errorf("decided by the policy: simulator %d, Limiters %d (want some, within 0.8-1.25x)", sim.Sources["fallback"], prod.stats.Fallback)
				}
			}
		})
	}
}
