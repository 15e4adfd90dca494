package sim

import (
	"fmt"
	"testing"
	"time"
)

// checks holds the claims docs/simulation.md makes of each suite. Each compares measured figures of
// the runs; none holds for a simulator that does not simulate.
var checks = map[string]func(t *testing.T, runs []outcome){
	"hot-key": func(t *testing.T, runs []outcome) {
		naive, script, hyb := pick(t, runs, "naive"), pick(t, runs, "script"), pick(t, runs, "hybrid")
		// The race lets (nearly) everything through: at demand 1.5× the limit, at least 1.5×
		// the limit means every request. Requests arriving in the last 1 ms are decided after
		// the window [0,T] closes, so the windowed admitted/limit reads 1.4998; the claim is
		// about requests let through, which counts them wherever they were decided.
		atLeast(t, "naive: requests admitted / (rate·T)", naive.RequestsAdmittedOverLimit, 1.5)
		t.Logf("naive admitted %d of %d requests (%.4f× rate·T; %.4f× the limit within [0,T])",
			naive.Admitted+naive.AdmittedLate, naive.Requests, naive.RequestsAdmittedOverLimit, naive.AdmittedOverLimit)
		withinBound(t, "script", script, 1)
		withinBound(t, "hybrid", hyb, 2)
		fewerCalls(t, script, hyb, 40)
		asyncNoWorse(t, runs)
		// Its windows, 100 ms, allow reports every 50 ms at most (a report must reach
		// Redis while its window's array lives): 1.0002× hybrid's round trips at seed 1.
		// At 120 ms, which the engine now refuses for such windows, 0.94×.
		windowNoWorse(t, runs, 1.01)
	},
	"abusive-client": func(t *testing.T, runs []outcome) {
		script, hyb := pick(t, runs, "script"), pick(t, runs, "hybrid")
		withinBound(t, "script", script, 1)
		withinBound(t, "hybrid", hyb, 2)
		fewerCalls(t, script, hyb, 50)
		atLeast(t, "naive: admitted / limit", pick(t, runs, "naive").AdmittedOverLimit, 1.5)
		asyncNoWorse(t, runs)
		windowNoWorse(t, runs, 1.5) // 1.4× hybrid's round trips
	},
	"many-keys": func(t *testing.T, runs []outcome) {
		// No key may pass its own bound; the table reports how much of the fair share
		// (Σ min(demand, bound)) each strategy admits.
		script, hyb, async := pick(t, runs, "script"), pick(t, runs, "hybrid"), pick(t, runs, "hybrid-async")
		atMost(t, "script: hottest key admitted / (burst+rate·T)", script.HottestKeyOverBound, 1)
		atMost(t, "hybrid: hottest key admitted / (burst+rate·T)", hyb.HottestKeyOverBound, twoBurst(hyb)/hyb.Bound)
		atMost(t, "hybrid-async: hottest key admitted / (burst+rate·T)", async.HottestKeyOverBound, twoBurst(async)/async.Bound)
		// Charge later: the keys within their limit lose nothing, in half the round trips
		// (their windows, cold start included, are checked below and by TestAsyncColdKeys).
		atLeast(t, "hybrid-async: keys within their limit, admitted", async.UnderLimitAdmitted, 0.995)
		// Hybrid: 99.5% of the fair share (99.6% for keys within their limit), at about
		// one Redis call every second request (0.48).
		atLeast(t, "hybrid: admitted / fair share", hyb.AdmittedOverLimit, 0.99)
		atLeast(t, "hybrid: keys within their limit, admitted", hyb.UnderLimitAdmitted, 0.99)
		atMost(t, "hybrid: Redis calls per request", hyb.RedisCallsPerRequest, 0.5)
		atLeast(t, "hybrid round trips per request / hybrid-async's", hyb.RedisRoundTripsPerRequest/async.RedisRoundTripsPerRequest, 1.8)
		// This suite is the plain cold-key scenario: its per-client claims, made at 200
		// servers (cold_test.go).
		if !testing.Short() {
			for _, o := range runs {
				switch o.st {
				case HybridAsync:
					asyncColdClaims(t, "many-keys", o)
				case HybridWindow:
					windowColdClaims(t, "many-keys", o)
				}
			}
		}
	},
	"skewed-lb": func(t *testing.T, runs []outcome) {
		withinBound(t, "script", pick(t, runs, "script"), 1)
		withinBound(t, "hybrid", pick(t, runs, "hybrid"), 2)
	},
	"sticky-client": func(t *testing.T, runs []outcome) {
		// One client on one server of the fleet: the leases must still find the whole
		// limit (pacing that waits past a full bucket lost 14% here), and a static
		// split gives that one server a 1/servers share.
		script, hyb, loc := pick(t, runs, "script"), pick(t, runs, "hybrid"), pick(t, runs, "local-only")
		withinBound(t, "script", script, 1)
		withinBound(t, "hybrid", hyb, 2)
		fewerCalls(t, script, hyb, 50)
		atMost(t, "local-only: admitted / limit", loc.AdmittedOverLimit, 2.0/float64(loc.Servers))
		asyncNoWorse(t, runs)
		windowNoWorse(t, runs, 1)
	},
	"bursty": func(t *testing.T, runs []outcome) {
		// Demand (8,000/s in 200 ms waves) is below the limit on average: the bound, and
		// hybrid follows the script (1.3% below it).
		for _, name := range []string{"script", "hybrid"} {
			r := pick(t, runs, name)
			limit := r.Bound
			if name == "hybrid" {
				limit = twoBurst(r)
			}
			atMost(t, name+": admitted", float64(r.Admitted), limit)
		}
		script, hyb := pick(t, runs, "script"), pick(t, runs, "hybrid")
		atLeast(t, "hybrid: admitted / script's", float64(hyb.Admitted)/float64(script.Admitted), 0.98)
	},
	"redis-outage":    checkOutage,
	"redis-partition": checkPartition,
	"limit-change":    checkLimitChange,
	"several-limits":  checkSeveral,
	"starved-server":  checkStarved,
	"clock-skew": func(t *testing.T, runs []outcome) {
		script, scriptFast := pick(t, runs, "script (TIME)"), pick(t, runs, "script (TIME), srv0 +2s")
		caller, callerFast := pick(t, runs, "caller clock"), pick(t, runs, "caller clock, srv0 +2s")
		hyb, hybFast := pick(t, runs, "hybrid"), pick(t, runs, "hybrid, srv0 +2s")
		if script.Admitted != scriptFast.Admitted || script.Requests != scriptFast.Requests {
			t.Errorf("script reading TIME: a server 2 s fast changed admissions from %d to %d", script.Admitted, scriptFast.Admitted)
		}
		if hyb.Admitted != hybFast.Admitted {
			t.Errorf("hybrid: a server 2 s fast changed admissions from %d to %d", hyb.Admitted, hybFast.Admitted)
		}
		// The article: a server whose clock runs 2 s fast adds 2 s of extra tokens — each time
		// it calls, since the next caller's clock sets ts back.
		extra := float64(callerFast.Admitted - caller.Admitted)
		atLeast(t, "caller clock: extra admissions with a server 2 s fast", extra, 2*callerFast.LimitPerS)
		t.Logf("TIME: %d admitted with or without the fast server; caller clock: %d without, %d with (+%.0f, %.1f× the limit)",
			script.Admitted, caller.Admitted, callerFast.Admitted, extra, callerFast.AdmittedOverLimit)
	},
	"reservations": func(t *testing.T, runs []outcome) {
		// Admissions count at the instants their holders act: a claim takes tokens the
		// bucket has not refilled yet, so the bound of the leases holds for them too.
		r := pick(t, runs, "hybrid")
		withinBound(t, "hybrid", r, 2)
		atLeast(t, "hybrid: requests admitted by a claim on the bucket's refill", float64(r.Sources["reserved"]), 1)
		t.Logf("%d of %d requests admitted by a claim, %d after the run", r.Sources["reserved"], r.Requests, r.AdmittedLate)
	},
	"churn": func(t *testing.T, runs []outcome) {
		withinBound(t, "script", pick(t, runs, "script"), 1)
		withinBound(t, "hybrid", pick(t, runs, "hybrid"), 2)
	},
}

