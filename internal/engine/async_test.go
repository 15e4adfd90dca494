package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// asyncEngine is testEngine's limit (rate 100/s, burst 100) with Async 100ms over 4
// servers: a server's share of the burst is 25, and a bucket is low below 4 tokens (one
// a server, fewer than a share).
func asyncEngine(t *testing.T, open *bool) (*Engine, *Limit) {
	t.Helper()
	return testEngine(t, func(c *Config) {
		c.Servers = 4
		c.Limits[0].Async = 100 * time.Millisecond
		c.BreakerOpen = func() bool { return *open }
	})
}

// asyncFailLocal is asyncEngine's limit under FailLocal (failLocalEngine).
func asyncFailLocal(t *testing.T, open *bool) (*Engine, *Limit) {
	t.Helper()
	return failLocalEngine(t, open, func(c *Config) {
		c.Servers = 4
		c.Limits[0].Async = 100 * time.Millisecond
	})
}

// exchange answers the low-key exchange due at now with the keys the fleet marks, and
// returns the keys this server marked; it fails if none is due.
func exchange(t *testing.T, e *Engine, now time.Time, fleet ...redisstore.KeyID) []redisstore.KeyID {
	t.Helper()
	e.Tick(now)
	trip := e.Next()
	if trip == nil || trip.Kind != LowTrip || len(trip.Lows) != 1 {
		t.Fatalf("Next at %v = %+v, want a low-key exchange", now.Sub(t0), trip)
	}
	trip.Lows[0].Got = fleet
	trip.Answered = true
	e.Done(now, trip)
	return trip.Lows[0].Mark
}

// warmUp ticks e from t0, decides a request of lm's (its lease cannot serve it: the
// low-key exchanges start) and answers its refill and its first two low-key exchanges
// (at 25 and 50 ms, Async 100ms): the server is warm at 50 ms.
func warmUp(t *testing.T, e *Engine, lm *Limit) {
	t.Helper()
	e.Tick(t0)
	if _, w := decide(e, t0, lm, "first", 1); w == nil {
		t.Fatal("a request before the server is warm did not wait for Redis")
	}
	for trip := e.Next(); trip != nil; trip = e.Next() {
		answerAll(trip)
		e.Done(t0, trip)
	}
	exchange(t, e, t0.Add(25*time.Millisecond))
	if _, _, warm, _ := e.lowState(t0.Add(25 * time.Millisecond)); warm {
		t.Fatal("warm after the exchange at a quarter of an Async")
	}
	exchange(t, e, t0.Add(50*time.Millisecond))
	if _, _, warm, _ := e.lowState(t0.Add(50 * time.Millisecond)); !warm {
		t.Fatal("not warm after the exchange at half an Async")
	}
}

// TestAsyncAdmitsAndCharges walks one server through the life of a charge-later limit:
// nothing is admitted without Redis before its low-key exchange at half an Async after
// its first request its lease could not serve; then a
// key not known
// low is admitted at once (one admission per key uncharged, of at most the server's
// share, and none of a key whose lease took from the bucket within its lifetime), and
// charged as a refund of -n in one trip within Async (in its second half); the charge's
// answer marks a bucket below its low level (4) low, and a low key waits for Redis
// until a refill finds that much in it again; an open breaker sends
// requests to the policy.
func TestAsyncAdmitsAndCharges(t *testing.T) {
	open := false
	e, lm := asyncEngine(t, &open)
	e.Tick(t0)
	if d, w := decide(e, t0, lm, "warming", 1); w == nil {
		t.Fatalf("a request before the server is warm: %+v, want it to wait for Redis", d)
	}
	trip := e.Next()
	trip.TakeResults[0].Remaining = 0
	trip.Answered = true
	e.Done(t0.Add(21*time.Millisecond), trip)
	// The server tells the fleet what it found low, and learns what the fleet found.
	if marks := exchange(t, e, t0.Add(25*time.Millisecond), "fleet-low"); len(marks) != 1 || marks[0] != "warming" {
		t.Fatalf("marked %q, want warming", marks)
	}
	if d, w := decide(e, t0.Add(30*time.Millisecond), lm, "early", 1); w == nil {
		t.Fatalf("a request before the server is warm: %+v, want it to wait for Redis", d)
	}
	trip = e.Next()
	trip.TakeResults[0].Granted, trip.TakeResults[0].Remaining = 1, 99
	trip.Answered = true
	e.Done(t0.Add(31*time.Millisecond), trip)
	if marks := exchange(t, e, t0.Add(50*time.Millisecond), "fleet-low"); len(marks) != 0 {
		t.Fatalf("marked %q again", marks)
	}
	if d, w := decide(e, t0.Add(100*time.Millisecond), lm, "fleet-low", 1); w == nil {
		t.Fatalf("a key the fleet marked low: %+v, want it to wait for Redis", d)
	}
	type step struct {
		at     time.Duration
		key    string
		n      int
		reason Reason // ReasonAsync: admitted at once; ReasonRefill: waits for Redis
	}
	for i, s := range []step{
		{100 * time.Millisecond, "a", 1, ReasonAsync},
		{101 * time.Millisecond, "a", 1, ReasonRefill}, // one uncharged admission per key
		{102 * time.Millisecond, "b", 25, ReasonAsync}, // the share of the burst
		{103 * time.Millisecond, "c", 26, ReasonRefill},
	} {
		d, w := decide(e, t0.Add(s.at), lm, s.key, s.n)
		got := d.Reason
		if w != nil {
			got = ReasonRefill
		}
		if got != s.reason || (s.reason == ReasonAsync) != d.Allowed {
			t.Fatalf("step %d (%s, cost %d at %v): %v (%+v), want %v", i, s.key, s.n, s.at, got, d, s.reason)
		}
	}
	// The refills of the waiting requests go first; they are answered with nothing left.
	for trip := e.Next(); trip != nil; trip = e.Next() {
		if trip.Kind != TakeTrip {
			t.Fatalf("%+v, want refills", trip)
		}
		if trip.debts {
			t.Fatalf("charges sent at once: %+v", trip.Refunds)
		}
		for i := range trip.Takes {
			trip.TakeResults[i].Remaining = 0
		}
		trip.Answered = true
		e.Done(t0.Add(104*time.Millisecond), trip)
	}
	if st := lm.Stats(); st.Owed != 26 {
		t.Fatalf("owed %d, want 26", st.Owed)
	}
	// The charges are due in the second half of an Async after the first of them (100
	// ms), at an instant drawn for the batch.
	if e.Tick(t0.Add(149 * time.Millisecond)); e.Next() != nil {
		t.Fatal("a trip before the charges are due")
	}
	due := e.NextTick()
	if due.Before(t0.Add(150*time.Millisecond)) || !due.Before(t0.Add(200*time.Millisecond)) {
		t.Fatalf("NextTick %v, want the charges' instant, from 150 ms to 200 ms", due.Sub(t0))
	}
	if e.Tick(due.Add(-time.Nanosecond)); e.Next() != nil {
		t.Fatal("a trip before the charges are due")
	}
	e.Tick(due)
	trip = e.Next()
	if trip == nil || !trip.debts || len(trip.Refunds) != 2 {
		t.Fatalf("Next = %+v, want the two charges", trip)
	}
	for i, want := range map[string]int{"a": -1, "b": -25} {
		_ = i
		found := false
		for _, r := range trip.Refunds {
			if string(r.ID) == i {
				found = true
				if r.N != want || r.HasRef || r.Floor != 100+100*10 {
					t.Errorf("charge of %s: %+v, want N %d, no reference, floor burst + rate·10 s", i, r, want)
				}
			}
		}
		if !found {
			t.Errorf("no charge of %s", i)
		}
	}
	// a's bucket is low (3 < 4), b's is not.
	for i, r := range trip.Refunds {
		trip.RefundResults[i].Remaining = map[string]float64{"a": 3, "b": 75}[string(r.ID)]
	}
	trip.Answered = true
	e.Done(t0.Add(201*time.Millisecond), trip)
	if st := lm.Stats(); st.Owed != 0 || st.Charged != 26 {
		t.Fatalf("owed %d, charged %d; want 0 and 26", st.Owed, st.Charged)
	}
	if d, w := decide(e, t0.Add(202*time.Millisecond), lm, "b", 1); w != nil || d.Reason != ReasonAsync {
		t.Fatalf("b after its charge: %+v, %v; want admitted at once", d, w)
	}
	_, w := decide(e, t0.Add(202*time.Millisecond), lm, "a", 1)
	if w == nil {
		t.Fatal("a, low, admitted without Redis")
	}
	// Much later a is still low: only an answer says otherwise.
	trip = e.Next()
	if trip == nil || trip.Kind != TakeTrip {
		t.Fatalf("Next = %+v, want a's refill", trip)
	}
	trip.TakeResults[0].Granted, trip.TakeResults[0].Remaining = 1, 60
	trip.Answered = true
	e.Done(t0.Add(203*time.Millisecond), trip)
	if d := w.Decision(); !d.Allowed || d.Source != SourceGlobal {
		t.Fatalf("a's request after its refill: %+v", d)
	}
	if lm.chargeLater().low.low("a", t0.Add(204*time.Millisecond)) {
		t.Fatal("a still low after a refill found 60 of 100")
	}
	// Not low, but its lease took from the bucket within its lifetime: the lease serves
	// a here, and a request it cannot serve asks Redis (an uncharged admission would be a
	// call more).
	if _, w := decide(e, t0.Add(205*time.Millisecond), lm, "a", 1); w == nil {
		t.Fatal("a, whose lease is in use, admitted uncharged")
	}
	// An open breaker, once the driver's loop has seen it: the policy (FailClosed)
	// decides, nothing is admitted to charge.
	open = true
	for trip := e.Next(); trip != nil; trip = e.Next() { // a's refill: the breaker refuses it
		trip.Err = breaker.ErrOpen
		e.Done(t0.Add(300*time.Millisecond), trip)
	}
	if d, w := decide(e, t0.Add(300*time.Millisecond), lm, "d", 1); w != nil || d.Allowed || d.Source != SourceFallback {
		t.Fatalf("breaker open: %+v, %v; want FailClosed's denial", d, w)
	}
}

