package engine

import (
	"container/heap"
	"errors"
	"slices"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/storeerr"
)

// TripKind is what a Trip carries.
type TripKind uint8

// Trip kinds.
const (
	// TakeTrip carries refills: one redisstore.Store.Take, or a TakeBatch of up to MaxBatch.
	TakeTrip TripKind = iota + 1
	// RefundTrip carries refunds, summed per key: a RefundBatch of up to MaxBatch.
	RefundTrip
	// HeartbeatTrip announces this server in its fleet (redisstore.Store.Heartbeat), and
	// records and reads the representations of the limits (reps.go).
	HeartbeatTrip
	// LowTrip exchanges the low keys of the limits with Async with the fleet
	// (redisstore.Store.Low, once per LowExchange).
	LowTrip
	// WindowsTrip is the report of the windowed limits (redisstore.Store.Windows, once per
	// item of Windows).
	WindowsTrip
)

// Trip is one round trip to Redis the engine asks its driver to make: the driver makes
// the call (through its breaker), writes the answers into the Trip and hands it back to
// Done. Only one Trip is out at a time.
type Trip struct {
	Kind TripKind
	// Takes are the refills of a TakeTrip; the driver writes the answer to Takes[i] in
	// TakeResults[i].
	Takes       []redisstore.TakeRequest
	TakeResults []redisstore.TakeResult
	// Refunds are the refunds of a RefundTrip, each with its sequence number already
	// chosen (a trip sent again after a timeout keeps them, so Redis answers a second
	// run as a replay); the answers go to RefundResults[i].
	Refunds       []redisstore.RefundRequest
	RefundResults []redisstore.RefundResult
	// Fleet and TTL are the heartbeat of a HeartbeatTrip; the driver writes the live
	// count it answers to Live.
	Fleet string
	TTL   time.Duration
	Live  int
	// Reps, when not nil, are the representations of this server's limits to record
	// in the fleet's record (wire.RepsKey), each live for RepsLive, in the same trip;
	// the driver writes every live member it reads back to RepsGot (which holds Reps
	// once answered), or the error of that call to RepsErr; nil RepsGot is no answer.
	// Fleet is "" when only they are due.
	Reps     []string
	RepsLive time.Duration
	RepsGot  []string
	RepsErr  error
	// Lows are the exchanges of a LowTrip, one per limit with Async; the driver writes
	// each answer to Lows[i].Got, or its error to Lows[i].Err.
	Lows []LowExchange
	// Windows are the round trips of a WindowsTrip, one per windowed limit with work;
	// the driver makes each with redisstore.Store.Windows, which writes the answers into it,
	// and writes its error to WindowErrs[i].
	Windows    []redisstore.WindowTrip
	WindowErrs []error
	// Err is the error of the call as a whole. Answered reports that the call returned,
	// so that the results hold every item's answer even when Err is set (one item's
	// node was unavailable); when it did not (breaker open, deadline passed), Err
	// stands for every item and the results are not read.
	Err      error
	Answered bool

	flights  []*Flight      // of a TakeTrip, by item
	debts    bool           // a RefundTrip of debts (negative refunds)
	lims     []*Limit       // of a RefundTrip, by item: the limit it counts on
	charges  []*chargeLater // of a debt trip, by item: a charge's limit, nil for a debt
	resent   int            // of a debt trip: its first items, sent before and their answers lost
	warms    bool           // a LowTrip whose answer makes the server warm
	winItems []windowItem   // of a WindowsTrip, by item
	lost     int            // tokens of a RefundTrip not refunded
	firstErr error          // the first error of a RefundTrip's lost tokens
}

// Lost returns, after Done, the tokens of a RefundTrip that were not refunded (they stay
// spent) and the first error that lost them.
func (t *Trip) Lost() (int, error) { return t.lost, t.firstErr }