// checkOutage: during the outage fail-open admits the demand, fail-closed admits nothing
// beyond tokens leased before it, the local fallback admits 0.8–1.2× the fleet limit, and
// no decision waits longer than the call deadline.
func checkOutage(t *testing.T, runs []outcome) {
	for _, o := range runs {
		if o.st != Hybrid {
			continue
		}
		r := o.res
		u := r.Outage
		if u == nil {
			t.Fatalf("%s: no outage measured", o.name())
		}
		sc, _ := o.sc.withDefaults()
		atMost(t, o.name()+": slowest decision during the outage (µs)", u.MaxDecisionUS, float64(sc.MaxWait/time.Microsecond))
		if u.CallsDuring == 0 {
			t.Errorf("%s: no Redis calls during the outage: the breaker was never tried", o.name())
		}
		if u.BreakerOpenS < 0 || u.BreakerOpenS > 1 {
			t.Errorf("%s: breakers opened %.3f s into the outage, want within 1 s", o.name(), u.BreakerOpenS)
		}
		switch sc.Policy {
		case FailOpen:
			// The policy admits everything it decides. The only other denials are by lease
			// pacing set while Redis was healthy and the bucket contended: a paced key is
			// denied locally until its pacing ends (one pacing interval, ~0.1 s here) before
			// its next refill can fail over to the policy. So "admits the demand" holds for
			// every request the policy sees; overall it is 99.2% (200 servers, 3 s outage).
			for src, n := range u.Sources {
				if src[len(src)-1] == '-' && src != srcPaced.String()+"-" {
					t.Errorf("fail-open: %d requests denied by %s during the outage", n, src[:len(src)-1])
				}
			}
			atLeast(t, "fail-open: admitted / demand during the outage", u.AdmittedPerS/u.DemandPerS, 0.95)
		case FailClosed:
			if n := u.Sources[srcFallback.String()+"+"]; n > 0 {
				t.Errorf("fail-closed: the policy admitted %d requests", n)
			}
			// Only tokens leased before the outage: at most the burst (plus one cost per server).
			leased := float64(sc.Burst + sc.Servers*sc.Cost)
			atMost(t, "fail-closed: admitted during the outage (leased tokens)", u.AdmittedPerS*(u.EndS-u.StartS), leased)
		case FailLocal:
			atLeast(t, "fail-local: admitted / limit during the outage", u.OverLimit, 0.8)
			atMost(t, "fail-local: admitted / limit during the outage", u.OverLimit, 1.2)
			// Its debts do not punish a full outage: the bucket sat full while the
			// servers admitted their shares, and the refill it lost pays for them; what
			// is charged is what their local bursts admitted over the limit, so from the
			// outage's start to 2.5 s after it the key runs at the limit.
			atLeast(t, "fail-local: admitted / limit from the outage to 2.5 s after it", u.ThroughPerS/sc.Rate, 0.9)
			atMost(t, "fail-local: admitted / limit from the outage to 2.5 s after it", u.ThroughPerS/sc.Rate, 1.2)
		}
		t.Logf("%s during the outage: %.4f× the limit, %.4f of the demand, max decision %.0f µs; %.4f× the limit 0.5-2.5 s after it, %.4f× from its start to 2.5 s after",
			o.name(), u.OverLimit, u.AdmittedPerS/u.DemandPerS, u.MaxDecisionUS, u.AfterPerS/sc.Rate, u.ThroughPerS/sc.Rate)
	}
}

