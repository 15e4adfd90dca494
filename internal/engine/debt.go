package engine

import (
	"math"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
)

// DebtWindow sizes how far below zero the debts of FailLocal may take a bucket: its
// burst plus DebtWindow of its rate. A partition that lets some servers admit their
// local shares while the others lease the whole rate is charged in full if their extra
// admissions stay within it (with half the servers cut off, a partition of 20 s).
const DebtWindow = 10 * time.Second

// debtRetry is how long debts wait after a debt trip failed before they go again: a
// Redis that answers errors must not be asked in a loop.
const debtRetry = 250 * time.Millisecond

// maxDebtKeys bounds the keys with debts one engine holds: past it, new keys' debts are
// forgiven (counted in LimitStats.Forgiven).
const maxDebtKeys = 100_000

// debtKey names the bucket a debt is owed to, and which kind of debt it is: FailLocal's
// and Async's are kept apart (a FailLocal debt is forgiven against its reference and
// waits for Redis to answer; an Async charge is neither).
type debtKey struct {
	lim   *Limit
	key   string // the key's ID
	async bool
}

// debt is what one server owes one bucket: tokens its FailLocal fallback admitted, or
// (async) tokens a limit with Async admitted uncharged.
type debt struct {
	shape  *Shape // the key's shape when it was last admitted
	n      int
	ref    float64 // the bucket's credit at this server's last grant, if hasRef
	hasRef bool
	async  bool // Async admissions (async.go): it goes once due
}

// debtFloor is how far below zero s's debts may take its bucket: Burst + Rate·DebtWindow.
func (s *Shape) debtFloor() int {
	f := float64(s.cfg.Burst) + s.cfg.Rate*DebtWindow.Seconds()
	return int(min(f, float64(global.MaxDebt)))
}

// owe records n tokens the FailLocal fallback of shape sh admitted for key of lm without
// the bucket: a debt, charged to the bucket once Redis answers again (debtTrip), so that
// over windows that include the repayment the fleet admits within the limit's bound
// even when only some servers lost Redis.
//
// ref is the credit the bucket answered at this server's last grant for the key (hasRef:
// there was one): the refill the bucket loses to its cap from there on is forgiven
// first (lua.Refund), which is what a full outage costs nothing by. With several, the
// latest is kept: it forgives the least.
func (e *Engine) owe(lm *Limit, sh *Shape, key string, n int, ref float64, hasRef bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.finished {
		lm.stats.forgiven.Add(int64(n))
		return
	}
	if e.addDebt(lm, sh, key, n, ref, hasRef, false) {
		e.debtWait = true
		lm.stats.owed.Add(int64(n))
	}
}

// addDebt adds n tokens to what this server owes the bucket of (lm, key), of shape sh:
// a debt of FailLocal's (with its reference) or, if async, an admission of a limit with
// Async. It reports false when the debt was forgiven instead (too many keys owed). It
// requires that e.mu is held.
func (e *Engine) addDebt(lm *Limit, sh *Shape, key string, n int, ref float64, hasRef, async bool) bool {
	k := debtKey{lm, key, async}
	d, ok := e.debts[k]
	if !ok {
		if len(e.debts) >= maxDebtKeys {
			lm.stats.forgiven.Add(int64(n))
			return false
		}
		if e.debts == nil {
			e.debts = make(map[debtKey]*debt)
		}
		d = &debt{}
		e.debts[k] = d
		e.debtOrder = append(e.debtOrder, k)
	}
	if hasRef && (!d.hasRef || ref > d.ref) {
		d.ref, d.hasRef = ref, true
	}
	d.shape = sh
	d.n = int(min(float64(d.n)+float64(n), math.MaxInt32))
	if async && !d.async {
		d.async = true
		e.asyncDebts++
	}
	return true
}

// debtsDue reports whether debts wait and can be sent: no debt trip failed in the last
// debtRetry, the breaker is not open, and either FailLocal's debts wait and Redis
// answered a trip since FailLocal last owed (a debt sent while Redis does not answer
// would only time out, and count against the breaker), or async admissions wait and
// their charges are due (Async passed since the first of them). It requires that e.mu
// is held.
func (e *Engine) debtsDue() bool {
	if e.debtHeld || e.open != nil && e.open() {
		return false
	}
	ready := !e.debtWait || e.asyncDue
	return len(e.debtRetry) > 0 && ready || !e.debtWait && len(e.debtOrder) > e.asyncDebts || e.asyncDue && e.asyncDebts > 0
}

