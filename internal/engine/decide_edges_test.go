package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
)

// preSpent is what key's pre-check in lm has spent at now: its shape's burst less the
// tokens it holds (no time passes in the tests that call it, so nothing refilled).
func preSpent(t *testing.T, lm *Limit, key string, now time.Time) float64 {
	t.Helper()
	spent, found := 0.0, false
	lm.keys.Peek(key, func(en *entry, _ int64) {
		found = true
		spent = float64(en.shape.preBurst) - en.pre.TokensAt(now.UnixNano())
	})
	if !found {
		t.Fatalf("no entry for %q", key)
	}
	return spent
}

// leasedOf is leased of lm's own rate and burst, with the bucket left at remaining.
func leasedOf(t *testing.T, e *Engine, lm *Limit, key string, granted int, remaining float64, now time.Time) {
	t.Helper()
	if _, w := decide(e, now, lm, key, 1); w == nil {
		t.Fatalf("%s: no refill for a new key", key)
	}
	trip := e.Next()
	answerAll(trip)
	trip.TakeResults[0].Granted, trip.TakeResults[0].Remaining = granted, remaining
	e.Done(now, trip)
}

// TestAdmissionsSpendThePreCheckAndReportRemaining: every request admitted spends its
// cost from its key's pre-check, whichever path admitted it (a lease hit, a refill it
// waited for, an admission to be charged later), and reports as Remaining what the key
// has left: the tokens on hand and the bucket's level at the last answer, or, admitted
// uncharged, the burst less its cost.
func TestAdmissionsSpendThePreCheckAndReportRemaining(t *testing.T) {
	const n = 3
	for _, tc := range []struct {
		name string
		// admit decides a request of cost n for key k, answering any refill it waits for,
		// and returns its decision and its instant.
		admit     func(t *testing.T) (*Limit, Decision, time.Time)
		reason    Reason
		spent     float64 // k's pre-check tokens spent by then
		remaining int
	}{
		{"lease hit", func(t *testing.T) (*Limit, Decision, time.Time) {
			e, lm := testEngine(t, nil)
			leased(t, e, lm, "", "k", 10, t0) // 9 on hand, the bucket empty
			d, w := decide(e, t0, lm, "k", n)
			if w != nil {
				t.Fatal("a lease of 9 made a request of 3 wait")
			}
			return lm, d, t0
		}, ReasonLease, 1 + n, 9 - n},
		{"after a refill", func(t *testing.T) (*Limit, Decision, time.Time) {
			e, lm := testEngine(t, nil)
			_, w := decide(e, t0, lm, "k", n)
			if w == nil {
				t.Fatal("no refill for a new key")
			}
			trip := e.Next()
			answerAll(trip) // granted n, 50 left in the bucket
			e.Done(t0, trip)
			return lm, w.Decision(), t0
		}, ReasonGranted, n, 50},
		{"charged later", func(t *testing.T) (*Limit, Decision, time.Time) {
			e, lm := asyncEngine(t, new(bool))
			warmUp(t, e, lm)
			at := t0.Add(time.Second)
			d, w := decide(e, at, lm, "k", n)
			if w != nil {
				t.Fatal("a warm server made a request wait")
			}
			return lm, d, at
		}, ReasonAsync, n, 100 - n},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lm, d, at := tc.admit(t)
			if !d.Allowed || d.Reason != tc.reason || d.Remaining != tc.remaining {
				t.Fatalf("decision %+v, want admitted for reason %d with %d remaining", d, tc.reason, tc.remaining)
			}
			if spent := preSpent(t, lm, "k", at); spent != tc.spent {
				t.Errorf("the pre-check spent %v, want %v", spent, tc.spent)
			}
		})
	}
}

