package engine

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
)

// testEngine is an engine of one limit for the tests of this file: rate 100/s, burst
// 100 over one server, prefetch off.
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
	}
	if mod != nil {
		mod(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e, e.Limit("api")
}

// decide is Decide returning the decision.
func decide(e *Engine, now time.Time, lm *Limit, key string, n int) (Decision, *Waiter) {
	var d Decision
	w := e.Decide(now, lm, "", key, n, &d)
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

func TestSlowRefundTripIsSentAgainInHalves(t *testing.T) {
	e, lm := testEngine(t, nil)
	for i := range 5 {
		e.queueRefund(lm, nil, fmt.Sprint("k", i), 1)
	}
	trip := e.Next()
	seqs := map[global.KeyID]uint64{}
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
	lm.keys.Update(t0, "held", func(en *entry, t time.Time) { en.lease.tokens = 7 })
	e.Drain()
	trip := e.Next()
	if trip == nil || trip.Kind != RefundTrip || len(trip.Refunds) != 1 || trip.Refunds[0].N != 7 {
		t.Fatalf("after Drain: %+v, want the held tokens refunded", trip)
	}
	trip.Answered = true
	e.Done(t0, trip)
	if lost := e.Finish(); lost != 0 {
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
	e, lm := testEngine(t, func(c *Config) { c.Fleet = "api-servers"; c.Servers = 4 })
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
		c.Fleet = "api-servers"
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
		{"rate", Config{Limits: []LimitConfig{{Name: "a", Rate: 0, Burst: 1, Policy: breaker.FailOpen}}, Servers: 1, NextSeq: seq}, global.ErrInvalidLimit},
		{"policy", Config{Limits: []LimitConfig{{Name: "a", Rate: 1, Burst: 1}}, Servers: 1, NextSeq: seq}, breaker.ErrNoPolicy},
		{"fleet", Config{Limits: []LimitConfig{ok}, Servers: 1, NextSeq: seq, Fleet: "a b"}, global.ErrInvalidLimit},
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
		lm.keys.Peek(key, func(en *entry, _ time.Time) { n = en.lease.Tokens() })
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

	// A lost take whose requests the policy admitted is not sent again.
	_, w := decide(e, t0.Add(time.Second), lm, "lost", 1)
	trip = e.Next()
	lost := trip.Takes[0].Seq
	trip.Err = fmt.Errorf("late: %w", breaker.ErrTimeout)
	e.Done(t0.Add(time.Second+10*ms), trip)
	if d := w.Decision(); !d.Allowed || d.Source != SourceFallback {
		t.Fatalf("%+v, want admitted by FailOpen", d)
	}
	decide(e, t0.Add(time.Second+20*ms), lm, "lost", 1)
	if trip = e.Next(); trip.Takes[0].Seq == lost {
		t.Errorf("the lost take went again under %d: what it granted paid for its admitted request", lost)
	}
}
