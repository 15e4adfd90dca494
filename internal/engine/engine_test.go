package engine

import (
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/storeerr"
)

// testEngine is an engine of one limit for the tests of this file: rate 100/s, burst
// 100 over one server, prefetch off, its first trip (the record of representations)
// made, and the next an hour later: out of the way of tests that count trips.
func testEngine(t *testing.T, mod func(*Config)) (*Engine, *Limit) {
	t.Helper()
	var seq uint64
	cfg := Config{
		Limits: []LimitConfig{{Name: "api", Rate: 100, Burst: 100, Policy: breaker.FailClosed,
			LowWatermark: -1}},
		Servers: 1,
		Seed:    1,
		Shards:  1,
		NextSeq: func() uint64 { seq++; return seq },

		HeartbeatInterval: time.Hour,
	}
	if mod != nil {
		mod(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	readReps(t, e, t0)
	return e, e.Limit("api")
}

// readReps makes the first trip of a new engine, which a driver makes before it serves
// requests: the record of representations, answered with this engine's own.
func readReps(t *testing.T, e *Engine, now time.Time) {
	t.Helper()
	trip := e.Next()
	if trip == nil || trip.Kind != HeartbeatTrip || trip.Reps == nil {
		t.Fatalf("a new engine's first trip is %+v, want the record of representations", trip)
	}
	trip.RepsGot, trip.Answered = trip.Reps, true
	e.Done(now, trip)
}

// decide is Decide returning the decision.
func decide(e *Engine, now time.Time, lm *Limit, key string, n int) (Decision, *Waiter) {
	var d Decision
	w := e.Decide(now.UnixNano(), lm, "", key, n, &d)
	return d, w
}

// answerAll answers every take of t in full and every refund as done.
func answerAll(t *Trip) {
	for i, r := range t.Takes {
		t.TakeResults[i].Granted, t.TakeResults[i].Remaining = r.Want, 50
	}
	t.Answered = true
}

func TestRequestsWaitForOneRefillAndAreDecidedInOrder(t *testing.T) {
	var decided []*Waiter
	e, lm := testEngine(t, func(c *Config) { c.Decided = func(w *Waiter) { decided = append(decided, w) } })
	d, w1 := decide(e, t0, lm, "k", 1)
	if w1 == nil || d.Reason != ReasonRefill {
		t.Fatalf("first request: %+v, %v; want a waiter for its refill", d, w1)
	}
	_, w2 := decide(e, t0, lm, "k", 1)
	if w2 == nil {
		t.Fatal("second request did not wait for the refill in flight")
	}
	trip := e.Next()
	if trip == nil || trip.Kind != TakeTrip || len(trip.Takes) != 1 {
		t.Fatalf("Next = %+v, want one take", trip)
	}
	if e.Next() != nil {
		t.Fatal("a second trip while one is out")
	}
	// The first refill was sized for one request: it serves the first waiter, and the
	// second waits for the next refill, which the engine starts itself.
	answerAll(trip)
	e.Done(t0.Add(ms), trip)
	if len(decided) != 1 || decided[0] != w1 {
		t.Fatalf("decided %v, want the first waiter", decided)
	}
	trip = e.Next()
	if trip == nil || trip.Kind != TakeTrip {
		t.Fatalf("Next = %+v, want the second waiter's refill", trip)
	}
	answerAll(trip)
	e.Done(t0.Add(2*ms), trip)
	if len(decided) != 2 || decided[1] != w2 {
		t.Fatalf("decided %v, want both waiters in the order they came", decided)
	}
	for i, w := range []*Waiter{w1, w2} {
		select {
		case <-w.Done():
		default:
			t.Fatalf("waiter %d: Done not closed", i)
		}
		if d := w.Decision(); !d.Allowed || d.Source != SourceGlobal || d.Reason != ReasonGranted {
			t.Errorf("waiter %d: %+v, want allowed after the refill", i, d)
		}
		if d := e.GiveUp(t0.Add(time.Second), w, ReasonTimeout); !d.Allowed {
			t.Errorf("GiveUp after the decision changed it: %+v", d)
		}
	}
	if s := e.Stats(); s.Global != 2 || s.Takes != 2 || s.RoundTrips != 2 || s.Fallback != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestGiveUpBeforeTheAnswer(t *testing.T) {
	for _, tc := range []struct {
		why     Reason
		allowed bool
		source  Source
	}{
		{ReasonTimeout, false, SourceFallback}, // FailClosed decides
		{ReasonCanceled, false, SourceFallback},
	} {
		t.Run(tc.why.name(), func(t *testing.T) {
			called := 0
			e, lm := testEngine(t, func(c *Config) { c.Decided = func(*Waiter) { called++ } })
			_, w := decide(e, t0, lm, "k", 1)
			d := e.GiveUp(t0.Add(10*ms), w, tc.why)
			if d.Allowed != tc.allowed || d.Source != tc.source || d.Reason != tc.why {
				t.Fatalf("GiveUp = %+v", d)
			}
			trip := e.Next()
			answerAll(trip)
			e.Done(t0.Add(11*ms), trip)
			if called != 0 {
				t.Fatal("the engine decided a request the driver gave up on")
			}
			if got := w.Decision(); got != d {
				t.Fatalf("decision changed to %+v", got)
			}
			// The late grant still fills the lease: the next request is served from it.
			if d, w := decide(e, t0.Add(12*ms), lm, "k", 1); w != nil || !d.Allowed || d.Source != SourceLease {
				t.Fatalf("after a late grant: %+v, %v", d, w)
			}
		})
	}
}

func (r Reason) name() string { return fmt.Sprintf("reason%d", r) }

func TestBreakerOpenFailsAtOnce(t *testing.T) {
	open := true
	e, lm := testEngine(t, func(c *Config) { c.BreakerOpen = func() bool { return open } })
	d, w := decide(e, t0, lm, "k", 1)
	if w != nil || d.Allowed || d.Source != SourceFallback || d.Reason != ReasonBreakerOpen {
		t.Fatalf("with the breaker open: %+v, %v; want the policy at once", d, w)
	}
	if trip := e.Next(); trip != nil {
		t.Fatalf("a trip while the breaker is open: %+v", trip)
	}
	if s := e.Stats(); s.Fallback != 1 || s.RefillErrors != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestFailedRefillSendsWaitersToThePolicy(t *testing.T) {
	e, lm := testEngine(t, func(c *Config) { c.Limits[0].Policy = breaker.FailOpen })
	_, w := decide(e, t0, lm, "k", 1)
	trip := e.Next()
	trip.Err = fmt.Errorf("deadline: %w", breaker.ErrTimeout)
	e.Done(t0.Add(10*ms), trip)
	if d := w.Decision(); !d.Allowed || d.Source != SourceFallback || d.Reason != ReasonTimeout {
		t.Fatalf("%+v, want admitted by FailOpen after a timeout", d)
	}
}

func TestTripsBatchAndTakeTurns(t *testing.T) {
	e, lm := testEngine(t, nil)
	for i := range MaxBatch + 10 {
		decide(e, t0, lm, fmt.Sprint("k", i), 1)
	}
	e.queueRefund(lm, nil, "a", 3)
	e.queueRefund(lm, nil, "b", 1)
	e.queueRefund(lm, nil, "a", 200) // summed with the first, capped at the burst
	var kinds []string
	for trip := e.Next(); trip != nil; trip = e.Next() {
		kinds = append(kinds, fmt.Sprintf("%d×%d", trip.Kind, len(trip.Takes)+len(trip.Refunds)))
		if trip.Kind == RefundTrip {
			if trip.Refunds[0].N != 100 || trip.Refunds[1].N != 1 || trip.Refunds[0].Seq == 0 {
				t.Errorf("refunds %+v: want a's summed and capped at 100, numbered", trip.Refunds)
			}
		}
		answerAll(trip)
		e.Done(t0.Add(ms), trip)
	}
	// The refills go first, but the refunds do not wait for the second batch of them.
	want := []string{fmt.Sprintf("%d×%d", TakeTrip, MaxBatch), fmt.Sprintf("%d×2", RefundTrip), fmt.Sprintf("%d×10", TakeTrip)}
	if fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Fatalf("trips %v, want %v", kinds, want)
	}
}

// TestRefundWhoseOwnAnswerWasLostGoesAgain: in a trip the other parts answered (a
// Cluster's masters), a refund whose own node's call timed out, or lost its connection
// once written, may have run: it goes again, under its number, which Redis answers as a
// replay if it ran. One refused before it went (its node's breaker open) is lost, its
// tokens spent.
func TestRefundWhoseOwnAnswerWasLostGoesAgain(t *testing.T) {
	e, lm := testEngine(t, nil)
	for _, k := range []string{"a", "b", "c", "d"} {
		e.queueRefund(lm, nil, k, 1)
	}
	trip := e.Next()
	seqs := map[redisstore.KeyID]uint64{}
	trip.Answered = true
	for i, r := range trip.Refunds {
		seqs[r.ID] = r.Seq
		switch r.ID {
		case "b":
			trip.RefundResults[i].Err = fmt.Errorf("%w: node 2", breaker.ErrTimeout)
		case "c":
			trip.RefundResults[i].Err = io.EOF
		case "d":
			trip.RefundResults[i].Err = breaker.ErrOpen
		}
	}
	e.Done(t0, trip)
	if n, _ := trip.Lost(); n != 1 {
		t.Fatalf("%d tokens lost, want d's 1", n)
	}
	again := e.Next()
	if again == nil || len(again.Refunds) != 2 {
		t.Fatalf("next trip %+v, want b's and c's refunds again", again)
	}
	for _, r := range again.Refunds {
		if (r.ID != "b" && r.ID != "c") || r.Seq != seqs[r.ID] {
			t.Fatalf("%s sent again under %d, want b or c under its number %d", r.ID, r.Seq, seqs[r.ID])
		}
	}
	again.Answered = true
	e.Done(t0, again)
	if s := e.Stats(); s.Refunded != 3 || s.RefundsLost != 1 {
		t.Fatalf("refunded %d, lost %d; want 3 and 1", s.Refunded, s.RefundsLost)
	}
}

func TestSlowRefundTripIsSentAgainInHalves(t *testing.T) {
	e, lm := testEngine(t, nil)
	for i := range 5 {
		e.queueRefund(lm, nil, fmt.Sprint("k", i), 1)
	}
	trip := e.Next()
	seqs := map[redisstore.KeyID]uint64{}
	for _, r := range trip.Refunds {
		seqs[r.ID] = r.Seq
	}
	trip.Err = fmt.Errorf("late: %w", breaker.ErrTimeout)
	e.Done(t0, trip)
	var sizes []int
	for trip := e.Next(); trip != nil; trip = e.Next() {
		sizes = append(sizes, len(trip.Refunds))
		for _, r := range trip.Refunds {
			if r.Seq != seqs[r.ID] {
				t.Errorf("%s re-sent with seq %d, want %d", r.ID, r.Seq, seqs[r.ID])
			}
		}
		if len(trip.Refunds) > 1 {
			trip.Err = breaker.ErrTimeout
		} else {
			trip.Answered = true
		}
		e.Done(t0, trip)
	}
	if fmt.Sprint(sizes) != "[2 1 1 3 1 2 1 1]" {
		t.Fatalf("trips of %v refunds, want halves down to single refunds", sizes)
	}
	if s := e.Stats(); s.Refunded != 5 || s.RefundsLost != 0 {
		t.Fatalf("stats %+v", s)
	}
	// Any other failure drops the refunds: the tokens stay spent.
	e.queueRefund(lm, nil, "k", 2)
	trip = e.Next()
	trip.Err = errors.New("refused")
	e.Done(t0, trip)
	if n, err := trip.Lost(); n != 2 || err == nil {
		t.Fatalf("Lost() = %d, %v", n, err)
	}
}

func TestShutdown(t *testing.T) {
	e, lm := testEngine(t, nil)
	_, w := decide(e, t0, lm, "k", 1) // its refill is pending, never sent
	e.Stop(t0)
	if d := w.Decision(); d.Reason != ReasonClosed || d.Allowed {
		t.Fatalf("a request waiting at Stop: %+v", d)
	}
	if d, w := decide(e, t0, lm, "j", 1); w != nil || d.Reason != ReasonClosed {
		t.Fatalf("a request after Stop: %+v, %v", d, w)
	}
	// A key that holds tokens: they are refunded at Drain.
	lm.keys.Update(t0.UnixNano(), "held", func(en *entry, _ int64) { en.lease.tokens = 7 })
	e.Drain()
	trip := e.Next()
	if trip == nil || trip.Kind != RefundTrip || len(trip.Refunds) != 1 || trip.Refunds[0].N != 7 {
		t.Fatalf("after Drain: %+v, want the held tokens refunded", trip)
	}
	trip.Answered = true
	e.Done(t0, trip)
	if lost, _ := e.Finish(); lost != 0 {
		t.Fatalf("Finish lost %d", lost)
	}
	// A refund queued after Finish (a request that raced the shutdown) is counted lost,
	// not left in a queue nobody sends.
	e.queueRefund(lm, nil, "late", 3)
	if s := e.Stats(); s.RefundsLost != 3 {
		t.Fatalf("RefundsLost %d, want 3", s.RefundsLost)
	}
	if trip := e.Next(); trip != nil {
		t.Fatalf("a trip after Finish: %+v", trip)
	}
}

func TestHeartbeatDividesTheLimits(t *testing.T) {
	e, lm := testEngine(t, func(c *Config) { c.Fleet, c.HeartbeatInterval, c.Servers = "api-servers", time.Second, 4 })
	if !e.NextTick().IsZero() {
		t.Fatal("NextTick before the first Tick")
	}
	e.Tick(t0)
	beat := e.NextTick() // the first heartbeat, at a phase of its own within 100ms
	if d := beat.Sub(t0); d < 0 || d >= 100*ms {
		t.Fatalf("first heartbeat at +%v, want within 100ms", d)
	}
	if trip := e.Next(); trip != nil {
		t.Fatalf("a trip before the first heartbeat is due: %+v", trip)
	}
	e.Tick(beat)
	trip := e.Next()
	if trip == nil || trip.Kind != HeartbeatTrip || trip.Fleet != "api-servers" || trip.TTL != 3*time.Second {
		t.Fatalf("first trip %+v, want a heartbeat", trip)
	}
	trip.Live, trip.Answered = 10, true
	e.Done(beat, trip)
	if e.Servers() != 10 || lm.Shape("").lease.Load().Servers != 10 {
		t.Fatalf("servers %d after a heartbeat answering 10", e.Servers())
	}
	if got := e.NextTick().Sub(t0); got < DefaultLifetime/8 || got >= 3*DefaultLifetime/8 {
		t.Fatalf("NextTick +%v, want the first expiry sweep within 0.5-1.5 sweep intervals", got)
	}
	e.Tick(beat.Add(999 * ms))
	if trip := e.Next(); trip != nil {
		t.Fatalf("a trip before the next heartbeat: %+v", trip)
	}
	e.Tick(beat.Add(time.Second))
	if trip := e.Next(); trip == nil || trip.Kind != HeartbeatTrip {
		t.Fatalf("no heartbeat a second later: %+v", trip)
	}
}

// TestSteadyRefillsDoNotStarveTheRest runs a server whose every round trip takes a
// millisecond while a new key asks for a refill every millisecond, so that a refill is
// always waiting: its heartbeats, and the refunds of the leases that keys hot for a while
// leave behind, must still go out.
func TestSteadyRefillsDoNotStarveTheRest(t *testing.T) {
	e, lm := testEngine(t, func(c *Config) {
		c.Fleet, c.HeartbeatInterval = "api-servers", time.Second
		c.Limits[0].Rate = 1e6
		c.Limits[0].Burst = 1e6
		c.Limits[0].LowWatermark = 0 // prefetch: a grant leaves tokens to expire
	})
	var out *Trip
	kinds := map[TripKind]int{}
	const steps = 10_000 // 10s
	for i := range steps {
		now := t0.Add(time.Duration(i) * ms)
		decide(e, now, lm, fmt.Sprint("new", i), 1)
		decide(e, now, lm, fmt.Sprint("hot", i/200), 1) // hot for 200ms, then left with tokens
		e.Tick(now)
		if out != nil {
			answerAll(out)
			e.Done(now, out)
		}
		if out = e.Next(); out != nil {
			kinds[out.Kind]++
		}
	}
	s := e.Stats()
	if kinds[HeartbeatTrip] < 9 {
		t.Errorf("%d heartbeats in 10s, want one a second (trips %v)", kinds[HeartbeatTrip], kinds)
	}
	if kinds[RefundTrip] == 0 || s.Refunded == 0 {
		t.Errorf("no refunds went out (trips %v, stats %+v)", kinds, s)
	}
	if kinds[TakeTrip] < steps/2-1 {
		t.Errorf("%d take trips, want at least every other trip (trips %v)", kinds[TakeTrip], kinds)
	}
}

func TestNewRejects(t *testing.T) {
	ok := LimitConfig{Name: "api", Rate: 1, Burst: 1, Policy: breaker.FailOpen}
	seq := func() uint64 { return 1 }
	for _, tc := range []struct {
		name string
		cfg  Config
		is   error
	}{
		{"no limits", Config{Servers: 1, NextSeq: seq}, nil},
		{"no servers", Config{Limits: []LimitConfig{ok}, NextSeq: seq}, nil},
		{"no seq", Config{Limits: []LimitConfig{ok}, Servers: 1}, nil},
		{"twice", Config{Limits: []LimitConfig{ok, ok}, Servers: 1, NextSeq: seq}, nil},
		{"tuning", Config{Limits: []LimitConfig{{Name: "a", Rate: 1, Burst: 1, Policy: breaker.FailOpen, Lifetime: -1}}, Servers: 1, NextSeq: seq}, nil},
		{"rate", Config{Limits: []LimitConfig{{Name: "a", Rate: 0, Burst: 1, Policy: breaker.FailOpen}}, Servers: 1, NextSeq: seq}, storeerr.ErrInvalidLimit},
		{"policy", Config{Limits: []LimitConfig{{Name: "a", Rate: 1, Burst: 1}}, Servers: 1, NextSeq: seq}, breaker.ErrNoPolicy},
		{"fleet", Config{Limits: []LimitConfig{ok}, Servers: 1, NextSeq: seq, Fleet: "a b"}, storeerr.ErrInvalidLimit},
		{"async", Config{Limits: []LimitConfig{{Name: "a", Rate: 1, Burst: 1, Policy: breaker.FailOpen, Async: time.Microsecond}}, Servers: 1, NextSeq: seq}, nil},
	} {
		_, err := New(tc.cfg)
		if err == nil || tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("%s: New = %v, want an error (wrapping %v)", tc.name, err, tc.is)
		}
	}
}

// TestHeldReturnsToZeroAfterAClampedRefund: refunds of one key summed above the burst
// are sent capped (Redis caps the bucket anyway); what is above counts as given back, so
// that a server holding no key holds no tokens.
func TestHeldReturnsToZeroAfterAClampedRefund(t *testing.T) {
	e, lm := testEngine(t, nil) // burst 100, one server
	now := t0
	if _, w := decide(e, now, lm, "k", 1); w == nil {
		t.Fatal("no waiter")
	}
	lm.keys.Remove("k") // evicted while its refill is still queued
	if _, w := decide(e, now, lm, "k", 1); w == nil {
		t.Fatal("no waiter")
	}
	tr := e.Next()
	if tr == nil || tr.Kind != TakeTrip || len(tr.Takes) != 2 {
		t.Fatalf("trip %+v, want two takes", tr)
	}
	for i := range tr.Takes {
		tr.TakeResults[i].Granted, tr.TakeResults[i].Remaining = 60, 0
	}
	tr.Answered = true
	e.Done(now, tr)
	lm.keys.Remove("k")
	rt := e.Next()
	if rt == nil || rt.Kind != RefundTrip || len(rt.Refunds) != 1 || rt.Refunds[0].N != 100 {
		t.Fatalf("trip %+v, want one refund capped at the burst", rt)
	}
	rt.Answered = true
	e.Done(now.Add(time.Millisecond), rt)
	if st := lm.Stats(); st.Held != 0 || st.Refunded+st.RefundsLost != st.Granted-2 {
		t.Fatalf("granted %d, refunded %d, lost %d, held %d; want nothing held with no key", st.Granted, st.Refunded, st.RefundsLost, st.Held)
	}
}

// TestLostTakeIsSentAgain: a take that timed out may have run in Redis, so the key's next
// refill goes under its sequence number; Redis answers it from its record when it ran
// (Replayed: its grant recovered, counted in Recovered), and runs it when it did not. A
// refill that failed otherwise (the breaker open: never sent) takes a fresh number.
func TestLostTakeIsSentAgain(t *testing.T) {
	e, lm := testEngine(t, func(c *Config) { c.Limits[0].Policy = breaker.FailClosed })
	_, w := decide(e, t0, lm, "k", 1)
	if w == nil {
		t.Fatal("no refill for a new key")
	}
	trip := e.Next()
	lost := trip.Takes[0].Seq
	if lost == 0 {
		t.Fatal("a take without a sequence number")
	}
	trip.Err = fmt.Errorf("late: %w", breaker.ErrTimeout)
	e.Done(t0.Add(10*ms), trip)

	_, w = decide(e, t0.Add(20*ms), lm, "k", 1)
	if w == nil {
		t.Fatal("no refill after a lost one")
	}
	trip = e.Next()
	if got := trip.Takes[0].Seq; got != lost {
		t.Fatalf("the next take went under seq %d, want the lost one's %d", got, lost)
	}
	answerAll(trip)
	trip.TakeResults[0].Granted, trip.TakeResults[0].Replayed = 7, true
	e.Done(t0.Add(21*ms), trip)
	if d := w.Decision(); !d.Allowed {
		t.Fatalf("after the replayed grant: %+v, want admitted", d)
	}
	if s := lm.Stats(); s.Recovered != 7 || s.Granted != 7 {
		t.Errorf("Recovered %d, Granted %d; want 7 and 7", s.Recovered, s.Granted)
	}

	// Not sent at all (the breaker was open): nothing to recover, a fresh number next.
	takeTrip := func() *Trip {
		for trip := e.Next(); trip != nil; trip = e.Next() {
			if trip.Kind == TakeTrip {
				return trip
			}
			answerAll(trip)
			e.Done(t0.Add(30*ms), trip)
		}
		t.Fatal("no take trip")
		return nil
	}
	decide(e, t0.Add(30*ms), lm, "k2", 1)
	trip = takeTrip()
	first := trip.Takes[0].Seq
	trip.Err = breaker.ErrOpen
	e.Done(t0.Add(30*ms), trip)
	decide(e, t0.Add(31*ms), lm, "k2", 1)
	if trip = takeTrip(); trip.Takes[0].Seq == first {
		t.Errorf("a take that was never sent went again under its number %d", first)
	}
}

// TestGrantPaysThePolicy: what the failure policy admitted to requests that waited for a
// refill, the refill's grant paid for, if Redis ran it. A grant that arrives after they
// gave up is spent on them first; a take whose answer was lost after the policy admitted
// its requests is taken as having paid (not sent again), so that a server whose every
// answer is late keeps paying for what its policy admits.
func TestGrantPaysThePolicy(t *testing.T) {
	e, lm := testEngine(t, func(c *Config) { c.Limits[0].Policy = breaker.FailOpen })
	tokens := func(key string) (n int) {
		lm.keys.Peek(key, func(en *entry, _ int64) { n = en.lease.Tokens() })
		return n
	}
	// Two requests wait; one gives up at its MaxWait (FailOpen admits it); the grant of
	// 10 then serves the other and pays for the first: 8 left.
	_, w1 := decide(e, t0, lm, "late", 1)
	_, w2 := decide(e, t0, lm, "late", 1)
	trip := e.Next()
	if d := e.GiveUp(t0.Add(10*ms), w1, ReasonTimeout); !d.Allowed || d.Source != SourceFallback {
		t.Fatalf("gave up: %+v, want admitted by FailOpen", d)
	}
	answerAll(trip)
	trip.TakeResults[0].Granted = 10
	e.Done(t0.Add(11*ms), trip)
	if d := w2.Decision(); !d.Allowed || d.Source != SourceGlobal {
		t.Fatalf("the request that waited: %+v, want served by the grant", d)
	}
	if n := tokens("late"); n != 10-1-1 {
		t.Errorf("%d tokens on hand after a grant of 10 that served one and paid for one, want 8", n)
	}
	if held := lm.Stats().Held; held != 8 {
		t.Errorf("Held %d after a grant of 10 that served one and paid for one, want 8", held)
	}

	// A lost take whose requests the policy admitted is not sent again.
	_, w := decide(e, t0.Add(time.Second), lm, "lost", 1)
	trip = e.Next()
	lost := lose(e, trip, t0.Add(time.Second+10*ms))
	if d := w.Decision(); !d.Allowed || d.Source != SourceFallback {
		t.Fatalf("%+v, want admitted by FailOpen", d)
	}
	decide(e, t0.Add(time.Second+20*ms), lm, "lost", 1)
	if trip = e.Next(); trip.Takes[0].Seq == lost {
		t.Errorf("the lost take went again under %d: what it granted paid for its admitted request", lost)
	}
}

// TestLateGrant: the answer of a take that came after its call had failed by timeout is
// read (Engine.Late): it pays first for what the failure policy admitted to the requests
// that waited for it, and the rest is on hand in the key's lease; while a take under the
// same sequence number is out, that take reads the grant, not the late answer.
func TestLateGrant(t *testing.T) {
	tests := []struct {
		name    string
		policy  breaker.Policy
		giveUp  bool // the request gives up at its MaxWait before the take fails
		resend  bool // the next refill (under the lost take's number) is out when the answer comes
		took    bool
		tokens  int   // on hand after the late answer of 10
		nextSeq bool  // the next refill goes under the lost take's number
		recov   int64 // LimitStats.Recovered
	}{
		{"nothing owed", breaker.FailClosed, false, false, true, 10, false, 10},
		{"owed to the policy", breaker.FailOpen, true, false, true, 9, false, 10},
		{"the resend is out", breaker.FailClosed, false, true, false, 0, true, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, lm := testEngine(t, func(c *Config) { c.Limits[0].Policy = tc.policy })
			_, w := decide(e, t0, lm, "k", 1)
			if w == nil {
				t.Fatal("no refill for a new key")
			}
			trip := e.Next()
			if tc.giveUp {
				if d := e.GiveUp(t0.Add(10*ms), w, ReasonTimeout); !d.Allowed || d.Source != SourceFallback {
					t.Fatalf("gave up: %+v, want admitted by the policy", d)
				}
			}
			lost := lose(e, trip, t0.Add(10*ms))
			var out *Trip
			if tc.resend {
				if _, w := decide(e, t0.Add(15*ms), lm, "k", 1); w == nil {
					t.Fatal("no refill after the lost one")
				}
				if out = e.Next(); out.Takes[0].Seq != lost {
					t.Fatalf("the refill went under %d, want the lost take's %d", out.Takes[0].Seq, lost)
				}
			}
			if got := lateAnswer(e, trip, 10, t0.Add(20*ms)); got != tc.took {
				t.Fatalf("Late = %v, want %v", got, tc.took)
			}
			if e.Late(t0.Add(21*ms), trip, 0, &trip.TakeResults[0]) {
				t.Error("the same late answer was taken twice")
			}
			var tokens int
			lm.keys.Peek("k", func(en *entry, _ int64) { tokens = en.lease.Tokens() })
			if tokens != tc.tokens {
				t.Errorf("%d tokens on hand, want %d", tokens, tc.tokens)
			}
			if s := lm.Stats(); s.Recovered != tc.recov || s.Held != int64(tc.tokens) {
				t.Errorf("Recovered %d, Held %d; want %d and the tokens on hand, %d", s.Recovered, s.Held, tc.recov, tc.tokens)
			}
			if out != nil {
				return
			}
			// Served from the lease now; once it is spent, the next refill goes under a
			// fresh number: the lost take was read.
			for i := range tc.tokens {
				if d, w := decide(e, t0.Add(30*ms), lm, "k", 1); w != nil || !d.Allowed {
					t.Fatalf("request %d after the late grant: %+v (waits: %v), want served by the lease", i, d, w != nil)
				}
			}
			decide(e, t0.Add(40*ms), lm, "k", 1)
			for next := e.Next(); next != nil; next = e.Next() {
				if next.Kind == TakeTrip {
					if got := next.Takes[0].Seq == lost; got != tc.nextSeq {
						t.Errorf("the next refill under the lost take's number: %v, want %v", got, tc.nextSeq)
					}
					break
				}
				answerAll(next)
				e.Done(t0.Add(40*ms), next)
			}
		})
	}
}

// TestLateGrantReadOnce: a take's grant is read once, whichever take reads it. A refill
// that starts while the requests of a lost take are decided goes under a number of its
// own, so the lost take's late answer is its only reader; a lost take sent again, and
// read back by the resend, is not read again by its late answer, the key's entry gone
// or not.
func TestLateGrantReadOnce(t *testing.T) {
	t.Run("refill while its requests are decided", func(t *testing.T) {
		var e *Engine
		var lm *Limit
		var again *Waiter
		e, lm = testEngine(t, func(c *Config) {
			c.Limits[0].Policy = breaker.FailOpen
			c.Decided = func(*Waiter) {
				if again == nil {
					_, again = decide(e, t0.Add(10*ms), lm, "k", 1)
				}
			}
		})
		_, w := decide(e, t0, lm, "k", 1)
		trip := e.Next()
		lost := lose(e, trip, t0.Add(10*ms))
		if d := w.Decision(); !d.Allowed || d.Source != SourceFallback || again == nil {
			t.Fatalf("%+v (a refill started meanwhile: %v), want admitted by FailOpen", d, again != nil)
		}
		next := e.Next()
		if next.Takes[0].Seq == lost {
			t.Fatalf("the refill that started meanwhile went under the lost take's number %d", lost)
		}
		if !lateAnswer(e, trip, 10, t0.Add(20*ms)) {
			t.Fatal("the lost take's late answer, its grant's only reader, was not taken")
		}
		answerAll(next)
		next.TakeResults[0].Granted = 5
		e.Done(t0.Add(21*ms), next)
		if s := lm.Stats(); s.Granted != 15 || s.Recovered != 10 {
			t.Errorf("granted %d, recovered %d; want 15 and 10 (two grants, each read once)", s.Granted, s.Recovered)
		}
	})
	for _, drain := range []bool{false, true} {
		t.Run(fmt.Sprintf("read back by a resend, drained %v", drain), func(t *testing.T) {
			e, lm := testEngine(t, nil) // FailClosed: the lost take is sent again
			decide(e, t0, lm, "k", 1)
			trip := e.Next()
			lost := lose(e, trip, t0.Add(10*ms))
			decide(e, t0.Add(15*ms), lm, "k", 1)
			resend := e.Next()
			if resend.Takes[0].Seq != lost {
				t.Fatalf("the refill went under %d, want the lost take's %d", resend.Takes[0].Seq, lost)
			}
			answerAll(resend)
			resend.TakeResults[0].Granted, resend.TakeResults[0].Replayed = 10, true
			e.Done(t0.Add(16*ms), resend)
			refunded := 0
			if drain {
				e.Stop(t0.Add(17 * ms))
				e.Drain()
			}
			if lateAnswer(e, trip, 10, t0.Add(20*ms)) {
				t.Error("the late answer of a grant its resend read back was taken")
			}
			for x := e.Next(); x != nil; x = e.Next() {
				for _, r := range x.Refunds {
					refunded += r.N
				}
				answerAll(x)
				e.Done(t0.Add(30*ms), x)
			}
			if want := map[bool]int{false: 0, true: 10 - 1}[drain]; refunded != want {
				t.Errorf("refunded %d, want %d", refunded, want)
			}
			if s := lm.Stats(); s.Granted != 10 {
				t.Errorf("granted %d, want 10: one grant, read once", s.Granted)
			}
		})
	}
}

// TestLateGrantReadOnceMore: a late answer read while the take sent again under its
// number is being failed leaves nothing to send again, and the resend's own late answer,
// Redis's replay of the same grant, is not read; a take whose key was evicted while it
// was out gives its late grant back.
func TestLateGrantReadOnceMore(t *testing.T) {
	t.Run("read while its resend fails", func(t *testing.T) {
		var e *Engine
		var first *Trip
		armed := false
		e, lm := testEngine(t, func(c *Config) {
			c.Decided = func(*Waiter) { // between the resend's failure and its waiters' decisions
				if !armed {
					return
				}
				armed = false
				if !lateAnswer(e, first, 10, t0.Add(20*ms)) {
					t.Error("the lost take's late answer, nothing out under its number, was not taken")
				}
			}
		})
		decide(e, t0, lm, "k", 1)
		first = e.Next()
		lost := lose(e, first, t0.Add(10*ms))
		decide(e, t0.Add(15*ms), lm, "k", 1)
		resend := e.Next()
		if resend.Takes[0].Seq != lost {
			t.Fatalf("the refill went under %d, want the lost take's %d", resend.Takes[0].Seq, lost)
		}
		armed = true
		lose(e, resend, t0.Add(25*ms))
		if armed {
			t.Fatal("no waiter of the resend was decided")
		}
		// Another take of the key, lost and read late, before the resend's answer.
		if _, w := decide(e, t0.Add(26*ms), lm, "k", 11); w == nil {
			t.Fatal("no refill for a cost above the tokens on hand")
		}
		other := e.Next()
		lose(e, other, t0.Add(27*ms))
		if !lateAnswer(e, other, 11, t0.Add(28*ms)) {
			t.Error("another take's late answer was not taken")
		}
		answerAll(resend)
		resend.TakeResults[0].Granted, resend.TakeResults[0].Replayed = 10, true
		if e.Late(t0.Add(30*ms), resend, 0, &resend.TakeResults[0]) {
			t.Error("the resend's late answer, a replay of a grant read already, was taken")
		}
		if s := lm.Stats(); s.Granted != 21 {
			t.Errorf("granted %d, want 21: two grants, each read once", s.Granted)
		}
		for x := e.Next(); x != nil; x = e.Next() {
			if x.Kind == TakeTrip && x.Takes[0].Seq == lost {
				t.Error("the grant read late was sent for again under its number")
			}
			answerAll(x)
			e.Done(t0.Add(40*ms), x)
		}
	})
	t.Run("evicted while out", func(t *testing.T) {
		e, lm := testEngine(t, nil)
		decide(e, t0, lm, "k", 1)
		trip := e.Next()
		lm.keys.Remove("k")
		lose(e, trip, t0.Add(10*ms))
		if !lateAnswer(e, trip, 10, t0.Add(20*ms)) {
			t.Fatal("the late answer of a take whose key was evicted was not taken")
		}
		if refunded := refundAll(e, t0.Add(30*ms)); refunded != 10 {
			t.Errorf("refunded %d, want the late grant's 10", refunded)
		}
	})
}

// lose fails take trip t at now as the breaker's timeout does (its answer lost, Redis
// may have run it) and returns its first take's Redis sequence number.
func lose(e *Engine, t *Trip, now time.Time) uint64 {
	t.Err = fmt.Errorf("late: %w", breaker.ErrTimeout)
	e.Done(now, t)
	return t.Takes[0].Seq
}

// TestLateGrantOfAnotherBucket: a take's late answer (Late) joins the key's lease only
// while the key is on the bucket the take was for. Once it moved to another tier, whose
// lease holds none of that bucket's tokens, the grant pays what the policy admitted and
// goes back to its own bucket, as for a key evicted; a key whose entry was made again and
// not decided yet (no shape: an AllowMulti stopped at another item's look) is one too,
// and must not crash the driver.
func TestLateGrantOfAnotherBucket(t *testing.T) {
	t.Run("another tier", func(t *testing.T) {
		e, lm := testEngine(t, func(c *Config) {
			c.Limits[0].Tiers = []TierConfig{{Name: "small", Rate: 10, Burst: 10}}
		})
		var d Decision
		if w := e.Decide(t0.UnixNano(), lm, "", "k", 50, &d); w == nil {
			t.Fatal("no refill")
		}
		trip := e.Next()
		if w := e.Decide(t0.Add(ms).UnixNano(), lm, "small", "k", 1, &d); w == nil { // the key moves tier
			t.Fatal("no refill under the new tier")
		}
		lose(e, trip, t0.Add(10*ms)) // the old tier's take times out, having run:
		lateAnswer(e, trip, trip.Takes[0].Want, t0.Add(20*ms))
		var tokens int
		lm.keys.Peek("k", func(en *entry, _ int64) { tokens = en.lease.Tokens() })
		if tokens != 0 {
			t.Fatalf("the key on tier small holds %d tokens of the old tier's grant", tokens)
		}
		var back []redisstore.RefundRequest
		for x := e.Next(); x != nil; x = e.Next() {
			if x.Kind == RefundTrip {
				back = append(back, x.Refunds...)
			}
			answerAll(x)
			e.Done(t0.Add(21*ms), x)
		}
		if len(back) != 1 || back[0].N != 50 || back[0].Limit.Burst != 100 {
			t.Fatalf("refunds %+v, want the grant of 50 back to the burst-100 bucket", back)
		}
	})
	t.Run("an entry not decided yet", func(t *testing.T) {
		e, lm := testEngine(t, nil)
		if _, w := decide(e, t0, lm, "j", 50); w == nil { // j's pre-check left at 50
			t.Fatal("no refill for j")
		}
		tr := e.Next()
		answerAll(tr)
		e.Done(t0.Add(ms), tr)
		decide(e, t0.Add(2*ms), lm, "k", 1)
		trip := e.Next()
		lm.keys.Remove("k") // evicted while its take is out
		lose(e, trip, t0.Add(10*ms))
		var m Multi // k's entry made again, and j denies at the look: k not decided
		m.Add(MultiItem{Limit: lm, Key: "k", N: 1})
		m.Add(MultiItem{Limit: lm, Key: "j", N: 100})
		if _, done := e.StartMulti(t0.Add(11*ms).UnixNano(), &m); !done || m.Allowed {
			t.Fatalf("the multi: done %v, allowed %v; want it denied at once", done, m.Allowed)
		}
		if !lateAnswer(e, trip, 10, t0.Add(20*ms)) {
			t.Fatal("the late grant was not taken")
		}
		if back := refundAll(e, t0.Add(21*ms)); back != 10 {
			t.Fatalf("%d tokens went back, want the late grant's 10", back)
		}
	})
}

// refundAll makes e's trips at now, answering each in full, and returns the tokens their
// refunds gave back.
func refundAll(e *Engine, now time.Time) int {
	n := 0
	for x := e.Next(); x != nil; x = e.Next() {
		for _, r := range x.Refunds {
			n += r.N
		}
		answerAll(x)
		e.Done(now, x)
	}
	return n
}

// lateAnswer answers take trip t, lost (lose), in full but for its first take's grant of
// granted, and hands that answer to e as a late one at now (Engine.Late), reporting
// whether e took it.
func lateAnswer(e *Engine, t *Trip, granted int, now time.Time) bool {
	answerAll(t)
	t.TakeResults[0].Granted = granted
	return e.Late(now, t, 0, &t.TakeResults[0])
}

// TestLateGrantOfAnAbandonedResend: a lost take whose requests the policy denied is to go
// again under its number (Lease.Lost), so its late answer leaves the grant to that
// resend. When the key's lease is let go of before the resend was sent (an eviction, or
// Close's Drain), no take will read the grant: the late answer gives it back to Redis.
// A resend that went before the lease was let go of reads it, and is given back with its
// own answer (Lease.Granted), so the late answer gives nothing. A key made again after
// the eviction holds a new lease, which no resend of the lost take's will read either;
// and a resend started before the eviction and refused before it was sent read nothing.
func TestLateGrantOfAnAbandonedResend(t *testing.T) {
	for _, tc := range []struct {
		name string
		// the resend went before the eviction; the key is made again after it; the
		// resend waited for its trip at the eviction, and was refused before it was sent
		sent, made, refused bool
	}{
		{"resend not sent", false, false, false},
		{"resend sent", true, false, false},
		{"resend not sent, the key made again", false, true, false},
		{"resend refused after the eviction", false, false, true},
	} {
		sent, refused := tc.sent, tc.refused
		t.Run(tc.name, func(t *testing.T) {
			e, lm := testEngine(t, nil) // FailClosed: the waiter is denied, nothing owed
			if _, w := decide(e, t0, lm, "k", 1); w == nil {
				t.Fatal("no refill for a new key")
			}
			trip := e.Next()
			lost := lose(e, trip, t0.Add(10*ms))
			if sent {
				if _, w := decide(e, t0.Add(15*ms), lm, "k", 1); w == nil {
					t.Fatal("no refill after the lost one")
				}
				if out := e.Next(); out.Takes[0].Seq != lost {
					t.Fatalf("the refill went under %d, want the lost take's %d", out.Takes[0].Seq, lost)
				}
			}
			if refused { // the resend waits for its trip when the key is evicted
				if _, w := decide(e, t0.Add(15*ms), lm, "k", 1); w == nil {
					t.Fatal("no refill after the lost one")
				}
			}
			lm.keys.Remove("k") // evicted: its lease let go of
			if refused {        // its trip is refused before it is sent: it never ran
				out := e.Next()
				if out.Kind != TakeTrip || out.Takes[0].Seq != lost {
					t.Fatalf("trip %+v, want the resend under %d", out, lost)
				}
				out.Err = breaker.ErrOpen
				e.Done(t0.Add(17*ms), out)
			}
			if tc.made {
				decide(e, t0.Add(16*ms), lm, "k", 1) // a new entry, of the same bucket
			}
			took := lateAnswer(e, trip, 10, t0.Add(20*ms))
			back := 0
			for x := e.Next(); x != nil; x = e.Next() {
				if x.Kind == RefundTrip {
					for _, r := range x.Refunds {
						back += r.N
					}
				}
				if x.Kind != TakeTrip {
					answerAll(x)
					e.Done(t0.Add(21*ms), x)
				}
			}
			if want := map[bool]int{false: 10, true: 0}[sent]; took != !sent || back != want {
				t.Fatalf("Late took %v, %d tokens back; want %v and %d", took, back, !sent, want)
			}
		})
	}
}

// TestFallbackAfterAPolicyChange: a request that read its shape just before a SetLimit
// replaced the limit's policy, closing the FailLocal fallback it read, is decided by the
// policy in force (FailOpen: admitted), not denied by the closed one.
func TestFallbackAfterAPolicyChange(t *testing.T) {
	e, lm := testEngine(t, func(c *Config) { c.Limits[0].Policy = breaker.FailLocal() })
	sh := lm.Shape("") // what the request read
	c := lm.Config()
	c.Policy = breaker.FailOpen
	if err := e.SetLimit(t0, c); err != nil {
		t.Fatal(err)
	}
	if d := e.fallbackOn(t0, lm, sh, "", "k", 1, ReasonUnavailable); !d.Allowed || d.Source != SourceFallback {
		t.Errorf("decision %+v, want admitted by FailOpen, the policy in force", d)
	}
}

// TestRefundsStayApartPerShape: refunds of one key queued under two shapes (a tier it
// moved from, the version before SetLimit) go as one request each, under its own
// shape, numbered in the order queued: Redis adds only what was leased under the
// parameters in force, and a sum under either shape would give back the other's tokens
// or lose its own.
func TestRefundsStayApartPerShape(t *testing.T) {
	for _, tc := range []struct {
		name  string
		other func(t *testing.T, e *Engine, lm *Limit) *Shape
	}{
		{"tier", func(t *testing.T, e *Engine, lm *Limit) *Shape { return lm.Shape("gold") }},
		{"version", func(t *testing.T, e *Engine, lm *Limit) *Shape {
			cfg := lm.Config()
			cfg.Rate, cfg.Version = 200, 1
			if err := e.SetLimit(t0, cfg); err != nil {
				t.Fatal(err)
			}
			return lm.Shape("")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, lm := testEngine(t, func(c *Config) {
				c.Limits[0].Tiers = []TierConfig{{Name: "gold", Rate: 1000, Burst: 1000}}
			})
			first := lm.Shape("")
			second := tc.other(t, e, lm)
			if first.glim == second.glim {
				t.Fatal("the two shapes have the same parameters")
			}
			e.queueRefund(lm, first, "k", 5)
			e.queueRefund(lm, second, "k", 7)
			e.queueRefund(lm, first, "k", 2)
			rt := e.Next()
			if rt == nil || rt.Kind != RefundTrip || len(rt.Refunds) != 2 {
				t.Fatalf("trip %+v, want two refunds", rt)
			}
			for i, want := range []struct {
				glim redisstore.Limit
				n    int
			}{{first.glim, 7}, {second.glim, 7}} {
				if r := rt.Refunds[i]; r.Limit != want.glim || r.N != want.n {
					t.Errorf("refund %d: %d under %+v, want %d under %+v", i, r.N, r.Limit, want.n, want.glim)
				}
			}
			if rt.Refunds[0].Seq >= rt.Refunds[1].Seq {
				t.Errorf("sequence numbers %d, %d: not in the order queued", rt.Refunds[0].Seq, rt.Refunds[1].Seq)
			}
		})
	}
}

// leased decides at now a first request of cost 1 for key, a new key of lm's of tier, and
// answers the refill it waits for with a grant of granted from a bucket it left empty:
// the key's lease then holds granted - 1, for the lifetime of a low bucket's grant.
func leased(t *testing.T, e *Engine, lm *Limit, tier, key string, granted int, now time.Time) {
	t.Helper()
	var d Decision
	if w := e.Decide(now.UnixNano(), lm, tier, key, 1, &d); w == nil {
		t.Fatalf("%s: no refill for a new key", key)
	}
	trip := e.Next()
	answerAll(trip)
	trip.TakeResults[0].Granted, trip.TakeResults[0].Remaining = granted, 0
	e.Done(now, trip)
}

// TestExpiredTokensGoBack: the tokens a lease held past its lifetime go back to Redis
// when the key's next request finds them expired, however few: one, two, or many.
func TestExpiredTokensGoBack(t *testing.T) {
	for _, left := range []int{1, 2, 40} {
		e, lm := testEngine(t, nil)
		leased(t, e, lm, "", "k", left+1, t0)
		decide(e, t0.Add(time.Minute), lm, "k", 1) // past the lease's lifetime
		if refunded := refundAll(e, t0.Add(time.Minute)); refunded != left {
			t.Errorf("%d tokens left to expire: %d refunded", left, refunded)
		}
	}
}
