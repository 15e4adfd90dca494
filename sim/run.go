package sim

import (
	"fmt"
	"math/rand/v2"
	"strconv"
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
// scripts (internal/luamodel), which its differential tests hold to the Lua; Hybrid runs
// the engine hybrid.Limiter runs, one per server, and the real scripts of package lua on
// an embedded miniredis whose clock follows the virtual one (or on the model: GoModel).
//
// Hybrid runs inside a testing/synctest bubble of t: the breaker package's breakers and
// deadlines read time.Now, and in the bubble that clock is kept on the virtual one. The
// other strategies do not use t, which may then be nil.
func Run(t *testing.T, sc Scenario, st Strategy) (res Result, err error) {
	start := time.Now()
	if st != Hybrid && st != HybridAsync && st != HybridWindow {
		res, err = simulate(sc, st, false, nil)
	} else {
		synctest.Test(t, func(*testing.T) {
			res, err = simulate(sc, st, true, nil)
		})
	}
	res.WallMS = float64(time.Since(start).Microseconds()) / 1000
	return res, err
}

// simulate runs sc under st. A test passes custom to run another implementation of the
// hybrid strategy's servers on the same fleet, demand, network and Redis (st is Hybrid).
func simulate(sc Scenario, st Strategy, inBubble bool, custom func(f *fleet, b *bubble) strategyImpl) (Result, error) {
	sc, err := sc.withDefaults()
	if err != nil {
		return Result{}, err
	}
	if st == HybridAsync && sc.Async == 0 {
		sc.Async = DefaultAsync
	}
	if st == HybridWindow && sc.Windowed == 0 {
		sc.Windowed = min(DefaultWindowed, time.Duration(wire.WindowMicros(sc.Rate, sc.Burst))*time.Microsecond/2)
	}
	f := &fleet{sc: &sc, rng: rand.New(rand.NewPCG(sc.Seed, uint64(len(sc.Name))))}
	f.redis.f = f
	f.redis.masters = make([]master, sc.Masters)
	f.arriveFn = f.arrive
	f.rec = newRecorder(&sc)
	f.keys = make([]string, sc.Keys)
	f.bkeys = make([]string, sc.Keys)
	for k := range f.keys {
		f.keys[k] = "k" + strconv.Itoa(k)
		f.bkeys[k] = wire.BucketKey(keyPrefix, limitName, f.keys[k])
	}
	if sc.Masters > 1 && sc.Masters <= 256 {
		f.rec.keyMaster, f.rec.outMaster = make([]uint8, sc.Keys), make([][2]int64, sc.Masters)
		for k, b := range f.bkeys {
			if sc.Windowed > 0 { // a windowed key is counted in its shard, on the shard's master
				b = wire.MarksKey("", limitName, sc.WindowShards, wire.WindowShard(f.keys[k], sc.WindowShards))
			}
			f.rec.keyMaster[k] = uint8(sc.masterOf(b))
		}
	}
	if zk := sc.Keys - sc.cold.abuseKeys(); zk > 1 {
		f.zipf = rand.NewZipf(f.rng, sc.ZipfS, 1, uint64(zk-1))
	}
	switch st {
	case Naive:
		f.strat = &naive{f: f, m: newModel()}
	case Script, ScriptCallerClock:
		f.strat = &perRequest{f: f, s: newModel(), callerClock: st == ScriptCallerClock}
	case LocalOnly:
		f.strat = &localOnly{f: f}
	case Hybrid, HybridAsync, HybridWindow:
		if !inBubble {
			return Result{}, fmt.Errorf("%w: the hybrid strategy runs in a synctest bubble", ErrInvalidScenario)
		}
		b := newBubble(&f.e)
		defer b.close()
		if custom != nil {
			f.strat = custom(f, b)
			break
		}
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
		f.strat = newHybrid(f, s, b)
	default:
		return Result{}, fmt.Errorf("%w: unknown strategy %q", ErrInvalidScenario, st)
	}
	f.resize(sc.Servers)
	for _, c := range sc.Churn {
		f.e.at(c.At, func() { f.resize(c.Servers) })
	}
	f.next(0)
	f.startAbuse()
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
	res.RedisBusy = f.redis.busy.Seconds() / sc.Duration.Seconds() / float64(sc.Masters)
	res.Masters = sc.Masters
	for _, m := range f.redis.masters {
		res.MasterBusy = append(res.MasterBusy, m.steady.Seconds()/(sc.Duration-sc.steadyFrom()).Seconds())
		res.MasterRoundTrips = append(res.MasterRoundTrips, m.trips)
	}
	if u, _ := res.fault(); u != nil {
		u.CallsDuring = f.redis.callsOut
	}
	if sc.FastBy != 0 {
		res.FastServer = fmt.Sprintf("srv%d +%v", sc.FastServer, sc.FastBy)
	}
	if r, ok := f.strat.(reporter); ok {
		r.report(&sc, &res)
	}
	res.Events = f.e.ran
	return res, nil
}

// reporter is a strategy that adds to the Result what only it knows.
type reporter interface {
	report(sc *Scenario, res *Result)
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