// TestMultiHitSendsItsPrefetch: a refill that a lease hit of an all-or-nothing request
// starts ahead of need goes to Redis as Decide's does: a steady stream of such requests
// on one key is served, its refills made ahead of need, and no request waits for a
// refill that is never sent.
func TestMultiHitSendsItsPrefetch(t *testing.T) {
	e, lm := testEngine(t, func(c *Config) { c.Limits[0].LowWatermark = 0 }) // the default: prefetch on
	ahead := 0
	for i := range 100 {
		now := t0.Add(time.Duration(i) * 10 * ms)
		var m Multi
		m.Add(MultiItem{Limit: lm, Key: "k", N: 1})
		w, done := e.StartMulti(now.UnixNano(), &m)
		trip := e.Next()
		if trip != nil && trip.Kind == TakeTrip && done {
			ahead++
		}
		if !done && trip == nil {
			t.Fatalf("request %d waits for a refill that is not sent", i)
		}
		if trip != nil {
			answerAll(trip)
			e.Done(now, trip)
		}
		if !done {
			_, done = e.ResumeMulti(now.UnixNano(), &m, w.Decision())
		}
		if !done || !m.Allowed {
			t.Fatalf("request %d: done %v, %+v; want admitted", i, done, m.Decision)
		}
	}
	if ahead == 0 {
		t.Fatal("no refill ahead of need: the stream never prefetched")
	}
}

// refundsOf makes e's trips at now, answering each in full, and returns the refunds they
// carried.
func refundsOf(e *Engine, now time.Time) []redisstore.RefundRequest {
	var rs []redisstore.RefundRequest
	for x := e.Next(); x != nil; x = e.Next() {
		rs = append(rs, x.Refunds...)
		answerAll(x)
		e.Done(now, x)
	}
	return rs
}

// TestGivenBackUnderTheLeasesShape: tokens spent from a key's lease and given back once
// the lease no longer holds them (they expired) go to Redis under the shape they were
// leased under, the key's, even when SetLimit has since given the limit another bucket
// the key has not moved to yet: Redis adds a refund only to the bucket it came from. A
// lease hit of an all-or-nothing request undone (unhit); a decision given back
// (Engine.Return).
func TestGivenBackUnderTheLeasesShape(t *testing.T) {
	for _, tc := range []struct {
		name string
		// spend spends 1 token from k's lease at t0+2ms; giveBack gives it back at the
		// same instant, after a request at t0+1500ms swept the lease's expired tokens and
		// SetLimit changed the limit.
		spend    func(t *testing.T, e *Engine, lm *Limit) Decision
		giveBack func(e *Engine, lm *Limit, d Decision)
	}{
		{"unhit", func(t *testing.T, e *Engine, lm *Limit) Decision {
			d, ok := lm.kind.(*bucket).hit(t0.Add(2*ms).UnixNano(), "", "k", 1)
			if !ok {
				t.Fatal("no hit on a lease of 9")
			}
			return d
		}, func(e *Engine, lm *Limit, _ Decision) {
			lm.kind.(*bucket).unhit(t0.Add(2*ms).UnixNano(), "", "k", 1)
		}},
		{"return", func(t *testing.T, e *Engine, lm *Limit) Decision {
			d, w := decide(e, t0.Add(2*ms), lm, "k", 1)
			if w != nil || !d.Allowed {
				t.Fatalf("a lease of 9: %+v, want served", d)
			}
			return d
		}, func(e *Engine, lm *Limit, d Decision) {
			e.Return(t0.Add(2*ms), t0.Add(2*ms), lm, "", "k", 1, d)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, lm := testEngine(t, nil)
			leased(t, e, lm, "", "k", 10, t0)
			old := lm.Shape("")
			d := tc.spend(t, e, lm)
			decide(e, t0.Add(1500*ms), lm, "k", 0) // past the lease's lifetime: sweeps the 8 left
			cfg := lm.Config()
			cfg.Rate, cfg.Version = 200, 1
			if err := e.SetLimit(t0.Add(1500*ms), cfg); err != nil {
				t.Fatal(err)
			}
			tc.giveBack(e, lm, d)
			back := 0
			for _, r := range refundsOf(e, t0.Add(1600*ms)) {
				if r.Limit != old.glim {
					t.Errorf("refund of %d under %+v, want the lease's %+v", r.N, r.Limit, old.glim)
				}
				back += r.N
			}
			if back != 9 { // the grant of 10 less the first request's token
				t.Errorf("%d tokens refunded, want 9", back)
			}
		})
	}
}