// checkPartition: half the servers lose Redis, the others do not. Fail-closed holds the
// limit (the cut-off servers admit only what they leased; the others lease the whole
// rate); fail-local over-admits by the cut-off servers' local shares while it lasts,
// and repays that debt once they reach Redis again: every window ending 2.5 s or more
// after the partition admits within 2·burst + servers·ceil(burst/servers) + rate·W.
// Fail-open over-admits by what their pre-checks allow.
func checkPartition(t *testing.T, runs []outcome) {
	for _, o := range runs {
		u := o.res.Partition
		if u == nil {
			t.Fatalf("%s: no partition measured", o.name())
		}
		sc, _ := o.sc.withDefaults()
		atMost(t, o.name()+": slowest decision during the partition (µs)", u.MaxDecisionUS, float64(sc.MaxWait/time.Microsecond))
		switch sc.Policy {
		case FailClosed:
			atMost(t, "fail-closed: admitted / limit during the partition", u.OverLimit, 1.05)
		case FailLocal:
			atLeast(t, "fail-local: admitted / limit during the partition", u.OverLimit, 0.9)
			atMost(t, "fail-local: admitted / limit during the partition", u.OverLimit, 1.6)
			atMost(t, "fail-local: windows ending 2.5 s after the partition, over their bound", u.LateOverBound, 1)
		}
		if sc.Policy != FailOpen {
			atMost(t, o.name()+": windows ending 2.5 s after the partition, over their bound", u.LateOverBound, 1)
		}
		t.Logf("%s during the partition: %.4f× the limit; windows ending 2.5 s after it: %.4f of 2·burst + servers·ceil(burst/servers) + rate·W (%s); %.0f/s 0.5-2.5 s after",
			o.name(), u.OverLimit, u.LateOverBound, u.LateW, u.AfterPerS)
	}
}