// TestAsyncTrustsNoKeyItsLeaseServes: a key is not admitted uncharged while its refill
// is out (its answer serves the key), nor while its lease is in use: a take of it was
// answered within the lease's lifetime (1 s), even one that granted nothing, or tokens
// it was granted live still (a roomy grant's, roomLifetimes lifetimes). Past both, it
// is. warmUp's refill of "first" at t0 granted its token with the bucket at 50 of 100,
// twice over for 4 servers: a roomy grant, usable until 5 s.
func TestAsyncTrustsNoKeyItsLeaseServes(t *testing.T) {
	at := t0.Add(time.Second)
	// refill asks for k's 26 tokens at at, above the share: Redis is asked.
	refill := func(e *Engine, lm *Limit) *Trip {
		if _, w := decide(e, at, lm, "k", 26); w == nil {
			t.Fatal("a request above the share did not wait for Redis")
		}
		return e.Next()
	}
	// nothing answers k's refill with no token, the bucket holding 50 (not low).
	nothing := func(e *Engine, lm *Limit) {
		trip := refill(e, lm)
		trip.TakeResults[0].Remaining, trip.Answered = 50, true
		e.Done(at, trip)
	}
	for _, tc := range []struct {
		name  string
		prep  func(e *Engine, lm *Limit)
		key   string
		after time.Duration // the request of cost 1, after t0
		async bool
	}{
		{"refill out", func(e *Engine, lm *Limit) { refill(e, lm) }, "k", time.Second, false},
		{"took nothing within the lifetime", nothing, "k", time.Second + time.Second - 1, false},
		{"took nothing a lifetime ago", nothing, "k", time.Second + time.Second, true},
		{"roomy grant's tokens live", nil, "first", 5*time.Second - 1, false},
		{"roomy grant's tokens expired", nil, "first", 5 * time.Second, true},
	} {
		e, lm := asyncEngine(t, new(bool))
		warmUp(t, e, lm)
		if tc.prep != nil {
			tc.prep(e, lm)
		}
		d, w := decide(e, t0.Add(tc.after), lm, tc.key, 1)
		if got := w == nil && d.Reason == ReasonAsync; got != tc.async {
			t.Errorf("%s: %s at %v: %+v (waits: %v); want admitted uncharged %v", tc.name, tc.key, tc.after, d, w != nil, tc.async)
		}
	}
}

// TestAsyncLowIsRemembered: a key low on this server stays low after its entry is let
// go of (idle), for lowMemory after the last answer that said so; a key noted when the
// set is full is not remembered, and the forgotten keys make room.
func TestAsyncLowIsRemembered(t *testing.T) {
	_, lm := asyncEngine(t, new(bool))
	sh := lm.Shape("")
	var s lowKeys
	for _, tc := range []struct {
		at        time.Duration
		remaining float64
		low       bool // after the note, at the same instant
	}{
		{0, 3.9, true},           // one token a server (4), fewer than the share (25)
		{time.Second, 4, false},  // the low level: not low
		{time.Second, 24, false}, // below the share, but each server's token is there
		{2 * time.Second, -300, true},
		{2*time.Second + lowMemory - 1, 0, true}, // noted again: remembered from here
	} {
		now := t0.Add(tc.at)
		s.note(sh, "k", tc.remaining, now)
		if got := s.low("k", now); got != tc.low {
			t.Fatalf("after %v at %v: low %v, want %v", tc.remaining, tc.at, got, tc.low)
		}
	}
	if !s.low("k", t0.Add(2*time.Second+2*lowMemory-2)) || s.low("k", t0.Add(2*time.Second+2*lowMemory-1)) {
		t.Fatal("a low key not remembered for lowMemory after its last answer")
	}
	// The fleet's set: a key learnt from it is low while it marks the key; an answer of
	// this server's own that found its share in the bucket outweighs the set for
	// LowShare, and unmarks the key there; a key this server found low itself stays
	// low when the set forgets it.
	var f lowKeys
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	f.learn(0, []redisstore.KeyID{"learnt", "mine"}, at(0))
	f.note(sh, "mine", 0, at(time.Millisecond))
	if !f.low("learnt", at(time.Millisecond)) || !f.low("mine", at(time.Millisecond)) {
		t.Fatal("keys the fleet marks not low")
	}
	f.learn(0, nil, at(time.Second))
	if f.low("learnt", at(time.Second)) || !f.low("mine", at(time.Second)) {
		t.Fatal("after the set forgot them: the learnt key must go, the one found low here stay")
	}
	f.learn(0, []redisstore.KeyID{"high"}, at(time.Second))
	f.note(sh, "high", 80, at(time.Second+time.Millisecond))
	f.note(sh, "fresh", 3, at(time.Second+time.Millisecond))
	// mine: the fleet had heard it low (learn) a millisecond before this server did.
	if mark, unmark := f.takeMarks(); len(mark) != 1 || mark[0] != "fresh" || len(unmark) != 1 || unmark[0] != "high" {
		t.Fatalf("marks %q, unmarks %q; want fresh marked, high unmarked", mark, unmark)
	}
	f.learn(0, []redisstore.KeyID{"high"}, at(2*time.Second))
	if f.low("high", at(2*time.Second)) {
		t.Fatal("the set outweighed this server's own answer within LowShare")
	}
	f.learn(0, []redisstore.KeyID{"high"}, at(time.Second+LowShare+time.Millisecond))
	if !f.low("high", at(time.Second+LowShare+time.Millisecond)) {
		t.Fatal("the set not heard LowShare after this server's own answer")
	}
	// A key found low and high by turns between two exchanges is sent once, as it was
	// last found; a failed exchange's word is put back unless a newer one came since.
	var flap lowKeys
	for i, remaining := range []float64{0, 80, 0, 80, 0} {
		flap.note(sh, "flap", remaining, at(time.Duration(i)*time.Millisecond))
	}
	mark, unmark := flap.takeMarks()
	if len(mark) != 1 || mark[0] != "flap" || len(unmark) != 0 {
		t.Fatalf("marks %q, unmarks %q; want flap marked once", mark, unmark)
	}
	flap.note(sh, "flap", 80, at(time.Second))
	flap.requeue(mark, unmark)
	if mark, unmark := flap.takeMarks(); len(mark) != 0 || len(unmark) != 1 || unmark[0] != "flap" {
		t.Fatalf("after a failed exchange: marks %q, unmarks %q; want the newer unmark only", mark, unmark)
	}
	// A mark still waiting when the key is found high LowShare later is dropped, and no
	// unmark goes (the set forgot any earlier one of this server's).
	var late lowKeys
	late.note(sh, "late", 0, at(0))
	late.note(sh, "late", 80, at(LowShare+time.Second))
	if mark, unmark := late.takeMarks(); len(mark)+len(unmark) != 0 {
		t.Fatalf("marks %q, unmarks %q; want none", mark, unmark)
	}
	// A key found high twice after a mark: the unmark the first answer queued stays.
	late.note(sh, "twice", 0, at(0))
	late.takeMarks()
	late.note(sh, "twice", 80, at(time.Second))
	late.note(sh, "twice", 80, at(2*time.Second))
	if mark, unmark := late.takeMarks(); len(mark) != 0 || len(unmark) != 1 || unmark[0] != "twice" {
		t.Fatalf("marks %q, unmarks %q; want twice unmarked", mark, unmark)
	}
	// Marks and unmarks are bounded apart: unmarks up to their bound leave room for marks.
	var capped lowKeys
	for i := range maxLowMarks {
		k := strconv.Itoa(i)
		capped.note(sh, k, 0, at(0))
	}
	capped.takeMarks()
	for i := range maxLowMarks {
		capped.note(sh, strconv.Itoa(i), 80, at(time.Second))
	}
	capped.note(sh, "new", 0, at(2*time.Second))
	if mark, unmark := capped.takeMarks(); len(mark) != 1 || mark[0] != "new" || len(unmark) != maxLowMarks {
		t.Fatalf("%d marks (%q), %d unmarks; want new marked beside %d unmarks", len(mark), mark, len(unmark), maxLowMarks)
	}
	// A full set: new keys are not noted until the forgotten ones are swept.
	var full lowKeys
	for i := range maxLowKeys {
		full.note(sh, strconv.Itoa(i), 0, t0)
	}
	full.note(sh, "late", 0, t0.Add(time.Second))
	if full.low("late", t0.Add(time.Second)) {
		t.Fatal("a key noted in a full set")
	}
	full.note(sh, "late", 0, t0.Add(lowMemory+time.Second))
	if !full.low("late", t0.Add(lowMemory+time.Second)) || full.size() != 1 {
		t.Fatalf("after lowMemory the forgotten keys make room: %d noted", full.size())
	}
}

// TestLowMarkTimes: a key this server marked low is marked again when found low once
// the fleet has not heard so for LowShare/2, and not before; found holding its low
// level again, it is unmarked while the fleet's set may still hold the mark (less than
// LowShare after it went: luascript.Low drops a mark LowShare after it was made), and
// not after, when the set forgot it.
func TestLowMarkTimes(t *testing.T) {
	_, lm := asyncEngine(t, new(bool))
	sh := lm.Shape("") // low below 4 tokens
	for _, tc := range []struct {
		after        time.Duration // the second answer, after the mark went
		remaining    float64
		mark, unmark int // what the next exchange carries
	}{
		{LowShare/2 - 1, 0, 0, 0},
		{LowShare / 2, 0, 1, 0},
		{LowShare - 1, 80, 0, 1},
		{LowShare, 80, 0, 0},
	} {
		var s lowKeys
		s.note(sh, "k", 0, t0)
		if mark, _ := s.takeMarks(); len(mark) != 1 {
			t.Fatalf("first answer: marks %q, want k", mark)
		}
		s.note(sh, "k", tc.remaining, t0.Add(tc.after))
		if mark, unmark := s.takeMarks(); len(mark) != tc.mark || len(unmark) != tc.unmark {
			t.Errorf("found holding %v, %v after the mark: marks %q, unmarks %q; want %d and %d", tc.remaining, tc.after, mark, unmark, tc.mark, tc.unmark)
		}
	}
}