// Next returns the next round trip to make, or nil when one is out already or nothing
// is due. Refills go first, as they have requests waiting, but never twice in a row
// while other work is due: after a TakeTrip, a due heartbeat and then queued refunds
// go next, so that a server under a steady stream of refills still announces itself
// and gives back what it does not use.
func (e *Engine) Next() *Trip {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.noteOpen()
	if e.busy {
		return nil
	}
	debts := e.debtsDue()
	windows := e.windowsDue()
	low := e.lowDue()
	refunds := len(e.refundTrips) > 0 || len(e.refunds) > 0
	// The record of representations rides on the next heartbeat, if the engine beats,
	// save the first.
	reps := e.repsDue && (e.fleet == "" || e.firstReps)
	other := e.beatDue || reps || low || refunds || debts || windows
	var t *Trip
	switch {
	case len(e.pending) > 0 && !(e.lastTake && other):
		t = e.takeTrip()
	case e.beatDue || reps:
		t = &Trip{Kind: HeartbeatTrip}
		if e.beatDue {
			t.Fleet, t.TTL = e.fleet, 3*e.beat
		}
		if e.repsDue {
			t.Reps, t.RepsLive = e.repsMembers(), e.repsLive()
		}
		e.beatDue, e.repsDue = false, false
	case windows && !(e.lastWindows && (low || refunds || debts)) && e.windowTripInto(&t):
		// windowed limits' trips in turn with the other work, as refills are
	case low:
		t = e.lowTrip()
	case refunds:
		t = e.refundTrip()
	case debts:
		if t = e.debtTrip(); t == nil { // a breaker opened since debtsDue
			if len(e.pending) == 0 {
				return nil
			}
			t = e.takeTrip()
		}
	default:
		return nil
	}
	e.lastTake, e.lastWindows = t.Kind == TakeTrip, t.Kind == WindowsTrip
	e.busy = true
	return t
}

// takeTrip takes up to MaxBatch pending refills; it requires that e.mu is held.
func (e *Engine) takeTrip() *Trip {
	batch := e.pending
	if len(batch) > MaxBatch {
		batch = batch[:MaxBatch:MaxBatch]
		e.pending = e.pending[MaxBatch:]
	} else {
		e.pending = nil
	}
	t := &Trip{Kind: TakeTrip, flights: batch,
		Takes: make([]redisstore.TakeRequest, len(batch)), TakeResults: make([]redisstore.TakeResult, len(batch))}
	for i, f := range batch {
		if f.rseq == 0 {
			f.rseq = e.nextSeq() // kept: a take whose answer is lost goes again under it
		}
		t.Takes[i] = redisstore.TakeRequest{Limit: f.shape.glim, ID: redisstore.KeyID(f.key), Want: f.want, Min: f.min, Floor: f.floor, Seq: f.rseq, Seen: f.seen}
	}
	return t
}

// refundTrip returns the next refund trip, first summing the queued refunds per key
// and shape (at most a burst each: the bucket holds no more), numbering them in the
// order queued and cutting them into trips of MaxBatch; it requires that e.mu is held.
// Refunds of one key under two shapes (a tier it moved from, a version before
// SetLimit) stay apart: Redis adds what was leased under the parameters in force and
// nothing of the rest, and one sum under either shape would give back the other's
// tokens or drop its own.
func (e *Engine) refundTrip() *Trip {
	if len(e.refundTrips) == 0 {
		type bucketKey struct {
			lim  *Limit
			key  string
			glim redisstore.Limit
		}
		at := make(map[bucketKey]int, len(e.refunds)) // index in reqs
		reqs := make([]redisstore.RefundRequest, 0, len(e.refunds))
		lims := make([]*Limit, 0, len(e.refunds))
		for _, r := range e.refunds {
			k := bucketKey{r.lim, r.key, r.shape.glim}
			i, ok := at[k]
			if !ok {
				i = len(reqs)
				at[k] = i
				reqs = append(reqs, redisstore.RefundRequest{Limit: r.shape.glim, ID: redisstore.KeyID(r.key), Seq: e.nextSeq()})
				lims = append(lims, r.lim)
			}
			reqs[i].N += r.n
		}
		e.refunds = nil
		for i := range reqs {
			if over := reqs[i].N - reqs[i].Limit.Burst; over > 0 {
				// Redis caps a bucket at its burst: what is above it needs no trip, and
				// counts as given back, so that Held returns to 0.
				lims[i].stats.refunded.Add(int64(over))
				reqs[i].N = reqs[i].Limit.Burst
			}
		}
		for lo := 0; lo < len(reqs); lo += MaxBatch {
			hi := min(lo+MaxBatch, len(reqs))
			e.refundTrips = append(e.refundTrips, refundBatch{reqs: reqs[lo:hi:hi], lims: lims[lo:hi:hi]})
		}
	}
	b := e.refundTrips[0]
	e.refundTrips = e.refundTrips[1:]
	return &Trip{Kind: RefundTrip, Refunds: b.reqs, RefundResults: make([]redisstore.RefundResult, len(b.reqs)), lims: b.lims}
}