// checkLimitChange: a limit halved or doubled while the change reaches the servers over
// half the run. The hottest key stays within 2·max(B_old, B_new) + max(r_old, r_new)·W
// over every window that overlaps the convergence, within 2·B_new + r_new·W after it,
// and runs at the new rate from a second after the first server has the change: the
// bucket keeps the highest Version's rate (ChangeResult).
func checkLimitChange(t *testing.T, runs []outcome) {
	for _, o := range runs {
		if len(o.res.LimitChanges) != 1 {
			t.Fatalf("%s: %d limit changes measured, want 1", o.name(), len(o.res.LimitChanges))
		}
		c := o.res.LimitChanges[0]
		atMost(t, o.name()+": admissions over the bound while servers disagree", c.DuringOverBound, 1)
		atMost(t, o.name()+": admissions over the bound once they agree", c.AfterOverBound, 1)
		atLeast(t, o.name()+": admitted / new rate while servers disagree", c.DuringPerS/c.NewRate, 0.9)
		atMost(t, o.name()+": admitted / new rate while servers disagree", c.DuringPerS/c.NewRate, 1.1)
		atLeast(t, o.name()+": admitted / new rate once they agree", c.AfterPerS/c.NewRate, 0.9)
		atMost(t, o.name()+": admitted / new rate once they agree", c.AfterPerS/c.NewRate, 1.1)
		t.Logf("%s: %v/s burst %d -> %v/s burst %d over %.1f s: worst window %.3f of the bound while servers disagree (%s), %.3f after (%s); %.0f/s while they disagree, %.0f/s after",
			o.name(), c.OldRate, c.OldBurst, c.NewRate, c.NewBurst, c.SpreadS, c.DuringOverBound, c.DuringW, c.AfterOverBound, c.AfterW, c.DuringPerS, c.AfterPerS)
	}
}

// checkSeveral: requests that count against a global limit, their tenant's and their
// own key's, all or nothing. Every limit's busiest key stays within 2·burst + rate·T;
// the global limit, which binds, admits at least 90% of its rate·T although most
// requests it admits are then denied by another limit: a denial spends nothing, the
// global tokens go back (GivenBack counts them).
func checkSeveral(t *testing.T, runs []outcome) {
	for _, o := range runs {
		r := o.res
		if len(r.Also) != 2 {
			t.Fatalf("%s: %d other limits measured, want 2", o.name(), len(r.Also))
		}
		atMost(t, o.name()+": own key's admissions / (2·burst + rate·T)", r.HottestKeyOverBound*r.Bound, twoBurst(r))
		for _, a := range r.Also {
			atMost(t, o.name()+": "+a.Name+": busiest key / (2·burst + rate·T)", a.HottestKeyOver2Burst, 1)
		}
		g := r.Also[0]
		atLeast(t, o.name()+": global admitted / rate·T", g.AdmittedOverLimit, 0.9)
		atLeast(t, o.name()+": admitted items given back", float64(r.GivenBack), 1)
		t.Logf("%s: global %.3f× its rate·T (%.3f of 2·burst + rate·T); tenants' busiest %.3f of theirs; own keys' busiest %.3f of burst + rate·T; %d admitted items given back",
			o.name(), g.AdmittedOverLimit, g.HottestKeyOver2Burst, r.Also[1].HottestKeyOver2Burst, r.HottestKeyOverBound, r.GivenBack)
	}
}