// TestLowKeysLearnt: a key is low while the fleet's set marks it and this server's own
// answers have not said otherwise for LowShare; one it knows low from the set alone is
// not once the set's answer leaves it out, unless that answer was cut at maxLowReply
// keys (the key may be among those cut). That holds for a key this server found low
// itself once, whose own answers are older news than the set's.
func TestLowKeysLearnt(t *testing.T) {
	_, lm := asyncEngine(t, new(bool))
	sh := lm.Shape("")
	others := func(n int) []redisstore.KeyID {
		ids := make([]redisstore.KeyID, n)
		for i := range ids {
			ids[i] = redisstore.KeyID("o" + strconv.Itoa(i))
		}
		return ids
	}
	at := t0.Add(time.Second + LowShare) // the set's first answer that marks k
	for _, tc := range []struct {
		name  string
		own   bool               // this server found k low at t0, then high a second later
		after []redisstore.KeyID // the set's next answer, a second after at
		low   bool               // k after it
	}{
		{"learnt, then left out", false, nil, false},
		{"learnt, then left out of a full answer", false, others(maxLowReply), true},
		{"learnt, then left out of an answer one short of full", false, others(maxLowReply - 1), false},
		{"found low and high here, then learnt, then left out", true, nil, false},
	} {
		var s lowKeys
		if tc.own {
			s.note(sh, "k", 0, t0)
			s.note(sh, "k", 80, t0.Add(time.Second))
		}
		s.learn(0, []redisstore.KeyID{"k"}, at)
		if !s.low("k", at) {
			t.Fatalf("%s: k not low while the set marks it", tc.name)
		}
		s.learn(0, tc.after, at.Add(time.Second))
		if got := s.low("k", at.Add(time.Second)); got != tc.low {
			t.Errorf("%s: k low %v, want %v", tc.name, got, tc.low)
		}
	}
}

// TestLowSetGoesStale: a set of the fleet's last heard from at t is fresh until lowStale
// after it, not at lowStale: from then its keys are not admitted uncharged, and the
// limit's knowledge counts as stale.
func TestLowSetGoesStale(t *testing.T) {
	for _, tc := range []struct {
		after time.Duration
		fresh bool
	}{
		{lowStale - 1, true},
		{lowStale, false},
	} {
		s := lowKeys{total: new(atomic.Int64)}
		s.learn(0, nil, t0)
		s.setWarm(0)
		now := t0.Add(tc.after)
		_, _, warm, stale := s.pending(now)
		if got := s.admit("k", now); got != tc.fresh || !warm || stale == tc.fresh {
			t.Errorf("%v after the set answered: admitted %v, warm %v, stale %v; want admitted and fresh %v", tc.after, got, warm, stale, tc.fresh)
		}
	}
}

// TestLowKeysSweep: a full set of low keys drops its forgotten keys (no news for
// lowMemory, none found high within LowShare) at most once a second, when a new key is
// to be noted: a key noted within a second of a sweep that made no room is not; and a
// key whose own answer found it high within LowShare is kept, so that the fleet's mark
// does not outweigh that answer.
func TestLowKeysSweep(t *testing.T) {
	_, lm := asyncEngine(t, new(bool))
	sh := lm.Shape("")
	var s lowKeys
	for i := range maxLowKeys - 1 {
		s.note(sh, strconv.Itoa(i), 0, t0)
	}
	s.note(sh, "high", 0, t0)
	first := t0.Add(lowMemory - 500*time.Millisecond) // no key is forgotten yet
	s.note(sh, "high", 80, first)
	for _, tc := range []struct {
		at    time.Time
		key   string
		noted bool
	}{
		{first, "a", false},                             // full: the sweep finds nothing to drop
		{first.Add(500 * time.Millisecond), "b", false}, // forgotten keys, but no sweep before a second passed
		{first.Add(time.Second), "c", true},             // swept: the keys low at t0 go
	} {
		s.note(sh, tc.key, 0, tc.at)
		if got := s.low(tc.key, tc.at); got != tc.noted {
			t.Fatalf("%s at %v: noted %v, want %v", tc.key, tc.at.Sub(t0), got, tc.noted)
		}
	}
	// high was found high a second ago: the sweep kept it, and its own answer outweighs
	// the fleet's mark.
	now := first.Add(time.Second)
	s.learn(0, []redisstore.KeyID{"high"}, now)
	if s.low("high", now) || s.size() != 2 {
		t.Fatalf("after the sweep: high low %v, %d keys noted; want not low, and high and c noted", s.low("high", now), s.size())
	}
}

// TestLowMarksBound: at most maxLowMarks marks wait for the exchanges; a mark past that
// is not queued. A waiting mark gives its room back once gone: replaced by its key's
// unmark (the key found high again before the exchange), or dropped (found high when
// the fleet's set had forgotten any mark of it, LowShare later).
func TestLowMarksBound(t *testing.T) {
	_, lm := asyncEngine(t, new(bool))
	sh := lm.Shape("")
	for _, tc := range []struct {
		name    string
		high    time.Duration // when each waiting mark's key is found high; 0: never
		unmarks int
		newMark bool // a key found low after it is marked
	}{
		{"full", 0, 0, false},
		{"replaced by unmarks", time.Second, maxLowMarks, true},
		{"dropped", LowShare, 0, true},
	} {
		var s lowKeys
		for i := range maxLowMarks {
			s.note(sh, strconv.Itoa(i), 0, t0)
		}
		if tc.high > 0 {
			for i := range maxLowMarks {
				s.note(sh, strconv.Itoa(i), 80, t0.Add(tc.high))
			}
		}
		s.note(sh, "new", 0, t0.Add(tc.high+time.Millisecond))
		mark, unmark := s.takeMarks()
		if got := slices.Contains(mark, "new"); got != tc.newMark || len(unmark) != tc.unmarks {
			t.Errorf("%s: %d marks (new among them: %v), %d unmarks; want new %v, %d unmarks", tc.name, len(mark), got, len(unmark), tc.newMark, tc.unmarks)
		}
	}
}

// TestAsyncExchangesOnlyWhenAsked: a server makes no low-key exchange before a request
// of a limit with Async asks more than its lease; the first two then come at a quarter
// and half an Async after it; once warm, it exchanges within a LowEvery (at its pace,
// ×[0.5, 1.5)) when it admitted a key uncharged, about LowShare after the last while
// requests still ask more than their lease (a low key's, not admitted uncharged; half
// that if marks wait), and not at all while none does.
func TestAsyncExchangesOnlyWhenAsked(t *testing.T) {
	e, lm := asyncEngine(t, new(bool))
	// answer answers every trip due at now: refills find the bucket empty, charges full;
	// it reports whether one was a low-key exchange.
	answer := func(now time.Time) bool {
		low := false
		for trip := e.Next(); trip != nil; trip = e.Next() {
			low = low || trip.Kind == LowTrip
			trip.Answered = true
			for j := range trip.RefundResults {
				trip.RefundResults[j].Remaining = 100
			}
			e.Done(now, trip)
		}
		return low
	}
	// first ticks every 5 ms from from to until (after a request of key ask at from, if
	// any) and returns the first instant with a low-key exchange, or until.
	first := func(from, until time.Time, ask string) time.Time {
		if ask != "" {
			decide(e, from, lm, ask, 1)
		}
		for now := from; now.Before(until); now = now.Add(5 * time.Millisecond) {
			e.Tick(now)
			if answer(now) {
				return now
			}
		}
		return until
	}
	start := t0.Add(time.Minute)
	if at := first(t0, start, ""); at != start {
		t.Fatalf("an exchange at %v, before any request", at.Sub(t0))
	}
	// The first request waits for Redis, which finds "low" empty: low.
	for i, want := range []time.Duration{25 * time.Millisecond, 50 * time.Millisecond} {
		ask := ""
		if i == 0 {
			ask = "low"
		}
		if at := first(start.Add(time.Duration(i)*25*time.Millisecond), start.Add(time.Second), ask); at.Sub(start) != want {
			t.Fatalf("warm-up exchange %d at %v, want %v", i, at.Sub(start), want)
		}
	}
	last := start.Add(50 * time.Millisecond)
	// (within lowMemory of the start, so that "low" is still low below)
	if at := first(last, last.Add(2*LowShare), ""); at != last.Add(2*LowShare) {
		t.Fatalf("an exchange %v after the last, nothing asked since", at.Sub(last))
	}
	now := last.Add(2 * LowShare)
	at := first(now, now.Add(LowShare), "new") // admitted uncharged: news
	if at.Sub(now) > 3*LowEvery/2 {
		t.Fatalf("an uncharged admission: the exchange came %v later, want within 1.5 LowEvery", at.Sub(now))
	}
	last = at
	// A low key asks (and its refill marks it again): not news, the exchange waits.
	at = first(last.Add(time.Second), last.Add(3*LowShare), "low")
	if d := at.Sub(last); d < LowShare/4 || d > 3*LowShare/2+3*LowEvery/2 {
		t.Fatalf("a low key asked: the exchange came %v after the last, want about LowShare (or half) after it", d)
	}
	last = at
	if at := first(last, last.Add(3*LowShare), ""); at != last.Add(3*LowShare) {
		t.Fatalf("an exchange %v after the last, nothing asked since", at.Sub(last))
	}
}

