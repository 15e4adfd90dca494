package sim

import (
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"
)

// coldScenarios are the many-keys scenario of the built-in suites, its 100,000-key
// variant, and both with one abusive key at 100× its limit added on top.
func coldScenarios() []Scenario { return coldVariants(false) }

// coldVariants are coldScenarios, and with late the same with the abusive key starting
// at 5 s, after the fleet learnt which keys are low: a key that turns hot at once.
func coldVariants(late bool) []Scenario {
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
		if late {
			ab.Name += "@5s"
			ab.cold.abuseAt = 5 * time.Second
			out = append(out, ab)
		}
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
		{"async-model 100ms", AsyncModel, async(100 * time.Millisecond)},
		{"async-model 250ms", AsyncModel, async(250 * time.Millisecond)},
		{"hybrid-async 100ms", HybridAsync, nil},
		{"hybrid-async 250ms", HybridAsync, func(sc *Scenario) { sc.Async = 250 * time.Millisecond }},
		{"window-array 100ms", WindowModel, async(100 * time.Millisecond)},
		{"window-array 120ms", WindowModel, async(120 * time.Millisecond)},
		{"window-array 300ms", WindowModel, async(300 * time.Millisecond)},
		{"window-array 200ms defer", WindowModel, func(sc *Scenario) { sc.cold.report, sc.cold.windowDefer = 200*time.Millisecond, true }},
		{"window-array 120ms sample", WindowModel, func(sc *Scenario) { sc.cold.report, sc.cold.windowSample = 120*time.Millisecond, true }},
		{"window-array 120ms routed", WindowModel, func(sc *Scenario) {
			sc.cold.report, sc.cold.windowSample, sc.cold.windowRoute = 120*time.Millisecond, true, true
		}},
		{"window-array exact", WindowModel, func(sc *Scenario) { sc.cold.windowExact = true }},
		// reports every 120ms (DefaultWindowed), or half the window if shorter (hot-key's)
		{"hybrid-window 120ms", HybridWindow, func(sc *Scenario) { sc.Windowed = 0 }},
	}
}

var (
	coldOnly   = flag.String("cold", "", "TestColdKeys: run only these designs (comma-separated labels)")
	coldLate   = flag.Bool("coldlate", false, "TestColdKeys: run the +abuser@5s scenarios as well")
	coldSpread = flag.Bool("coldspread", false, "TestColdKeys: run the +abuser/40 scenarios as well")
)

// coldSpreadVariants are the 1,000- and 100,000-key scenarios with one key at four times
// its limit (200/s) sent to 40 of the 200 servers only, 5/s each: a key over its limit
// that no server sees once a report interval, and that is not spread over the fleet.
func coldSpreadVariants() []Scenario {
	var out []Scenario
	for _, sc := range coldVariants(false) {
		if sc.cold.abuse > 0 {
			sc.Name += "/40"
			sc.cold.abuse, sc.cold.abuseServers = 4*sc.Rate, 40
			out = append(out, sc)
		}
	}
	return out
}

// onlyWhenNamed skips t, a comparison that prints tables and asserts nothing, unless
// -run names it and -short is off; what says what it runs, for the skip message.
func onlyWhenNamed(t *testing.T, name, what string) {
	if testing.Short() || !strings.Contains(flag.Lookup("test.run").Value.String(), name) {
		t.Skipf("%s runs only with -run %s, without -short", what, name)
	}
}

// coldSuite is scenario sc run by every cold-key design, or by those -cold names.
func coldSuite(t *testing.T, sc Scenario) suite {
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
	if len(s.runs) == 0 {
		t.Fatalf("-cold %q names no design", *coldOnly)
	}
	return s
}