// TestPreCheckDenialRetryAfter: a request its key's pre-check denies is told to retry
// once the pre-check holds its cost (what it lacks at the pre-check's rate), never if
// its cost is above the pre-check's burst, whether the lease could have served it or
// not, and when an all-or-nothing request's look denies it.
func TestPreCheckDenialRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		name    string
		granted int // k's first grant: the lease holds granted - 1, less the 2 spent at t0
		n       int
		multi   bool
		retry   time.Duration
	}{
		{"the lease serves", 10, 3, false, 125 * ms},
		{"the lease serves, the pre-check's burst", 10, 4, false, 250 * ms},
		{"above the pre-check's burst", 10, 5, false, InfDuration},
		{"the lease is empty", 3, 3, false, 125 * ms},
		{"an all-or-nothing request's look", 3, 3, true, 125 * ms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, lm := testEngine(t, func(c *Config) { c.Limits[0].PreRate, c.Limits[0].PreBurst = 8, 4 })
			leased(t, e, lm, "", "k", tc.granted, t0) // the pre-check spent 1
			if d, w := decide(e, t0, lm, "k", 2); w != nil || d.Reason != ReasonLease {
				t.Fatalf("%+v, want served by the lease", d)
			}
			// 125ms later the pre-check holds 1 + 8/s × 125ms = 2 tokens.
			now := t0.Add(125 * ms)
			var d Decision
			if tc.multi {
				var m Multi
				m.Add(MultiItem{Limit: lm, Key: "k", N: tc.n})
				if _, done := e.StartMulti(now.UnixNano(), &m); !done || m.Allowed || m.RetryAfter != tc.retry {
					t.Fatalf("multi: done %v, %+v; want denied, RetryAfter %v", done, m, tc.retry)
				}
				d = m.Decision
			} else {
				d, _ = decide(e, now, lm, "k", tc.n)
			}
			if d.Allowed || d.Reason != ReasonPreCheck || d.RetryAfter != tc.retry {
				t.Fatalf("%+v, want denied by the pre-check, RetryAfter %v", d, tc.retry)
			}
		})
	}
}

// TestGivenBackRefillsThePreCheck: an admission given back gives its key's pre-check its
// cost back with its tokens: given back by its caller (Engine.Return), or by an
// all-or-nothing request whose later item was denied after it was granted.
func TestGivenBackRefillsThePreCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		// giveBack admits a request of cost 3 for key k at t0 and gives it back.
		giveBack func(t *testing.T, e *Engine, lm *Limit, open *bool)
		spent    float64 // k's pre-check tokens spent after
	}{
		{"returned", func(t *testing.T, e *Engine, lm *Limit, _ *bool) {
			leased(t, e, lm, "", "k", 10, t0) // spends 1
			d, w := decide(e, t0, lm, "k", 3)
			if w != nil || !d.Allowed {
				t.Fatalf("a lease of 9: %+v, want served", d)
			}
			e.Return(t0, t0, lm, "", "k", 3, d)
		}, 1},
		{"a later item denied", func(t *testing.T, e *Engine, lm *Limit, open *bool) {
			var m Multi
			m.Add(MultiItem{Limit: lm, Key: "k", N: 3})
			m.Add(MultiItem{Limit: lm, Key: "j", N: 1})
			w, done := e.StartMulti(t0.UnixNano(), &m)
			if done {
				t.Fatal("a new key's item did not wait for its refill")
			}
			trip := e.Next()
			answerAll(trip)
			e.Done(t0, trip)
			*open = true // j's refill fails at once: FailClosed denies it
			if _, done := e.ResumeMulti(t0.UnixNano(), &m, w.Decision()); !done || m.Allowed || m.Denied != 1 {
				t.Fatalf("done %v, %+v; want denied by j", done, m)
			}
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			open := false
			e, lm := testEngine(t, func(c *Config) { c.BreakerOpen = func() bool { return open } })
			tc.giveBack(t, e, lm, &open)
			if spent := preSpent(t, lm, "k", t0); spent != tc.spent {
				t.Errorf("the pre-check spent %v, want %v", spent, tc.spent)
			}
		})
	}
}

