package engine

import (
	"math"
	"slices"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/fallback"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
)

// DebtWindow sizes how far below zero the debts of FailLocal may take a bucket: its
// burst plus DebtWindow of its rate. A partition that lets some servers admit their
// local shares while the others lease the whole rate is charged in full if their extra
// admissions stay within it (with half the servers cut off, a partition of 20 s).
const DebtWindow = 10 * time.Second

// debtRetry is how long debts wait after a debt trip failed before they go again: a
// Redis that answers errors must not be asked in a loop.
const debtRetry = 250 * time.Millisecond

// stopRetries is how many failed debt trips after Stop send their items again at once
// (charged): enough for a timeout's halves and a refused item, few enough that a Redis
// that refuses every charge does not keep a Close without a deadline sending them.
const stopRetries = 3

// maxDebtKeys bounds the keys with debts one engine holds, and apart from them the keys
// with charges: past it, new keys' debts are forgiven (counted in LimitStats.Forgiven).
const maxDebtKeys = 100_000

// debtKey names the bucket a debt is owed to.
type debtKey struct {
	lim *Limit
	key string // the key's ID
}

// debt is what one server owes one bucket: tokens its FailLocal fallback admitted, or
// tokens a charge-later limit admitted uncharged (a charge, whose answer goes to cl).
type debt struct {
	shape  *Shape // the key's shape when it was last admitted
	n      int
	ref    float64 // the bucket's credit at this server's last grant, if hasRef
	hasRef bool
	seq    uint64       // the engine's count of debts and charges when this one was first owed
	cl     *chargeLater // a charge's limit; nil for a debt of FailLocal's
}

// owed is tokens owed to buckets, one debt per bucket, in the order first owed. An
// engine has two: FailLocal's debts (Engine.debts), which wait for Redis to answer and
// are forgiven against their reference, and the charge-later limits' charges
// (laterSched.charges), which go once due; one debt trip carries both, in the order
// first owed.
type owed struct {
	m     map[debtKey]*debt
	order []debtKey
}

// len is the number of debts of q (nil: none).
func (q *owed) len() int {
	if q == nil {
		return 0
	}
	return len(q.m)
}

// add adds n tokens to what this server owes the bucket of (lm, key), of shape sh, with
// the reference ref (hasRef: there is one); a debt new to q takes the next number of
// *seq. It returns the tokens it added, and reports false when the debt was forgiven
// instead (maxDebtKeys keys owed). A debt holds at most MaxInt32 tokens: what would
// take it above is forgiven, and counted so.
func (q *owed) add(lm *Limit, sh *Shape, key string, n int, ref float64, hasRef bool, seq *uint64, cl *chargeLater) (int, bool) {
	k := debtKey{lm, key}
	d, ok := q.m[k]
	if !ok {
		if len(q.m) >= maxDebtKeys {
			lm.stats.forgiven.Add(int64(n))
			return 0, false
		}
		if q.m == nil {
			q.m = make(map[debtKey]*debt)
		}
		*seq++
		d = &debt{seq: *seq, cl: cl}
		q.m[k] = d
		q.order = append(q.order, k)
	}
	if hasRef && (!d.hasRef || ref > d.ref) {
		d.ref, d.hasRef = ref, true
	}
	d.shape = sh
	added := min(n, math.MaxInt32-d.n)
	if over := n - added; over > 0 {
		lm.stats.forgiven.Add(int64(over))
	}
	d.n += added
	return added, true
}

// prune drops from q's order the keys among its first debtScan that q no longer holds
// (debtTrip took them), keeping the others in their order.
func (q *owed) prune() {
	if q == nil {
		return
	}
	n := min(len(q.order), debtScan)
	kept := slices.DeleteFunc(q.order[:n], func(k debtKey) bool { return q.m[k] == nil })
	if q.order = append(kept, q.order[n:]...); len(q.order) == 0 {
		q.order = nil
	}
}

// head is q's debt first owed, nil if none.
func (q *owed) head() *debt {
	if q == nil || len(q.order) == 0 {
		return nil
	}
	return q.m[q.order[0]]
}

// settle takes up to n tokens off the debt of (lm, key), and returns how many, and what
// is left of it (0: the debt is gone).
func (q *owed) settle(lm *Limit, key string, n int) (taken, left int) {
	k := debtKey{lm, key}
	d := q.m[k]
	if d == nil || n <= 0 {
		return 0, 0
	}
	x := min(n, d.n)
	if d.n -= x; d.n == 0 {
		delete(q.m, k)
		if q.order = slices.DeleteFunc(q.order, func(o debtKey) bool { return o == k }); len(q.order) == 0 {
			q.order = nil
		}
	}
	return x, d.n
}

