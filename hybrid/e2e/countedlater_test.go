package e2e_test

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
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// countedLater is a kind of limit whose servers admit a key they do not know low without
// asking Redis (hybrid.ReasonAsync) and count the admission later.
type countedLater struct {
	name string
	mode hybrid.Mode
	// coldRate and coldBurst are the cold keys' limit; checkCold asserts what Redis and
	// the servers hold of the cold keys' admissions once the servers are closed.
	coldRate  float64
	coldBurst int
	checkCold func(t *testing.T, run coldRun)
	// hotFloor is the share of rate·T the fleet admits at least of a key turning hot.
	hotFloor float64
	// learnsLow: the servers learn the hot key is low, so that at most S·c + rate·T of
	// its admissions go without Redis.
	learnsLow bool
}

// coldRun is what the cold keys' check reads: the fleet, closed, that admitted perKey
// requests for each of keys keys, and when they began.
type coldRun struct {
	fleet        []*server
	rate         float64
	burst        int
	keys, perKey int
	start        time.Time // before the first request
	takes        int64     // the fleet's refills before the first request
}

// sumStats sums f over the single limit of every server of fleet.
func sumStats(fleet []*server, f func(hybrid.LimitStats) int64) (n int64) {
	for _, s := range fleet {
		n += f(s.limiter.Stats().Limits[0])
	}
	return n
}

var countedLaterKinds = []countedLater{
	{name: "charge-later", mode: hybrid.ChargeLater(20 * time.Millisecond),
		coldRate: 0.01, coldBurst: 40, checkCold: chargedOnce,
		hotFloor: 0.9, learnsLow: true},
	{name: "windowed", mode: hybrid.Windowed(20 * time.Millisecond),
		// windows of 100 s: the counts are read after Close, one key a round trip, and
		// an array is gone a second after the end of the window after its own; under
		// -race on a loaded machine the run and the reads have taken 16 s
		coldRate: 0.1, coldBurst: 10, checkCold: countedOnce,
		// keys over their limit get about 95% of burst + rate·T in the simulator
		hotFloor: 0.8},
}

// chargedOnce: no refill and nothing owed for keys admitted without Redis, one charge
// for each admission (and for each server's warm-up probes that went in without Redis,
// one a pass), and every bucket holds burst − perKey.
func chargedOnce(t *testing.T, r coldRun) {
	if takes := sumStats(r.fleet, func(s hybrid.LimitStats) int64 { return s.Takes }) - r.takes; takes != 0 {
		t.Errorf("%d refills for keys admitted without Redis", takes)
	}
	charged := sumStats(r.fleet, func(s hybrid.LimitStats) int64 { return s.Charged })
	probes := warmPasses * len(r.fleet)
	if owed := sumStats(r.fleet, func(s hybrid.LimitStats) int64 { return s.Owed }); charged != int64(r.keys*r.perKey+probes) || owed != 0 {
		t.Errorf("charged %d (owed %d), want the %d admissions and the %d probes that went in without Redis", charged, owed, r.keys*r.perKey, probes)
	}
	lim, _ := global.NewLimit("api", r.rate, r.burst)
	for k := range r.keys {
		g, err := redisstore.Of(r.fleet[0].store).Take(context.Background(), redisstore.Limit(lim), fmt.Sprintf("k%d", k), 1, 1)
		if err != nil {
			t.Fatal(err)
		}
		// 0.01 tokens a second refill: the test's seconds add a few hundredths.
		if want := float64(r.burst - r.perKey - 1); g.Remaining < want-0.01 || g.Remaining > want+0.2 {
			t.Fatalf("bucket of k%d holds %.3f after a take of 1, want %v: the charges did not land once each", k, g.Remaining, want)
		}
	}
}

// countedOnce: Redis counts each key's perKey admissions in its windows, no more (the
// servers gave back the grants they held).
func countedOnce(t *testing.T, r coldRun) {
	lim := redisstore.Limit{Name: "api", Rate: r.rate, Burst: r.burst}
	w := wire.WindowMicros(r.rate, r.burst)
	for k := range r.keys {
		// the key's windows from the run's start to now, read with an add of 0
		id := redisstore.IDOf(fmt.Sprintf("k%d", k))
		phase := wire.WindowPhase(string(id), w)
		trip := redisstore.WindowTrip{Limit: lim, Width: 1 << 18}
		for win := wire.WindowIndex(r.start.UnixMicro(), phase, w) - 1; win <= wire.WindowIndex(time.Now().UnixMicro(), phase, w)+1; win++ {
			trip.Ops = append(trip.Ops, redisstore.WindowOp{ID: id, Win: win})
		}
		if err := redisstore.Of(r.fleet[0].store).Windows(context.Background(), &trip); err != nil {
			t.Fatal(err)
		}
		sum := 0
		for _, op := range trip.Ops {
			sum += op.Count
		}
		if sum != r.perKey {
			t.Fatalf("k%d: Redis counts %d over its windows, want the %d admissions", k, sum, r.perKey)
		}
	}
}