// TestMultiLookDeniesOnlyWhatCannotPass: an all-or-nothing request's look denies an item
// only when it certainly would be denied: its cost above its tier's burst, or its key's
// pre-check short of it. A cost of the burst itself, a pre-check holding the cost
// exactly, or a key's items on two tiers (two buckets, each looked at alone) are not
// denied: the request goes on to the lease and Redis.
func TestMultiLookDeniesOnlyWhatCannotPass(t *testing.T) {
	for _, tc := range []struct {
		name  string
		items []MultiItem // of limit lm ("api": burst 100; its tier gold: 1000), key k
		// k's pre-check (PreRate 8, PreBurst 4) holds 3 at the request
		pre    bool
		denied bool
		reason Reason
	}{
		{"the burst", []MultiItem{{N: 100}}, false, false, 0},
		{"above the burst", []MultiItem{{N: 101}}, false, true, ReasonExceedsBurst},
		{"two tiers, each within its burst", []MultiItem{{N: 60}, {Tier: "gold", N: 60}}, false, false, 0},
		{"the pre-check holds the cost", []MultiItem{{N: 3}}, true, false, 0},
		{"the pre-check is short", []MultiItem{{N: 4}}, true, true, ReasonPreCheck},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, lm := testEngine(t, func(c *Config) {
				c.Limits[0].Tiers = []TierConfig{{Name: "gold", Rate: 1000, Burst: 1000}}
				if tc.pre {
					c.Limits[0].PreRate, c.Limits[0].PreBurst = 8, 4
				}
			})
			if tc.pre { // a first request, granted: the pre-check spent 1 of 4
				if _, w := decide(e, t0, lm, "k", 1); w == nil {
					t.Fatal("no refill for a new key")
				}
				trip := e.Next()
				answerAll(trip)
				e.Done(t0, trip)
			}
			var m Multi
			for _, it := range tc.items {
				it.Limit, it.Key = lm, "k"
				m.Add(it)
			}
			_, done := e.StartMulti(t0.UnixNano(), &m)
			if !tc.denied {
				if done && !m.Allowed {
					t.Fatalf("%+v; want not denied", m)
				}
				return
			}
			if !done || m.Allowed || m.Denied != 0 || m.Decision.Reason != tc.reason {
				t.Fatalf("done %v, %+v; want item 0 denied for reason %d", done, m, tc.reason)
			}
		})
	}
}

// TestMultiReportsTheFewestRemaining: an all-or-nothing request admitted reports the
// decision of the item with the fewest tokens remaining, whatever its place.
func TestMultiReportsTheFewestRemaining(t *testing.T) {
	for _, tc := range []struct {
		name    string
		granted [3]int // keys a, b, c: each lease holds its grant less 1
		item    int
	}{
		{"first", [3]int{5, 10, 20}, 0},
		{"middle", [3]int{10, 5, 20}, 1},
		{"last", [3]int{20, 10, 5}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, lm := testEngine(t, nil)
			var m Multi
			for i, key := range []string{"a", "b", "c"} {
				leased(t, e, lm, "", key, tc.granted[i], t0)
				m.Add(MultiItem{Limit: lm, Key: key, N: 1})
			}
			if _, done := e.StartMulti(t0.UnixNano(), &m); !done || !m.Allowed {
				t.Fatalf("done %v, %+v; want admitted", done, m)
			}
			if want := tc.granted[tc.item] - 2; m.Item != tc.item || m.Decision.Remaining != want {
				t.Fatalf("item %d, remaining %d; want item %d, %d", m.Item, m.Decision.Remaining, tc.item, want)
			}
		})
	}
}

// TestClaimCostBounds: a claim takes at least 1 token and at most the burst; a cost
// outside those is refused at once, with no take.
func TestClaimCostBounds(t *testing.T) {
	for _, tc := range []struct {
		n       int
		refused bool
	}{{-1, true}, {0, true}, {1, false}, {100, false}, {101, true}} {
		e, lm := testEngine(t, nil)
		var d Decision
		w := e.Claim(t0, lm, "k", tc.n, &d)
		if refused := w == nil; refused != tc.refused {
			t.Errorf("claim of %d: refused %v, want %v", tc.n, refused, tc.refused)
			continue
		}
		trip := e.Next()
		if tc.refused {
			if d.Allowed || d.Reason != ReasonExceedsBurst || trip != nil {
				t.Errorf("claim of %d: %+v, trip %+v; want refused for its cost, no trip", tc.n, d, trip)
			}
			continue
		}
		if trip == nil || trip.Kind != TakeTrip || trip.Takes[0].Want != tc.n {
			t.Errorf("claim of %d: trip %+v, want its take", tc.n, trip)
		}
	}
}