// refundBatch is the items of a refund or debt trip: the requests, and for each the
// limit it counts on (a companion's own, though it has its limit's name) and, of a debt
// trip, a charge's limit (nil: a debt).
type refundBatch struct {
	reqs    []redisstore.RefundRequest
	lims    []*Limit
	charges []*chargeLater
}

// batch is t's items as a refundBatch.
func (t *Trip) batch() refundBatch {
	return refundBatch{reqs: t.Refunds, lims: t.lims, charges: t.charges}
}

// add appends item i of t to b.
func (b *refundBatch) add(t *Trip, i int) {
	b.reqs, b.lims = append(b.reqs, t.Refunds[i]), append(b.lims, t.lims[i])
	if t.charges != nil {
		b.charges = append(b.charges, t.charges[i])
	}
}

// halves splits b in two as halves does each of its slices.
func (b refundBatch) halves() (refundBatch, refundBatch) {
	r1, r2 := halves(b.reqs)
	l1, l2 := halves(b.lims)
	x, y := refundBatch{reqs: r1, lims: l1}, refundBatch{reqs: r2, lims: l2}
	if b.charges != nil {
		x.charges, y.charges = halves(b.charges)
	}
	return x, y
}

// Done takes the answers of trip t, made by the driver, at now: grants fill their leases
// and decide the requests waiting for them (failures send those to their policy), the
// heartbeat's live count divides the limits. A refund trip answered too late for the
// breaker's deadline is sent again in two halves (its items keep their sequence numbers:
// where the first attempt ran, Redis answers the resend as a replay and adds nothing);
// any other failed refund is dropped, and its tokens stay spent.
func (e *Engine) Done(now time.Time, t *Trip) {
	switch t.Kind {
	case TakeTrip:
		e.stats.roundTrips.Add(1)
		var redisNow time.Time // Redis's clock in the trip's last answer
		for i, f := range t.flights {
			f.lim.stats.takes.Add(1)
			if !t.Answered {
				e.answer(now, f, Grant{}, t.Err, nil)
				continue
			}
			r := &t.TakeResults[i]
			if r.Err == nil && !r.Now.IsZero() {
				redisNow = r.Now
			}
			e.answer(now, f, grantOf(r), r.Err, nil)
		}
		if !redisNow.IsZero() {
			e.cl.redisOff.Store(int64(redisNow.Sub(now)))
		}
	case RefundTrip:
		if t.debts {
			e.charged(now, t)
		} else {
			e.refunded(t)
		}
	case HeartbeatTrip:
		if t.Fleet != "" {
			e.stats.heartbeats.Add(1)
		}
		if t.Fleet != "" && t.Err == nil && t.Live >= 1 {
			e.setServers(now, t.Live)
		}
		if t.Reps != nil {
			e.repsDone(now, t.RepsGot, t.RepsErr)
		}
	case LowTrip:
		e.lowDone(now, t)
	case WindowsTrip:
		e.stats.roundTrips.Add(1)
		e.windowsDone(now, t)
	}
	e.mu.Lock()
	if t.Answered && t.Err == nil {
		e.redisAnswered(now)
	}
	e.busy = false
	e.mu.Unlock()
}

// redisAnswered notes that Redis answered a trip at now, or ran one it answered late:
// FailLocal's debts may go. Debts that waited for that answer wait a random part of
// spreadFor more, so that the servers of a fleet do not charge theirs together when
// Redis comes back to all of them at once: after an outage a server's debts fill a trip
// or more, and a fleet's, sent in the same few milliseconds, would queue its refills
// behind them past the breaker's Timeout. The spread's end lets go every debt owed by
// then (Tick), whatever was owed during it: a server that keeps owing while Redis
// answers waits one spread, not one after each answer. Charges of charge-later limits
// do not wait, nor do the debts of an engine stopped (its shutdown sends them at once).
// It requires that e.mu is held.
func (e *Engine) redisAnswered(now time.Time) {
	if d := e.debts.len(); e.debtWait && e.debtSpreadUntil.IsZero() && !e.stopped && d > 0 {
		spread := float64(spreadFor(e.Servers(), d))
		e.debtSpreadUntil = now.Add(time.Duration(spread * uniform(&e.rng)))
	}
	e.debtWait = false
}

