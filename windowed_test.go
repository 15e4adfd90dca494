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
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// windowedFleet starts n servers sharing prefix with one windowed limit "api" (reports
// every 20ms) of rate and burst: warmFleet.
func windowedFleet(t *testing.T, addr, prefix string, n int, rate float64, burst int, counter *redistest.Counter) []*server {
	return warmFleet(t, addr, prefix, n, hybrid.Limit{Name: "api", Rate: rate, Burst: burst, Policy: breaker.FailClosed,
		MaxWait: time.Second, Mode: hybrid.Windowed(20 * time.Millisecond)}, counter)
}

// TestWindowedFleet: 8 servers share one Redis with a windowed limit
// (hybrid.Windowed), on miniredis and on a real Redis.
//
// Cold keys: each of 100 keys gets 3 requests, at 3 random servers. Every one is admitted
// at once, without a round trip of its own (ReasonAsync); once the servers close, Redis
// counts each key's 3 admissions in its windows, no more (the servers gave back the
// grants they held).
//
// A key turning hot: 64 goroutines over the 8 servers ask for one key for a second. The
// fleet admits at most 2·burst + rate·T + S·c and at least 80% of rate·T (keys over their
// limit get about 95% of burst + rate·T in the simulator).
func TestWindowedFleet(t *testing.T) {
	const servers = 8
	targets(t, func(t *testing.T, addr string, real bool) {
		ctx := context.Background()
		t.Run("cold keys", func(t *testing.T) {
			prefix := randomPrefix()
			// windows of 100 s: the counts are read after Close, one key a round trip, and
			// an array is gone a second after the end of the window after its own; under
			// -race on a loaded machine the run and the reads have taken 16 s
			const rate, burst, perKey, keys = 0.1, 10, 3, 100
			var counter redistest.Counter
			fleet := windowedFleet(t, addr, prefix, servers, rate, burst, &counter)
			before := counter.Trips.Load()
			rng := rand.New(rand.NewPCG(1, 2))
			start := time.Now()
			for k := range keys {
				for _, i := range rng.Perm(servers)[:perKey] {
					d, err := fleet[i].limiter.Allow(ctx, "api", fmt.Sprintf("k%d", k))
					if err != nil || !d.Allowed || d.Reason != hybrid.ReasonAsync {
						t.Fatalf("key k%d: %+v, %v; want admitted without Redis", k, d, err)
					}
				}
			}
			t.Logf("%d requests in %v, %d round trips meanwhile (reports, reads)", keys*perKey, time.Since(start), counter.Trips.Load()-before)
			for _, s := range fleet {
				if err := s.limiter.Close(ctx); err != nil {
					t.Fatal(err)
				}
			}
			lim := global.Limit{Name: "api", Rate: rate, Burst: burst}
			w := wire.WindowMicros(rate, burst)
			for k := range keys {
				// the key's windows from the run's start to now, read with an add of 0
				id := global.IDOf(fmt.Sprintf("k%d", k))
				phase := wire.WindowPhase(string(id), w)
				trip := global.WindowTrip{Limit: lim, Width: 1 << 18}
				for win := wire.WindowIndex(start.UnixMicro(), phase, w) - 1; win <= wire.WindowIndex(time.Now().UnixMicro(), phase, w)+1; win++ {
					trip.Ops = append(trip.Ops, global.WindowOp{ID: id, Win: win})
				}
				if err := fleet[0].store.Windows(ctx, &trip); err != nil {
					t.Fatal(err)
				}
				sum := 0
				for _, op := range trip.Ops {
					sum += op.Count
				}
				if sum != perKey {
					t.Fatalf("k%d: Redis counts %d over its windows, want the %d admissions", k, sum, perKey)
				}
			}
		})
		t.Run("hot key", func(t *testing.T) {
			prefix := randomPrefix()
			const rate, burst = 100, 40
			fleet := windowedFleet(t, addr, prefix, servers, rate, burst, nil)
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
			t.Logf("admitted %d in %.2fs (%d without asking); bound 2·burst + rate·T + S·c = %.0f", admitted.Load(), elapsed, async.Load(), bound)
			if a := float64(admitted.Load()); a > bound || a < 0.8*rate*run.Seconds() {
				t.Errorf("admitted %.0f, want at most %.0f and at least %.0f", a, bound, 0.8*rate*run.Seconds())
			}
		})
	})
}

// TestWindowedRedisMemory: a windowed limit at the shortest window (100 ms, reports every
// 50 ms), 1,000 keys for 3 s on a redis-server of the test's own. Its arrays never
// exceed the stated bound, (4 + ⌈1 s / W⌉) arrays of 1.5 MB, and reach at least half of
// it (the formula is what it costs, not a loose ceiling); once the limiter is closed and
// the arrays' deadlines pass, nothing of it is left in Redis.
func TestWindowedRedisMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("3 s of load")
	}
	srv := redistest.StartServer(t)
	ctx := context.Background()
	const rate, burst, keys = 1000, 100, 1000
	s := newServer(t, srv.Addr, "mem:", nil, breaker.Settings{Timeout: time.Second}, hybrid.Config{FleetSize: 4,
		Limits: []hybrid.Limit{{Name: "api", Rate: rate, Burst: burst, Policy: breaker.FailClosed, Mode: hybrid.Windowed(50 * time.Millisecond)}}})
	w := time.Duration(wire.WindowMicros(rate, burst)) * time.Microsecond
	arrays := 4 + int((time.Second+w-1)/w)
	bound := int64(arrays) * 3 * (1 << 18) * 2
	c := srv.Client()
	var peak int64
	measure := func() {
		var sum int64
		for _, k := range c.Keys(ctx, "mem:win:*").Val() {
			sum += c.StrLen(ctx, k).Val()
		}
		peak = max(peak, sum)
	}
	deadline := time.Now().Add(3 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		if _, err := s.limiter.Allow(ctx, "api", fmt.Sprintf("k%d", i%keys)); err != nil {
			t.Fatal(err)
		}
		if i%2000 == 0 {
			measure()
		}
	}
	measure()
	t.Logf("peak %.1f MB in arrays, bound %.1f MB (%d arrays of 1.5 MB)", float64(peak)/1e6, float64(bound)/1e6, arrays)
	if peak > bound || peak < bound/2 {
		t.Errorf("peak %d bytes in arrays, want within [bound/2, bound] = [%d, %d]", peak, bound/2, bound)
	}
	if err := s.limiter.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range c.Keys(ctx, "mem:*").Val() {
		d := c.PTTL(ctx, k).Val()
		if d == -2 { // expired since it was listed
			continue
		}
		if d < 0 || d > 3*w+time.Second+100*time.Millisecond && k != "mem:marks:{api}" {
			t.Errorf("%s: TTL %v after Close", k, d)
		}
	}
}
