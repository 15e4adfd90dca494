package engine

import (
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// TestClaim: a reservation's claim goes with the refills as a take with the burst as its
// floor, never through the key's lease; its answer decides its waiter (admitted with the
// bucket's wait as its delay, or refused with it), counts Reserved, and nothing among
// the decisions; a claim given up on before its answer gives its tokens back when the
// answer comes; CancelClaim gives a granted claim's tokens back.
func TestClaim(t *testing.T) {
	for _, tc := range []struct {
		name     string
		granted  int
		wait     time.Duration
		giveUp   bool
		allowed  bool
		reserved int64
		refund   int // tokens queued back to the bucket
	}{
		{name: "granted", granted: 3, wait: 40 * ms, allowed: true, reserved: 3},
		{name: "refused", granted: 0, wait: 70 * ms},
		{name: "given up, then granted", granted: 3, wait: 40 * ms, giveUp: true, refund: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var decided []*Waiter
			e, lm := testEngine(t, func(c *Config) { c.Decided = func(w *Waiter) { decided = append(decided, w) } })
			var d Decision
			w := e.Claim(t0, lm, "k", 3, &d)
			if w == nil {
				t.Fatalf("Claim refused at once: %+v", d)
			}
			trip := e.Next()
			if trip == nil || trip.Kind != TakeTrip || len(trip.Takes) != 1 {
				t.Fatalf("Next = %+v, want the claim's take", trip)
			}
			if r := trip.Takes[0]; r.Want != 3 || r.Min != 3 || r.Floor != 100 {
				t.Fatalf("claim's take %+v, want 3, all or nothing, floor the burst", r)
			}
			if tc.giveUp {
				if g := e.GiveUp(t0.Add(10*ms), w, ReasonTimeout); g.Allowed || g.Reason != ReasonTimeout {
					t.Fatalf("GiveUp: %+v, want a denial for the timeout, not the policy's", g)
				}
			}
			trip.TakeResults[0].Granted, trip.TakeResults[0].Wait = tc.granted, tc.wait
			trip.Answered = true
			e.Done(t0.Add(ms), trip)
			got := w.Decision()
			if got.Allowed != tc.allowed || !tc.giveUp && got.RetryAfter != tc.wait {
				t.Fatalf("claim decided %+v, want allowed %v, RetryAfter %v", got, tc.allowed, tc.wait)
			}
			if n := len(decided); n != 0 && tc.giveUp || n != 1 && !tc.giveUp {
				t.Fatalf("Decided called %d times", n)
			}
			st := lm.Stats()
			if st.Reserved != tc.reserved {
				t.Fatalf("Reserved %d, want %d", st.Reserved, tc.reserved)
			}
			if st.Decisions != ([2][NumSources][NumReasons]int64{}) {
				t.Fatalf("a claim counted among the decisions: %v", st.Decisions)
			}
			var lease Lease
			lm.keys.Peek("k", func(en *entry, _ int64) { lease = en.lease })
			if lease.Tokens() != 0 {
				t.Fatalf("the claim's tokens went to the lease: %d", lease.Tokens())
			}
			refund := 0
			if trip := e.Next(); trip != nil && trip.Kind == RefundTrip {
				refund = trip.Refunds[0].N
			}
			if refund != tc.refund {
				t.Fatalf("refunded %d, want %d", refund, tc.refund)
			}
			if tc.allowed {
				e.CancelClaim(lm, lm.Shape(""), "k", 3)
				if st := lm.Stats(); st.Reserved != 0 {
					t.Fatalf("after CancelClaim, Reserved %d", st.Reserved)
				}
			}
		})
	}
}

// TestClaimRefusedAtOnce: no take for a cost above the burst, a windowed limit (no
// bucket), or an open breaker; the last is refused for its reason, not by the policy.
func TestClaimRefusedAtOnce(t *testing.T) {
	open := false
	e, lm := testEngine(t, func(c *Config) {
		c.Limits = append(c.Limits, LimitConfig{Name: "win", Rate: 10, Burst: 10, Policy: breaker.FailOpen, Windowed: 100 * ms})
		c.BreakerOpen = func() bool { return open }
	})
	for _, tc := range []struct {
		name string
		lm   *Limit
		n    int
		open bool
		why  Reason
	}{
		{"above the burst", lm, 101, false, ReasonExceedsBurst},
		{"windowed", e.Limit("win"), 1, false, ReasonNone},
		{"breaker open", lm, 1, true, ReasonBreakerOpen},
	} {
		open = tc.open
		var d Decision
		if w := e.Claim(t0, tc.lm, "k", tc.n, &d); w != nil || d.Allowed || d.Reason != tc.why {
			t.Errorf("%s: Claim = %v, %+v; want refused at once for %v", tc.name, w, d, tc.why)
		}
	}
	if trip := e.Next(); trip != nil && trip.Kind == TakeTrip {
		t.Fatalf("a take was planned: %+v", trip.Takes)
	}
}