// TestScheduleLowDue: when a low-key exchange is checked for (at its planned instant,
// lowAt), a warm server makes one due if marks wait and LowShare/2 passed since the
// last (at its pace, here 1), or if a request asked more than its lease since and
// LowShare passed; and a request that asks once lowStale passed since the last makes
// one due at once, before its planned instant, unless exchanges are failing (their
// retries keep their back-off). The last exchange was warmUp's, at 50 ms.
func TestScheduleLowDue(t *testing.T) {
	last := t0.Add(50 * time.Millisecond)
	for _, tc := range []struct {
		name    string
		after   time.Duration // now, after the last exchange
		planned time.Duration // lowAt, after now
		asked   bool
		marks   bool
		fails   int
		due     bool
	}{
		{"marks, LowShare/2 after", LowShare / 2, 0, false, true, 0, true},
		{"marks, just before LowShare/2 after", LowShare/2 - 1, 0, false, true, 0, false},
		{"asked, LowShare after", LowShare, 0, true, false, 0, true},
		{"asked, just before LowShare after", LowShare - 1, 0, true, false, 0, false},
		{"asked, stale", lowStale, time.Second, true, false, 0, true},
		{"asked, just before stale", lowStale - 1, time.Second, true, false, 0, false},
		{"not asked, stale", lowStale, time.Second, false, false, 0, false},
		{"asked, stale, failing", lowStale, time.Second, true, false, 1, false},
	} {
		e, lm := asyncEngine(t, new(bool))
		warmUp(t, e, lm)
		now := last.Add(tc.after)
		if tc.marks {
			lm.chargeLater().low.note(lm.Shape(""), "m", 0, last)
		}
		e.mu.Lock()
		e.cl.lowAt, e.cl.lowPhase, e.cl.lowFails, e.cl.lowNews = now.Add(tc.planned), 1, tc.fails, false
		e.mu.Unlock()
		e.cl.lowActive.Store(tc.asked)
		e.Tick(now)
		due := false
		for trip := e.Next(); trip != nil; trip = e.Next() {
			due = due || trip.Kind == LowTrip
			answerAll(trip)
			e.Done(now, trip)
		}
		if due != tc.due {
			t.Errorf("%s: exchange due %v, want %v", tc.name, due, tc.due)
		}
	}
}

// TestLowExchangeBackOffResets: failed low-key exchanges go again a quarter of an Async
// (25 ms) later, then twice as late each time; an exchange answered, or, once every set
// is warm, answered by some set, ends the back-off: the next failure goes again 25 ms
// later. Three exchanges failed first (the next failure's retry: 200 ms).
func TestLowExchangeBackOffResets(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sets   int
		answer func(trip *Trip) // the exchange after the three failed
		retry  time.Duration    // the retry of the failure after it
	}{
		{"answered", 1, func(trip *Trip) { trip.Answered = true }, 25 * time.Millisecond},
		{"failed", 1, func(*Trip) {}, 400 * time.Millisecond},
		{"answered by every set", 3, func(trip *Trip) { trip.Answered = true }, 25 * time.Millisecond},
		{"answered by some set", 3, func(trip *Trip) {
			trip.Answered = true
			trip.Lows[1].Err = errors.New("set 1's master: down")
		}, 25 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, lm := testEngine(t, func(c *Config) {
				c.Servers = 4
				c.Limits[0].Async = 100 * time.Millisecond
				c.Limits[0].LowShards = tc.sets
			})
			// exchange ticks e at the exchange's instant (at least from), after an
			// admission uncharged at from if admit (news: an exchange is due), answers
			// the exchange with answer and every other trip in full, and returns its
			// instant.
			exchange := func(from time.Time, admit string, answer func(*Trip)) time.Time {
				if admit != "" {
					if d, w := decide(e, from, lm, admit, 1); w != nil || d.Reason != ReasonAsync {
						t.Fatalf("%s at %v: %+v, want admitted uncharged", admit, from.Sub(t0), d)
					}
				}
				e.Tick(from) // plans the exchange, if it is not yet
				e.mu.Lock()
				at := e.cl.lowAt // zero: due at from
				e.mu.Unlock()
				if at.Before(from) {
					at = from
				}
				e.Tick(at)
				low := false
				for trip := e.Next(); trip != nil; trip = e.Next() {
					if trip.Kind == LowTrip {
						low = true
						answer(trip)
					} else {
						answerAll(trip)
					}
					e.Done(at, trip)
				}
				if !low {
					t.Fatalf("no low-key exchange at %v", at.Sub(t0))
				}
				return at
			}
			e.Tick(t0)
			decide(e, t0, lm, "first", 1)
			for trip := e.Next(); trip != nil; trip = e.Next() {
				answerAll(trip)
				e.Done(t0, trip)
			}
			all := func(trip *Trip) { trip.Answered = true }
			fail := func(*Trip) {}
			at := exchange(t0, "", all) // 25 ms
			at = exchange(at, "", all)  // 50 ms: warm
			if _, _, warm, _ := e.lowState(at); !warm {
				t.Fatal("not warm after the exchange at half an Async")
			}
			at = exchange(at.Add(time.Second), "a", fail)
			for range 2 {
				at = exchange(at, "", fail)
			}
			at = exchange(at, "", tc.answer)
			at = exchange(at.Add(time.Second), "b", fail)
			e.mu.Lock()
			retry := e.cl.lowAt.Sub(at)
			e.mu.Unlock()
			if retry != tc.retry {
				t.Fatalf("the failure's retry %v later, want %v", retry, tc.retry)
			}
		})
	}
}

// TestLowExchangesPaced: once warm, each server keeps a pace of its own, drawn from its
// seed, LowEvery ×[0.5, 1.5) between its checks: servers started together do not
// exchange together. Over 20 seeds the check after the warm-up's last exchange, at 50
// ms, comes at different instants spread over most of that range.
func TestLowExchangesPaced(t *testing.T) {
	var lo, hi time.Duration
	seen := map[time.Duration]bool{}
	for seed := range uint64(20) {
		e, lm := testEngine(t, func(c *Config) {
			c.Servers = 4
			c.Seed = seed + 1
			c.Limits[0].Async = 100 * time.Millisecond
			c.BreakerOpen = func() bool { return false }
		})
		warmUp(t, e, lm)
		e.mu.Lock()
		gap := e.cl.lowAt.Sub(t0.Add(50 * time.Millisecond))
		e.mu.Unlock()
		if gap < LowEvery/2 || gap >= 3*LowEvery/2 {
			t.Fatalf("seed %d: next check %v after the last exchange, want from %v to %v", seed+1, gap, LowEvery/2, 3*LowEvery/2)
		}
		if seed == 0 || gap < lo {
			lo = gap
		}
		hi, seen[gap] = max(hi, gap), true
	}
	if hi-lo < LowEvery/2 || len(seen) < 15 {
		t.Errorf("checks from %v to %v after the last exchange, %d instants of 20; want a spread of %v or more, and different instants", lo, hi, len(seen), LowEvery/2)
	}
}

// TestAsyncExchangeFailsAndStales: a failed exchange goes again a quarter of an Async
// later, then twice as late each time up to LowEvery, its marks with it; a server that
// heard nothing from the fleet's set for lowStale admits nothing uncharged, and its next
// request that could be makes an exchange due at once; a request of a cost above the
// server's share does not start the exchanges, one within it does, and wakes the driver.
func TestAsyncExchangeFailsAndStales(t *testing.T) {
	wakes := 0
	e, lm := testEngine(t, func(c *Config) {
		c.Servers = 4
		c.Limits[0].Async = 100 * time.Millisecond
		c.Notify = func() { wakes++ }
	})
	e.Tick(t0)
	decide(e, t0, lm, "big", 26) // above the share, 25: never admitted uncharged
	if e.cl.asyncStart.Load() != 0 {
		t.Fatal("a request above the share started the exchanges")
	}
	for trip := e.Next(); trip != nil; trip = e.Next() {
		answerAll(trip)
		e.Done(t0, trip)
	}
	before := wakes
	warmUp(t, e, lm)
	if wakes <= before {
		t.Fatal("the request that started the exchanges did not wake the driver")
	}
	// An uncharged admission whose charge finds the bucket low: a mark, and news.
	at := t0.Add(time.Second)
	if d, _ := decide(e, at, lm, "k", 1); d.Reason != ReasonAsync {
		t.Fatalf("%+v, want admitted at once", d)
	}
	var sent []time.Duration
	for now := at; now.Before(at.Add(5 * time.Second)); now = now.Add(time.Millisecond) {
		e.Tick(now)
		for trip := e.Next(); trip != nil; trip = e.Next() {
			if trip.Kind == LowTrip {
				sent = append(sent, now.Sub(at))
				if len(sent) <= 3 { // the first three fail
					e.Done(now, trip)
					continue
				}
				if marks := trip.Lows[0].Mark; len(marks) != 1 || marks[0] != "k" {
					t.Fatalf("the exchange after the failed ones marks %q, want k", marks)
				}
			}
			trip.Answered = true
			for j := range trip.RefundResults {
				trip.RefundResults[j].Remaining = 0 // the charge finds k low
			}
			e.Done(now, trip)
		}
		if len(sent) == 4 {
			break
		}
	}
	if len(sent) != 4 {
		t.Fatalf("exchanges at %v, want four (three failed)", sent)
	}
	for i, want := range []time.Duration{25, 50, 100} { // after each failure
		if gap := sent[i+1] - sent[i]; gap != want*time.Millisecond {
			t.Fatalf("exchange %d came %v after a failed one, want %vms", i+2, gap, want)
		}
	}
	// Stale: nothing heard for lowStale; no exchange meanwhile, nothing asked.
	quiet := at.Add(sent[3])
	for now := quiet; now.Before(quiet.Add(lowStale + time.Second)); now = now.Add(100 * time.Millisecond) {
		e.Tick(now)
		if trip := e.Next(); trip != nil {
			t.Fatalf("a %v trip at %v, nothing asked", trip.Kind, now.Sub(quiet))
		}
	}
	now := quiet.Add(lowStale + time.Second)
	if _, w := decide(e, now, lm, "fresh", 1); w == nil {
		t.Fatal("a server whose knowledge went stale admitted uncharged")
	}
	e.Tick(now)
	kinds := map[TripKind]bool{}
	for trip := e.Next(); trip != nil; trip = e.Next() {
		kinds[trip.Kind] = true
		answerAll(trip)
		trip.Answered = true
		e.Done(now, trip)
	}
	if !kinds[LowTrip] {
		t.Fatalf("trips %v after a stale server was asked, want a low-key exchange at once", kinds)
	}
	if d, _ := decide(e, now.Add(time.Millisecond), lm, "other", 1); d.Reason != ReasonAsync {
		t.Fatalf("after the exchange: %+v, want admitted at once", d)
	}
}