// debtSpreadPer is the time the debts a fleet owes are spread over, per debt: about twice
// the Redis time that charging one takes (a refund, 5-8 µs on redis-server 7.0:
// bench/rediscost's TestRefundCalls), so that while they go they take about half of
// Redis's time, wherever the fleet's other work leaves it.
const debtSpreadPer = 16 * time.Microsecond

// spreadFor is how long a server of a fleet of servers, which owes debts keys' debts,
// spreads its first debt trip over once Redis answers again (redisAnswered): the fleet's
// debts, taken as servers times this server's, at debtSpreadPer each; at least debtRetry
// and at most half the DebtWindow, which the debts must land well within.
func spreadFor(servers, debts int) time.Duration {
	s := time.Duration(servers) * time.Duration(debts) * debtSpreadPer
	return min(max(s, debtRetry), DebtWindow/2)
}

// timedOutWhole reports whether t, a trip of refunds or debts, ran out of time whole with
// more than one item: it goes again in halves (halves), so that a batch too large for
// the call's deadline is not sent whole again, and counted against the breaker, each
// time.
func (t *Trip) timedOutWhole() bool {
	return len(t.Refunds) > 1 && !t.Answered && errors.Is(t.Err, breaker.ErrTimeout)
}

// halves splits s in two, the first half with no room to grow into the second.
func halves[T any](s []T) (a, b []T) {
	h := len(s) / 2
	return s[:h:h], s[h:]
}

// refunded counts the answers of a refund trip, or queues it again in halves; an item
// of an answered trip whose own answer was lost (its node's call timed out, or lost its
// connection once written: it may have run) goes again too, under its number, ahead of
// the others.
func (e *Engine) refunded(t *Trip) {
	e.stats.refundCalls.Add(1)
	if t.timedOutWhole() {
		a, b := t.batch().halves()
		e.refundAgain(a, b)
		return
	}
	var again refundBatch
	for i, r := range t.Refunds {
		err := t.Err
		if t.Answered {
			err = t.RefundResults[i].Err
		}
		lc := &t.lims[i].stats
		if err == nil {
			lc.refunded.Add(int64(r.N))
			continue
		}
		if t.Answered && mayHaveRun(err) {
			again.add(t, i)
			continue
		}
		lc.refundsLost.Add(int64(r.N))
		t.lost += r.N
		if t.firstErr == nil {
			t.firstErr = err
		}
	}
	if len(again.reqs) > 0 {
		e.refundAgain(again)
	}
}

// refundAgain queues refund trips of bs, sent before, at the head of the queue: they
// keep their sequence numbers, and go before the refunds queued since.
func (e *Engine) refundAgain(bs ...refundBatch) {
	e.mu.Lock()
	e.refundTrips = append(bs, e.refundTrips...)
	e.mu.Unlock()
}

// send queues refill f, or fails it at once when its key's breaker is open or the engine is
// stopped, and reports whether it failed. self is a waiter of f the caller holds (see
// decideFailed).
func (e *Engine) send(now time.Time, f *Flight, self *Waiter) bool {
	var err error
	if e.keyOpen != nil && e.keyOpen(f.lim.name, f.key) {
		err = breaker.ErrOpen
	} else {
		e.mu.Lock()
		if e.stopped {
			err = errClosed
		} else {
			e.pending = append(e.pending, f)
		}
		e.mu.Unlock()
	}
	if err == nil {
		e.wake()
		return false
	}
	e.answer(now, f, Grant{}, err, self)
	return true
}

