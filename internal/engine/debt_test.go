package engine

import (
	"errors"
	"testing"

	"github.com/fleetlimit/fleetlimit/breaker"
)

// TestDebtsWaitForRedis: what FailLocal admits while the breaker is open is owed, per
// key, with the credit of the key's last grant as its reference; the debt goes out as a
// negative refund once the breaker is not open and Redis has answered a trip; a failed
// debt trip is owed again and held back for debtRetry, so that a Redis answering errors
// is not asked in a loop.
func TestDebtsWaitForRedis(t *testing.T) {
	open := false
	e, lm := testEngine(t, func(c *Config) {
		c.Limits[0].Policy = breaker.FailLocal()
		c.BreakerOpen = func() bool { return open }
	})
	// A grant first: its credit is the debt's reference.
	if _, w := decide(e, t0, lm, "k", 1); w == nil {
		t.Fatal("no refill")
	}
	trip := e.Next()
	answerAll(trip)
	trip.TakeResults[0].Granted, trip.TakeResults[0].Credit = 1, 1234.5
	e.Done(t0, trip)
	// Redis goes away: the next requests go to FailLocal, which admits this server's share.
	open = true
	admitted := 0
	for range 5 {
		if d, w := decide(e, t0.Add(ms), lm, "k", 1); w == nil && d.Allowed && d.Source == SourceFallback {
			admitted++
		}
	}
	if admitted == 0 {
		t.Fatal("FailLocal admitted nothing")
	}
	if st := lm.Stats(); st.Owed != int64(admitted) {
		t.Fatalf("owed %d, want the %d FailLocal admitted", st.Owed, admitted)
	}
	if trip := e.Next(); trip != nil && trip.debts {
		t.Fatal("a debt trip while the breaker is open")
	}
	// The breaker closes, but debts wait until Redis has answered a trip: here the
	// refill of another key's request.
	open = false
	if trip := e.Next(); trip != nil && trip.debts {
		t.Fatal("a debt trip before Redis answered anything")
	}
	decide(e, t0.Add(2*ms), lm, "other", 1)
	trip = e.Next()
	for trip != nil && !trip.debts {
		answerAll(trip)
		e.Done(t0.Add(2*ms), trip)
		trip = e.Next()
	}
	if trip == nil || len(trip.Refunds) != 1 {
		t.Fatalf("Next = %+v, want one debt", trip)
	}
	r := trip.Refunds[0]
	if r.N != -admitted || !r.HasRef || r.Ref != 1234.5 || r.Floor != 100+100*10 {
		t.Fatalf("debt %+v, want N -%d, reference 1234.5, floor burst + rate·10 s", r, admitted)
	}
	// It fails: owed again, and held back.
	trip.Err = errors.New("LOADING")
	e.Done(t0.Add(3*ms), trip)
	e.Tick(t0.Add(4 * ms))
	if trip := e.Next(); trip != nil {
		t.Fatalf("Next = %+v right after a failed debt trip, want nothing before %v", trip, debtRetry)
	}
	e.Tick(t0.Add(3*ms + debtRetry))
	trip = e.Next()
	if trip == nil || !trip.debts || trip.Refunds[0].N != -admitted {
		t.Fatalf("Next = %+v after %v, want the debt again", trip, debtRetry)
	}
	trip.Answered = true
	e.Done(t0.Add(debtRetry+4*ms), trip)
	if st := lm.Stats(); st.Owed != 0 || st.Charged != int64(admitted) {
		t.Fatalf("owed %d, charged %d; want 0 and %d", st.Owed, st.Charged, admitted)
	}
}