// checkStarved: half the servers are CPU-starved while Redis stays healthy. When their
// processes see each deadline at least twice its budget late, the breaker's rule for
// starved timeouts keeps every breaker closed, and over every window W of the 100 ms grid
// the fleet stays within its policy's bound: 2·burst + rate·W under fail-closed, plus the
// starved servers' local bursts (their debts repay the rest) under fail-local; fail-open
// admits whatever waited past its deadline, so what it admits over the limit during the
// starvation is at most what its policy admitted (it is not enforced then). When they
// see them less than a budget late, the timeouts count: the breakers open, and fail-local
// then admits the starved servers' local shares on top of what the others lease from
// the bucket (as in a partition). The bound on that excess records the weakness; it is
// not a target. A starved server decides every request within two of its periods: it
// reads the request at its next run, and its refill's deadline at the run after. Under
// every policy no grant is lost to a late answer: the take's call lingers past the
// breaker's deadline and reads it (engine.Engine.Late), paying first for what the policy
// admitted, or the next refill reads it back from Redis's record (engine.Lease.Lost).
func checkStarved(t *testing.T, runs []outcome) {
	for _, o := range runs {
		u := o.res.Starve
		if u == nil {
			t.Fatalf("%s: no starvation measured", o.name())
		}
		sc, _ := o.sc.withDefaults()
		atMost(t, o.name()+": slowest decision during the starvation (µs)", u.MaxDecisionUS, float64(2*sc.StarvePeriod/time.Microsecond))
		worst, from, to := worstWindow(o.res)
		atMost(t, o.name()+": granted tokens unread during the starvation / limit", float64(u.GrantsUnread)/(u.EndS-u.StartS)/sc.Rate, 0.05)
		atLeast(t, o.name()+": granted tokens unread (below zero: a grant read twice)", float64(u.GrantsUnread), 0)
		if sc.StarvePeriod-sc.StarveRun >= 2*sc.Breaker.Timeout {
			if u.StarvedTimeouts == 0 {
				t.Errorf("%s: no timeout was seen starved: the breaker's rule was not exercised", o.name())
			}
			atLeast(t, o.name()+": starved timeouts / timeouts", float64(u.StarvedTimeouts)/float64(u.Timeouts), 0.95)
			atMost(t, o.name()+": breaker opens on the starved servers", float64(u.BreakerOpens), 0)
			switch sc.Policy {
			case FailOpen:
				atMost(t, o.name()+": admitted over the limit during the starvation / what the policy decided", (u.OverLimit-1)*sc.Rate/(u.PolicyShare*sc.Demand), 1)
			case FailLocal:
				local := float64(sc.StarvedServers * max(1, (sc.Burst+sc.Servers-1)/sc.Servers))
				w, _, _ := worstWindowOver(o.res, local)
				atMost(t, o.name()+": worst window's admitted / (2·burst + rate·W + the starved servers' local bursts)", w, 1)
			default:
				atMost(t, o.name()+": worst window's admitted / (2·burst + rate·W)", worst, 1)
			}
		} else {
			if u.BreakerOpens == 0 {
				t.Errorf("%s: deadlines seen less than a budget late opened no breaker", o.name())
			}
			if sc.Policy == FailLocal {
				atMost(t, o.name()+": admitted / limit during the starvation", u.OverLimit, 1.6)
				atMost(t, o.name()+": worst window's admitted / (2·burst + rate·W)", worst, 1.6)
			}
		}
		t.Logf("%s during the starvation: %.4f× the limit, policy decided %.2f%%, %d breaker opens, %d of %d timeouts starved, %d granted tokens unread (%.3f× the limit); worst window %.1f-%.1f s at %.4f× 2·burst + rate·W",
			o.name(), u.OverLimit, 100*u.PolicyShare, u.BreakerOpens, u.StarvedTimeouts, u.Timeouts, u.GrantsUnread,
			float64(u.GrantsUnread)/(u.EndS-u.StartS)/sc.Rate, from, to, worst)
	}
}

// worstWindow returns the largest admitted / (2·burst + rate·W) over every window W of
// whole timeline bins, and where that window is (seconds).
func worstWindow(r Result) (worst, from, to float64) { return worstWindowOver(r, 0) }

// worstWindowOver is worstWindow against 2·burst + rate·W + extra.
func worstWindowOver(r Result, extra float64) (worst, from, to float64) {
	for i := range r.Timeline {
		admitted := 0.0
		for j := i; j < len(r.Timeline); j++ {
			admitted += r.Timeline[j].AdmittedPerS * r.BinS
			w := float64(j-i+1) * r.BinS
			if x := admitted / (2*float64(r.Burst) + r.LimitPerS*w + extra); x > worst {
				worst, from, to = x, r.Timeline[i].AtS, r.Timeline[i].AtS+w
			}
		}
	}
	return worst, from, to
}