// TestAsyncUnchargedOutlivesTheEntry: a key admitted uncharged is not admitted so again
// before its charge is answered, even if its entry was let go of meanwhile; and a
// charge answered after the limit changed (another shape) still frees the key.
func TestAsyncUnchargedOutlivesTheEntry(t *testing.T) {
	e, lm := asyncEngine(t, new(bool))
	warmUp(t, e, lm)
	at := t0.Add(time.Second)
	if d, _ := decide(e, at, lm, "k", 1); d.Reason != ReasonAsync {
		t.Fatalf("%+v, want admitted at once", d)
	}
	lm.keys.Remove("k") // let go of, as an idle sweep or a full store does
	if _, w := decide(e, at, lm, "k", 1); w == nil {
		t.Fatal("admitted uncharged twice: the entry was let go of, the admission not charged")
	}
	for trip := e.Next(); trip != nil; trip = e.Next() { // the refill of that request: k is not low
		answerAll(trip)
		e.Done(at, trip)
	}
	c := lm.Config()
	c.Version, c.Burst = 1, 80
	if err := e.SetLimit(at, c); err != nil {
		t.Fatal(err)
	}
	e.Tick(at.Add(100 * time.Millisecond))
	trip := e.Next()
	for trip != nil && trip.Kind == LowTrip { // the exchange the admissions made due
		trip.Answered = true
		e.Done(at.Add(100*time.Millisecond), trip)
		trip = e.Next()
	}
	if trip == nil || !trip.debts || len(trip.Refunds) != 1 {
		t.Fatalf("Next = %+v, want the charge", trip)
	}
	trip.Answered = true
	trip.RefundResults[0].Remaining = 90
	e.Done(at.Add(101*time.Millisecond), trip)
	if d, _ := decide(e, at.Add(102*time.Millisecond), lm, "j", 1); d.Reason != ReasonAsync {
		t.Fatalf("another key: %+v", d)
	}
	if lm.chargeLater().low.admit("k", at.Add(102*time.Millisecond)) == false {
		t.Fatal("k still counted uncharged after its charge was answered under the old limit")
	}
}

// TestAsyncChargesGoAtStop: a server shutting down charges what it admitted at once,
// without waiting for Async: what it admitted before Stop, what it admits between Stop
// and Drain (Close waits for lingering takes there, and no Tick comes), and debts a
// failed charge trip held back just before.
func TestAsyncChargesGoAtStop(t *testing.T) {
	for _, tc := range []struct {
		name          string
		before, after int  // admitted uncharged before Stop, after it
		held          bool // a charge trip failed just before Stop
	}{
		{name: "admitted before Stop", before: 3},
		{name: "admitted after Stop", after: 2},
		{name: "both", before: 3, after: 2},
		{name: "a charge trip failed just before", before: 3, held: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, lm := asyncEngine(t, new(bool))
			warmUp(t, e, lm)
			at := t0.Add(time.Second)
			if tc.before > 0 {
				if d, _ := decide(e, at, lm, "k", tc.before); d.Reason != ReasonAsync {
					t.Fatalf("%+v, want admitted at once", d)
				}
			}
			if tc.held {
				e.Tick(at.Add(100 * time.Millisecond))
				trip := e.Next()
				for trip != nil && trip.Kind == LowTrip {
					trip.Answered = true
					e.Done(at, trip)
					trip = e.Next()
				}
				if trip == nil || !trip.debts {
					t.Fatalf("Next = %+v, want the charge", trip)
				}
				e.Done(at.Add(100*time.Millisecond), trip) // not answered: held for debtRetry
				at = at.Add(100 * time.Millisecond)
			}
			e.Stop(at)
			if tc.after > 0 {
				if d, _ := decide(e, at, lm, "j", tc.after); d.Reason != ReasonAsync {
					t.Fatalf("after Stop: %+v, want admitted uncharged", d)
				}
			}
			e.Drain()
			charged := 0
			for trip := e.Next(); trip != nil; trip = e.Next() {
				if trip.debts {
					for _, r := range trip.Refunds {
						charged -= r.N
					}
				}
				answerAll(trip)
				e.Done(at, trip)
			}
			if lost, forgiven := e.Finish(); lost != 0 || forgiven != 0 || int(lm.Stats().Charged) != charged || lm.Stats().Forgiven != 0 {
				t.Fatalf("lost %d, charged %d (sent %d), forgiven %d; want 0, every admission uncharged sent, 0 forgiven",
					lost, lm.Stats().Charged, charged, lm.Stats().Forgiven)
			}
			if want := tc.before + tc.after; charged != want {
				t.Fatalf("charged %d, want %d", charged, want)
			}
		})
	}
}

// TestAsyncChargeRetryGoesAtStop: a charge whose trip failed just before Stop is due
// at Stop, as a retry (its number kept), and goes first, before a debt FailLocal owed
// after Stop (which waits for no answered trip then). Neither is forgiven.
func TestAsyncChargeRetryGoesAtStop(t *testing.T) {
	open := false
	e, lm := asyncFailLocal(t, &open)
	warmUp(t, e, lm)
	at := t0.Add(time.Second)
	if d, w := decide(e, at, lm, "k", 1); w != nil || d.Reason != ReasonAsync {
		t.Fatalf("%+v, want k admitted uncharged", d)
	}
	timeout := fmt.Errorf("%w: %w", breaker.ErrTimeout, context.DeadlineExceeded)
	debtTrips(e, at, 1, func(trip *Trip, _ int) { trip.Err = timeout }) // k's charge: held, to go again
	stop := at.Add(time.Second)
	e.Stop(stop)
	open = true
	if trip := e.Next(); trip != nil { // the driver sees the breaker open
		t.Fatalf("Next = %+v with the breaker open", trip)
	}
	if d, w := decide(e, stop, lm, "y", 1); w != nil || d.Source != SourceFallback || !d.Allowed {
		t.Fatalf("y after Stop: %+v, want FailLocal's admission", d)
	}
	open = false
	e.Drain()
	var sent []string
	for trip := e.Next(); trip != nil; trip = e.Next() {
		for _, r := range trip.Refunds {
			sent = append(sent, string(r.ID))
		}
		answerAll(trip)
		e.Done(stop, trip)
	}
	if _, forgiven := e.Finish(); !slices.Equal(sent, []string{"k", "y"}) || forgiven != 0 || lm.Stats().Charged != 2 {
		t.Fatalf("sent %q, charged %d, forgiven %d; want k's retry then y's debt, both charged", sent, lm.Stats().Charged, forgiven)
	}
}

// TestAsyncRefusedChargeGoesAgain: a charge Redis refused without running it (its node's
// breaker open) is queued again as a charge, under a fresh number, and goes with the
// next batch of charges (not waiting, as FailLocal's debts do, for Redis to answer);
// once it is answered its key may be admitted uncharged again.
func TestAsyncRefusedChargeGoesAgain(t *testing.T) {
	e, lm := asyncEngine(t, new(bool))
	warmUp(t, e, lm)
	at := t0.Add(time.Second)
	if d, w := decide(e, at, lm, "k", 1); w != nil || d.Reason != ReasonAsync {
		t.Fatalf("%+v, want k admitted uncharged", d)
	}
	var seqs []uint64
	debtTrips(e, at, 2, func(trip *Trip, i int) {
		seqs = append(seqs, trip.Refunds[0].Seq)
		trip.Answered = true
		trip.RefundResults[0].Remaining = 90
		if i == 0 {
			trip.RefundResults[0].Err = breaker.ErrOpen
		}
	})
	if len(seqs) != 2 || seqs[0] == seqs[1] {
		t.Fatalf("k's charge sent under %v, want twice, the second under a fresh number", seqs)
	}
	if st := lm.Stats(); st.Owed != 0 || st.Charged != 1 {
		t.Fatalf("owed %d, charged %d; want 0 and 1", st.Owed, st.Charged)
	}
	if d, w := decide(e, at.Add(time.Second), lm, "k", 1); w != nil || d.Reason != ReasonAsync {
		t.Fatalf("k once its charge was answered: %+v, want admitted uncharged", d)
	}
}

// low reports whether key is low at now.
func (s *lowKeys) low(key string, now time.Time) bool {
	s.mu.Lock()
	m, ok := s.keys[key]
	s.mu.Unlock()
	return ok && m.isLow(now)
}

// size returns the number of keys noted (forgotten ones included until a sweep).
func (s *lowKeys) size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

// takeMarks returns the marks and unmarks s's next exchanges send, and forgets them.
func (s *lowKeys) takeMarks() (mark, unmark []redisstore.KeyID) {
	for more := true; more; _, more, _, _ = s.pending(t0) { // as many exchanges as they need
		for _, x := range s.exchanges(nil, "l", nil) {
			mark, unmark = append(mark, x.Mark...), append(unmark, x.Unmark...)
		}
	}
	return mark, unmark
}