// TestColdKeys compares the cold-key designs (docs/design.md, "Cold keys: designs
// compared") and prints one table per scenario. It runs only when named by -run and not
// under -short:
//
//	go test ./sim -run TestColdKeys -v
//	go test ./sim -run TestColdKeys -v -args -cold 'hybrid-async 100ms'   # one row per scenario
//	go test ./sim -run TestColdKeys -v -args -cold 'window-array 200ms defer' -coldlate -seed 2
func TestColdKeys(t *testing.T) {
	onlyWhenNamed(t, "TestColdKeys", "the cold-key comparison")
	var ss []suite
	scs := coldVariants(*coldLate)
	if *coldSpread {
		scs = append(scs, coldSpreadVariants()...)
	}
	for _, sc := range scs {
		ss = append(ss, coldSuite(t, sc))
	}
	all := runSuites(t, ss)
	for i, s := range ss {
		var b strings.Builder
		fmt.Fprintf(&b, "%s: 200 servers, limit 50/s burst 50 per key, demand 20,000/s over %d Zipf keys", s.name, s.runs[0].sc.Keys-s.runs[0].sc.cold.abuseKeys())
		if a := s.runs[0].sc.cold.abuse; a > 0 {
			fmt.Fprintf(&b, " + one key at %v/s", a)
			if n := s.runs[0].sc.cold.abuseServers; n > 0 {
				fmt.Fprintf(&b, " to %d servers", n)
			}
		}
		fmt.Fprintf(&b, "\n%-24s %7s %9s %9s %9s %9s %9s %7s %11s %11s %10s %9s %7s %9s\n", "design", "busy", "trips/req", "calls/req", "waited", "(>=1s)", "within", "over", "hot/bound", "hot/2b+rW", "abuse/2b+rW", "any/+S·c", "p99 µs", "abuse adm")
		for _, o := range all[i] {
			if o.err != nil {
				t.Fatalf("%s / %s: %v", s.name, o.name(), o.err)
			}
			r, c := o.res, o.res.Cold
			abuse, adm := "-", "-"
			if c.AbuseWorstW > 0 {
				abuse = fmt.Sprintf("%.3f@%v", c.AbuseWorst, c.AbuseWorstW)
				adm = fmt.Sprintf("%.1f%%", 100*c.AbuseOverBound)
			}
			fmt.Fprintf(&b, "%-24s %6.2f%% %9.4f %9.4f %8.2f%% %8.2f%% %8.2f%% %6.1f%% %11.4f %11s %10s %9.3f %7.0f %9s\n", o.name(), 100*r.RedisBusy,
				r.RedisRoundTripsPerRequest, r.RedisCallsPerRequest, 100*c.UnderLimitWaited, 100*c.UnderLimitWaitedAfter1s, 100*r.UnderLimitAdmitted, 100*c.OverLimitAdmitted,
				r.HottestKeyOverBound, fmt.Sprintf("%.3f@%v", c.HotWorst, c.HotWorstW), abuse, c.AnyWorstAsync, r.P99DecisionUS, adm)
		}
		t.Log("\n" + b.String())
	}
}

// TestColdSuites runs the cold-key designs (all, or those -cold names) on the built-in
// hot-key, abusive-client and sticky-client suites, which a design for per-client keys
// must not make worse, and prints one table per suite. It runs only when named by -run
// and not under -short:
//
//	go test ./sim -run TestColdSuites -v -args -cold 'hybrid,hybrid-async 100ms,window-array 120ms sample'
func TestColdSuites(t *testing.T) {
	onlyWhenNamed(t, "TestColdSuites", "the cold-key designs on the suites")
	var ss []suite
	for _, b := range suites(fullScale(), *seedFlag) {
		if b.name != "hot-key" && b.name != "abusive-client" && b.name != "sticky-client" {
			continue
		}
		ss = append(ss, coldSuite(t, b.runs[0].sc))
	}
	all := runSuites(t, ss)
	for i, s := range ss {
		var b strings.Builder
		fmt.Fprintf(&b, "%s\n%-26s %11s %9s %9s %7s %11s %9s\n", s.name, "design", "admitted/s", "calls/req", "trips/req", "busy", "p99 µs", "hot/bound")
		for _, o := range all[i] {
			if o.err != nil {
				t.Fatalf("%s / %s: %v", s.name, o.name(), o.err)
			}
			r := o.res
			fmt.Fprintf(&b, "%-26s %11.0f %9.4f %9.4f %6.2f%% %11.0f %9.3f\n", o.name(), r.AdmittedPerS, r.RedisCallsPerRequest, r.RedisRoundTripsPerRequest, 100*r.RedisBusy, r.P99DecisionUS, r.HottestKeyOverBound)
		}
		t.Log("\n" + b.String())
	}
}