func pick(t *testing.T, runs []outcome, name string) Result {
	t.Helper()
	for _, o := range runs {
		if o.name() == name {
			return o.res
		}
	}
	t.Fatalf("no run %q", name)
	return Result{}
}

// asyncNoWorse checks that a limit that charges later (hybrid-async) admits what the
// exact one does, within 1%, and keeps its bound (2·burst + rate·T), on a suite where its
// keys are not per-client keys spread thin: its round trips are the exact one's plus a
// low-key exchange per server now and then.
func asyncNoWorse(t *testing.T, runs []outcome) {
	t.Helper()
	hyb, async := pick(t, runs, "hybrid"), pick(t, runs, "hybrid-async")
	withinBound(t, "hybrid-async", async, 2)
	atLeast(t, "hybrid-async admitted / hybrid's", float64(async.Admitted)/float64(hyb.Admitted), 0.99)
	t.Logf("hybrid-async: %.4f calls per request (hybrid %.4f)", async.RedisCallsPerRequest, hyb.RedisCallsPerRequest)
}

// windowNoWorse checks that a windowed limit (hybrid-window) admits what the exact one
// does, within 1%, at no more than trips times its round trips per request: a
// per-client design that must not make these suites worse (TestHybridWindowColdKeys
// holds it to the per-client targets). A claim of the full scale: under -short, at 20
// servers, the hot key's windowed runs make 1.5× hybrid's round trips.
func windowNoWorse(t *testing.T, runs []outcome, trips float64) {
	t.Helper()
	if testing.Short() {
		return
	}
	hyb, win := pick(t, runs, "hybrid"), pick(t, runs, "hybrid-window")
	atLeast(t, "hybrid-window admitted per second / hybrid's", win.AdmittedPerS/hyb.AdmittedPerS, 0.99)
	atMost(t, "hybrid-window round trips per request / hybrid's", win.RedisRoundTripsPerRequest/hyb.RedisRoundTripsPerRequest, trips)
	t.Logf("hybrid-window: %.0f/s at %.4f round trips per request, against hybrid's %.0f/s at %.4f",
		win.AdmittedPerS, win.RedisRoundTripsPerRequest, hyb.AdmittedPerS, hyb.RedisRoundTripsPerRequest)
}

func twoBurst(r Result) float64 { return r.Bound + float64(r.Burst) }

// withinBound checks burst·k + rate·T >= admitted > 90% of rate·T.
func withinBound(t *testing.T, name string, r Result, bursts int) {
	t.Helper()
	limit := r.Bound + float64((bursts-1)*r.Burst)
	atMost(t, fmt.Sprintf("%s: admitted in [0,T] (bound %d·burst + rate·T)", name, bursts), float64(r.Admitted), limit)
	atLeast(t, name+": admitted in [0,T] (floor 90% of rate·T)", float64(r.Admitted), r.Floor)
	t.Logf("%s admitted %d: %.4f of the bound, %.4f× rate·T", name, r.Admitted, float64(r.Admitted)/limit, r.AdmittedOverLimit)
}

// fewerCalls checks that hybrid makes at least factor times fewer Redis calls per request.
func fewerCalls(t *testing.T, script, hyb Result, factor float64) {
	t.Helper()
	got := script.RedisCallsPerRequest / hyb.RedisCallsPerRequest
	atLeast(t, "script calls per request / hybrid calls per request", got, factor)
	t.Logf("hybrid makes %.1f× fewer Redis calls per request than the script (%.4f vs %.4f); round trips %.1f× fewer",
		got, hyb.RedisCallsPerRequest, script.RedisCallsPerRequest, script.RedisRoundTripsPerRequest/hyb.RedisRoundTripsPerRequest)
}

func atLeast(t *testing.T, what string, got, want float64) {
	t.Helper()
	if !(got >= want) {
		t.Errorf("%s = %.4f, want >= %.4f", what, got, want)
	}
}

func atMost(t *testing.T, what string, got, want float64) {
	t.Helper()
	if !(got <= want) {
		t.Errorf("%s = %.4f, want <= %.4f", what, got, want)
	}
}