// TestAsyncLowSets: a limit whose low keys are marked in several sets (LowShards, as on
// a Cluster) exchanges with every set each time, each mark and unmark going to its key's
// set (wire.LowShard), a set with nothing to write only read, by Redis's clock as the
// last take measured it; a set's answer drops the keys learnt from that set alone; a set
// is warm once it answered an exchange after the server's warm-up, the limit once every
// set is; and a set that stops answering costs its own keys alone.
func TestAsyncLowSets(t *testing.T) {
	const sets = 3
	_, lm0 := asyncEngine(t, new(bool))
	sh := lm0.Shape("") // a share of 25
	s := lowKeys{shards: sets}
	var keys []string
	for i := range 30 {
		k := "k" + strconv.Itoa(i)
		keys = append(keys, k)
		s.note(sh, k, 0, t0)
	}
	s.note(sh, "k0", 80, t0.Add(time.Millisecond)) // an unmark: marked at t0
	xs := s.exchanges(nil, "api", nil)
	if len(xs) != sets {
		t.Fatalf("%d exchanges, want one with each of %d sets", len(xs), sets)
	}
	seen := map[string]bool{}
	for i, x := range xs {
		if x.Shard != i || x.Shards != sets || x.Limit != "api" {
			t.Fatalf("exchange %d: set %d of %d of %q", i, x.Shard, x.Shards, x.Limit)
		}
		for _, id := range append(append([]redisstore.KeyID{}, x.Mark...), x.Unmark...) {
			if got := wire.LowShard(string(id), sets); got != x.Shard || seen[string(id)] {
				t.Fatalf("%s in set %d's exchange (twice: %v), its set %d", id, x.Shard, seen[string(id)], got)
			}
			seen[string(id)] = true
		}
	}
	if len(seen) != len(keys) || slices.IndexFunc(xs, func(x LowExchange) bool { return slices.Contains(x.Unmark, "k0") }) < 0 {
		t.Fatalf("%d keys sent of %d, k0 unmarked: want every key once", len(seen), len(keys))
	}
	nothing := func(x LowExchange) bool { return len(x.Mark)+len(x.Unmark) == 0 } // only read, at the trip's ReadAt
	if xs := s.exchanges(nil, "api", nil); len(xs) != sets || !nothing(xs[0]) || !nothing(xs[sets-1]) {
		t.Fatalf("the next exchanges: %+v, want every set, only read", xs)
	}
	// Learnt from two sets; one set's answer without its key drops that key alone.
	a, b := keyOfSet(t, 0, sets), keyOfSet(t, 1, sets)
	var f lowKeys
	f.shards = sets
	f.learn(0, []redisstore.KeyID{redisstore.KeyID(a)}, t0)
	f.learn(1, []redisstore.KeyID{redisstore.KeyID(b)}, t0)
	f.learn(0, nil, t0.Add(time.Second))
	if f.low(a, t0.Add(time.Second)) || !f.low(b, t0.Add(time.Second)) {
		t.Fatalf("after set 0 forgot %s: %s low %v, %s low %v; want only %s low", a, a, f.low(a, t0.Add(time.Second)), b, f.low(b, t0.Add(time.Second)), b)
	}
	// Warm once every set answered an exchange after the warm-up.
	e, lm := testEngine(t, func(c *Config) {
		c.Servers = 4
		c.Limits[0].Async = 100 * time.Millisecond
		c.Limits[0].LowShards = sets
	})
	e.Tick(t0)
	decide(e, t0, lm, "first", 1)
	for trip := e.Next(); trip != nil; trip = e.Next() {
		answerAll(trip)
		for i := range trip.TakeResults {
			trip.TakeResults[i].Now = t0.Add(3 * time.Second) // Redis's clock 3 s ahead
		}
		e.Done(t0, trip)
	}
	for i, fail := range []bool{false, true, false} { // at 25, 50 (a set fails) and 75 ms
		now := t0.Add(time.Duration(i+1) * 25 * time.Millisecond)
		e.Tick(now)
		trip := e.Next()
		if trip == nil || trip.Kind != LowTrip || len(trip.Lows) != sets {
			t.Fatalf("exchange %d: %+v, want one with each of %d sets", i, trip, sets)
		}
		if want := now.Add(3 * time.Second); !trip.Lows[0].ReadAt.Equal(want) {
			t.Fatalf("exchange %d reads at %v, want Redis's clock as the take measured it, %v", i, trip.Lows[0].ReadAt.Sub(t0), want.Sub(t0))
		}
		trip.Answered = true
		if fail {
			trip.Lows[1].Err = errors.New("set 1's master: down")
		}
		e.Done(now, trip)
		if _, _, warm, _ := e.lowState(now); warm != (i == 2) {
			t.Fatalf("after exchange %d (a set failed: %v): warm %v", i, fail, warm)
		}
		if i == 1 { // the sets that answered are warm: their keys may be admitted uncharged
			low := &lm.chargeLater().low
			if !low.admit(keyOfSet(t, 0, sets), now) || low.admit(keyOfSet(t, 1, sets), now) {
				t.Fatal("after set 1 failed the warm-up: want set 0's key admitted uncharged, set 1's not")
			}
		}
	}
	// A set that stops answering goes stale alone: its keys are not admitted uncharged
	// lowStale after it last answered; the others' are, and the exchanges keep their
	// pace (the fleet was heard from).
	// tick ticks e to now, answers every trip due (set 2 failing, charges finding the
	// bucket full) and returns the low-key exchanges among them.
	tick := func(now time.Time) (exchanges int) {
		e.Tick(now)
		for trip := e.Next(); trip != nil; trip = e.Next() {
			if trip.Kind == LowTrip {
				exchanges++
			}
			trip.Answered = true
			for i := range trip.Lows {
				if trip.Lows[i].Shard == 2 {
					trip.Lows[i].Err = errors.New("set 2's master: down")
				}
			}
			for j := range trip.RefundResults {
				trip.RefundResults[j].Remaining = 100
			}
			e.Done(now, trip)
		}
		return exchanges
	}
	last := t0.Add(75 * time.Millisecond)
	now, exchanges := last, 0
	for now.Sub(last) <= lowStale+LowEvery {
		now = now.Add(5 * time.Millisecond)
		exchanges += tick(now)
		decide(e, now, lm, "k"+strconv.Itoa(int(now.Sub(last)/time.Millisecond)), 1) // asks: news for the exchanges
	}
	if most := int((lowStale + LowEvery) / (LowEvery / 2)); exchanges > most {
		t.Fatalf("%d exchanges in %v with a set failing, want at most %d (one a LowEvery, at a pace down to half of it)", exchanges, now.Sub(last), most)
	}
	low := &lm.chargeLater().low
	if k := keyOfSetFrom(t, "fresh", 0, sets); !low.admit(k, now) {
		t.Fatalf("set 0 answers: its key %s not admitted uncharged", k)
	}
	if k := keyOfSet(t, 2, sets); low.admit(k, now) {
		t.Fatalf("set 2 silent for %v: its key %s admitted uncharged", now.Sub(last), k)
	}
	// Idle, with set 2 still failing: only its waiting marks make exchanges due, at their
	// pace (LowShare/2, ×[0.5, 1.5)), not a retry a LowEvery.
	idle := 0
	for end := now.Add(2 * LowShare); now.Before(end); {
		now = now.Add(5 * time.Millisecond)
		idle += tick(now)
	}
	if most := int(2 * LowShare / (LowShare / 4)); idle > most {
		t.Fatalf("%d exchanges in %v of an idle server with a set failing, want at most %d", idle, 2*LowShare, most)
	}
}

// keyOfSet is a key ID whose set is shard of shards (wire.LowShard).
func keyOfSet(t *testing.T, shard, shards int) string { return keyOfSetFrom(t, "key", shard, shards) }

// keyOfSetFrom is the first key ID prefix<n> whose set is shard of shards.
func keyOfSetFrom(t *testing.T, prefix string, shard, shards int) string {
	t.Helper()
	for i := range 1000 {
		if k := prefix + strconv.Itoa(i); wire.LowShard(k, shards) == shard {
			return k
		}
	}
	t.Fatalf("no key of set %d of %d", shard, shards)
	return ""
}

// TestChargesSpread: a batch of charges is due at an instant drawn for it in the second
// half of an Async after its first admission, so that servers admitting together do not
// charge together: over 40 batches of one server the instants spread over most of that
// half, and two servers given the same admissions charge at different instants.
func TestChargesSpread(t *testing.T) {
	const batches = 40
	delays := make([][]time.Duration, 2)
	for s := range delays {
		e, lm := testEngine(t, func(c *Config) {
			c.Servers = 4
			c.Seed = uint64(s + 1)
			c.Limits[0].Async = 100 * time.Millisecond
			c.BreakerOpen = func() bool { return false }
		})
		warmUp(t, e, lm)
		for i := range batches {
			at := t0.Add(time.Second + time.Duration(i)*time.Second)
			e.Tick(at)
			if d, w := decide(e, at, lm, "k"+strconv.Itoa(i), 1); w != nil || d.Reason != ReasonAsync {
				t.Fatalf("server %d, batch %d: %+v, %v; want an admission charged later", s, i, d, w)
			}
			e.mu.Lock()
			due := e.cl.asyncAt
			e.mu.Unlock()
			delays[s] = append(delays[s], due.Sub(at))
			for charged := false; !charged; { // its exchanges, then the charge
				now := e.NextTick()
				if now.After(due.Add(time.Second)) {
					t.Fatalf("server %d, batch %d: not charged a second after it was due", s, i)
				}
				e.Tick(now)
				for trip := e.Next(); trip != nil; trip = e.Next() {
					if trip.debts {
						if !now.Equal(due) {
							t.Fatalf("server %d, batch %d: charged at %v, due at %v", s, i, now.Sub(at), due.Sub(at))
						}
						charged = true
					}
					answerAll(trip)
					e.Done(now, trip)
				}
			}
		}
	}
	lo, hi, same := delays[0][0], delays[0][0], 0
	for i, d := range delays[0] {
		if d < 50*time.Millisecond || d >= 100*time.Millisecond {
			t.Fatalf("batch %d due %v after its first admission, want from 50 ms to 100 ms", i, d)
		}
		lo, hi = min(lo, d), max(hi, d)
		if d == delays[1][i] {
			same++
		}
	}
	if hi-lo < 40*time.Millisecond || same > 1 {
		t.Errorf("due from %v to %v after the first admission, %d of %d batches at the other server's instant; want a spread of 40 ms or more, and different instants", lo, hi, same, batches)
	}
}