// TestAsyncColdKeys holds hybrid-async (hybrid.ChargeLater(100ms)) to its claims on the
// cold-key scenarios, with one key at 100× its limit on top: every window of 10 ms to
// 10 s of the hottest key and of the abusive key, cold start included, within
// 2·burst + rate·W; the keys within their limit admitted (99.5%) and, but for a few,
// without waiting for Redis; the keys over their limit admitted what it allows (98% of
// burst + rate·T); fewer than half the exact leases' round trips per request.
// An abusive key that starts at 5 s, when the fleet knows no reason to ask Redis about
// it, is admitted once by each server at once: its windows are held to the stated bound
// 2·burst + rate·W + S·c, and shown to need it; so is every key's every window, and
// every window from 1 s on, past the fleet's cold start (when keys that drain only after
// the servers' warm-up are admitted once by each server), to 2·burst + rate·W. The
// waiting share is asserted at 1.5%: the runs wait 0.7-1.2% over seeds 1-5, the first
// 50 ms (0.5% of the run) included (docs/design.md §11).
func TestAsyncColdKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("six 200-server runs of 10 s")
	}
	t.Parallel()
	var ss []suite
	for _, sc := range coldVariants(true) {
		ss = append(ss, suite{name: sc.Name, runs: []run{{sc: sc, st: HybridAsync}}})
	}
	for i, runs := range runSuites(t, ss) {
		o := runs[0]
		if o.err != nil {
			t.Fatalf("%s: %v", ss[i].name, o.err)
		}
		r, c, name := o.res, o.res.Cold, ss[i].name
		atMost(t, name+": hottest key's worst window / (2·burst + rate·W)", c.HotWorst, 1)
		switch {
		case o.sc.cold.abuseAt > 0:
			atMost(t, name+": abusive key's worst window / (2·burst + rate·W + S·c)", c.AbuseWorstAsync, 1)
			atLeast(t, name+": abusive key's worst window / (2·burst + rate·W), a key that turns hot at once", c.AbuseWorst, 1.5)
		case c.AbuseWorstW > 0:
			atMost(t, name+": abusive key's worst window / (2·burst + rate·W)", c.AbuseWorst, 1)
		}
		if o.sc.cold.abuseAt == 0 {
			// Past the fleet's cold start no key turns hot at once: every key is held to the
			// exact bound.
			atMost(t, name+": any key's worst window from 1 s on / (2·burst + rate·W)", c.AnyWorstAfter1s, 1)
		}
		atMost(t, name+": any key's worst window / (2·burst + rate·W + S·c)", c.AnyWorstAsync, 1)
		atLeast(t, name+": keys within their limit, admitted", r.UnderLimitAdmitted, 0.995)
		// a limit is honoured from below too: a key over it gets what it allows
		atLeast(t, name+": keys over their limit, admitted of burst + rate·T", c.OverLimitAdmitted, 0.98)
		atMost(t, name+": keys within their limit, waited for Redis", c.UnderLimitWaited, 0.015)
		atMost(t, name+": keys within their limit, waited for Redis from 1 s on", c.UnderLimitWaitedAfter1s, 0.01)
		atMost(t, name+": round trips per request", r.RedisRoundTripsPerRequest, 0.25)
		t.Logf("%s: hot %.3f@%v, abuse %.3f@%v (%.3f of the bound with S·c), any key %.3f@%v (%.3f with S·c; %.3f past the first second), within %.2f%%, over-limit keys %.1f%% of burst + rate·T, waited %.2f%% (%.2f%% from 1 s on), %.4f trips and %.4f calls per request, Redis busy %.2f%%",
			name, c.HotWorst, c.HotWorstW, c.AbuseWorst, c.AbuseWorstW, c.AbuseWorstAsync, c.AnyWorst, c.AnyWorstW, c.AnyWorstAsync, c.AnyWorstAfter1s, 100*r.UnderLimitAdmitted, 100*c.OverLimitAdmitted, 100*c.UnderLimitWaited, 100*c.UnderLimitWaitedAfter1s,
			r.RedisRoundTripsPerRequest, r.RedisCallsPerRequest, 100*r.RedisBusy)
	}
}

// coldDesignNamed is the cold-key design of that label.
func coldDesignNamed(t *testing.T, label string) coldDesign {
	for _, d := range coldDesigns() {
		if d.label == label {
			return d
		}
	}
	t.Fatalf("no cold-key design %q", label)
	return coldDesign{}
}

// TestRoutedColdKeys holds the window-array model with routed to what docs/design.md §11
// says of it (windowedClaims); TestHybridWindowColdKeys holds the engine's windowed
// limits (hybrid-window, what ships) to the same.
func TestRoutedColdKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("eight 200-server runs of 10 s and three suites")
	}
	t.Parallel()
	windowedClaims(t, "window-array 120ms routed")
}

func TestHybridWindowColdKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("eight 200-server runs of 10 s and three suites")
	}
	t.Parallel()
	windowedClaims(t, "hybrid-window 120ms")
}