// forgive drops every debt of q, counted in LimitStats.Forgiven.
func (q *owed) forgive() (n int) {
	for _, k := range q.order {
		d := q.m[k]
		n += d.n
		k.lim.stats.owed.Add(-int64(d.n))
		k.lim.stats.forgiven.Add(int64(d.n))
	}
	q.m, q.order = nil, nil
	return n
}

// debtFloor is how far below zero s's debts may take its bucket: Burst + Rate·DebtWindow.
func (s *Shape) debtFloor() int {
	f := float64(s.cfg.Burst) + s.cfg.Rate*DebtWindow.Seconds()
	return int(min(f, float64(redisstore.MaxDebt)))
}

// owe records n tokens the FailLocal fallback of shape sh admitted for key of lm without
// the bucket: a debt, charged to the bucket once Redis answers again (debtTrip), so that
// over windows that include the repayment the fleet admits within the limit's bound
// even when only some servers lost Redis.
//
// ref is the credit the bucket answered at this server's last grant for the key (hasRef:
// there was one): the refill the bucket loses to its cap from there on is forgiven
// first (luascript.Refund), which is what a full outage costs nothing by. With several, the
// latest is kept: it forgives the least.
func (e *Engine) owe(lm *Limit, sh *Shape, key string, n int, ref float64, hasRef bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.finished {
		lm.stats.forgiven.Add(int64(n))
		return
	}
	if added, ok := e.debts.add(lm, sh, key, n, ref, hasRef, &e.debtSeq, nil); ok {
		e.debtWait = true
		lm.stats.owed.Add(int64(added))
	}
}

// settle takes n tokens of key of lm, admitted by the failure policy and paid since by the
// grant of the refill the requests had waited for (answer, Late), off what this server
// owes the bucket (FailLocal's debt): counted as charged. The n tokens are spent, not
// held.
func (e *Engine) settle(lm *Limit, key string, n int) {
	if n <= 0 {
		return
	}
	lm.stats.paid.Add(int64(n))
	e.mu.Lock()
	x, _ := e.debts.settle(lm, key, n)
	e.mu.Unlock()
	lm.stats.owed.Add(-int64(x))
	lm.stats.charged.Add(int64(x))
}

// debtsDue reports whether debts wait and can be sent: no debt trip failed in the last
// debtRetry, and either FailLocal's debts wait and Redis answered a trip since FailLocal
// last owed (a debt sent while Redis does not answer would only time out, and count
// against the breaker), past the spread after that answer (debtsMayGo), or async
// admissions wait and their charges are due (Async passed since the first of them);
// and, while a breaker is open, one of them is owed to a bucket whose breaker is not (a
// Cluster's other masters: planDebts). It requires that e.mu is held.
func (e *Engine) debtsDue() bool {
	if !e.debtHoldUntil.IsZero() {
		return false
	}
	debts, charges := e.owedDue()
	due := len(e.debtRetry) > 0 && (debts != nil || charges != nil) || debts.len() > 0 || charges.len() > 0
	if !due || e.open == nil || !e.open() {
		return due
	}
	retry, items := e.planDebts(debts, charges, true, 1)
	return retry >= 0 || len(items) > 0
}

// owedDue returns FailLocal's debts if they may go (debtsMayGo) and the charges if they
// are due (dueCharges), nil for each that may not. It requires that e.mu is held.
func (e *Engine) owedDue() (debts, charges *owed) {
	if e.debtsMayGo() {
		debts = &e.debts
	}
	return debts, e.dueCharges()
}

// debtScan bounds the debts a debt trip looks at while a breaker is open (debtsDue,
// debtTrip): those owed to a bucket behind it stay owed, in their order, and the next
// trip looks at the same ones first.
const debtScan = 4 * MaxBatch

// bucketOpen reports whether the breaker that guards the bucket of limit and key (its
// ID) is open (Config.KeyOpen, which New sets whenever BreakerOpen is).
func (e *Engine) bucketOpen(limit, key string) bool {
	return e.keyOpen != nil && e.keyOpen(limit, key)
}

// owedItem is a debt of q, of bucket k, planned for the next debt trip.
type owedItem struct {
	q *owed
	k debtKey
	d *debt
}