// TestLateGrantOfALostResendGoesBackOnce: a lost take's resend, sent after its key was
// let go of and lost in turn (it may have run, reading the first take's grant), leaves
// that grant to its own late answer: the first take's late answer gives nothing back,
// and the resend's gives the grant back, once.
func TestLateGrantOfALostResendGoesBackOnce(t *testing.T) {
	e, lm := testEngine(t, nil) // FailClosed: the waiters are denied, nothing owed
	if _, w := decide(e, t0, lm, "k", 1); w == nil {
		t.Fatal("no refill for a new key")
	}
	first := e.Next()
	seq := lose(e, first, t0.Add(10*ms))
	if _, w := decide(e, t0.Add(15*ms), lm, "k", 1); w == nil {
		t.Fatal("no refill after the lost one")
	}
	lm.keys.Remove("k") // evicted while the resend waits for its trip
	resend := e.Next()
	if resend == nil || resend.Kind != TakeTrip || resend.Takes[0].Seq != seq {
		t.Fatalf("trip %+v, want the resend under %d", resend, seq)
	}
	lose(e, resend, t0.Add(17*ms))
	if lateAnswer(e, first, 10, t0.Add(20*ms)) {
		t.Error("the first take's late answer was taken: the resend may have read its grant")
	}
	if !lateAnswer(e, resend, 10, t0.Add(21*ms)) {
		t.Error("the resend's late answer was not taken")
	}
	if back := refundAll(e, t0.Add(22*ms)); back != 10 {
		t.Errorf("%d tokens went back, want the grant's 10, once", back)
	}
}

// TestRefillThatNeverRanPaysNothing: what the failure policy admitted to the requests of
// a refill that never ran (refused before it was sent, or its trip refused whole) is
// not paid from the tokens the key's lease holds: no grant came to pay for it.
func TestRefillThatNeverRanPaysNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(e *Engine) // fails the refill of the request waiting at t0; nil: the breaker is open at send
	}{
		{"refused at send", nil},
		{"its trip refused", func(e *Engine) {
			trip := e.Next()
			trip.Err = breaker.ErrOpen
			e.Done(t0.Add(ms), trip)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			open := false
			e, lm := testEngine(t, func(c *Config) {
				c.Limits[0].Policy = breaker.FailOpen
				c.BreakerOpen = func() bool { return open }
			})
			leasedOf(t, e, lm, "k", 2, 50, t0) // 1 on hand, the bucket not low: no pacing
			open = tc.fail == nil
			d, w := decide(e, t0, lm, "k", 3)
			if tc.fail != nil {
				if w == nil {
					t.Fatalf("%+v, want a wait for a refill", d)
				}
				tc.fail(e)
				d = w.Decision()
			}
			if !d.Allowed || d.Source != SourceFallback {
				t.Fatalf("%+v, want admitted by FailOpen", d)
			}
			var tokens int
			lm.keys.Peek("k", func(en *entry, _ int64) { tokens = en.lease.Tokens() })
			if tokens != 1 {
				t.Errorf("%d tokens on hand, want the 1 the lease held", tokens)
			}
		})
	}
}

// TestClaimLateRefusalTakesNothing: the late answer of a claim whose call timed out is
// taken only if the claim took tokens: a refusal (nothing granted) gives nothing back,
// and no refund goes.
func TestClaimLateRefusalTakesNothing(t *testing.T) {
	e, lm := testEngine(t, nil)
	var d Decision
	if w := e.Claim(t0, lm, "k", 3, &d); w == nil {
		t.Fatalf("claim refused at once: %+v", d)
	}
	trip := e.Next()
	lose(e, trip, t0.Add(ms))
	if lateAnswer(e, trip, 0, t0.Add(2*ms)) {
		t.Error("Late took a claim's answer that granted nothing")
	}
	if rt := e.Next(); rt != nil {
		t.Errorf("Next = %+v, want nothing", rt)
	}
}