// answer applies the outcome of refill f (a grant, or the error that failed it) to its
// key's lease, if the key still holds that flight (else the tokens go back), then decides
// the requests that waited for it: again with the grant, or by their policy.
func (e *Engine) answer(now time.Time, f *Flight, g Grant, err error, self *Waiter) {
	if f.floor > 0 {
		// A claim that may have run is read if its answer comes late (Late): it was
		// decided without its tokens, which go back.
		f.lost.Store(mayHaveRun(err))
		e.claimed(f, g, err, self)
		return
	}
	lm := f.lim
	back, paid, found := 0, 0, false
	lost := mayHaveRun(err)
	var expires time.Time // the granted tokens' expiry, for the sweep: set when Granted ran
	var ws []*Waiter
	lm.keys.Peek(f.key, func(en *entry, last int64) {
		if en.flight != f {
			return
		}
		found = true
		en.flight = nil
		ws, f.waiters = f.waiters, nil
		if err != nil {
			// A lost take is sent again under its number (Lease.Lost) only once its
			// waiters are decided, below: if the policy admitted some, its grant pays for
			// them and nothing may read it back.
			en.lease.Failed(f.seq)
			f.lost.Store(lost)
			return
		}
		// A bucket with no record of this server, which took from it within the time its
		// records surely live: the bucket was lost (evicted, flushed, deleted), and the
		// take started it empty (Refill.Seen).
		sh, at := en.shape, lastOf(now, last)
		if en.lease.answeredWithin(at, sh.lostWindow) && g.First {
			lm.stats.lostBuckets.Add(1)
		}
		lc := sh.lease.Load()
		en.credit, en.hasCredit = g.Credit, true
		back = en.lease.Granted(lc, at, f.seq, g)
		expires = at.Add(en.lease.lifeFrom(at)) // a roomy grant's tokens live longer
	})
	if !found {
		// The key was evicted (or the store closed) while f was out: no request can join
		// f any more, and Peek's lock orders this read after the last that did. A lost
		// f's late answer goes back to Redis (Late).
		ws, f.waiters = f.waiters, nil
		if err == nil {
			back = g.Granted
		}
		f.lost.Store(lost)
		if err != nil && !lost && f.again {
			// A resend under a lost take's number that never ran, of a key let go of
			// while it waited: nothing reads that take's grant now (abandon).
			e.abandon(f.rseq)
		}
	}
	if err == nil {
		lm.stats.granted.Add(int64(g.Granted))
		if g.Replayed {
			lm.stats.recovered.Add(int64(g.Granted))
		}
		f.b.spill.note(f.shape, f.key, g.Remaining, now)
	} else {
		lm.stats.refillErrors.Add(1)
	}
	// A grant for a key evicted meanwhile serves the requests that waited for it, in
	// order, as far as it goes: asked again they would make the key again, and in a key
	// store too small for its traffic evict another's, each waiting out its MaxWait.
	gone := !found && err == nil
	if back > 0 && !gone {
		e.queueRefund(lm, f.shape, f.key, back)
	}
	if err == nil && g.Granted > back {
		e.mu.Lock()
		heap.Push(&e.expiries, expiry{lim: lm, key: f.key, at: expires})
		e.mu.Unlock()
	}
	for _, w := range ws {
		var decided bool
		switch {
		case err != nil:
			decided = e.decideFailed(now, w, self, err)
		case gone && back >= w.n:
			decided = e.grantGone(w, &back, g)
		default:
			decided = e.recheck(now, f.b, w)
		}
		if decided && w != self && e.decided != nil {
			e.decided(w)
		}
	}
	if gone && back > 0 {
		e.queueRefund(lm, f.shape, f.key, back)
	}
	// What the failure policy admitted to the requests that waited for f (they gave up,
	// or f failed), f's grant paid for if Redis ran f: spent on them first, not kept for
	// others, and FailLocal's debt for them settled. A lost f is taken as having paid,
	// and is not sent again, so that a server whose every answer comes late keeps paying
	// for what its policy admits; its answer, if it comes late (Late), pays for them
	// then. A lost f whose requests the policy all denied is sent again under its number
	// (Lease.Lost), unless a refill started meanwhile, under a number of its own.
	adm := policyAdmitted(ws, self)
	switch {
	case !found:
	case lost:
		lm.keys.Peek(f.key, func(en *entry, _ int64) {
			f.owed = adm
			f.resend = en.lease.Lost(f.seq, f.rseq, f.again, adm > 0)
		})
	case adm > 0 && err == nil:
		lm.keys.Peek(f.key, func(en *entry, _ int64) { paid = en.lease.pay(adm) })
		e.settle(lm, f.key, paid)
	}
}

// abandonedMax bounds the lost takes whose planned resend was let go of (abandon) that
// an engine remembers for their late answers. Such an answer comes within the
// breaker's probe deadline of its call, or never, so a few suffice; past the bound the
// oldest is forgotten, and its grant, if its answer still comes, stays spent.
const abandonedMax = 256

// abandon records that the take rseq, lost, was to go again under its number and will
// not: its key's lease was let go of first (Lease.Drain). Its late answer gives its grant
// back (Late).
func (e *Engine) abandon(rseq uint64) {
	e.mu.Lock()
	if len(e.abandonedSeqs) >= abandonedMax {
		e.abandonedSeqs = slices.Delete(e.abandonedSeqs, 0, 1)
	}
	e.abandonedSeqs = append(e.abandonedSeqs, rseq)
	e.mu.Unlock()
}