// planDebts chooses what the next debt trip sends, while a breaker is open if open:
// the retry at index retry of debtRetry, or (retry -1) items, at most max, of the
// first debtScan debts of debts and charges (either may be nil) in the order first
// owed. Without an open breaker it is the first retry, or the first debts. With one, a
// debt of a bucket behind an open breaker stays owed, in its place, and so does every
// debt of a bucket that a retry passed over holds: a later debt of a bucket must not go
// before an earlier one (charged), and a retry goes whole, under its numbers, once none
// of its buckets is behind an open breaker. It changes nothing; it requires that e.mu
// is held.
func (e *Engine) planDebts(debts, charges *owed, open bool, max int) (retry int, items []owedItem) {
	// The buckets of the retries passed over, by the limit's name: a limit's companions
	// (reps.go) share it, and their debts of a key are of the same bucket.
	type bucketName struct{ limit, key string }
	var held map[bucketName]bool
	for i, b := range e.debtRetry {
		if !open {
			return i, nil
		}
		blocked := false
		for _, r := range b.reqs {
			if held[bucketName{r.Limit.Name, string(r.ID)}] || e.bucketOpen(r.Limit.Name, string(r.ID)) {
				blocked = true
				break
			}
		}
		if !blocked {
			return i, nil
		}
		if held == nil {
			held = make(map[bucketName]bool)
		}
		for _, r := range b.reqs {
			held[bucketName{r.Limit.Name, string(r.ID)}] = true
		}
	}
	walkOwed(debts, charges, func(q *owed, k debtKey, d *debt) bool {
		if !open || !held[bucketName{k.lim.name, k.key}] && !e.bucketOpen(k.lim.name, k.key) {
			items = append(items, owedItem{q, k, d})
		}
		return len(items) < max
	})
	return -1, items
}

// walkOwed calls fn with the first debtScan debts of debts and charges (either may be
// nil) in the order first owed, until fn returns false.
func walkOwed(debts, charges *owed, fn func(q *owed, k debtKey, d *debt) bool) {
	i, j := 0, 0
	for range debtScan {
		var dk, ck debtKey
		var dd, cd *debt
		if debts != nil && i < len(debts.order) {
			dk = debts.order[i]
			dd = debts.m[dk]
		}
		if charges != nil && j < len(charges.order) {
			ck = charges.order[j]
			cd = charges.m[ck]
		}
		switch {
		case cd != nil && (dd == nil || cd.seq < dd.seq):
			j++
			if !fn(charges, ck, cd) {
				return
			}
		case dd != nil:
			i++
			if !fn(debts, dk, dd) {
				return
			}
		default:
			return
		}
	}
}

// debtsMayGo reports whether FailLocal's debts may go: Redis answered a trip since the
// last was owed, and the spread after that answer is over (redisAnswered); or the
// engine is stopped, whatever was owed since: no answered trip may come before Close's
// last trips, and a debt that waited for one would be forgiven unsent. It requires
// that e.mu is held.
func (e *Engine) debtsMayGo() bool {
	return e.stopped || !e.debtWait && e.debtSpreadUntil.IsZero()
}

// Owes reports whether this server owes buckets tokens not charged yet: FailLocal's
// debts and the charge-later limits' charges, which go only to buckets whose breaker is
// not open (Next offers no trip of the others), unlike refunds.
func (e *Engine) Owes() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.debts.len() > 0 || e.cl.charges.len() > 0 || len(e.debtRetry) > 0
}

// debtTrip returns the next trip of debts: a batch sent before that timed out goes again
// with its sequence numbers (Redis answers a charge that ran as a replay), then up to
// MaxBatch debts in the order they were first owed, each as a refund of -n: FailLocal's
// once Redis answered a trip, the charges once due. It requires that e.mu is held.
func (e *Engine) debtTrip() *Trip {
	debts, charges := e.owedDue()
	retry, items := e.planDebts(debts, charges, e.open != nil && e.open(), MaxBatch)
	var batch refundBatch
	if retry >= 0 {
		batch = e.debtRetry[retry]
		e.debtRetry = slices.Delete(e.debtRetry, retry, retry+1)
	}
	resent := len(batch.reqs)
	for _, it := range items {
		d, k := it.d, it.k
		delete(it.q.m, k)
		floor := d.shape.debtFloor()
		batch.reqs = append(batch.reqs, redisstore.RefundRequest{Limit: d.shape.glim, ID: redisstore.KeyID(k.key),
			N: -min(d.n, floor), Floor: floor, Seq: e.nextSeq(), Ref: d.ref, HasRef: d.hasRef})
		batch.lims, batch.charges = append(batch.lims, k.lim), append(batch.charges, d.cl)
		if over := d.n - floor; over > 0 {
			k.lim.stats.forgiven.Add(int64(over))
			k.lim.stats.owed.Add(-int64(over))
		}
	}
	debts.prune()
	charges.prune()
	e.chargesSent()
	if len(batch.reqs) == 0 { // every debt looked at is behind a breaker that opened since debtsDue
		return nil
	}
	return &Trip{Kind: RefundTrip, Refunds: batch.reqs, RefundResults: make([]redisstore.RefundResult, len(batch.reqs)),
		debts: true, lims: batch.lims, charges: batch.charges, resent: resent}
}