// TestAsyncChargesBatch: the first admission uncharged of a batch draws the instant
// its charges are due, and wakes the driver, whose next tick must come by then; the
// admissions after it join its batch, at that instant, without waking it again (a
// stream of them does not put the batch off); one made while the charges are due goes
// with them; and once they went, the next admission waits its own Async/2 at least.
func TestAsyncChargesBatch(t *testing.T) {
	wakes := 0
	e, lm := testEngine(t, func(c *Config) {
		c.Servers = 4
		c.Limits[0].Async = 100 * time.Millisecond
		c.BreakerOpen = func() bool { return false }
		c.Notify = func() { wakes++ }
	})
	warmUp(t, e, lm)
	// run ticks e every 10 ms from from until before until, answering every trip (a
	// charge's bucket at 90, not low), and returns the keys charged.
	run := func(from, until time.Time) (charged []string) {
		for at := from; at.Before(until); at = at.Add(10 * time.Millisecond) {
			e.Tick(at)
			for trip := e.Next(); trip != nil; trip = e.Next() {
				for i, r := range trip.Refunds {
					if trip.debts {
						charged = append(charged, string(r.ID))
					}
					trip.RefundResults[i].Remaining = 90
				}
				answerAll(trip)
				e.Done(at, trip)
			}
		}
		return charged
	}
	admit := func(at time.Time, key string) {
		t.Helper()
		if d, w := decide(e, at, lm, key, 1); w != nil || d.Reason != ReasonAsync {
			t.Fatalf("%s at %v: %+v, want admitted uncharged", key, at.Sub(t0), d)
		}
	}
	start := t0.Add(time.Second)
	before := wakes
	admit(start, "a")
	if wakes != before+1 {
		t.Fatalf("the batch's first admission woke the driver %d times, want once", wakes-before)
	}
	e.mu.Lock()
	due := e.cl.asyncAt
	e.mu.Unlock()
	keys := []string{"a"}
	for at := start.Add(10 * time.Millisecond); at.Before(due); at = at.Add(10 * time.Millisecond) {
		if charged := run(at, at.Add(time.Nanosecond)); len(charged) > 0 {
			t.Fatalf("%q charged at %v, before the batch's instant %v", charged, at.Sub(start), due.Sub(start))
		}
		keys = append(keys, "k"+strconv.Itoa(len(keys)))
		before = wakes
		admit(at, keys[len(keys)-1])
		if wakes != before {
			t.Fatalf("an admission into a planned batch woke the driver")
		}
	}
	e.Tick(due)
	admit(due, "late") // the charges are due, not sent yet: it goes with them
	keys = append(keys, "late")
	if charged := run(due, due.Add(time.Nanosecond)); !slices.Equal(charged, keys) {
		t.Fatalf("charged %q at the batch's instant, want %q", charged, keys)
	}
	// The next batch: nothing is due until an admission, then not before Async/2.
	next := due.Add(200 * time.Millisecond)
	if charged := run(due.Add(10*time.Millisecond), next); len(charged) > 0 {
		t.Fatalf("%q charged with nothing admitted", charged)
	}
	admit(next, "c")
	if charged := run(next, next.Add(50*time.Millisecond)); len(charged) > 0 {
		t.Fatalf("%q charged within Async/2 of its admission", charged)
	}
	if charged := run(next.Add(50*time.Millisecond), next.Add(110*time.Millisecond)); !slices.Equal(charged, []string{"c"}) {
		t.Fatalf("charged %q in the second half of an Async after c's admission, want c", charged)
	}
}

// TestAsyncAdmissionIsNews: an admission uncharged makes a low-key exchange due at this
// server's next check (within 1.5 LowEvery of the last exchange): the fleet must learn
// what its charge finds. A request that asked more than its lease and was not admitted
// uncharged (its lease in use: warmUp's roomy grant of "first") is not news: the next
// exchange waits for LowShare after the last.
func TestAsyncAdmissionIsNews(t *testing.T) {
	last := t0.Add(50 * time.Millisecond) // warmUp's last exchange
	for _, tc := range []struct {
		key      string
		async    bool
		exchange bool // within 1.5 LowEvery of the last
	}{
		{"new", true, true},
		{"first", false, false},
	} {
		e, lm := asyncEngine(t, new(bool))
		warmUp(t, e, lm)
		at := last.Add(10 * time.Millisecond)
		if d, w := decide(e, at, lm, tc.key, 1); (w == nil && d.Reason == ReasonAsync) != tc.async {
			t.Fatalf("%s: %+v, want admitted uncharged %v", tc.key, d, tc.async)
		}
		exchange := false
		for ; at.Before(last.Add(3 * LowEvery / 2)); at = at.Add(10 * time.Millisecond) {
			e.Tick(at)
			for trip := e.Next(); trip != nil; trip = e.Next() {
				exchange = exchange || trip.Kind == LowTrip
				for i := range trip.RefundResults {
					trip.RefundResults[i].Remaining = 90 // not low: no mark waits
				}
				answerAll(trip)
				e.Done(at, trip)
			}
		}
		if exchange != tc.exchange {
			t.Errorf("%s: an exchange within 1.5 LowEvery %v, want %v", tc.key, exchange, tc.exchange)
		}
	}
}

// TestLowLevel: a bucket is low below one server's share of the burst, or below a token
// a server when the fleet has fewer servers than a share.
func TestLowLevel(t *testing.T) {
	for _, tc := range []struct{ servers, burst, want int }{
		{1, 100, 1},           // a share is the whole burst: a token
		{4, 100, 4},           // share 25
		{10, 100, 10},         // share 10: either
		{20, 100, 5},          // share 5
		{200, 50, 1},          // share 1
		{2, 1_000_000, 2},     // share 500,000
		{300, 1_000_000, 300}, // share 3,334
	} {
		_, lm := testEngine(t, func(c *Config) {
			c.Servers = tc.servers
			c.Limits[0].Burst = tc.burst
			c.Limits[0].Async = 100 * time.Millisecond
		})
		if got := lm.Shape("").lowLevel(); got != tc.want {
			t.Errorf("%d servers, burst %d: low level %d, want %d", tc.servers, tc.burst, got, tc.want)
		}
	}
}

// TestLowExchangeBacklog: an exchange carries at most maxLowSend of a limit's marks, the
// first queued; the rest make the next exchange due at the next check, a LowEvery at
// this server's pace later, not LowShare/2 later as marks that fit would.
func TestLowExchangeBacklog(t *testing.T) {
	e, lm := asyncEngine(t, new(bool))
	warmUp(t, e, lm)
	const n = 2*maxLowSend + 100
	low := &lm.chargeLater().low
	start := t0.Add(100 * time.Millisecond)
	for i := range n {
		low.note(lm.Shape(""), "k"+strconv.Itoa(i), 0, start)
	}
	var at []time.Duration
	var carried []int
	next := 0
	for now := start; len(carried) < 3 && now.Before(start.Add(time.Minute)); now = e.NextTick() {
		e.Tick(now)
		for trip := e.Next(); trip != nil; trip = e.Next() {
			if trip.Kind == LowTrip {
				x := trip.Lows[0]
				for j, id := range x.Mark {
					if want := "k" + strconv.Itoa(next+j); string(id) != want {
						t.Fatalf("exchange %d, mark %d: %s, want %s (the order queued)", len(carried)+1, j, id, want)
					}
				}
				next += len(x.Mark)
				at, carried = append(at, now.Sub(start)), append(carried, len(x.Mark))
				trip.Lows[0].Got = []redisstore.KeyID{}
			}
			answerAll(trip)
			e.Done(now, trip)
		}
	}
	if len(carried) != 3 || carried[0] != maxLowSend || carried[1] != maxLowSend || carried[2] != 100 {
		t.Fatalf("exchanges carried %v marks, want %d, %d and 100", carried, maxLowSend, maxLowSend)
	}
	for i := 1; i < 3; i++ {
		if gap := at[i] - at[i-1]; gap > LowEvery*3/2 {
			t.Errorf("exchange %d came %v after the one before, want within 1.5 LowEvery", i+1, gap)
		}
	}
	if _, backlog, _, _ := low.pending(t0); backlog {
		t.Error("a backlog after every mark was sent")
	}
}

// TestAsyncUnchargedBoundIsEngineWide: the engine holds at most maxDebtKeys charges, of
// every charge-later limit together, so a key is admitted uncharged only while the
// engine counts fewer keys uncharged than that. With one limit's keys at the bound, a
// key of another limit asks Redis: were it admitted, its charge would find no room and
// be forgiven, and its key, free again, admitted and forgiven without end. Once a
// charge is answered, the key of the other limit is admitted uncharged again, and no
// charge was forgiven.
func TestAsyncUnchargedBoundIsEngineWide(t *testing.T) {
	e, lm := testEngine(t, func(c *Config) {
		c.Servers = 4
		c.Limits[0].Async = 100 * time.Millisecond
		c.Limits = append(c.Limits, LimitConfig{Name: "b", Rate: 100, Burst: 100, Policy: breaker.FailClosed,
			LowWatermark: -1, Async: 100 * time.Millisecond})
	})
	b := e.Limit("b")
	// warm: a request the lease cannot serve starts the low-key exchanges, at 25 and
	// 50 ms (warmUp's, for both limits)
	e.Tick(t0)
	if _, w := decide(e, t0, lm, "first", 1); w == nil {
		t.Fatal("a request before the server is warm did not wait for Redis")
	}
	for _, at := range []time.Time{t0, t0.Add(25 * time.Millisecond), t0.Add(50 * time.Millisecond)} {
		e.Tick(at)
		for trip := e.Next(); trip != nil; trip = e.Next() {
			answerAll(trip)
			e.Done(at, trip)
		}
	}
	now := t0.Add(60 * time.Millisecond)
	for i := range maxDebtKeys {
		if d, w := decide(e, now, lm, "k"+strconv.Itoa(i), 1); w != nil || d.Reason != ReasonAsync {
			t.Fatalf("key %d of api: %+v, want it admitted uncharged", i, d)
		}
	}
	for i := range 100 {
		d, w := decide(e, now, b, "x", 25)
		if w == nil && d.Reason == ReasonAsync {
			t.Fatalf("request %d of b's key x admitted uncharged with %d keys of api uncharged", i, maxDebtKeys)
		}
		if w != nil {
			e.GiveUp(now, w, ReasonTimeout)
		}
	}
	// The charges go (at most 1,000 a trip), and are answered: the keys are free again.
	for at := now; at.Before(now.Add(time.Second)); at = at.Add(10 * time.Millisecond) {
		e.Tick(at)
		for trip := e.Next(); trip != nil; trip = e.Next() {
			answerAll(trip)
			for i := range trip.RefundResults {
				trip.RefundResults[i].Remaining = 90
			}
			e.Done(at, trip)
		}
	}
	if got := e.cl.uncharged.Load(); got != 0 {
		t.Fatalf("%d keys counted uncharged once every charge was answered", got)
	}
	if d, w := decide(e, now.Add(time.Second), b, "y", 25); w != nil || d.Reason != ReasonAsync {
		t.Fatalf("b's key y once the charges were answered: %+v, want it admitted uncharged", d)
	}
	for _, l := range []*Limit{lm, b} {
		if st := l.Stats(); st.Forgiven != 0 {
			t.Fatalf("limit %s forgave %d tokens", l.Name(), st.Forgiven)
		}
	}
}