// abandoned reports whether the take rseq is one abandon recorded, and forgets it: a
// take's late answer is read once.
func (e *Engine) abandoned(rseq uint64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	i := slices.Index(e.abandonedSeqs, rseq)
	if i >= 0 {
		e.abandonedSeqs = slices.Delete(e.abandonedSeqs, i, i+1)
	}
	return i >= 0
}

// Late takes the answer r of item i of take trip t, answered after its call had failed
// by timeout and Done had taken the item as lost, at now: the grant Redis spent when the
// take ran. It pays first for what the failure policy admitted to the requests that
// waited for the item's refill (FailLocal's debt for them settled), and the rest goes to
// the key's lease until at least its Lifetime from now (Lease.Late), or back to
// Redis if the key is gone; a reservation's claim, decided as failed, gives back all it
// took. It reports whether it took the grant: not while a later take under the same
// sequence number is out, or once one was answered (Lease.Lost): that take reads the
// same grant from Redis's record. Call it after Done(t), from any goroutine; an item's
// answer is taken at most once.
func (e *Engine) Late(now time.Time, t *Trip, i int, r *redisstore.TakeResult) bool {
	if t.Kind != TakeTrip || i < 0 || i >= len(t.flights) || r.Err != nil {
		return false
	}
	f := t.flights[i]
	if !f.lost.CompareAndSwap(true, false) { // not lost, or read
		return false
	}
	lm, g := f.lim, grantOf(r)
	if f.floor > 0 {
		if g.Granted <= 0 {
			return false
		}
		lm.stats.claimsBack.Add(int64(g.Granted))
		e.queueRefund(lm, f.shape, f.key, g.Granted)
		e.mu.Lock()
		e.redisAnswered(now)
		e.mu.Unlock()
		return true
	}
	took, found, paid, back := false, false, 0, 0
	var expires time.Time // the tokens' expiry, for the sweep: set when the key is found
	lm.keys.Peek(f.key, func(en *entry, last int64) {
		if en.shape == nil || !en.shape.sameBucket(f.shape) {
			// The key moved to another bucket (a tier, a new rate or burst) since f went,
			// and its lease went back then; or its entry is new and not decided yet:
			// either way its lease is not of f's bucket, as for a key evicted.
			return
		}
		found = true
		lc := en.shape.lease.Load()
		at := lastOf(now, last)
		paid, took = en.lease.Late(lc, at, f.rseq, f.resend, f.owed, g)
		back = max(g.Granted, 0) - paid
		expires = at.Add(en.lease.lifeFrom(at))
	})
	// Evicted or re-shaped meanwhile (the key's entry may have been made again since),
	// and no take read the grant back: what the policy admitted is paid, the rest goes
	// back, to f's bucket. One sent again under f's number before the lease was let go
	// of may have read it into the lease the eviction or the change refunded; one
	// planned and not sent never will (Lease.Drain, abandon).
	giveBack := !found && !f.resend || !took && f.resend && e.abandoned(f.rseq)
	if giveBack {
		paid = min(f.owed, max(g.Granted, 0))
		back, took = max(g.Granted, 0)-paid, true
		if back > 0 {
			e.queueRefund(lm, f.shape, f.key, back)
		}
	}
	if !took {
		return false
	}
	lm.stats.granted.Add(int64(g.Granted))
	lm.stats.recovered.Add(int64(g.Granted))
	e.settle(lm, f.key, paid)
	e.mu.Lock()
	if found && !giveBack && back > 0 { // on hand in the lease
		heap.Push(&e.expiries, expiry{lim: lm, key: f.key, at: expires})
	}
	e.redisAnswered(now) // Redis runs what it is sent, if late
	e.mu.Unlock()
	e.wake()
	return true
}

// grantOf is the grant a take answered.
func grantOf(r *redisstore.TakeResult) Grant {
	return Grant{Granted: r.Granted, Remaining: r.Remaining, Wait: r.Wait, First: r.First, Credit: r.Credit, Replayed: r.Replayed, At: r.Now}
}