// charged counts the answers of a debt trip. A batch that timed out goes again, in
// halves (its charges may have run: each keeps its sequence number), and so do the items
// whose own answer was lost to a timeout (one node's, in a Cluster), with their sequence
// numbers, ahead of the other retries; so does an item sent before whose answer was lost
// and that failed now without running (the first sending may have run: under a fresh
// number Redis would charge it twice). Any other failed item is owed again, with a fresh
// sequence number (Redis answered that it did not run, or the call was refused before it
// was sent). An Async charge answered, or never to be sent, lets its key be admitted
// uncharged again; its answer says whether the key is low.
func (e *Engine) charged(now time.Time, t *Trip) {
	e.stats.refundCalls.Add(1)
	e.mu.Lock()
	finished := e.finished
	// After Stop no Tick ends a hold: the shutdown's next trip is the failed items' last
	// chance, and they go again at once, for stopRetries failed trips (each of which may
	// have taken the breaker's Timeout); Finish forgives what is left.
	hold := !e.stopped || e.stopFailed >= stopRetries
	e.mu.Unlock()
	failed := t.Err != nil || !t.Answered
	var again refundBatch
	for i, r := range t.Refunds {
		err := t.Err
		if t.Answered {
			err = t.RefundResults[i].Err
		}
		lost := !t.Answered || mayHaveRun(err) || err != nil && i < t.resent // it may have run: only its own Seq may go
		failed = failed || err != nil
		if lost && !finished {
			again.add(t, i)
			continue
		}
		lm, cl := t.lims[i], t.charges[i]
		n := -r.N
		lm.stats.owed.Add(-int64(n))
		sh := lm.shapeOf(r.Limit)
		switch {
		case err == nil:
			lm.stats.charged.Add(int64(n))
			if cl != nil {
				cl.charged(sh, string(r.ID), true, t.RefundResults[i].Remaining, now)
			}
		case lost:
			lm.stats.forgiven.Add(int64(n)) // after Finish: nothing will send it
			if cl != nil {
				cl.charged(sh, string(r.ID), false, 0, now)
			}
		default:
			if sh == nil {
				sh = lm.Shape("")
			}
			if cl != nil {
				cl.charge(sh, string(r.ID), n, now)
			} else {
				e.owe(lm, sh, string(r.ID), n, r.Ref, r.HasRef)
			}
		}
	}
	if len(again.reqs) > 0 {
		e.mu.Lock()
		// Back at the head of the retries, in their order: a later item of a bucket must
		// not run before an earlier one, which Redis would then answer stale, charging
		// nothing (refund.lua: the server's record of the bucket holds the later number).
		parts := []refundBatch{again}
		if t.timedOutWhole() && len(again.reqs) > 1 {
			a, b := again.halves()
			parts = []refundBatch{a, b}
		}
		e.debtRetry = append(parts, e.debtRetry...)
		e.mu.Unlock()
	}
	if failed { // the trip, or one of its items: the debts wait debtRetry (hold)
		e.mu.Lock()
		if hold {
			e.debtHoldUntil = now.Add(debtRetry)
		}
		if e.stopped {
			e.stopFailed++
		}
		e.mu.Unlock()
	}
}

// shapeOf returns the current shape whose bucket is g, nil if none is.
func (lm *Limit) shapeOf(g redisstore.Limit) *Shape {
	for _, s := range lm.cur.Load().all() {
		if s.glim == g {
			return s
		}
	}
	return nil
}

// forgiveDebts drops every debt not sent (Finish): counted in LimitStats.Forgiven. It
// requires that e.mu is held.
func (e *Engine) forgiveDebts() (n int) {
	n = e.debts.forgive() + e.forgiveCharges()
	for _, b := range e.debtRetry {
		for i, r := range b.reqs {
			n -= r.N
			b.lims[i].stats.owed.Add(int64(r.N))
			b.lims[i].stats.forgiven.Add(-int64(r.N))
		}
	}
	e.debtRetry = nil
	return n
}

// chargesDebt reports whether admissions of sh's fallback are owed to the bucket:
// FailLocal's are (its local share is admitted without the bucket); FailOpen admits
// everything, so that charging it would only punish the key after the outage, and
// FailClosed admits nothing.
func (s *Shape) chargesDebt() bool { return s.fallback.Kind() == fallback.Local }