// TestClaimKeepsHeld: a claim's tokens given back go out as refunds, but were never
// leased: the tokens the key's lease holds (Held) stay what they were.
func TestClaimKeepsHeld(t *testing.T) {
	e, lm := testEngine(t, nil)
	now := t0
	for range 20 { // a request a millisecond: the refills grow with the demand
		now = now.Add(ms)
		if _, w := decide(e, now, lm, "k", 1); w != nil {
			trip := e.Next()
			answerAll(trip)
			e.Done(now, trip)
		}
	}
	held := lm.Stats().Held
	if held == 0 {
		t.Fatal("the lease holds nothing: nothing to test")
	}
	var d Decision
	w := e.Claim(now, lm, "k", 3, &d)
	trip := e.Next()
	trip.TakeResults[0].Granted, trip.Answered = 3, true
	e.Done(now, trip)
	if !w.Decision().Allowed {
		t.Fatalf("claim: %+v", w.Decision())
	}
	e.CancelClaim(lm, lm.Shape(""), "k", 3)
	trip = e.Next()
	if trip == nil || trip.Kind != RefundTrip {
		t.Fatalf("Next = %+v, want the claim's refund", trip)
	}
	trip.Answered = true
	e.Done(now, trip)
	if st := lm.Stats(); st.Held != held || st.Refunded != 3 {
		t.Fatalf("after a claim given back: Held %d (was %d), Refunded %d (want 3)", st.Held, held, st.Refunded)
	}
}

// TestClaimAnsweredLate: a claim whose call timed out after Redis ran it is decided as
// failed, and the tokens it took go back when its answer comes late (Late), once; Held
// is unchanged and Refunded counts them. A claim refused before it was sent (breaker
// open) ran nowhere: its late answer is not taken.
func TestClaimAnsweredLate(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		back bool
	}{
		{"timed out", breaker.ErrTimeout, true},
		{"never sent", breaker.ErrOpen, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, lm := testEngine(t, nil)
			var d Decision
			w := e.Claim(t0, lm, "k", 3, &d)
			if w == nil {
				t.Fatalf("claim refused at once: %+v", d)
			}
			trip := e.Next()
			if trip == nil || trip.Kind != TakeTrip || len(trip.Takes) != 1 || trip.Takes[0].Floor == 0 {
				t.Fatalf("Next = %+v, want the claim's take", trip)
			}
			trip.Err = tc.err
			e.Done(t0.Add(ms), trip)
			if got := w.Decision(); got.Allowed {
				t.Fatalf("failed claim admitted: %+v", got)
			}
			late := &redisstore.TakeResult{Grant: redisstore.Grant{Granted: 3}}
			if took := e.Late(t0.Add(2*ms), trip, 0, late); took != tc.back {
				t.Fatalf("Late took the claim's answer: %v, want %v", took, tc.back)
			}
			if e.Late(t0.Add(3*ms), trip, 0, late) {
				t.Fatal("a claim's late answer taken twice")
			}
			rt := e.Next()
			if !tc.back {
				if rt != nil {
					t.Fatalf("Next = %+v, want nothing", rt)
				}
				return
			}
			if rt == nil || rt.Kind != RefundTrip || len(rt.Refunds) != 1 || rt.Refunds[0].N != 3 || string(rt.Refunds[0].ID) != wire.KeyID("k") {
				t.Fatalf("Next = %+v, want the refund of the claim's 3 tokens", rt)
			}
			rt.Answered = true
			e.Done(t0.Add(4*ms), rt)
			if st := lm.Stats(); st.Held != 0 || st.Refunded != 3 || st.Reserved != 0 {
				t.Fatalf("Held %d, Refunded %d, Reserved %d; want 0, 3, 0", st.Held, st.Refunded, st.Reserved)
			}
		})
	}
}

// TestTakesCarrySeen: a key's takes, its refills and its reservations' claims alike,
// carry what its lease last heard of the bucket (the level, floored at zero, and Redis's
// clock then), so that a take that finds the bucket lost starts it empty; a key this
// server has heard nothing of carries nothing.
func TestTakesCarrySeen(t *testing.T) {
	e, lm := testEngine(t, nil)
	take := func(trip *Trip) redisstore.TakeRequest {
		t.Helper()
		if trip == nil || trip.Kind != TakeTrip || len(trip.Takes) != 1 {
			t.Fatalf("Next = %+v, want one take", trip)
		}
		return trip.Takes[0]
	}
	if _, w := decide(e, t0, lm, "k", 1); w == nil {
		t.Fatal("a new key's request did not wait for a refill")
	}
	trip := e.Next()
	if r := take(trip); r.Seen.Known {
		t.Fatalf("a new key's refill carries %+v, want nothing heard", r.Seen)
	}
	heard := t0.Add(3 * ms)
	trip.TakeResults[0] = redisstore.TakeResult{Grant: redisstore.Grant{Granted: 1, Remaining: -2.5, Now: heard}}
	trip.Answered = true
	e.Done(t0.Add(ms), trip)
	want := wire.Seen{Known: true, Level: 0, AtMS: heard.UnixMilli()}
	var d Decision
	if w := e.Claim(t0.Add(ms), lm, "k", 3, &d); w == nil {
		t.Fatalf("Claim refused at once: %+v", d)
	}
	trip = e.Next()
	if r := take(trip); r.Seen != want {
		t.Errorf("the claim carries %+v, want %+v", r.Seen, want)
	}
	trip.Answered = true
	e.Done(t0.Add(ms), trip)
	if w := e.Claim(t0.Add(ms), lm, "other", 3, &d); w == nil {
		t.Fatalf("Claim refused at once: %+v", d)
	}
	if r := take(e.Next()); r.Seen.Known {
		t.Errorf("a claim for a key never heard of carries %+v, want nothing", r.Seen)
	}
}
