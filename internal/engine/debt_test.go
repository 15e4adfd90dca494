package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
)

// TestDebtsWaitForRedis: what FailLocal admits while the breaker is open is owed, per
// key, with the credit of the key's last grant as its reference; the debt goes out as a
// negative refund once the breaker is not open and Redis has answered a trip; a failed
// debt trip is owed again and held back for debtRetry, so that a Redis answering errors
// is not asked in a loop.
func TestDebtsWaitForRedis(t *testing.T) {
	open := false
	e, lm := failLocalEngine(t, &open, nil)
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
	trip = firstDebts(e, t0.Add(2*ms), lm)
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

// TestDebtLostToATimeoutGoesAgainWithItsSeq: a debt trip answered for some items (one
// Cluster master's part of it timed out) charges the answered items, and sends the
// items whose answer was lost again with their own sequence numbers, which Redis
// recognises as replays where they ran: never owed again under new numbers, which a
// charge that ran would be charged twice for. A refused item (breaker open: never sent)
// is owed again.
func TestDebtLostToATimeoutGoesAgainWithItsSeq(t *testing.T) {
	open := false
	e, lm := failLocalEngine(t, &open, nil)
	keys := []string{"ran", "lost", "refused"}
	oweOneEach(t, e, lm, &open, keys)
	trip := firstDebts(e, t0.Add(2*ms), lm)
	if trip == nil || len(trip.Refunds) != 3 {
		t.Fatalf("Next = %+v, want the three debts", trip)
	}
	owed := lm.Stats().Owed
	seq := map[string]uint64{}
	trip.Answered = true
	for i, r := range trip.Refunds {
		seq[string(r.ID)] = r.Seq
		switch r.ID {
		case "lost": // as a master's part the breaker gave up on answers it
			trip.RefundResults[i].Err = fmt.Errorf("%w: %w", breaker.ErrTimeout, context.DeadlineExceeded)
		case "refused":
			trip.RefundResults[i].Err = breaker.ErrOpen
		}
	}
	trip.Err = breaker.ErrTimeout
	e.Done(t0.Add(3*ms), trip)
	if st := lm.Stats(); owed != 3 || st.Charged != 1 || st.Owed != 2 {
		t.Fatalf("owed %d before, then charged %d, owed %d; want 3, then 1 and 2", owed, st.Charged, st.Owed)
	}
	e.Tick(t0.Add(3*ms + debtRetry))
	decide(e, t0.Add(3*ms+debtRetry), lm, "other2", 1) // Redis answers a trip: debts may go
	got := map[string]uint64{}
	for trip := e.Next(); trip != nil; trip = e.Next() {
		if !trip.debts {
			answerAll(trip)
			e.Done(t0.Add(3*ms+debtRetry), trip)
			e.Tick(t0.Add(3*ms + 2*debtRetry)) // past the debts' hold after that answer
			continue
		}
		for _, r := range trip.Refunds {
			got[string(r.ID)] = r.Seq
		}
		answerAll(trip)
		e.Done(t0.Add(3*ms+debtRetry), trip)
		e.Tick(t0.Add(4*ms + 2*debtRetry))
	}
	if got["lost"] != seq["lost"] {
		t.Errorf("the debt whose answer was lost went again with seq %d, want its own %d", got["lost"], seq["lost"])
	}
	if s, ok := got["refused"]; !ok || s == seq["refused"] {
		t.Errorf("the refused debt went again with seq %d (sent: %v), want a new one (was %d)", s, ok, seq["refused"])
	}
	if _, ok := got["ran"]; ok {
		t.Error("the charged debt went again")
	}
	if st := lm.Stats(); st.Owed != 0 || st.Charged != 3 {
		t.Errorf("owed %d, charged %d; want 0 and 3", st.Owed, st.Charged)
	}
}

// TestDebtBatchTimedOutGoesInHalves: a debt trip that outlasted its deadline whole goes
// again in two halves, each item with its sequence number: a batch too large for the
// deadline is not sent whole again, and counted against the breaker, each time.
func TestDebtBatchTimedOutGoesInHalves(t *testing.T) {
	open := false
	e, lm := failLocalEngine(t, &open, nil)
	keys := []string{"a", "b", "c", "d"}
	oweOneEach(t, e, lm, &open, keys)
	trip := firstDebts(e, t0.Add(2*ms), lm)
	if trip == nil || len(trip.Refunds) != len(keys) {
		t.Fatalf("Next = %+v, want the four debts", trip)
	}
	seq := map[string]uint64{}
	for _, r := range trip.Refunds {
		seq[string(r.ID)] = r.Seq
	}
	trip.Err = fmt.Errorf("%w: %w", breaker.ErrTimeout, context.DeadlineExceeded) // not answered
	e.Done(t0.Add(3*ms), trip)
	// Every debt waits to go again, as retries: the server owes them still (Close waits
	// for a probe to send them).
	if !e.Owes() {
		t.Fatal("Owes false while the timed-out debts wait to go again")
	}
	e.Tick(t0.Add(3*ms + debtRetry))
	decide(e, t0.Add(3*ms+debtRetry), lm, "other", 1) // Redis answers a trip: debts may go
	var sizes []int
	for trip := e.Next(); trip != nil; trip = e.Next() {
		if trip.debts {
			sizes = append(sizes, len(trip.Refunds))
			for _, r := range trip.Refunds {
				if r.Seq != seq[string(r.ID)] {
					t.Errorf("%s went again with seq %d, want its own %d", r.ID, r.Seq, seq[string(r.ID)])
				}
			}
		}
		answerAll(trip)
		e.Done(t0.Add(3*ms+debtRetry), trip)
	}
	if !slices.Equal(sizes, []int{2, 2}) {
		t.Fatalf("debt trips of %v after the timeout, want two halves of 2", sizes)
	}
}

// oweOneEach makes each of keys owe a token under FailLocal: a grant of one token each
// at t0, then, with the breaker open (*open), a request each that FailLocal admits.
func oweOneEach(t *testing.T, e *Engine, lm *Limit, open *bool, keys []string) {
	t.Helper()
	for _, k := range keys {
		decide(e, t0, lm, k, 1)
	}
	trip := e.Next()
	answerAll(trip)
	for i := range trip.TakeResults {
		trip.TakeResults[i].Granted = 1
	}
	e.Done(t0, trip)
	*open = true
	for _, k := range keys {
		if d, w := decide(e, t0.Add(ms), lm, k, 1); w != nil || !d.Allowed || d.Source != SourceFallback {
			t.Fatalf("%s: %+v, %v; want FailLocal to admit", k, d, w)
		}
	}
	*open = false
}

// TestKeyOpenFailsOnlyItsKeys: with a breaker per Redis node (KeyOpen), a refill for a
// key whose node's breaker is open fails at once, to the policy; a key on another node
// gets its refill queued.
func TestKeyOpenFailsOnlyItsKeys(t *testing.T) {
	e, lm := testEngine(t, func(c *Config) {
		c.BreakerOpen = func() bool { return true } // some breaker is open
		c.KeyOpen = func(limit, key string) bool { return key == "down" }
	})
	if d, w := decide(e, t0, lm, "down", 1); w != nil || d.Source != SourceFallback || d.Reason != ReasonBreakerOpen {
		t.Errorf("key on the open node: %+v, %v; want the policy at once, breaker open", d, w)
	}
	if _, w := decide(e, t0, lm, "up", 1); w == nil {
		t.Fatal("key on a closed node: no refill")
	}
	trip := e.Next()
	if trip == nil || trip.Kind != TakeTrip || len(trip.Takes) != 1 || trip.Takes[0].ID != "up" {
		t.Fatalf("Next = %+v, want the refill of up alone", trip)
	}
}

// TestDebtSpread: the time a server spreads its first debt trip over grows with the
// debts its fleet owes (its own times the fleet's size), from debtRetry to half the
// DebtWindow.
func TestDebtSpread(t *testing.T) {
	for _, tc := range []struct {
		servers, debts int
		want           time.Duration
	}{
		{1, 2, debtRetry},
		{120, 120, debtRetry}, // 14,400 debts: 230 ms
		{480, 120, 921600 * time.Microsecond},
		{200, 100_000, DebtWindow / 2},
	} {
		if got := spreadFor(tc.servers, tc.debts); got != tc.want {
			t.Errorf("spreadFor(%d servers, %d debts) = %v, want %v", tc.servers, tc.debts, got, tc.want)
		}
	}
}

// TestDebtSpreadOncePerWait: a server that keeps owing while Redis answers its other
// trips (its refills time out, say) waits one spread for its debts, not one after each
// answer: the spread's end lets go what was owed during it.
func TestDebtSpreadOncePerWait(t *testing.T) {
	open := false
	e, lm := failLocalEngine(t, &open, nil)
	e.Tick(t0)
	debtTrips := 0
	drain := func(now time.Time) {
		for trip := e.Next(); trip != nil; trip = e.Next() {
			if trip.debts {
				debtTrips++
			}
			answerAll(trip)
			e.Done(now, trip)
		}
	}
	// Every 20 ms Redis answers a refill, then FailLocal admits a request (an owe); the
	// driver ticks at NextTick.
	const every = 20 * ms
	now := t0
	for i := 0; now.Sub(t0) < 5*time.Second; i++ {
		next := now.Add(every)
		for nt := e.NextTick(); nt.After(now) && nt.Before(next); nt = e.NextTick() {
			now = nt
			e.Tick(now)
			drain(now)
		}
		now = next
		e.Tick(now)
		decide(e, now, lm, fmt.Sprintf("ok%d", i), 1)
		drain(now)
		open = true
		decide(e, now.Add(ms), lm, fmt.Sprintf("owe%d", i), 1)
		open = false
		drain(now.Add(ms))
	}
	// A spread of at most debtRetry each, then one trip: at least one every 2 debtRetry.
	if min := int(5 * time.Second / (2 * debtRetry)); debtTrips < min {
		t.Fatalf("%d debt trips in 5 s while Redis answered every 20 ms, want at least %d", debtTrips, min)
	}
	if st := lm.Stats(); st.Charged < st.Owed {
		t.Fatalf("charged %d, owed %d: most debts should have gone", st.Charged, st.Owed)
	}
}

// TestDebtsGoAtStop: an engine stopped (a Close) sends FailLocal's debts once Redis
// answers its shutdown's trips, with no spread: no Tick runs then, and Finish forgives
// what is left. A debt owed after Stop (a request FailLocal admitted while Close waited)
// goes with them.
func TestDebtsGoAtStop(t *testing.T) {
	open := false
	e, lm := failLocalEngine(t, &open, func(c *Config) {
		c.KeyOpen = func(string, string) bool { return open }
	})
	e.Tick(t0)
	decide(e, t0, lm, "a", 1) // a lease, refunded at Drain
	trip := e.Next()
	answerAll(trip)
	trip.TakeResults[0].Granted = 20
	e.Done(t0, trip)
	open = true
	decide(e, t0.Add(ms), lm, "x", 1) // owed during the outage
	e.Stop(t0.Add(2 * ms))
	decide(e, t0.Add(3*ms), lm, "y", 1) // owed after Stop
	open = false
	e.Drain()
	debts := 0
	for tr := e.Next(); tr != nil; tr = e.Next() {
		if tr.debts {
			debts += len(tr.Refunds)
		}
		answerAll(tr)
		e.Done(t0.Add(time.Second), tr)
	}
	e.Finish()
	if st := lm.Stats(); debts != 2 || st.Charged != 2 || st.Forgiven != 0 {
		t.Fatalf("%d debts sent, charged %d, forgiven %d; want both sent and charged", debts, st.Charged, st.Forgiven)
	}
}

// TestFailedDebtTripGoesAgainAtStop: after Stop no Tick ends a failed debt trip's
// hold, so the shutdown's trips send its debts again at once (the same sequence
// numbers, in halves: Redis answers one that ran as a replay), the timed-out whole and
// the refused item alike, rather than Finish forgiving them untried; and debts Finish forgives are
// counted in what it returns.
func TestFailedDebtTripGoesAgainAtStop(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(tr *Trip)
	}{
		{"timed out", func(tr *Trip) { tr.Err = fmt.Errorf("%w: %w", breaker.ErrTimeout, context.DeadlineExceeded) }},
		{"refused", func(tr *Trip) {
			tr.Answered = true
			for i := range tr.RefundResults {
				tr.RefundResults[i].Err = errors.New("LOADING")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, lm := owedAtStop(t, false, 1, 1)
			var seqs [][]uint64
			for tr := e.Next(); tr != nil; tr = e.Next() {
				if !tr.debts {
					answerAll(tr)
					e.Done(t0.Add(time.Second), tr)
					continue
				}
				var s []uint64
				for _, r := range tr.Refunds {
					s = append(s, r.Seq)
				}
				seqs = append(seqs, s)
				if len(seqs) == 1 {
					tc.fail(tr)
				} else {
					answerAll(tr)
				}
				e.Done(t0.Add(time.Second), tr)
			}
			_, forgiven := e.Finish()
			st := lm.Stats()
			if len(seqs) < 2 || st.Charged != 2 || st.Forgiven != 0 || forgiven != 0 {
				t.Fatalf("debt trips %v, charged %d, forgiven %d (Finish: %d); want the failed trip sent again and both charged", seqs, st.Charged, st.Forgiven, forgiven)
			}
			if again := slices.Concat(seqs[1:]...); tc.name == "timed out" && !slices.Equal(seqs[0], again) {
				t.Fatalf("debt trips %v: a trip that may have run must go again under its numbers (in halves)", seqs)
			}
		})
	}
}

// TestShutdownDebtRetriesAreBounded: a Redis that refuses every charge after Stop gets
// 1 + stopRetries debt trips, not a loop that a Close without a deadline cannot leave;
// Finish then forgives the debts and says so.
func TestShutdownDebtRetriesAreBounded(t *testing.T) {
	e, _ := owedAtStop(t, false, 1)
	trips := 0
	for tr := e.Next(); tr != nil && trips < 100; tr = e.Next() {
		if tr.debts {
			trips++
			tr.Answered = true
			for i := range tr.RefundResults {
				tr.RefundResults[i].Err = errors.New("LOADING")
			}
		} else {
			answerAll(tr)
		}
		e.Done(t0.Add(time.Second), tr)
	}
	if _, forgiven := e.Finish(); trips != 1+stopRetries || forgiven != 1 {
		t.Fatalf("%d debt trips, %d forgiven; want %d trips, 1 forgiven", trips, forgiven, 1+stopRetries)
	}
}

// TestDebtsGoAroundAnOpenMaster: on a Cluster with one master's breaker open, the debts
// owed to buckets on the other masters go (the running engine's and the shutdown's
// trips alike), and those behind the open breaker stay owed, in their order, until it
// closes; a debt trip carries none of them while it is open.
func TestDebtsGoAroundAnOpenMaster(t *testing.T) {
	for _, stop := range []bool{false, true} {
		t.Run(map[bool]string{false: "running", true: "at stop"}[stop], func(t *testing.T) {
			open := map[string]bool{}
			e, lm := failLocalEngine(t, new(bool), func(c *Config) {
				c.BreakerOpen = func() bool { return open["x"] || open["y"] || open["z"] }
				c.KeyOpen = func(_, key string) bool { return open[key] }
			})
			e.Tick(t0)
			open["x"], open["y"], open["z"] = true, true, true
			decide(e, t0, lm, "x", 1) // owed during the outage of every master
			decide(e, t0, lm, "y", 2)
			decide(e, t0, lm, "z", 3)
			open["y"], open["z"] = false, false // x's master stays down
			sent := map[string]int{}
			run := func(at time.Time) {
				for tr := e.Next(); tr != nil; tr = e.Next() {
					if tr.debts {
						for _, r := range tr.Refunds {
							if open[string(r.ID)] {
								t.Fatalf("a debt of %s sent while its master's breaker is open", r.ID)
							}
							sent[string(r.ID)] -= r.N
						}
					}
					answerAll(tr)
					e.Done(at, tr)
				}
			}
			if stop {
				e.Stop(t0.Add(ms))
				e.Drain()
				run(t0.Add(time.Second))
			} else {
				// Redis answers a refill; the debts go once the spread after it is over.
				decide(e, t0.Add(ms), lm, "other", 1)
				run(t0.Add(ms))
				for at := t0.Add(ms); at.Before(t0.Add(10 * time.Second)); at = at.Add(100 * ms) {
					e.Tick(at)
					run(at)
				}
			}
			if sent["y"] != 2 || sent["z"] != 3 || sent["x"] != 0 {
				t.Fatalf("sent %v; want y's 2 and z's 3, none of x's", sent)
			}
			if stop {
				if _, forgiven := e.Finish(); forgiven != 1 {
					t.Fatalf("forgiven %d at Finish, want x's 1", forgiven)
				}
				return
			}
			open["x"] = false // its master is back
			for at := t0.Add(10 * time.Second); at.Before(t0.Add(20*time.Second)) && sent["x"] == 0; at = at.Add(100 * ms) {
				e.Tick(at)
				run(at)
			}
			if sent["x"] != 1 {
				t.Fatalf("sent %v once x's master is back; want x's 1", sent)
			}
		})
	}
}

// TestDebtRetryBehindAnOpenMaster: a timed-out debt trip's retry that holds a bucket
// behind an open breaker waits for it, whole; the other retries and the fresh debts of
// other buckets go meanwhile.
func TestDebtRetryBehindAnOpenMaster(t *testing.T) {
	open := map[string]bool{"x": true, "y": true, "z": true}
	e, lm := failLocalEngine(t, new(bool), func(c *Config) {
		c.BreakerOpen = func() bool { return open["x"] || open["y"] || open["z"] }
		c.KeyOpen = func(_, key string) bool { return open[key] }
	})
	e.Tick(t0)
	for _, k := range []string{"x", "y", "z"} {
		decide(e, t0, lm, k, 1) // owed during the outage of every master
	}
	e.Stop(t0.Add(ms))
	e.Drain()
	open["x"], open["y"] = false, false
	tr := e.Next()
	if tr == nil || !tr.debts || len(tr.Refunds) != 2 {
		t.Fatalf("first trip %+v, want the debts of x and y", tr)
	}
	tr.Err = fmt.Errorf("%w: %w", breaker.ErrTimeout, context.DeadlineExceeded) // lost: retried in halves
	e.Done(t0.Add(time.Second), tr)
	open["x"], open["z"] = true, false // x's master goes down, z's comes back
	var sent []string
	for tr := e.Next(); tr != nil; tr = e.Next() {
		for _, r := range tr.Refunds {
			sent = append(sent, string(r.ID))
		}
		answerAll(tr)
		e.Done(t0.Add(time.Second), tr)
	}
	if !slices.Equal(sent, []string{"y", "z"}) {
		t.Fatalf("sent %v, want y's retry and z's debt, x's retry held", sent)
	}
	if _, forgiven := e.Finish(); forgiven != 1 {
		t.Fatalf("forgiven %d, want x's 1", forgiven)
	}
}

// TestHeldRetryHoldsCompanions: a retry passed over (one of its buckets is behind an
// open breaker) holds the later debts of its other buckets, a companion limit's too
// (reps.go: the same name, a Limit of its own), which must not run before it.
func TestHeldRetryHoldsCompanions(t *testing.T) {
	e, lm := failLocalEngine(t, new(bool), func(c *Config) {
		c.BreakerOpen = func() bool { return true }
		c.KeyOpen = func(_, key string) bool { return key == "o" }
	})
	comp := &Limit{name: lm.name, e: e}
	sh := lm.Shape("")
	e.mu.Lock()
	defer e.mu.Unlock()
	e.debtRetry = []refundBatch{{reqs: []redisstore.RefundRequest{
		{Limit: sh.glim, ID: "x", N: -1}, {Limit: sh.glim, ID: "o", N: -1}}, lims: []*Limit{lm, lm}, charges: []*chargeLater{nil, nil}}}
	e.debts.add(comp, sh, "x", 1, 0, false, &e.debtSeq, nil)
	e.debts.add(lm, sh, "x", 1, 0, false, &e.debtSeq, nil)
	e.debts.add(lm, sh, "y", 1, 0, false, &e.debtSeq, nil)
	retry, items := e.planDebts(&e.debts, nil, true, MaxBatch)
	var keys []string
	for _, it := range items {
		keys = append(keys, it.k.key)
	}
	if retry != -1 || !slices.Equal(keys, []string{"y"}) {
		t.Fatalf("planned retry %d and debts of %v; want no retry and y's debt alone", retry, keys)
	}
}

// TestHeldRetryHoldsLaterRetries: a retry passed over (one of its buckets is behind an
// open breaker) holds a later retry of any of its buckets, which must not run before
// it; the first retry of other buckets goes.
func TestHeldRetryHoldsLaterRetries(t *testing.T) {
	e, lm := failLocalEngine(t, new(bool), func(c *Config) {
		c.BreakerOpen = func() bool { return true }
		c.KeyOpen = func(_, key string) bool { return key == "o" }
	})
	sh := lm.Shape("")
	batch := func(keys ...string) refundBatch {
		var b refundBatch
		for _, k := range keys {
			b.reqs = append(b.reqs, redisstore.RefundRequest{Limit: sh.glim, ID: redisstore.KeyID(k), N: -1})
			b.lims, b.charges = append(b.lims, lm), append(b.charges, nil)
		}
		return b
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.debtRetry = []refundBatch{batch("o", "y"), batch("y"), batch("z")}
	if retry, items := e.planDebts(nil, nil, true, MaxBatch); retry != 2 || len(items) != 0 {
		t.Fatalf("planned retry %d and %d debts; want z's retry (2): y's later one waits for o's", retry, len(items))
	}
}

// TestDebtRetryWaitsForRedis: a debt trip that timed out goes again once its hold
// (debtRetry) is over, but not while a debt FailLocal owed since waits for Redis to
// answer a trip (it would only time out too); once Redis answers, and the spread after
// that answer is over, it goes, under its sequence number.
func TestDebtRetryWaitsForRedis(t *testing.T) {
	open := false
	e, lm := failLocalEngine(t, &open, nil)
	oweOneEach(t, e, lm, &open, []string{"a"})
	trip := firstDebts(e, t0.Add(2*ms), lm)
	if trip == nil || len(trip.Refunds) != 1 {
		t.Fatalf("Next = %+v, want a's debt", trip)
	}
	seq := trip.Refunds[0].Seq
	trip.Err = fmt.Errorf("%w: %w", breaker.ErrTimeout, context.DeadlineExceeded)
	e.Done(t0.Add(3*ms), trip)
	open = true
	if d, w := decide(e, t0.Add(4*ms), lm, "b", 1); w != nil || d.Source != SourceFallback || !d.Allowed {
		t.Fatalf("b: %+v, want FailLocal's admission", d)
	}
	open = false
	after := t0.Add(3*ms + debtRetry)
	e.Tick(after)
	if trip := e.Next(); trip != nil {
		t.Fatalf("Next = %+v past the hold, want nothing before Redis answers", trip)
	}
	trip = firstDebts(e, after, lm)
	if trip == nil || len(trip.Refunds) != 1 || trip.Refunds[0].ID != "a" || trip.Refunds[0].Seq != seq {
		t.Fatalf("Next = %+v once Redis answered, want a's retry under seq %d", trip, seq)
	}
}

// TestChargeRetryKeepsTheChargesTurn: the charges' turn (their trip due) lasts while a
// retry of them is owed: a charge retry passed over while its master's breaker was open
// goes as soon as that breaker closes, even while FailLocal's debts wait out their spread
// after Redis answered (debtsMayGo), which is theirs alone.
func TestChargeRetryKeepsTheChargesTurn(t *testing.T) {
	open := map[string]bool{"x": true}
	e, lm := failLocalEngine(t, new(bool), func(c *Config) {
		c.BreakerOpen = func() bool { return open["x"] }
		c.KeyOpen = func(_, key string) bool { return open[key] }
	})
	e.Tick(t0)
	sh := lm.Shape("")
	e.mu.Lock()
	e.debtRetry = []refundBatch{{reqs: []redisstore.RefundRequest{{Limit: sh.glim, ID: "x", N: -1, Seq: 1}},
		lims: []*Limit{lm}, charges: []*chargeLater{nil}}} // a charge that timed out, behind x's open breaker
	e.cl.charges.add(lm, sh, "z", 1, 0, false, &e.debtSeq, nil) // a charge due
	e.cl.asyncDue = true
	e.debts.add(lm, sh, "y", 1, 0, false, &e.debtSeq, nil) // FailLocal's, waiting for Redis to answer
	e.debtWait = true
	e.mu.Unlock()
	trip := e.Next()
	if trip == nil || !trip.debts || len(trip.Refunds) != 1 || trip.Refunds[0].ID != "z" {
		t.Fatalf("Next = %+v, want z's charge alone", trip)
	}
	answerAll(trip)
	e.Done(t0, trip) // Redis answered: y's debt waits out its spread
	open["x"] = false
	if trip := e.Next(); trip == nil || !trip.debts || len(trip.Refunds) != 1 || trip.Refunds[0].ID != "x" || trip.Refunds[0].Seq != 1 {
		t.Fatalf("Next = %+v once x's breaker closed, want x's retry under its number", trip)
	}
}

// TestDebtsBehindAnOpenMasterDoNotHoldRefills: while the first debts looked at are all
// behind an open breaker, no debt trip is due, so refills are not passed over for one
// that never comes.
func TestDebtsBehindAnOpenMasterDoNotHoldRefills(t *testing.T) {
	for _, blocked := range []int{10, debtScan} {
		t.Run(fmt.Sprint(blocked), func(t *testing.T) {
			e, lm := failLocalEngine(t, new(bool), func(c *Config) {
				c.BreakerOpen = func() bool { return true }
				c.KeyOpen = func(_, key string) bool { return key[0] == 'a' }
			})
			e.Tick(t0)
			sh := lm.Shape("")
			e.mu.Lock()
			for i := range blocked {
				e.cl.charges.add(lm, sh, fmt.Sprintf("a%d", i), 1, 0, false, &e.debtSeq, nil)
			}
			e.debts.add(lm, sh, "b", 1, 0, false, &e.debtSeq, nil)
			e.cl.asyncDue, e.debtWait, e.lastTake = true, false, true
			e.mu.Unlock()
			decide(e, t0, lm, "k", 1) // a refill waits
			kinds := map[TripKind]int{}
			var sent []string
			for tr := e.Next(); tr != nil; tr = e.Next() {
				kinds[tr.Kind]++
				if tr.debts {
					for _, r := range tr.Refunds {
						sent = append(sent, string(r.ID))
					}
				}
				answerAll(tr)
				e.Done(t0, tr)
			}
			if kinds[TakeTrip] != 1 {
				t.Fatalf("trips %v: the refill did not go", kinds)
			}
			// b is owed after the blocked charges: within the first debtScan it goes, past
			// them it waits its turn.
			if want := blocked < debtScan; slices.Contains(sent, "b") != want || len(sent) > 1 {
				t.Fatalf("debts sent %v; want b's: %v, nothing behind the open breaker", sent, want)
			}
		})
	}
}

// TestFinishCountsForgivenDebts: debts no trip could send before Finish (the breaker
// open throughout the shutdown) are forgiven, and Finish says how many tokens.
func TestFinishCountsForgivenDebts(t *testing.T) {
	e, lm := owedAtStop(t, true, 1, 2)
	for tr := e.Next(); tr != nil; tr = e.Next() {
		if tr.debts {
			t.Fatal("a debt trip while the breaker is open")
		}
		answerAll(tr)
		e.Done(t0.Add(time.Second), tr)
	}
	lost, forgiven := e.Finish()
	if st := lm.Stats(); forgiven != 3 || st.Forgiven != 3 || lost != 0 {
		t.Fatalf("Finish: %d lost, %d forgiven; stats forgiven %d; want 0 and 3", lost, forgiven, st.Forgiven)
	}
}

// owedAtStop is failLocalEngine's engine after requests of the given costs, for keys x,
// y, ... in turn, decided while its breaker was open (owed: FailLocal's debts), then
// Stop and Drain, the breaker open still if stillOpen.
func owedAtStop(t *testing.T, stillOpen bool, costs ...int) (*Engine, *Limit) {
	t.Helper()
	open := false
	e, lm := failLocalEngine(t, &open, nil)
	e.Tick(t0)
	open = true
	for i, n := range costs {
		decide(e, t0, lm, string(rune('x'+i)), n)
	}
	e.Stop(t0.Add(ms))
	open = stillOpen
	e.Drain()
	return e, lm
}

// failLocalEngine is testEngine's with a FailLocal limit and a breaker open while *open,
// then mod applied (if not nil).
func failLocalEngine(t *testing.T, open *bool, mod func(*Config)) (*Engine, *Limit) {
	t.Helper()
	return testEngine(t, func(c *Config) {
		c.Limits[0].Policy = breaker.FailLocal()
		c.BreakerOpen = func() bool { return *open }
		if mod != nil {
			mod(c)
		}
	})
}

// firstDebts makes Redis answer a refill at now (of a key of lm not asked before) and
// answers every trip before the first debt trip, which it returns (nil if none comes):
// the debts' trip goes once their hold after that answer (redisAnswered) has passed.
func firstDebts(e *Engine, now time.Time, lm *Limit) *Trip {
	decide(e, now, lm, "other", 1)
	trip := e.Next()
	for ticked := false; ; {
		for trip != nil && !trip.debts {
			answerAll(trip)
			e.Done(now, trip)
			trip = e.Next()
		}
		if trip != nil || ticked {
			return trip
		}
		ticked = true
		e.Tick(now.Add(debtRetry))
		trip = e.Next()
	}
}

// TestDebtsSpreadAfterRedisAnswers: debts that waited for Redis to answer wait a
// random part of spreadFor more once it has (for one server and two debts, debtRetry),
// drawn from the engine's seed, so that the servers of a fleet Redis comes back to at
// once do not all send theirs in the same milliseconds; NextTick is no later than the
// instant they may go.
func TestDebtsSpreadAfterRedisAnswers(t *testing.T) {
	var holds []time.Duration
	for seed := range uint64(40) {
		open := false
		e, lm := failLocalEngine(t, &open, func(c *Config) { c.Seed = seed })
		oweOneEach(t, e, lm, &open, []string{"a", "b"})
		e.Tick(t0) // the engine's schedule starts: NextTick is its next sweep
		at := t0.Add(2 * ms)
		decide(e, at, lm, "other", 1)
		trip := e.Next()
		if trip == nil || trip.debts {
			t.Fatalf("seed %d: Next = %+v, want the refill first", seed, trip)
		}
		answerAll(trip)
		e.Done(at, trip)
		if trip := e.Next(); trip != nil {
			t.Fatalf("seed %d: Next = %+v as Redis answered, want the debts held", seed, trip)
		}
		e.mu.Lock()
		held, until := !e.debtSpreadUntil.IsZero(), e.debtSpreadUntil
		e.mu.Unlock()
		if next := e.NextTick(); !held || next.After(until) {
			t.Fatalf("seed %d: held %v until %v, NextTick %v; want held, NextTick by its end", seed, held, until, next)
		}
		hold := until.Sub(at)
		if hold < 0 || hold >= debtRetry {
			t.Fatalf("seed %d: debts held %v, want within [0, %v)", seed, hold, debtRetry)
		}
		if hold > 0 {
			e.Tick(until.Add(-time.Nanosecond))
			if trip := e.Next(); trip != nil {
				t.Fatalf("seed %d: Next = %+v before the hold's end, want nothing", seed, trip)
			}
		}
		e.Tick(until)
		if trip := e.Next(); trip == nil || !trip.debts || len(trip.Refunds) != 2 {
			t.Fatalf("seed %d: Next = %+v at the hold's end, want the two debts", seed, trip)
		}
		holds = append(holds, hold)
	}
	// Spread: 40 draws of a uniform hold fall in every quarter of debtRetry.
	var quarters [4]int
	for _, h := range holds {
		quarters[4*h/debtRetry]++
	}
	for q, n := range quarters {
		if n == 0 {
			t.Errorf("no hold in quarter %d of %v: %v", q, debtRetry, holds)
		}
	}
}

// TestDebtCapIsForgiven: a key's debt holds at most MaxInt32 tokens; what would take it
// above is counted forgiven, not owed, so that Owed returns to 0 once the debt is gone.
func TestDebtCapIsForgiven(t *testing.T) {
	e, lm := testEngine(t, nil)
	sh := lm.Shape("")
	e.owe(lm, sh, "k", math.MaxInt32, 0, false)
	e.owe(lm, sh, "k", math.MaxInt32, 0, false)
	if s := lm.Stats(); s.Owed != math.MaxInt32 || s.Forgiven != math.MaxInt32 {
		t.Errorf("owed %d, forgiven %d; want %d each", s.Owed, s.Forgiven, int64(math.MaxInt32))
	}
	e.Finish()
	if s := lm.Stats(); s.Owed != 0 || s.Forgiven != 2*math.MaxInt32 {
		t.Errorf("after Finish: owed %d, forgiven %d; want 0 and %d", s.Owed, s.Forgiven, int64(2*math.MaxInt32))
	}
}

// TestDebtKeysBound: an engine holds the debts of at most maxDebtKeys keys; past it, a
// new key's debt is forgiven, counted in Forgiven and not in Owed, while a key that owes
// already owes more.
func TestDebtKeysBound(t *testing.T) {
	e, lm := testEngine(t, nil)
	sh := lm.Shape("")
	for i := range maxDebtKeys {
		e.owe(lm, sh, fmt.Sprint(i), 1, 0, false)
	}
	e.owe(lm, sh, "new", 2, 0, false)
	e.owe(lm, sh, "0", 3, 0, false)
	if st := lm.Stats(); st.Owed != maxDebtKeys+3 || st.Forgiven != 2 || e.debts.len() != maxDebtKeys {
		t.Fatalf("owed %d, forgiven %d, %d keys owing; want %d, 2 and %d", st.Owed, st.Forgiven, e.debts.len(), maxDebtKeys+3, maxDebtKeys)
	}
}

// TestDebtReference: a debt keeps the largest reference of the grants its tokens were
// owed against (the latest: a bucket's credit only grows, and the latest forgives the
// least), whatever their order and sign; owes without one leave it as it was.
func TestDebtReference(t *testing.T) {
	type ref struct {
		v   float64
		has bool
	}
	for _, tc := range []struct {
		owes []ref
		want ref
	}{
		{[]ref{{-5, true}}, ref{-5, true}}, // a bucket in debt at the grant
		{[]ref{{10, true}, {20, true}}, ref{20, true}},
		{[]ref{{20, true}, {10, true}}, ref{20, true}},
		{[]ref{{0, false}, {10, true}}, ref{10, true}},
		{[]ref{{10, true}, {0, false}}, ref{10, true}},
		{[]ref{{0, false}}, ref{0, false}},
	} {
		e, lm := failLocalEngine(t, new(bool), nil)
		for _, r := range tc.owes {
			e.owe(lm, lm.Shape(""), "k", 1, r.v, r.has)
		}
		trip := firstDebts(e, t0, lm)
		if trip == nil || len(trip.Refunds) != 1 {
			t.Fatalf("owes %v: Next = %+v, want k's debt", tc.owes, trip)
		}
		if r := trip.Refunds[0]; r.N != -len(tc.owes) || r.Ref != tc.want.v || r.HasRef != tc.want.has {
			t.Errorf("owes %v: debt %+v, want N -%d, reference %v", tc.owes, r, len(tc.owes), tc.want)
		}
	}
}

// TestDebtGoesUnderTheLatestShape: a debt owed under a limit's shape, then under the
// shape a change made (another burst, a new version), goes to the bucket of the latest,
// with that shape's floor (its burst + rate·DebtWindow).
func TestDebtGoesUnderTheLatestShape(t *testing.T) {
	e, lm := failLocalEngine(t, new(bool), nil)
	e.owe(lm, lm.Shape(""), "k", 1, 0, false)
	c := lm.Config()
	c.Version, c.Burst = 1, 80
	if err := e.SetLimit(t0, c); err != nil {
		t.Fatal(err)
	}
	sh := lm.Shape("")
	e.owe(lm, sh, "k", 1, 0, false)
	trip := firstDebts(e, t0, lm)
	if trip == nil || len(trip.Refunds) != 1 {
		t.Fatalf("Next = %+v, want k's debt", trip)
	}
	if r := trip.Refunds[0]; r.Limit != sh.glim || r.Limit.Version != 1 || r.N != -2 || r.Floor != 80+100*10 {
		t.Fatalf("debt %+v, want N -2 to version 1's bucket, floor 80 + 100·10", r)
	}
}

// TestDebtFloor: a debt may take its bucket down to -(Burst + Rate·DebtWindow), never
// below -MaxDebt, the most a refund may charge (redisstore.Refund).
func TestDebtFloor(t *testing.T) {
	for _, tc := range []struct {
		rate  float64
		burst int
		want  int
	}{
		{100, 100, 100 + 100*10},
		{0.5, 3, 3 + 5},
		{1e7, 1 << 53, redisstore.MaxDebt}, // 2^53 + 10^8
		{1e7, 1<<53 - 100_000_001, redisstore.MaxDebt},
		{1e7, 1<<53 - 100_000_002, redisstore.MaxDebt - 1},
	} {
		_, lm := testEngine(t, func(c *Config) { c.Limits[0].Rate, c.Limits[0].Burst = tc.rate, tc.burst })
		if got := lm.Shape("").debtFloor(); got != tc.want {
			t.Errorf("rate %v, burst %d: floor %d, want %d", tc.rate, tc.burst, got, tc.want)
		}
	}
}

// TestGrantSettlesTheDebt: a request FailLocal admitted while it waited for a refill
// (it gave up at its MaxWait) is owed to the bucket; the refill's grant, when it comes,
// pays for it: the debt is settled, counted as charged and no longer owed,
// and no debt trip charges it again.
func TestGrantSettlesTheDebt(t *testing.T) {
	e, lm := failLocalEngine(t, new(bool), nil)
	e.Tick(t0)
	_, w1 := decide(e, t0, lm, "k", 1)
	_, w2 := decide(e, t0, lm, "k", 1)
	trip := e.Next()
	if d := e.GiveUp(t0.Add(10*ms), w1, ReasonTimeout); !d.Allowed || d.Source != SourceFallback {
		t.Fatalf("gave up: %+v, want admitted by FailLocal", d)
	}
	if st := lm.Stats(); st.Owed != 1 {
		t.Fatalf("owed %d after FailLocal's admission, want 1", st.Owed)
	}
	answerAll(trip)
	trip.TakeResults[0].Granted = 10
	e.Done(t0.Add(11*ms), trip)
	if d := w2.Decision(); !d.Allowed || d.Source != SourceGlobal {
		t.Fatalf("the request that waited: %+v, want served by the grant", d)
	}
	if st := lm.Stats(); st.Owed != 0 || st.Charged != 1 {
		t.Fatalf("owed %d, charged %d; want 0 and 1", st.Owed, st.Charged)
	}
	for at := t0.Add(11 * ms); at.Before(t0.Add(time.Second)); at = at.Add(10 * ms) {
		e.Tick(at)
		for trip := e.Next(); trip != nil; trip = e.Next() {
			if trip.debts {
				t.Fatalf("a debt trip %+v after the grant paid the debt", trip.Refunds)
			}
			answerAll(trip)
			e.Done(at, trip)
		}
	}
}

// TestDebtTripsCarryMaxBatch: a debt trip carries at most MaxBatch debts, the first
// owed; the next trip carries the rest.
func TestDebtTripsCarryMaxBatch(t *testing.T) {
	e, lm := failLocalEngine(t, new(bool), nil)
	for i := range MaxBatch + 1 {
		e.owe(lm, lm.Shape(""), fmt.Sprint(i), 1, 0, false)
	}
	trip := firstDebts(e, t0, lm)
	if trip == nil || len(trip.Refunds) != MaxBatch || trip.Refunds[MaxBatch-1].ID != redisstore.KeyID(fmt.Sprint(MaxBatch-1)) {
		t.Fatalf("first debt trip %+v, want the first %d debts", trip, MaxBatch)
	}
	answerAll(trip)
	e.Done(t0, trip)
	if trip = e.Next(); trip == nil || !trip.debts || len(trip.Refunds) != 1 || trip.Refunds[0].ID != redisstore.KeyID(fmt.Sprint(MaxBatch)) {
		t.Fatalf("next trip %+v, want the last debt alone", trip)
	}
}

// TestDebtBeyondTheFloor: a debt larger than its bucket's floor (Burst + Rate·DebtWindow,
// here 100 + 100·10) goes as a charge of the floor; the rest is forgiven, counted so and
// no longer owed.
func TestDebtBeyondTheFloor(t *testing.T) {
	e, lm := failLocalEngine(t, new(bool), nil)
	e.owe(lm, lm.Shape(""), "k", 1500, 0, false)
	trip := firstDebts(e, t0, lm)
	if trip == nil || len(trip.Refunds) != 1 || trip.Refunds[0].N != -1100 || trip.Refunds[0].Floor != 1100 {
		t.Fatalf("Next = %+v, want k's debt as a charge of 1100, floor 1100", trip)
	}
	answerAll(trip)
	e.Done(t0, trip)
	if st := lm.Stats(); st.Owed != 0 || st.Charged != 1100 || st.Forgiven != 400 {
		t.Fatalf("owed %d, charged %d, forgiven %d; want 0, 1100 and 400", st.Owed, st.Charged, st.Forgiven)
	}
}

// TestDebtItemsLostGoAgainTogether: the items of an answered debt trip whose own answers
// were lost (a Cluster node's timed out) go again together, in one retry under their
// numbers: only a trip that timed out whole goes again in halves (it may have been too
// large for its deadline).
func TestDebtItemsLostGoAgainTogether(t *testing.T) {
	open := false
	e, lm := failLocalEngine(t, &open, nil)
	oweOneEach(t, e, lm, &open, []string{"a", "b", "c"})
	trip := firstDebts(e, t0.Add(2*ms), lm)
	if trip == nil || len(trip.Refunds) != 3 {
		t.Fatalf("Next = %+v, want the three debts", trip)
	}
	trip.Answered = true
	for i := range trip.Refunds[:2] {
		trip.RefundResults[i].Err = fmt.Errorf("%w: %w", breaker.ErrTimeout, context.DeadlineExceeded)
	}
	e.Done(t0.Add(3*ms), trip)
	e.Tick(t0.Add(3*ms + debtRetry))
	trip = e.Next()
	if trip == nil || !trip.debts || len(trip.Refunds) != 2 || trip.Refunds[0].ID != "a" || trip.Refunds[1].ID != "b" {
		t.Fatalf("Next = %+v, want a's and b's debts again in one trip", trip)
	}
}

// TestDebtsAnsweredAfterFinish: a charge trip out when Finish ran and answered after it
// charges what it ran; what it did not run (refused) or may have (its answer lost) is
// forgiven, counted so and no longer owed, not owed again: nothing will send it.
func TestDebtsAnsweredAfterFinish(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error // the charge's own answer
		forgiven int64
	}{
		{"answered", nil, 0},
		{"refused", breaker.ErrOpen, 2},
		{"lost", fmt.Errorf("%w: %w", breaker.ErrTimeout, context.DeadlineExceeded), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, lm := asyncEngine(t, new(bool))
			warmUp(t, e, lm)
			at := t0.Add(time.Second)
			if d, w := decide(e, at, lm, "k", 2); w != nil || d.Reason != ReasonAsync {
				t.Fatalf("%+v, want k admitted uncharged", d)
			}
			var charge *Trip // out: not handed back to Done before Finish
			for now := at; charge == nil && now.Before(at.Add(time.Second)); now = now.Add(10 * ms) {
				e.Tick(now)
				for trip := e.Next(); trip != nil; trip = e.Next() {
					if trip.debts {
						charge = trip
						break
					}
					answerAll(trip)
					e.Done(now, trip)
				}
			}
			if charge == nil || len(charge.Refunds) != 1 || charge.Refunds[0].N != -2 {
				t.Fatalf("charge trip %+v, want k's charge of 2", charge)
			}
			e.Stop(at.Add(time.Second))
			if _, forgiven := e.Finish(); forgiven != 0 {
				t.Fatalf("Finish forgave %d with the charge out, want 0", forgiven)
			}
			charge.Answered = true
			charge.RefundResults[0].Err = tc.err
			e.Done(at.Add(time.Second), charge)
			if st := lm.Stats(); st.Owed != 0 || st.Forgiven != tc.forgiven || st.Charged != 2-tc.forgiven || e.Owes() {
				t.Fatalf("owed %d, forgiven %d, charged %d, owes %v; want 0, %d, %d, nothing owed", st.Owed, st.Forgiven, st.Charged, e.Owes(), tc.forgiven, 2-tc.forgiven)
			}
		})
	}
}