// debtTrip returns the next trip of debts: a batch sent before that timed out goes again
// with its sequence numbers (Redis answers a charge that ran as a replay), then up to
// MaxBatch debts in the order they were first owed, each as a refund of -n: FailLocal's
// once Redis answered a trip, the async admissions' once due. It requires that e.mu is
// held.
func (e *Engine) debtTrip() *Trip {
	var batch debtBatch
	if len(e.debtRetry) > 0 {
		batch, e.debtRetry = e.debtRetry[0], e.debtRetry[1:]
	} else {
		rest := e.debtOrder[:0:0]
		for i, k := range e.debtOrder {
			d := e.debts[k]
			if len(batch.reqs) == MaxBatch {
				rest = append(rest, e.debtOrder[i:]...)
				break
			}
			if d.async && !e.asyncDue || !d.async && e.debtWait {
				rest = append(rest, k)
				continue
			}
			delete(e.debts, k)
			if d.async {
				e.asyncDebts--
			}
			floor := d.shape.debtFloor()
			batch.reqs = append(batch.reqs, global.RefundRequest{Limit: d.shape.glim, ID: global.KeyID(k.key),
				N: -min(d.n, floor), Floor: floor, Seq: e.nextSeq(), Ref: d.ref, HasRef: d.hasRef})
			batch.async = append(batch.async, d.async)
			if over := d.n - floor; over > 0 {
				k.lim.stats.forgiven.Add(int64(over))
				k.lim.stats.owed.Add(-int64(over))
			}
		}
		e.debtOrder = rest
	}
	if e.asyncDebts == 0 && len(e.debtRetry) == 0 {
		e.asyncDue = false // the next async admission waits Async again
	}
	return &Trip{Kind: RefundTrip, Refunds: batch.reqs, RefundResults: make([]global.RefundResult, len(batch.reqs)),
		debts: true, asyncDebts: batch.async}
}

// debtBatch is the items of a debt trip, and which of them are Async's charges.
type debtBatch struct {
	reqs  []global.RefundRequest
	async []bool
}

// charged counts the answers of a debt trip. A batch that timed out goes again whole
// (its charges may have run); a failed item is owed again, with a fresh sequence number
// (Redis answered that it did not run). An Async charge answered, or never to be sent,
// lets its key be admitted uncharged again; its answer says whether the key is low.
func (e *Engine) charged(now time.Time, t *Trip) {
	e.stats.refundCalls.Add(1)
	if t.Err != nil || !t.Answered {
		e.mu.Lock()
		e.debtHeld, e.debtHoldUntil = true, now.Add(debtRetry)
		e.mu.Unlock()
	}
	if !t.Answered {
		e.mu.Lock()
		if !e.finished {
			e.debtRetry = append(e.debtRetry, debtBatch{t.Refunds, t.asyncDebts})
			e.mu.Unlock()
			return
		}
		e.mu.Unlock()
	}
	for i, r := range t.Refunds {
		err := t.Err
		if t.Answered {
			err = t.RefundResults[i].Err
		}
		lm := e.limitNamed(r.Limit.Name)
		if lm == nil {
			continue
		}
		async := t.asyncDebts[i]
		n := -r.N
		lm.stats.owed.Add(-int64(n))
		sh := lm.shapeOf(r.Limit)
		switch {
		case err == nil:
			lm.stats.charged.Add(int64(n))
			if async {
				if sh != nil && sh.cfg.Async > 0 {
					lm.low.note(sh, string(r.ID), t.RefundResults[i].Remaining, now)
				}
				lm.low.charged(string(r.ID))
			}
		case !t.Answered:
			lm.stats.forgiven.Add(int64(n)) // after Finish: nothing will send it
			if async {
				lm.low.charged(string(r.ID))
			}
		default:
			e.mu.Lock()
			e.debtHeld, e.debtHoldUntil = true, now.Add(debtRetry)
			e.mu.Unlock()
			if sh == nil {
				sh = lm.Shape("")
			}
			if async {
				e.oweAsync(lm, sh, string(r.ID), n, now)
			} else {
				e.owe(lm, sh, string(r.ID), n, r.Ref, r.HasRef)
			}
		}
	}
}

// shapeOf returns the current shape whose bucket is g, nil if none is.
func (lm *Limit) shapeOf(g global.Limit) *Shape {
	for _, s := range lm.cur.Load().all() {
		if s.glim == g {
			return s
		}
	}
	return nil
}

// forgiveDebts drops every debt not sent (Finish): counted in LimitStats.Forgiven. It
// requires that e.mu is held.
func (e *Engine) forgiveDebts() {
	for _, k := range e.debtOrder {
		d := e.debts[k]
		k.lim.stats.owed.Add(-int64(d.n))
		k.lim.stats.forgiven.Add(int64(d.n))
	}
	for _, b := range e.debtRetry {
		for _, r := range b.reqs {
			if lm := e.limitNamed(r.Limit.Name); lm != nil {
				lm.stats.owed.Add(int64(r.N))
				lm.stats.forgiven.Add(-int64(r.N))
			}
		}
	}
	e.debts, e.debtOrder, e.debtRetry, e.asyncDebts = nil, nil, nil, 0
}

// chargesDebt reports whether admissions of sh's fallback are owed to the bucket:
// FailLocal's are (its local share is admitted without the bucket); FailOpen admits
// everything, so that charging it would only punish the key after the outage, and
// FailClosed admits nothing.
func (s *Shape) chargesDebt() bool { return s.fallback.Policy().Kind() == breaker.KindLocal }