// TestLateGrantPaysNoMoreThanItGranted: the late answer of a lost take whose key was let
// go of pays for what FailLocal admitted to the take's requests only as far as it
// granted: a grant of 2 for 5 admitted settles 2 of the debt, and 3 stay owed.
func TestLateGrantPaysNoMoreThanItGranted(t *testing.T) {
	e, lm := failLocalEngine(t, new(bool), nil)
	_, w := decide(e, t0, lm, "k", 5)
	if w == nil {
		t.Fatal("no refill for a new key")
	}
	trip := e.Next()
	if d := e.GiveUp(t0.Add(5*ms), w, ReasonTimeout); !d.Allowed || d.Source != SourceFallback {
		t.Fatalf("gave up: %+v, want admitted by FailLocal", d)
	}
	lose(e, trip, t0.Add(10*ms))
	lm.keys.Remove("k")
	if !lateAnswer(e, trip, 2, t0.Add(20*ms)) {
		t.Fatal("the late grant was not taken")
	}
	if st := lm.Stats(); st.Owed != 3 || st.Charged != 2 {
		t.Errorf("owed %d, charged %d; want 3 and 2", st.Owed, st.Charged)
	}
}

// TestMultiLookReportsTheSurestDenial: when the look denies several items of an
// all-or-nothing request, it reports the first that can never pass (its cost above the
// burst), or else the first denied, and RetryAfter is the longest of theirs: never, if
// one never passes.
func TestMultiLookReportsTheSurestDenial(t *testing.T) {
	for _, tc := range []struct {
		name   string
		costs  []int // of keys k0, k1, ...; each pre-check (PreRate 8, PreBurst 4) holds 3
		denied int
		retry  time.Duration
	}{
		{"short, then never", []int{4, 101}, 1, InfDuration},
		{"never, then short", []int{101, 4}, 0, InfDuration},
		{"never twice", []int{101, 102}, 0, InfDuration},
		{"short twice", []int{4, 4}, 0, 125 * ms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, lm := testEngine(t, func(c *Config) { c.Limits[0].PreRate, c.Limits[0].PreBurst = 8, 4 })
			var m Multi
			for i, n := range tc.costs {
				key := fmt.Sprint("k", i)
				leasedOf(t, e, lm, key, 1, 50, t0) // the pre-check spent 1
				m.Add(MultiItem{Limit: lm, Key: key, N: n})
			}
			if _, done := e.StartMulti(t0.UnixNano(), &m); !done || m.Allowed {
				t.Fatalf("done %v, %+v; want denied", done, m)
			}
			if m.Denied != tc.denied || m.Item != tc.denied || m.RetryAfter != tc.retry {
				t.Errorf("denied by item %d (item %d), RetryAfter %v; want item %d, %v", m.Denied, m.Item, m.RetryAfter, tc.denied, tc.retry)
			}
		})
	}
}

// TestClaimable: a denial may be served by a claim only if the request may pass later
// (a finite RetryAfter) and the engine is not closed; an admission never is.
func TestClaimable(t *testing.T) {
	for _, tc := range []struct {
		d    Decision
		want bool
	}{
		{Decision{Reason: ReasonPaced, RetryAfter: 10 * ms}, true},
		{Decision{Reason: ReasonPreCheck, RetryAfter: 0}, true},
		{Decision{Reason: ReasonExceedsBurst, RetryAfter: InfDuration}, false},
		{Decision{Reason: ReasonClosed}, false},
		{Decision{Allowed: true, Reason: ReasonLease}, false},
	} {
		if got := tc.d.Claimable(); got != tc.want {
			t.Errorf("%+v: Claimable %v, want %v", tc.d, got, tc.want)
		}
	}
}

// TestReturnLeavesDenialsAlone: a decision that did not admit gives nothing back when
// returned: the key's lease and pre-check, and the limit's counts, stay as they were.
func TestReturnLeavesDenialsAlone(t *testing.T) {
	e, lm := testEngine(t, nil)
	leased(t, e, lm, "", "k", 10, t0)
	d, _ := decide(e, t0, lm, "k", 101) // above the burst
	if d.Allowed {
		t.Fatalf("%+v, want denied", d)
	}
	tokens, pre, _, _ := lmState(lm)
	e.Return(t0, t0, lm, "", "k", 101, d)
	if tokens2, pre2, _, _ := lmState(lm); tokens2 != tokens || pre2 != pre {
		t.Errorf("tokens %d→%d, pre-check %v→%v; want unchanged", tokens, tokens2, pre, pre2)
	}
	if st := lm.Stats(); st.GivenBack != 0 {
		t.Errorf("GivenBack %d, want 0", st.GivenBack)
	}
	if n := refundAll(e, t0); n != 0 {
		t.Errorf("%d tokens refunded, want none", n)
	}
}