// warmPasses is how many times warmFleet goes over the fleet.
const warmPasses = 2

// warmFleet starts n servers sharing prefix with one limit lim (named "api"), and waits
// until each admits a key it does not know without asking Redis (ReasonAsync): its first
// exchange with the fleet, of low keys or of marks, is answered.
//
// It waits twice over the fleet. A windowed server that admits nothing reads the fleet's
// marks once more and then stops, and its marks go stale 0.75 s after its last free
// admission: on a loaded machine warming the later servers can outlast that for the
// first ones. The second pass finds each server admitting freely again, together.
// Each pass ends on one admission without Redis per server.
func warmFleet(t *testing.T, addr, prefix string, n int, lim hybrid.Limit, counter *redistest.Counter) []*server {
	t.Helper()
	fleet := make([]*server, n)
	for i := range fleet {
		fleet[i] = newServer(t, addr, prefix, counter, breaker.Settings{Timeout: time.Second}, hybrid.Config{
			FleetSize: n, Limits: []hybrid.Limit{lim}})
	}
	ctx := context.Background()
	probe := 0
	for range warmPasses {
		for i, s := range fleet {
			deadline := time.Now().Add(5 * time.Second)
			for ; ; probe++ {
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
			probe++
		}
	}
	return fleet
}

// TestCountedLaterFleet: 8 servers share one Redis with a limit whose keys are admitted
// without asking Redis and counted later, of each kind (hybrid.ChargeLater: charged to
// the bucket within 20ms; hybrid.Windowed: counted in the key's window, reports every
// 20ms), on miniredis and on a real Redis.
//
// Cold keys: each of 100 keys gets 3 requests, at 3 random servers (a charge-later server
// holds one admission per key uncharged: a second one within its time asks Redis). Every
// one is admitted at once, without a round trip of its own (ReasonAsync); once the
// servers close, each admission was counted once: the kind's checkCold.
//
// A key turning hot: 64 goroutines over the 8 servers ask for one key for a second. The
// fleet admits at most 2·burst + rate·T + S·c (c = ceil(burst/S), what each server may
// admit before it hears the key is low) and at least the kind's hotFloor of rate·T; under
// a charge-later limit most of its decisions are not charge-later ones: the servers
// learnt the key is low.
func TestCountedLaterFleet(t *testing.T) {
	const servers = 8
	for _, kind := range countedLaterKinds {
		limit := func(rate float64, burst int) hybrid.Limit {
			return hybrid.Limit{Name: "api", Rate: rate, Burst: burst, Policy: breaker.FailClosed, MaxWait: time.Second, Mode: kind.mode}
		}
		t.Run(kind.name, func(t *testing.T) {
			targets(t, func(t *testing.T, addr string, real bool) {
				ctx := context.Background()
				t.Run("cold keys", func(t *testing.T) {
					run := coldRun{rate: kind.coldRate, burst: kind.coldBurst, keys: 100, perKey: 3}
					var counter redistest.Counter
					run.fleet = warmFleet(t, addr, randomPrefix(), servers, limit(run.rate, run.burst), &counter)
					before := counter.Trips.Load()
					run.takes = sumStats(run.fleet, func(s hybrid.LimitStats) int64 { return s.Takes })
					rng := rand.New(rand.NewPCG(1, 2))
					run.start = time.Now()
					for k := range run.keys {
						for _, i := range rng.Perm(servers)[:run.perKey] {
							d, err := run.fleet[i].limiter.Allow(ctx, "api", fmt.Sprintf("k%d", k))
							if err != nil || !d.Allowed || d.Reason != hybrid.ReasonAsync {
								t.Fatalf("key k%d: %+v, %v; want admitted without Redis", k, d, err)
							}
						}
					}
					t.Logf("%d requests in %v, %d round trips meanwhile (charges, reports, exchanges)",
						run.keys*run.perKey, time.Since(run.start), counter.Trips.Load()-before)
					for _, s := range run.fleet {
						if err := s.limiter.Close(ctx); err != nil {
							t.Fatal(err)
						}
					}
					kind.checkCold(t, run)
				})
				t.Run("hot key", func(t *testing.T) {
					const rate, burst = 100, 40
					fleet := warmFleet(t, addr, randomPrefix(), servers, limit(rate, burst), nil)
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
					floor := kind.hotFloor * rate * run.Seconds()
					t.Logf("admitted %d in %.2fs (%d without asking Redis); bound 2·burst + rate·T + S·c = %.0f, floor %.0f",
						admitted.Load(), elapsed, async.Load(), bound, floor)
					if a := float64(admitted.Load()); a > bound || a < floor {
						t.Errorf("admitted %.0f, want at most %.0f and at least %.0f", a, bound, floor)
					}
					if a := async.Load(); kind.learnsLow && a > int64(servers*c)+int64(rate*elapsed) {
						t.Errorf("%d admitted without Redis: the servers did not learn the key is low", a)
					}
				})
			})
		})
	}
}