// windowedClaims holds a windowed design, on the six cold-key variants, the two
// +abuser/40 ones, and the hot-key, abusive-client and sticky-client suites, to the
// per-client targets: Redis busy and round trips within them; the keys within their
// limit admitted (99.5%), and waiting for Redis at most 1%; the hottest key and the
// abusive key from the start within 2·burst + rate·W, every key within the bound with
// S·c; the keys over their limit 90% of burst + rate·T, and a key at four times its
// limit sent to 40 servers 80% (the model's runs: 93.9–96.3% and 83.1–97.5% over seeds
// 1–20); on the suites, what hybrid admits, within 1%, at no more round trips than
// hybrid's but for the abusive client's (1.4× hybrid's: asserted at 1.5×) and the hot
// key's (within 1%).
func windowedClaims(t *testing.T, label string) {
	routed := coldDesignNamed(t, label)
	var ss []suite
	for _, sc := range append(coldVariants(true), coldSpreadVariants()...) {
		routed.set(&sc)
		ss = append(ss, suite{name: sc.Name, runs: []run{{sc: sc, st: routed.st}}})
	}
	cold := len(ss)
	for _, b := range suites(fullScale(), *seedFlag) {
		if b.name != "hot-key" && b.name != "abusive-client" && b.name != "sticky-client" {
			continue
		}
		sc := b.runs[0].sc
		wa := sc
		routed.set(&wa)
		ss = append(ss, suite{name: sc.Name, runs: []run{{sc: sc, st: Hybrid}, {sc: wa, st: routed.st}}})
	}
	all := runSuites(t, ss)
	for i, runs := range all {
		for _, o := range runs {
			if o.err != nil {
				t.Fatalf("%s: %v", ss[i].name, o.err)
			}
		}
		name := ss[i].name
		if i >= cold {
			h, w := runs[0].res, runs[1].res
			atLeast(t, name+": admitted per second, of hybrid's", w.AdmittedPerS/h.AdmittedPerS, 0.99)
			trips := 1.0
			switch name {
			case "abusive-client":
				trips = 1.5
			case "hot-key":
				// Its windows, 100 ms, allow reports every 50 ms at most (a report must
				// reach Redis while its window's array lives): 1.0002× hybrid's at seed 1.
				// At 120 ms, which the engine now refuses for such windows, 0.94×.
				trips = 1.01
			}
			atMost(t, name+": round trips per request, of hybrid's", w.RedisRoundTripsPerRequest/h.RedisRoundTripsPerRequest, trips)
			t.Logf("%s: %.0f/s at %.4f round trips per request, against hybrid's %.0f/s at %.4f", name, w.AdmittedPerS, w.RedisRoundTripsPerRequest, h.AdmittedPerS, h.RedisRoundTripsPerRequest)
			continue
		}
		o := runs[0]
		r, c := o.res, o.res.Cold
		atMost(t, name+": Redis busy", r.RedisBusy, 0.0078)
		atMost(t, name+": round trips per request", r.RedisRoundTripsPerRequest, 0.1)
		atLeast(t, name+": keys within their limit, admitted", r.UnderLimitAdmitted, 0.995)
		atMost(t, name+": keys within their limit, waited for Redis", c.UnderLimitWaited, 0.01)
		atMost(t, name+": hottest key's worst window / (2·burst + rate·W)", c.HotWorst, 1)
		if c.AbuseWorstW > 0 && o.sc.cold.abuseAt == 0 {
			atMost(t, name+": abusive key's worst window / (2·burst + rate·W)", c.AbuseWorst, 1)
		}
		atMost(t, name+": any key's worst window / (2·burst + rate·W + S·c)", c.AnyWorstAsync, 1)
		atLeast(t, name+": keys over their limit, admitted of burst + rate·T", c.OverLimitAdmitted, 0.9)
		if o.sc.cold.abuseServers > 0 {
			atLeast(t, name+": the abusive key, admitted of burst + rate·T", c.AbuseOverBound, 0.8)
		}
		t.Logf("%s: busy %.2f%%, %.4f round trips per request, within %.2f%%, waited %.2f%%, hot %.3f, abuse %.3f (admitted %.1f%%), any key %.3f of the bound with S·c, over-limit keys %.1f%%",
			name, 100*r.RedisBusy, r.RedisRoundTripsPerRequest, 100*r.UnderLimitAdmitted, 100*c.UnderLimitWaited, c.HotWorst, c.AbuseWorst, 100*c.AbuseOverBound, c.AnyWorstAsync, 100*c.OverLimitAdmitted)
	}
}