// mayHaveRun reports whether a call that ended with err may have run in Redis, its answer
// unknown: it timed out (the breaker's deadline, a context's, a connection's), or its
// connection was lost once it was written. A call the breaker or the engine refused, or
// that storeerr.DidNotRun says did not run, did not.
func mayHaveRun(err error) bool {
	return err != nil && !errors.Is(err, breaker.ErrOpen) && !errors.Is(err, breaker.ErrOverloaded) &&
		!errors.Is(err, errClosed) && !storeerr.DidNotRun(err)
}

// policyAdmitted is the tokens the failure policy admitted among ws, self's mutex held by
// the caller.
func policyAdmitted(ws []*Waiter, self *Waiter) int {
	n := 0
	for _, w := range ws {
		var d Decision
		if w == self {
			d = w.d
		} else {
			d = w.Decision()
		}
		if d.Allowed && d.Source == SourceFallback {
			n += w.n
		}
	}
	return n
}

// grantGone admits w from *back, tokens granted for its key after the key's entry was
// evicted, unless it was decided meanwhile. It reports whether it decided w.
func (e *Engine) grantGone(w *Waiter, back *int, g Grant) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.decided {
		return false
	}
	*back -= w.n
	w.set(Decision{Allowed: true, Remaining: int(g.Remaining), Source: SourceGlobal, Reason: ReasonGranted, Servers: e.Servers()})
	w.counted()
	return true
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// lastOf is later(now, last) for last an instant as the key store keeps it (Unix
// nanoseconds): a time.Time of now's clock, made from now by the difference (so with
// now's monotonic reading, if it has one).
func lastOf(now time.Time, last int64) time.Time {
	if d := last - now.UnixNano(); d > 0 {
		return now.Add(time.Duration(d))
	}
	return now
}

// timeAt is the instant ns (Unix nanoseconds) as a time.Time, for a decision's slow path
// from Decide's instant; it requires ns within UnixNano's range (the years 1678 to 2261).
func timeAt(ns int64) time.Time { return time.Unix(0, ns) }

// queueRefund queues n tokens of (lm, key) to be given back to the bucket, for a key of
// shape sh (nil: the limit's own).
func (e *Engine) queueRefund(lm *Limit, sh *Shape, key string, n int) {
	if sh == nil {
		sh = lm.Shape("")
	}
	e.mu.Lock()
	if e.finished {
		// Finish has counted the last refunds: a request that raced it found expired
		// tokens. Nothing will send them; say so.
		e.mu.Unlock()
		lm.stats.refundsLost.Add(int64(n))
		return
	}
	e.refunds = append(e.refunds, refund{lim: lm, shape: sh, key: key, n: n})
	e.mu.Unlock()
	e.wake()
}

// wake tells the driver that I/O is queued.
func (e *Engine) wake() {
	if e.notify != nil {
		e.notify()
	}
}

// Tick advances the engine's own schedule to now: every quarter of the shortest lease
// lifetime it refunds the leased tokens whose lifetime has passed, for keys nobody asked
// about since (a request finds and refunds its key's expired tokens itself), and every
// HeartbeatInterval it makes a heartbeat due. Call it at NextTick, and whenever else is
// convenient: it does nothing before its time.
//
// The first Tick starts the schedule at a phase drawn from the seed (the first expiry
// sweep within 0.5 to 1.5 sweep intervals, the first heartbeat within a tenth of an
// interval), so that servers started together do not sweep and beat together.
func (e *Engine) Tick(now time.Time) {
	e.mu.Lock()
	if !e.debtHoldUntil.IsZero() && !now.Before(e.debtHoldUntil) {
		e.debtHoldUntil = time.Time{}
	}
	if !e.debtSpreadUntil.IsZero() && !now.Before(e.debtSpreadUntil) {
		// Redis answered before the spread began: what was owed during it goes too.
		e.debtSpreadUntil, e.debtWait = time.Time{}, false
	}
	if !e.ticked {
		e.ticked = true
		e.nextExpiry = now.Add(time.Duration(float64(e.tickEvery) * (0.5 + uniform(&e.rng))))
		e.nextBeat = now.Add(time.Duration(float64(e.beat) / 10 * uniform(&e.rng)))
		e.nextReps = now.Add(time.Duration(float64(e.repsEvery()) * (0.5 + uniform(&e.rng))))
	}
	var due []expiry
	if !now.Before(e.nextExpiry) {
		for len(e.expiries) > 0 && !e.expiries[0].at.After(now) {
			due = append(due, heap.Pop(&e.expiries).(expiry))
		}
		e.nextExpiry = now.Add(e.tickEvery)
	}
	beat := false
	if e.fleet != "" && !e.stopped && !now.Before(e.nextBeat) {
		e.beatDue, beat = true, true
		e.nextBeat = now.Add(e.beat)
	}
	if !e.stopped && !now.Before(e.nextReps) {
		e.repsDue, beat = true, true
		e.nextReps = now.Add(e.repsEvery())
	}
	if e.tickLater(now) {
		beat = true
	}
	e.mu.Unlock()
	if e.windowsTick(now) {
		beat = true
	}
	for _, x := range due {
		n := 0
		var sh *Shape
		x.lim.keys.Peek(x.key, func(en *entry, last int64) {
			if sh = en.shape; sh != nil {
				n = en.lease.Expire(sh.lease.Load(), lastOf(now, last))
			}
		})
		if n > 0 {
			e.queueRefund(x.lim, sh, x.key, n)
		}
	}
	if due != nil || beat {
		e.wake()
	}
}

