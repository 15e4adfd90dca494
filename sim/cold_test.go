package sim

import (
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"
)

// coldCost is the Redis cost model of a multi-key script, in the simulator's units (a
// one-key script call costs ScriptTime, 8 µs). Measured with TestRedisCost on redis-server
// 7.0.15 on the 2-vCPU machine of these figures:
//
//	redis-server --port 6391 --save '' --daemonize yes
//	go test ./sim -run TestRedisCost -v -args -rediscost localhost:6391
//
// lua.Take cost 13.6-14.2 µs per call there; the multi-key take 8.6-8.7 µs per key at
// 64-256 keys per call (14.3 µs with one key), and the leanest charge (one string per
// bucket, GET and SET PX) 7.3-7.6 µs per key. Scaled by 8 / 14 to the simulator's 8 µs
// per take call: 5 µs per key, and the 3 µs rest of a one-key call per call. The per-key
// work (three redis.call and the Lua arithmetic per key) is most of a script's cost: a
// multi-key script saves the per-call part only.
var coldCost = struct{ call, key time.Duration }{3 * time.Microsecond, 5 * time.Microsecond}

// coldScenarios are the many-keys scenario of the built-in suites, its 100,000-key
// variant, and both with one abusive key at 100× its limit added on top.
func coldScenarios() []Scenario {
	base := Scenario{Name: "many-keys", Servers: 200, Duration: 10 * time.Second, Seed: *seedFlag,
		Rate: 50, Burst: 50, Demand: 20000, Keys: 1000, ZipfS: 1.1, GoModel: true, Policy: FailLocal}
	base.cold = coldOpts{on: true, callTime: coldCost.call, keyTime: coldCost.key}
	k100 := base
	k100.Name, k100.Keys = "many-keys-100k", 100000
	var out []Scenario
	for _, sc := range []Scenario{base, k100} {
		out = append(out, sc)
		ab := sc
		ab.Name += "+abuser"
		ab.Keys++
		ab.cold.abuse = 100 * sc.Rate
		out = append(out, ab)
	}
	return out
}

type coldDesign struct {
	label string
	st    Strategy
	set   func(*Scenario)
}

func coldDesigns() []coldDesign {
	async := func(iv time.Duration) func(*Scenario) { return func(sc *Scenario) { sc.cold.report = iv } }
	return []coldDesign{
		{"script", Script, nil},
		{"hybrid", Hybrid, nil},
		{"hybrid-multikey", HybridMultiKey, nil},
		{"hybrid-shares", HybridShares, nil},
		{"hybrid-async 100ms", HybridAsync, async(100 * time.Millisecond)},
		{"hybrid-async 250ms", HybridAsync, async(250 * time.Millisecond)},
		{"engine async 100ms", Hybrid, func(sc *Scenario) { sc.Async = 100 * time.Millisecond }},
	}
}

var coldOnly = flag.String("cold", "", "TestColdKeys: run only these designs (comma-separated labels)")

// TestColdKeys compares the cold-key designs (docs/design.md, "Cold keys: designs
// compared") and prints one table per scenario. It runs only when named by -run and not
// under -short:
//
//	go test ./sim -run TestColdKeys -v
//	go test ./sim -run TestColdKeys -v -args -cold 'hybrid-async 100ms'   # one row per scenario
func TestColdKeys(t *testing.T) {
	if testing.Short() || !strings.Contains(flag.Lookup("test.run").Value.String(), "TestColdKeys") {
		t.Skip("the cold-key comparison runs only with -run TestColdKeys, without -short")
	}
	var ss []suite
	for _, sc := range coldScenarios() {
		s := suite{name: sc.Name}
		for _, d := range coldDesigns() {
			if *coldOnly != "" && !strings.Contains(","+*coldOnly+",", ","+d.label+",") {
				continue
			}
			c := sc
			if d.set != nil {
				d.set(&c)
			}
			s.runs = append(s.runs, run{label: d.label, sc: c, st: d.st})
		}
		ss = append(ss, s)
	}
	all := runSuites(t, ss)
	for i, s := range ss {
		var b strings.Builder
		fmt.Fprintf(&b, "%s: 200 servers, limit 50/s burst 50 per key, demand 20,000/s over %d Zipf keys", s.name, s.runs[0].sc.Keys-s.runs[0].sc.cold.abuseKeys())
		if a := s.runs[0].sc.cold.abuse; a > 0 {
			fmt.Fprintf(&b, " + one key at %v/s", a)
		}
		fmt.Fprintf(&b, "\n%-20s %7s %9s %9s %9s %9s %11s %11s %10s %7s\n", "design", "busy", "trips/req", "calls/req", "waited", "within", "hot/bound", "hot/2b+rW", "abuse/2b+rW", "p99 µs")
		for _, o := range all[i] {
			if o.err != nil {
				t.Fatalf("%s / %s: %v", s.name, o.name(), o.err)
			}
			r, c := o.res, o.res.Cold
			abuse := "-"
			if c.AbuseWorstW > 0 {
				abuse = fmt.Sprintf("%.3f@%v", c.AbuseWorst, c.AbuseWorstW)
			}
			fmt.Fprintf(&b, "%-20s %6.2f%% %9.4f %9.4f %8.2f%% %8.2f%% %11.4f %11s %10s %7.0f\n", o.name(), 100*r.RedisBusy,
				r.RedisRoundTripsPerRequest, r.RedisCallsPerRequest, 100*c.UnderLimitWaited, 100*r.UnderLimitAdmitted,
				r.HottestKeyOverBound, fmt.Sprintf("%.3f@%v", c.HotWorst, c.HotWorstW), abuse, r.P99DecisionUS)
		}
		t.Log("\n" + b.String())
	}
}