// TestDebtOwedAfterStopIsCharged: after Stop, FailLocal's debts no longer wait for a
// trip Redis answered (stopLater: with no lease to refund, none may come), and neither
// does a debt owed after Stop, by a request FailLocal admitted while Close waited (its
// breaker open): with no other trip answered during the shutdown it would never go, and
// Finish would forgive it though Redis answers. A charge whose retry fails at the
// shutdown goes with the debts (chargesSent ended the charges' turn as the retry went):
// both are charged.
func TestDebtOwedAfterStopIsCharged(t *testing.T) {
	timeout := fmt.Errorf("%w: %w", breaker.ErrTimeout, context.DeadlineExceeded)
	for _, tc := range []struct {
		name   string
		charge bool // k admitted uncharged, its charge trip timed out before Stop and again after
	}{
		{"debt alone", false},
		{"debt and a charge whose retry fails", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			open := false
			e, lm := asyncFailLocal(t, &open)
			warmUp(t, e, lm)
			at := t0.Add(time.Second)
			if tc.charge {
				if d, w := decide(e, at, lm, "k", 1); w != nil || d.Reason != ReasonAsync {
					t.Fatalf("%+v, want k admitted uncharged", d)
				}
				debtTrips(e, at, 1, func(trip *Trip, _ int) { trip.Err = timeout })
			}
			stop := at.Add(time.Second)
			e.Stop(stop)
			open = true
			e.Next() // the driver sees the breaker open
			if d, w := decide(e, stop, lm, "y", 1); w != nil || d.Source != SourceFallback || !d.Allowed {
				t.Fatalf("y after Stop: %+v, want FailLocal's admission", d)
			}
			open = false
			e.Drain()
			failed := !tc.charge // the first debt trip times out if k's retry is in it
			for trip := e.Next(); trip != nil; trip = e.Next() {
				if trip.debts && !failed {
					trip.Err, failed = timeout, true
				} else {
					answerAll(trip)
				}
				e.Done(stop, trip)
			}
			want := 1 + map[bool]int64{false: 0, true: 1}[tc.charge]
			if _, forgiven := e.Finish(); forgiven != 0 || lm.Stats().Charged != want {
				t.Fatalf("charged %d, forgiven %d; want %d charged, none forgiven", lm.Stats().Charged, forgiven, want)
			}
		})
	}
}