// NextTick returns when Tick next has work: the zero Time before the first Tick.
func (e *Engine) NextTick() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.ticked {
		return time.Time{}
	}
	t := e.nextExpiry
	if e.fleet != "" && !e.stopped && e.nextBeat.Before(t) {
		t = e.nextBeat
	}
	if !e.stopped && e.nextReps.Before(t) {
		t = e.nextReps
	}
	if !e.debtHoldUntil.IsZero() && e.debtHoldUntil.Before(t) {
		t = e.debtHoldUntil
	}
	if !e.debtSpreadUntil.IsZero() && e.debtSpreadUntil.Before(t) {
		t = e.debtSpreadUntil
	}
	return e.windowsNextTick(e.laterNextTick(t))
}

// Stop ends the engine's refills: the refills not yet sent fail (their requests are
// denied with ReasonClosed), and so does every later one. Refunds still go out; a Trip
// that is out is still handed back to Done. Stop is the first step of a shutdown: then
// wait for the Trip out, Drain, send what Next returns, and Finish.
func (e *Engine) Stop(now time.Time) {
	e.mu.Lock()
	e.stopped = true
	e.beatDue, e.repsDue = false, false
	e.stopLater()
	pending := e.pending
	e.pending = nil
	e.mu.Unlock()
	for _, f := range pending {
		e.answer(now, f, Grant{}, errClosed, nil)
	}
	e.windowsStop(now)
}

// Drain lets go of every key (their leased tokens are queued for refund) and of the
// fallbacks; requests are then denied with ReasonClosed. Call it after Stop, once no
// Trip is out.
func (e *Engine) Drain() {
	for _, lm := range e.limits.Load().list {
		lm.keys.Close() // drains every lease through evicted
		for _, s := range lm.cur.Load().all() {
			s.fallback.Close()
		}
	}
	e.mu.Lock()
	e.expiries = nil
	e.mu.Unlock()
}

// Finish ends the shutdown: the refunds not sent by now are dropped and returned as
// lost tokens (they stay spent), and so is every refund queued later; the debts and
// charges not sent are forgiven (LimitStats.Forgiven), and their tokens returned as
// forgiven (the buckets never learn of them).
func (e *Engine) Finish() (lost, forgiven int) {
	e.mu.Lock()
	e.finished = true
	for _, r := range e.refunds {
		lost += r.n
		r.lim.stats.refundsLost.Add(int64(r.n))
	}
	for _, b := range e.refundTrips {
		for i, r := range b.reqs {
			lost += r.N
			b.lims[i].stats.refundsLost.Add(int64(r.N))
		}
	}
	e.refunds, e.refundTrips = nil, nil
	forgiven = e.forgiveDebts()
	e.mu.Unlock()
	return lost, forgiven
}

// expiry is a grant whose lifetime ends at at.
type expiry struct {
	lim *Limit
	key string // the key's ID
	at  time.Time
}

// expiries is a min-heap of grants by the instant their lifetime ends. Grants of one
// limit arrive in that order, but limits' lifetimes differ.
type expiries []expiry

func (h expiries) Len() int           { return len(h) }
func (h expiries) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h expiries) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiries) Push(x any)        { *h = append(*h, x.(expiry)) }
func (h *expiries) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = expiry{}
	*h = old[:len(old)-1]
	return x
}
