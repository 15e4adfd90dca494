package sim

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// Run simulates sc under strategy st and returns what it measured. It is deterministic:
// the same scenario (including Seed) and strategy give the same Result, but for WallMS.
//
// The per-request strategies (Naive, Script, ScriptCallerClock) run on the Go model of the
// scripts, which TestModelMatchesScripts holds to the Lua; Hybrid runs the real scripts of
// package lua on an embedded miniredis whose clock follows the virtual one.
//
// Hybrid runs inside a testing/synctest bubble of t: the breaker package's breakers and
// deadlines read time.Now, and in the bubble that clock is kept on the virtual one. The
// other strategies do not use t, which may then be nil.
func Run(t *testing.T, sc Scenario, st Strategy) (res Result, err error) {
	start := time.Now()
	if st != Hybrid {
		res, err = simulate(sc, st, false)
	} else {
		synctest.Test(t, func(*testing.T) {
			res, err = simulate(sc, st, true)
		})
	}
	res.WallMS = float64(time.Since(start).Microseconds()) / 1000
	return res, err
}

func simulate(sc Scenario, st Strategy, inBubble bool) (Result, error) {
	sc, err := sc.withDefaults()
	if err != nil {
		return Result{}, err
	}
	f := &fleet{sc: &sc, rng: rand.New(rand.NewPCG(sc.Seed, uint64(len(sc.Name))))}
	f.redis.f = f
	f.arriveFn = f.arrive
	f.rec = newRecorder(&sc)
	f.keys = make([]string, sc.Keys)
	for k := range f.keys {
		f.keys[k] = wire.BucketKey("fl:", sc.Name, fmt.Sprintf("k%d", k))
	}
	if sc.Keys > 1 {
		f.zipf = rand.NewZipf(f.rng, sc.ZipfS, 1, uint64(sc.Keys-1))
	}
	var hyb *hybridStrat
	switch st {
	case Naive:
		f.strat = &naive{f: f, m: newModel()}
	case Script, ScriptCallerClock:
		f.strat = &perRequest{f: f, s: newModel(), callerClock: st == ScriptCallerClock}
	case LocalOnly:
		f.strat = &localOnly{f: f}
	case Hybrid:
		var s scripts = newModel()
		if !sc.GoModel {
			lua, stop, err := startMiniredis()
			if err != nil {
				return Result{}, err
			}
			defer stop()
			defer func() { f.fail(lua.err) }()
			s = lua
		}
		if !inBubble {
			return Result{}, fmt.Errorf("%w: the hybrid strategy runs in a synctest bubble", ErrInvalidScenario)
		}
		b := newBubble(&f.e)
		defer b.close()
		if hyb, err = newHybrid(f, s, b); err != nil {
			return Result{}, err
		}
		f.strat = hyb
	default:
		return Result{}, fmt.Errorf("%w: unknown strategy %q", ErrInvalidScenario, st)
	}
	f.resize(sc.Servers)
	for _, c := range sc.Churn {
		f.e.at(c.At, func() {
			f.resize(c.Servers)
			if hyb != nil {
				// Servers learn the new fleet size from the heartbeat within a second.
				f.e.after(time.Second, func() { hyb.resize(len(f.live)) })
			}
		})
	}
	f.next(0)
	f.e.runUntil(sc.Duration)
	// Requests that arrived before the end are still decided (a saturated Redis may hold
	// them for a while); their admissions count as late.
	f.e.runUntil(sc.Duration + time.Minute)
	if f.err != nil {
		return Result{}, f.err
	}
	res := f.rec.result(st)
	res.RedisCalls, res.RedisRoundTrips = f.redis.calls, f.redis.trips
	if res.Requests > 0 {
		res.RedisCallsPerRequest = float64(res.RedisCalls) / float64(res.Requests)
		res.RedisRoundTripsPerRequest = float64(res.RedisRoundTrips) / float64(res.Requests)
	}
	res.RedisBusy = f.redis.busy.Seconds() / sc.Duration.Seconds()
	if res.Outage != nil {
		res.Outage.CallsDuring = f.redis.callsOut
	}
	if sc.FastBy != 0 {
		res.FastServer = fmt.Sprintf("srv%d +%v", sc.FastServer, sc.FastBy)
	}
	if hyb != nil {
		hyb.report(&res)
	}
	res.Events = f.e.events
	return res, nil
}

// startMiniredis starts an embedded miniredis whose TIME and TTLs follow the clock the
// simulator sets before each command; commands go straight into its dispatcher.
func startMiniredis() (*luaScripts, func(), error) {
	m := miniredis.NewMiniRedis()
	m.SetTime(epoch)
	m.ClockTTL(true)
	d, err := newDirectEval(m)
	if err != nil {
		return nil, nil, err
	}
	return &luaScripts{ev: d, mini: m}, m.Close, nil
}