// TestAsyncReturnTakesBackTheCharge: an admission uncharged given back (Engine.Return:
// another item of AllowMulti denied, a reservation cancelled) takes its charge back:
// off the queue while it waits there, so that no charge of it goes and its key may be
// admitted uncharged again at once; once the charge went, as a refund of its tokens.
func TestAsyncReturnTakesBackTheCharge(t *testing.T) {
	// trips ticks e from the instant from to to every 5 ms, answers every trip (a
	// charge's bucket holding 90) and returns the charges and refunds they carried.
	trips := func(e *Engine, from, to time.Time) (moves []redisstore.RefundRequest) {
		for at := from; !at.After(to); at = at.Add(5 * time.Millisecond) {
			e.Tick(at)
			for trip := e.Next(); trip != nil; trip = e.Next() {
				moves = append(moves, trip.Refunds...)
				answerAll(trip)
				for i := range trip.RefundResults {
					trip.RefundResults[i].Remaining = 90
				}
				e.Done(at, trip)
			}
		}
		return moves
	}
	// admitted is a warm engine that admitted k uncharged at now, its cost 3.
	admitted := func(t *testing.T) (*Engine, *Limit, time.Time, Decision) {
		open := false
		e, lm := asyncEngine(t, &open)
		warmUp(t, e, lm)
		now := t0.Add(60 * time.Millisecond)
		d, w := decide(e, now, lm, "k", 3)
		if w != nil || d.Reason != ReasonAsync {
			t.Fatalf("%+v, want k admitted uncharged", d)
		}
		return e, lm, now, d
	}
	t.Run("queued", func(t *testing.T) {
		e, lm, now, d := admitted(t)
		held := lm.Stats().Held
		e.Return(now, now, lm, "", "k", 3, d)
		// The charge off the queue moved no leased token: Held stays.
		if st := lm.Stats(); st.Owed != 0 || st.GivenBack != 1 || st.Held != held {
			t.Fatalf("after Return: owed %d, given back %d, held %d; want 0, 1 and %d", st.Owed, st.GivenBack, st.Held, held)
		}
		if d, w := decide(e, now, lm, "k", 2); w != nil || d.Reason != ReasonAsync {
			t.Fatalf("k again after Return: %+v, want it admitted uncharged", d)
		}
		moves := trips(e, now, now.Add(300*time.Millisecond))
		if len(moves) != 1 || moves[0].ID != "k" || moves[0].N != -2 {
			t.Fatalf("the trips moved %+v, want the second admission's charge of 2 alone", moves)
		}
	})
	t.Run("sent", func(t *testing.T) {
		e, lm, now, d := admitted(t)
		// The charge goes, and is not answered yet.
		var charge *Trip
		for at := now; charge == nil && at.Before(now.Add(300*time.Millisecond)); at = at.Add(5 * time.Millisecond) {
			e.Tick(at)
			for trip := e.Next(); trip != nil; trip = e.Next() {
				if trip.debts {
					charge = trip
					break
				}
				answerAll(trip)
				e.Done(at, trip)
			}
		}
		if charge == nil || len(charge.Refunds) != 1 || charge.Refunds[0].N != -3 {
			t.Fatalf("charge trip %+v, want k's charge of 3", charge)
		}
		at := now.Add(300 * time.Millisecond)
		e.Return(at, now, lm, "", "k", 3, d)
		answerAll(charge)
		e.Done(at, charge)
		moves := trips(e, at, at.Add(time.Second))
		if len(moves) != 1 || moves[0].ID != "k" || moves[0].N != 3 {
			t.Fatalf("after the charge went, the trips moved %+v, want a refund of 3 to k", moves)
		}
	})
}

// debtTrips ticks e from now every 10 ms, for at most 5 s, until n debt trips went:
// each is given to answer (its index among them), then done; every other trip is
// answered in full.
func debtTrips(e *Engine, now time.Time, n int, answer func(trip *Trip, i int)) {
	i := 0
	for at := now; i < n && at.Before(now.Add(5*time.Second)); at = at.Add(10 * time.Millisecond) {
		e.Tick(at)
		for trip := e.Next(); trip != nil; trip = e.Next() {
			if trip.debts {
				answer(trip, i)
				i++
			} else {
				answerAll(trip)
			}
			e.Done(at, trip)
		}
	}
}

// TestDebtRetriesKeepTheirOrder: a debt trip that times out goes again, in halves, ahead
// of the other retries and in its order, and so does a half that times out again: no
// item goes before one first sent ahead of it. Redis answers an item of a bucket stale,
// charging nothing, once a later item of this server's ran there.
func TestDebtRetriesKeepTheirOrder(t *testing.T) {
	open := false
	e, lm := asyncEngine(t, &open)
	warmUp(t, e, lm)
	now := t0.Add(60 * time.Millisecond)
	for _, k := range []string{"a", "b"} {
		if d, w := decide(e, now, lm, k, 1); w != nil || d.Reason != ReasonAsync {
			t.Fatalf("%s: %+v, want it admitted uncharged", k, d)
		}
	}
	timeout := fmt.Errorf("%w: %w", breaker.ErrTimeout, context.DeadlineExceeded)
	var sent [][]uint64
	debtTrips(e, now, 4, func(trip *Trip, i int) {
		var seqs []uint64
		for _, r := range trip.Refunds {
			seqs = append(seqs, r.Seq)
		}
		sent = append(sent, seqs)
		if i < 2 { // the whole trip, then its first half, time out
			trip.Err = timeout
		} else {
			trip.Answered = true
		}
	})
	if len(sent) != 4 || len(sent[0]) != 2 {
		t.Fatalf("debt trips sent %v, want both charges, then three more trips", sent)
	}
	a, b := sent[0][0], sent[0][1]
	if want := [][]uint64{{a, b}, {a}, {a}, {b}}; !reflect.DeepEqual(sent, want) {
		t.Fatalf("debt trips sent %v, want %v: the first half again before the second", sent, want)
	}
	if st := lm.Stats(); st.Charged != 2 || st.Owed != 0 {
		t.Fatalf("charged %d, owed %d; want 2 and 0", st.Charged, st.Owed)
	}
}

// TestDebtLostConnectionKeepsItsNumber: a charge whose connection was lost once it was
// written (its node's, in a trip the other nodes answered) may have run: it goes again
// under its sequence number, which Redis answers as a replay if it ran, not as a new
// charge under a fresh one, which would charge twice; and so it stays, until answered,
// when a sending after fails without running (a dial refused). One refused before it
// first went (its node's breaker open) takes a fresh number.
func TestDebtLostConnectionKeepsItsNumber(t *testing.T) {
	timeout := fmt.Errorf("%w: %w", breaker.ErrTimeout, context.DeadlineExceeded)
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	for _, tc := range []struct {
		name string
		errs []error // of the first sendings; the next one is answered
		same bool    // every sending under one number
	}{
		{"connection reset", []error{&net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}}, true},
		{"EOF", []error{io.EOF}, true},
		{"breaker open", []error{breaker.ErrOpen}, false},
		{"timeout, then dial refused", []error{timeout, dial}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			open := false
			e, lm := asyncEngine(t, &open)
			warmUp(t, e, lm)
			now := t0.Add(60 * time.Millisecond)
			if d, w := decide(e, now, lm, "a", 1); w != nil || d.Reason != ReasonAsync {
				t.Fatalf("%+v, want it admitted uncharged", d)
			}
			var seqs []uint64
			debtTrips(e, now, len(tc.errs)+1, func(trip *Trip, i int) {
				seqs = append(seqs, trip.Refunds[0].Seq)
				trip.Answered = true // the trip's other nodes answered (a Cluster's)
				if i < len(tc.errs) {
					trip.RefundResults[0].Err = tc.errs[i]
				}
			})
			if len(seqs) != len(tc.errs)+1 {
				t.Fatalf("charge sent %d times, want %d", len(seqs), len(tc.errs)+1)
			}
			if same := !slices.ContainsFunc(seqs, func(s uint64) bool { return s != seqs[0] }); same != tc.same {
				t.Fatalf("sent under %v: want one number %v", seqs, tc.same)
			}
			if st := lm.Stats(); st.Charged != 1 || st.Owed != 0 {
				t.Fatalf("charged %d, owed %d; want 1 and 0", st.Charged, st.Owed)
			}
		})
	}
}

// TestShareOf: a server's share of a burst is the burst over the servers rounded up,
// at least 1: the servers' shares cover the burst.
func TestShareOf(t *testing.T) {
	for _, tc := range []struct{ burst, servers, want int }{
		{10, 3, 4}, {9, 3, 3}, {1, 200, 1}, {100, 1, 100}, {10_000, 200, 50}, {10_001, 200, 51},
	} {
		if got := shareOf(tc.burst, tc.servers); got != tc.want {
			t.Errorf("shareOf(%d, %d) = %d, want %d", tc.burst, tc.servers, got, tc.want)
		}
	}
}
