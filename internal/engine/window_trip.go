package engine

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/keystore"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// maxWindowOps is the most counts one trip carries for a limit (redisstore.MaxWindowOps
// allows more): about 1 ms of Redis's time, so that one server's report never holds
// Redis long.
const maxWindowOps = 4096

// windowItem is what the engine keeps of one windowed limit's part of a WindowsTrip:
// its round trips, one per shard with work, are t.Windows[first:first+n].
type windowItem struct {
	wl       *windowed
	ops      []wop
	announce map[wmk]int
	warms    bool        // its reads, answered, make the server warm
	prevRead []time.Time // by shard: lastRead before the reads it sent
	sentAt   time.Time
	first, n int
	trip     []int // by shard: the index of its trip among the item's, -1: none
}

// windowPending is one decision the answers of a trip made for a waiting request, made
// once no lock is held (a Waiter's mutex goes before a key's).
type windowPending struct {
	w    *Waiter
	d    Decision
	fail error // decide by the policy instead, for this failure
	win  int64 // the window whose grant d spends
}

// decide is Decide for a windowed limit.
func (wl *windowed) decide(now int64, _, key string, n int) (Decision, *Waiter) {
	lm, e := wl.lm, wl.lm.e
	var o wdecision
	if !wl.decideLocked(&o, now, wire.KeyID(key), n) {
		return Decision{Reason: ReasonClosed, Servers: e.Servers()}, nil
	}
	o.d.Servers = e.Servers()
	if o.wake {
		e.wake()
	}
	if o.w != nil {
		return o.d, o.w
	}
	lm.stats.count(&o.d, n)
	return o.d, nil
}

// decideLocked is hitKey, or decideKey if the key's grants cannot serve the request
// alone, for a new request for the key of ID id, under its store lock, as
// bucket.decideLocked is for a bucket kind; false once the store is closed. The lock is
// released by a defer only past the hit (missLocked), as bucket.decideLocked's is.
func (wl *windowed) decideLocked(o *wdecision, now int64, id string, n int) bool {
	keys := wl.lm.keys
	ksh, ke, ok := keys.Acquire(now, id)
	if !ok {
		return false
	}
	en, t := &ke.Val, ke.Touch(now)
	if en.shape == wl.lm.cur.Load().base && wl.hitKey(o, en, t, n) {
		keys.Release(ksh)
		return true
	}
	wl.missLocked(o, ksh, en, t, n)
	return true
}

// missLocked is decideKey for decideLocked, which holds the lock of shard sh: it
// releases it, by a defer.
func (wl *windowed) missLocked(o *wdecision, sh *keystore.Shard[entry], en *entry, t int64, n int) {
	lm := wl.lm
	defer lm.keys.Release(sh) // a panic must not leave the shard locked
	// a new key, or a new pre-check (SetLimit)
	if s := lm.cur.Load().base; en.shape != s {
		lm.reshape(en, s, t)
	}
	wl.decideKey(o, en, t, n)
}

// hit: a windowed key's common path (fastDecide) runs under the key's lock beside the
// limit's report state; StartMulti takes the full path for windowed items.
func (wl *windowed) hit(int64, string, string, int) (Decision, bool) {
	return Decision{}, false
}

// unhit: hit serves nothing.
func (wl *windowed) unhit(int64, string, string, int) {}

// tick advances the windowed limit's schedule to now and reports whether a trip is due.
func (wl *windowed) tick(now time.Time) bool {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	if wl.stopped.Load() {
		return false
	}
	wl.now(now)
	wl.begin(now)
	for i := range wl.warmAt {
		if !wl.warmAt[i].IsZero() && !now.Before(wl.warmAt[i]) {
			wl.warmAt[i] = time.Time{}
			wl.due.Store(true)
		}
	}
	if !now.Before(wl.nextTick) {
		// The report is judged at the instant it was due, g, not when the tick ran: a
		// tick that runs late (a busy process) must not make the next one skip its
		// report as if a round trip had just gone.
		g := wl.nextTick
		for !now.Before(wl.nextTick) {
			g, wl.nextTick = wl.nextTick, wl.nextTick.Add(wl.iv)
		}
		if g.Sub(wl.sent) >= wl.iv || !wl.warm.Load() || wl.hasCarry() {
			wl.due.Store(true)
			wl.report = g
		}
		for id, m := range wl.marks { // forget what no longer says anything
			if now.After(m.low) && now.After(m.over) && now.Sub(m.at) > windowMemory {
				delete(wl.marks, id)
			}
		}
	}
	return wl.due.Load()
}

func (wl *windowed) hasCarry() bool {
	for i := range wl.ops {
		if wl.ops[i].carry {
			return true
		}
	}
	return false
}

// nextTickAt is when tick next has work; it requires wl.mu.
func (wl *windowed) nextTickAt() time.Time {
	t := wl.nextTick
	for _, w := range wl.warmAt {
		if !w.IsZero() && w.Before(t) {
			t = w
		}
	}
	return t
}

// urgentWork reports whether something queued goes at once; it requires wl.mu.
//
// Marks go at once only with a key's first mark in a while (mark), the others with the
// next report: a trip of their own puts the report off by an interval (a report goes an
// interval after the last trip, tick). On the simulator's many-keys suite, with every
// mark sent at once the admissions without asking were answered 90 ms after on average
// instead of 70, and more requests found one unanswered and waited; with first marks
// held back as well, a key turning hot 5 s into the run went past the bound with S·c
// (seeds 11 and 15).
func (wl *windowed) urgentWork() bool {
	if len(wl.announce) > 0 && wl.urgent {
		return true
	}
	for i := range wl.ops {
		if op := &wl.ops[i]; op.now || op.w != nil || op.ask != nil && op.ask.now {
			return true
		}
	}
	return false
}

// build takes the limit's queued work into a trip's item at now: a round trip per shard
// with ops, marks or a read due (a shard that holds marks: wire.WindowMarksShard; the
// first also asks Redis's time when it is due), or
// reports false when there is nothing to send or its last trip is out; it requires
// wl.mu.
func (wl *windowed) build(now time.Time) ([]redisstore.WindowTrip, windowItem, bool) {
	wl.due.Store(false)
	warm := wl.warm.Load()
	read := make([]bool, wl.shards)
	anyRead := false
	for i := 0; i < wl.shards; i += wire.WindowMarksGroup(wl.shards) { // the shards that hold marks
		read[i] = now.Sub(wl.lastRead[i]) >= windowRead || !warm
		anyRead = anyRead || read[i]
	}
	// A read makes a trip of its own only while the server admits without asking, which
	// only fresh marks allow; otherwise it goes with trips that go anyway.
	alone := anyRead && (wl.free || !warm)
	if wl.busy || (len(wl.ops) == 0 && len(wl.announce) == 0 && !alone) {
		return nil, windowItem{}, false
	}
	it := windowItem{wl: wl, announce: wl.announce, prevRead: slices.Clone(wl.lastRead), sentAt: now, trip: make([]int, wl.shards)}
	it.warms = anyRead && !now.Before(wl.start.Add(windowWarm))
	wl.announce, wl.urgent = map[wmk]int{}, false
	wl.demOp, wl.admOp = emptied(wl.demOp), emptied(wl.admOp)
	// A report counts as sent at the instant it was due; any other trip when it goes.
	wl.sent = now
	if !wl.report.IsZero() {
		wl.sent, wl.report = wl.report, time.Time{}
	}
	if anyRead {
		wl.free = false
	}
	var trips []redisstore.WindowTrip
	tripOf := func(shard int) *redisstore.WindowTrip {
		if k := it.trip[shard] - 1; k >= 0 {
			return &trips[k]
		}
		trips = append(trips, redisstore.WindowTrip{Limit: wl.glim, Width: wl.width, Shards: wl.shards, Shard: shard,
			Since: wl.since[shard], Skip: wl.skip[shard], Memory: windowMemory, At: now.Add(wl.off())})
		it.trip[shard] = len(trips)
		return &trips[len(trips)-1]
	}
	for i, r := range read {
		if r {
			tripOf(i).Read = true
			wl.lastRead[i] = now
		}
	}
	// At most maxWindowOps a trip: what is left goes with the next, at once.
	ops := wl.ops
	if len(ops) > maxWindowOps {
		// the rest stays where it is: what is appended to it never reaches ops' part
		ops, wl.ops = ops[:maxWindowOps:maxWindowOps], ops[maxWindowOps:]
		wl.due.Store(true)
	} else {
		wl.ops = nil
	}
	for _, op := range ops {
		// An array lives until a second after the end of the window after its own, for
		// every phase (redisstore.Store.Windows): an op of a window that old would make it
		// again, with no deadline.
		if time.UnixMicro((op.win + 2) * wl.wUs).Add(-wl.off()).Before(now) {
			op.dropped = true
			it.ops = append(it.ops, op)
			continue
		}
		it.ops = append(it.ops, op)
		x := tripOf(wire.WindowShard(op.id, wl.shards))
		x.Ops = append(x.Ops, redisstore.WindowOp{ID: redisstore.KeyID(op.id), Win: op.win, N: op.n, Demand: op.demand})
	}
	for k, f := range it.announce {
		x := tripOf(wire.WindowMarksShard(k.id, wl.shards))
		x.Marks = append(x.Marks, redisstore.WindowMark{ID: redisstore.KeyID(k.id), Flags: f, Win: k.win})
	}
	if len(trips) == 0 { // dropped ops alone: a trip still goes, for their answers' turn
		tripOf(0)
	}
	trips[0].Clock = wl.clockAt.IsZero() || now.Sub(wl.clockAt) >= windowClock
	for k := range trips {
		x := &trips[k]
		// by key and window, so that a trip does not depend on map order
		slices.SortFunc(x.Marks, func(a, b redisstore.WindowMark) int {
			return cmp.Or(strings.Compare(string(a.ID), string(b.ID)), cmp.Compare(a.Win, b.Win))
		})
		// A shard's set of marks grows only by what is added to it: it is trimmed with
		// its marks, at most once a windowClock by this server.
		if len(x.Marks) > 0 && now.Sub(wl.tidyAt[x.Shard]) >= windowClock {
			x.Tidy, wl.tidyAt[x.Shard] = true, now
		}
	}
	for i := range it.trip {
		it.trip[i]--
	}
	it.n = len(trips)
	wl.busy = true
	return trips, it, true
}

// windowed yields the windowed limits that may have work: the engine's, then the
// removed ones whose last report has not gone (retiring), after dropping from those the
// ones whose report went. It requires e.mu.
func (e *Engine) windowed(yield func(*windowed) bool) {
	for _, lm := range e.limits.Load().list {
		if wl := lm.windowed(); wl != nil && !yield(wl) {
			return
		}
	}
	if len(e.retiring) == 0 {
		return
	}
	e.retiring = slices.DeleteFunc(e.retiring, func(wl *windowed) bool {
		wl.mu.Lock()
		defer wl.mu.Unlock()
		return !wl.busy && !wl.due.Load()
	})
	for _, wl := range e.retiring {
		if !yield(wl) {
			return
		}
	}
}

// windowTrip builds a WindowsTrip of every windowed limit with work due, or nil; it
// requires e.mu.
func (e *Engine) windowTrip() *Trip {
	var t *Trip
	for wl := range e.windowed {
		wl.mu.Lock()
		if wl.due.Load() {
			if xs, it, ok := wl.build(wl.latest()); ok {
				if t == nil {
					t = &Trip{Kind: WindowsTrip}
				}
				it.first = len(t.Windows)
				t.Windows = append(t.Windows, xs...)
				t.winItems = append(t.winItems, it)
			}
		}
		wl.mu.Unlock()
	}
	if t != nil {
		t.WindowErrs = make([]error, len(t.Windows))
	}
	return t
}

// windowTripInto builds a WindowsTrip into *t and reports whether there was one; it
// requires e.mu.
func (e *Engine) windowTripInto(t **Trip) bool {
	*t = e.windowTrip()
	return *t != nil
}

// windowsDue reports whether a windowed limit wants a trip; it requires e.mu.
func (e *Engine) windowsDue() bool {
	for wl := range e.windowed {
		wl.mu.Lock()
		due := wl.due.Load() && !wl.busy
		wl.mu.Unlock()
		if due {
			return true
		}
	}
	return false
}

// windowsDone takes the answers of a WindowsTrip at now.
func (e *Engine) windowsDone(now time.Time, t *Trip) {
	var pend []windowPending
	wake := false
	for i := range t.winItems {
		it := &t.winItems[i]
		// Answered, each round trip has its own answer: one shard's node being down says
		// nothing of another's, whose counts landed.
		errs := make([]error, it.n)
		for k := range errs {
			errs[k] = t.Err
			if t.Answered {
				errs[k] = t.WindowErrs[it.first+k]
			}
		}
		pend = it.wl.done(now, it, t.Windows[it.first:it.first+it.n], errs, pend)
		it.wl.mu.Lock()
		it.wl.busy = false
		if it.wl.urgentWork() {
			it.wl.due.Store(true)
		}
		wake = wake || it.wl.due.Load()
		it.wl.mu.Unlock()
	}
	for _, p := range pend {
		var decided bool
		if p.fail != nil {
			decided = e.decideFailed(now, p.w, nil, p.fail)
		} else {
			p.w.mu.Lock()
			if decided = !p.w.decided; decided {
				p.d.Servers = e.Servers()
				p.w.set(p.d)
				p.w.counted()
			}
			p.w.mu.Unlock()
			if !decided && p.d.Allowed { // it gave up meanwhile: its grant goes back
				p.w.lim.windowed().undoWin(now, p.w.key, p.w.n, ReasonGranted, p.win)
			}
		}
		if decided && e.decided != nil {
			e.decided(p.w)
		}
	}
	if wake {
		e.wake()
	}
}

// done takes the answers of its item of a trip, xs its round trips and errs their
// errors: what a shard's failed trip carried is put back (failed), the rest answered.
func (wl *windowed) done(now time.Time, it *windowItem, xs []redisstore.WindowTrip, errs []error, pend []windowPending) []windowPending {
	wl.mu.Lock()
	wl.now(now)
	for k := range xs {
		x := &xs[k]
		if errs[k] != nil {
			if x.Read && wl.lastRead[x.Shard].Equal(it.sentAt) {
				wl.lastRead[x.Shard] = it.prevRead[x.Shard]
			}
			continue
		}
		if x.Clock && !x.Now.IsZero() {
			// Redis's time less this server's at the answer: off by at most the round trip.
			wl.offset.Store(int64(x.Now.Sub(now)))
			wl.clockAt = now
		}
		if x.Read {
			wl.read(now, it, x)
		}
	}
	for k, f := range it.announce { // a failed shard's marks go again, while they say something
		if errs[it.trip[wire.WindowMarksShard(k.id, wl.shards)]] != nil && wl.markStands(k, now) {
			wl.announce[k] |= f
		}
	}
	wl.mu.Unlock()
	lm := wl.lm
	pos := make([]int, len(xs)) // the next op of each trip
	for _, op := range it.ops {
		// A key evicted while op was out is not made again (Peek): a new entry has no
		// shape, and the key's requests are decided from op alone.
		if op.dropped { // not sent: its window is long gone
			if !lm.keys.Peek(op.id, func(en *entry, last int64) {
				wl.mu.Lock()
				defer wl.mu.Unlock()
				t := lastOf(now, last)
				wl.key(en.win, en.key, t)
				pend = wl.rejoin(op, en, t, pend)
			}) {
				wl.mu.Lock()
				pend = wl.rejoin(op, nil, now, pend)
				wl.mu.Unlock()
			}
			continue
		}
		k := it.trip[wire.WindowShard(op.id, wl.shards)]
		j := pos[k]
		pos[k]++
		if err := errs[k]; err != nil {
			pend = wl.failed(now, op, err, pend)
			continue
		}
		count := xs[k].Ops[j].Count
		if op.n < 0 { // a give-back: it takes off what this server counted
			lm.keys.Peek(op.id, func(en *entry, _ int64) {
				wl.mu.Lock()
				defer wl.mu.Unlock()
				if st := en.win; st != nil && op.win == st.mineWin {
					st.mine = max(st.mine+op.n, 0)
				}
			})
			continue
		}
		if !lm.keys.Peek(op.id, func(en *entry, last int64) {
			wl.mu.Lock()
			defer wl.mu.Unlock()
			pend = wl.answer(en, op, count, lastOf(now, last), pend)
		}) {
			wl.mu.Lock()
			pend = wl.answerGone(op, count, pend)
			wl.mu.Unlock()
		}
	}
	return pend
}

// read takes the marks x, a shard's round trip, read; it requires wl.mu.
func (wl *windowed) read(now time.Time, it *windowItem, x *redisstore.WindowTrip) {
	if it.warms {
		wl.warm.Store(true)
	}
	wl.since[x.Shard], wl.skip[x.Shard] = x.At.Add(-windowOverlap), 0
	if x.More { // more to read: from where this read ended, at once
		wl.since[x.Shard], wl.skip[x.Shard], wl.lastRead[x.Shard] = x.Resume, x.ResumeSkip, time.Time{}
		wl.due.Store(true)
	}
	for _, m := range x.Got {
		id := string(m.ID)
		old := wl.marks[id]
		phase := wire.WindowPhase(id, wl.wUs)
		if m.Flags&wire.MarkLow != 0 {
			old.low = later(old.low, wl.end(m.Win, phase))
		}
		if m.Flags&wire.MarkSpent != 0 {
			old.spent = max(old.spent, m.Win+1)
		}
		if m.Flags&wire.MarkOver != 0 {
			old.over = later(old.over, m.At.Add(-wl.off()).Add(windowMemory))
		}
		old.at = now
		wl.marks[id] = old
	}
	if len(x.Got) > 0 {
		wl.marksGen.Add(1) // a key's next decision learns them (key)
	}
}

// markStands reports whether a mark of key k.id for window k.win, not sent yet, still
// says something at now: a low or spent mark holds until its window's end, an over
// mark for windowMemory from when it is written. Past both, a failed trip drops it
// rather than putting it back, so that an outage of the master that holds a key's marks
// does not pile up a mark for each of its windows.
func (wl *windowed) markStands(k wmk, now time.Time) bool {
	return now.Before(wl.end(k.win, wire.WindowPhase(k.id, wl.wUs)).Add(windowMemory))
}

// own adds what op added to the key's count to what this server counted in window
// op.win (st.mine), and returns how much of that the count answered misses, 0 if none:
// a count is never below what one server alone added to it (counters only grow but by
// that server's own give-backs, and the smaller of two counters is at least the key's
// count), unless the array was lost. It then takes the count as this server's part from
// now on, so that the ops answered after it in the same trip do not find the loss again.
// It requires wl.mu.
func (wl *windowed) own(st *wkey, op wop, count int) int {
	switch {
	case op.win > st.mineWin:
		st.mineWin, st.mine = op.win, 0
	case op.win < st.mineWin:
		return 0
	}
	st.mine += op.n
	if miss := st.mine - count; miss > 0 {
		st.mine = count
		return miss
	}
	return 0
}

// answerGone takes the count answered for op of a key no longer held (evicted while op
// was out, or the store drained): its admissions are answered, its overshoot carried;
// a grant serves the requests that waited for it, in order, as far as it goes, the rest
// refused, and what none of them spent goes back to its window. It requires wl.mu.
func (wl *windowed) answerGone(op wop, count int, pend []windowPending) []windowPending {
	switch {
	case op.demand:
		return pend
	case !op.grant: // as answer: admissions answered, and a carry's overshoot carried too
		if op.admits() {
			wl.answerOut(nil, op.id, op.n)
		}
		wl.carry(op, count)
		return pend
	}
	left := wl.granted(op, count)
	serve := func(w *Waiter) {
		if left >= w.n {
			left -= w.n
			pend = append(pend, windowPending{w: w, d: Decision{Allowed: true, Remaining: left, Source: SourceGlobal, Reason: ReasonGranted}, win: op.win})
			return
		}
		pend = append(pend, windowPending{w: w, d: Decision{Source: SourceGlobal, Reason: ReasonPaced, RetryAfter: wl.refill()}})
	}
	if op.w != nil {
		serve(op.w)
	}
	if op.ask != nil {
		for _, w := range op.ask.waiters {
			serve(w)
		}
		op.ask.waiters = nil
	}
	if left > 0 { // as evicted gives back a key's grants
		wl.queue(wop{id: op.id, win: op.win, n: -left})
		wl.due.Store(true)
	}
	return pend
}

// owe adds n to what key id, no longer held, has unanswered: an eviction adds what the
// entry had, an answer takes off what it answers. The store reports an eviction once the
// key's lock is let go, so an answer may come between the two, or after a new entry of
// the key was made: the key then owes below zero until the eviction is recorded.
func (wl *windowed) owe(id string, n int) {
	if out := wl.gone[id] + n; out != 0 {
		wl.gone[id] = out
		wl.goneMax = max(wl.goneMax, len(wl.gone))
	} else {
		wl.forget(id)
	}
}

// answerOut takes n answered admissions off the unanswered ones of key id, whose state is
// st (nil: no longer held): what st does not hold belongs to an entry of the key evicted
// before st was made.
func (wl *windowed) answerOut(st *wkey, id string, n int) {
	d := 0
	if st != nil {
		d = min(st.out, n)
		st.out -= d
	}
	if n > d {
		wl.owe(id, d-n)
	}
}

// granted is what grant op got of what it asked, the key's count answered being count:
// as far as the count stays within the burst.
func (wl *windowed) granted(op wop, count int) int {
	return min(op.n, max(0, wl.glim.Burst-(count-op.n)))
}

// carry counts in the next window the part of an overshoot that op, a count answered
// count, is responsible for: at most its own n. The parts of all the counts answered
// over the burst add up to at least what the window admitted over it (the count also
// holds the refused parts of grants, left counted), and a carry's own overshoot is
// carried in turn, so a window's overshoot is taken from the next, and what that one
// cannot hold from the one after, however many windows it takes. Over any run of whole
// windows a key is admitted at most Burst per window plus the debt still carried.
func (wl *windowed) carry(op wop, count int) {
	if x := min(op.n, count-wl.glim.Burst); x > 0 {
		wl.queue(wop{id: op.id, win: op.win + 1, n: x, carry: true})
	}
}

// forget drops key id from gone, and gone's memory with its last key: a map keeps what
// it grew to, and a burst of one-shot keys grows it to the burst's size.
func (wl *windowed) forget(id string) {
	delete(wl.gone, id)
	if len(wl.gone) == 0 && wl.goneMax > smallMap {
		wl.gone, wl.goneMax = map[string]int{}, 0
	}
}

// smallMap is the most keys a map of a windowed limit keeps the memory of once emptied.
const smallMap = 1024

// emptied returns m emptied: cleared, or a new map if it had grown past smallMap.
func emptied[V any](m map[string]V) map[string]V {
	if len(m) > smallMap {
		return map[string]V{}
	}
	clear(m)
	return m
}

// undo gives back n of key id that a decision admitted for reason r in window win (the
// key's current one if win < 0): a request that waited gave up before its grant came,
// or Return undoes a decision (a multi-limit request another limit denied, a
// reservation canceled). The pre-check gets its tokens back; grants go back to the
// window if it is still the key's; an admission without asking is taken back from its
// count with the next report. A fallback's admission, or a key no longer held, stays
// counted, which is conservative. It reports whether anything went back to the window.
func (wl *windowed) undoWin(now time.Time, id string, n int, r Reason, win int64) (back bool) {
	wl.lm.keys.Peek(id, func(en *entry, last int64) {
		t := lastOf(now, last)
		en.pre.AllowN(t.UnixNano(), -n)
		wl.mu.Lock()
		defer wl.mu.Unlock()
		st := en.win
		if !st.init {
			return
		}
		wl.key(st, en.key, t)
		if win < 0 {
			win = st.win
		}
		switch {
		case win != st.win:
		case r == ReasonAsync:
			wl.queue(wop{id: en.key, win: st.win, n: -n})
			back = true
		case r == ReasonLease || r == ReasonGranted:
			st.grants += n
			back = true
		}
	})
	return back
}

// admitFallback counts n that the limit's policy admitted for the key of en, in its
// window with the next report (there is no bucket to owe), and reports whether it could:
// not with the queue full (count), when the request is refused for a report interval.
// It requires the key's lock.
func (wl *windowed) admitFallback(en *entry, t time.Time, n int) (bool, time.Duration) {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	wl.key(en.win, en.key, t)
	if !wl.count(en.key, en.win.win, n) {
		return false, wl.iv
	}
	en.win.out += n
	return true, 0
}

// fellBack: the admission is counted already (admitFallback); nothing is owed.
func (wl *windowed) fellBack(*Shape, string, int, float64, bool) {}

// undo is undoWin in the key's window at the instant at, the decision's (on this
// server's clock against Redis's as last measured): a decision counted in a window that
// has ended gives nothing back. It returns n if anything went back.
func (wl *windowed) undo(now, at time.Time, _, id string, n int, d Decision) int {
	if wl.undoWin(now, id, n, d.Reason, wire.WindowIndex(wl.rnow(at), wire.WindowPhase(id, wl.wUs), wl.wUs)) {
		return n
	}
	return 0
}

// claim: a windowed limit has no bucket to claim a refill from; a reservation holds
// only what decide admits.
func (wl *windowed) claim(time.Time, string, int) (Decision, *Waiter) {
	return Decision{RetryAfter: InfDuration, Servers: wl.lm.e.Servers()}, nil
}

// initKey gives a new key its window state.
func (wl *windowed) initKey(en *entry) { en.win = new(wkey) }

// rejoin takes back op, not sent because its window ended long before its trip went
// (a stalled client): Redis is healthy, so its requests are not the failure policy's.
// They wait again for a grant of the key's current window; a key no longer held (en nil)
// has none to ask, and its requests are refused, to try again after a refill, as those a
// grant of a key gone does not cover (answerGone). It requires wl.mu, and the key's lock
// if en is set.
func (wl *windowed) rejoin(op wop, en *entry, now time.Time, pend []windowPending) []windowPending {
	var st *wkey
	if en != nil {
		st = en.win
	}
	if wl.stopped.Load() { // nothing would answer a new grant: closed, as stop decides
		return wl.release(op, st, errClosed, pend)
	}
	w := op.w
	var ws []*Waiter
	if op.ask != nil {
		ws, op.ask.waiters = op.ask.waiters, nil
	}
	op.w = nil
	pend = wl.release(op, st, nil, pend)
	decide := func(w *Waiter) {
		if st == nil {
			pend = append(pend, windowPending{w: w, d: Decision{Source: SourceGlobal, Reason: ReasonPaced, RetryAfter: wl.refill()}})
			return
		}
		pend = wl.serve(en, w, now, pend)
	}
	if w != nil {
		decide(w)
	}
	for _, w := range ws {
		decide(w)
	}
	return pend
}

// release ends what op held when it got no answer: its requests are decided for fail
// (by the policy, or closed), its key (st, nil if not at hand) asks again, and an
// admission is no longer unanswered. It requires wl.mu, and the key's lock if st is set.
func (wl *windowed) release(op wop, st *wkey, fail error, pend []windowPending) []windowPending {
	if st != nil {
		if op.ask != nil && st.ask == op.ask {
			st.ask = nil
		}
		if op.nextWin {
			st.nextAsked = false
		}
	}
	if op.admits() {
		wl.answerOut(st, op.id, op.n)
	}
	if op.w != nil {
		pend = append(pend, windowPending{w: op.w, fail: fail})
	}
	if op.ask != nil {
		for _, w := range op.ask.waiters {
			pend = append(pend, windowPending{w: w, fail: fail})
		}
		op.ask.waiters = nil
	}
	return pend
}

// answer takes the count answered for op of the key of en; it requires the key's lock
// and wl.mu.
func (wl *windowed) answer(en *entry, op wop, count int, now time.Time, pend []windowPending) []windowPending {
	burst := wl.glim.Burst
	st := en.win
	wl.key(st, en.key, now)
	if op.demand {
		if op.win >= st.demWin {
			st.demWin, st.dem, st.demAt = op.win, count, at(now)
		}
		return pend
	}
	if miss := wl.own(st, op, count); miss > 0 {
		// The window's array was lost (evicted, flushed, Redis restarted empty): count
		// again what this server knows it added there, as the other servers do when
		// their answers show the loss, so that the window does not start over empty.
		wl.lm.stats.lostBuckets.Add(1)
		wl.queue(wop{id: en.key, win: op.win, n: miss, carry: true})
		wl.due.Store(true)
	}

	cur := st.win == op.win
	if op.ask != nil && st.ask == op.ask {
		st.ask = nil
	}
	got := 0
	if op.grant {
		got = wl.granted(op, count)
	}
	switch {
	case op.carry:
	case !op.grant:
		wl.answerOut(st, en.key, op.n)
	case op.w != nil:
		if got < op.w.n {
			got = 0
		}
		d := Decision{Allowed: got > 0, Source: SourceGlobal, Reason: ReasonGranted}
		spent, ns := 0, now.UnixNano()
		switch {
		case got == 0:
			d.Reason, d.RetryAfter = ReasonPaced, wl.retry(st, now)
		case en.pre.TokensAt(ns) < float64(op.w.n): // the pre-check emptied meanwhile
			d = wl.lm.preDenied(en, ns, op.w.n)
		default:
			en.pre.AllowN(ns, op.w.n)
			spent = op.w.n
		}
		pend = append(pend, windowPending{w: op.w, d: d, win: op.win})
		if cur && got > 0 {
			st.grants += got - spent
		}
	case op.win == st.win+1:
		st.next += got
		st.passed = got == 0
	default:
		if cur {
			st.grants += got
		}
	}
	if op.nextWin {
		st.nextAsked = false
	}
	// A grant is refused in part only if the count before it, and so after it, is within
	// its n of the burst or past it: once it stands, what the window holds in grants,
	// admissions and debt carried into it reaches the burst, and counts only grow. The
	// refused part is left counted: the count overstates the window by it, which refuses
	// nothing the burst would allow (but for a waiting request's grant smaller than its
	// cost, left unused) and carries the same (every later overshoot is whole either way).
	refused := op.grant && got < op.n
	if !op.grant {
		wl.carry(op, count)
	}
	switch {
	case op.nextWin && op.win > st.win:
		// a window ahead full of grants says nothing of the current one
		if refused || count-(op.n-got) >= burst {
			st.nextFull = op.win
		}
	case !op.grant && !op.carry && op.win+1 == st.win && count > burst:
		// an admission's count past the burst of the window before is a debt carried
		// into this one, or less: that count may hold grants refused there and left
		// counted. Judged as this window's count, but never making the key over, which
		// a count early in a window would.
		if debt := count - burst; debt+wl.share() > burst {
			wl.mark(st, en.key, st.win, debt >= burst, false, now)
		}
	case op.win >= st.win:
		c := count
		if op.grant { // as it stands: the refused part is left counted
			c -= op.n - got
		}
		wl.judge(st, en.key, op.win, c, refused, now)
	}
	if op.ask != nil && len(op.ask.waiters) > 0 { // served from what it got, or wait again
		ws := op.ask.waiters
		op.ask.waiters = nil
		for _, w := range ws {
			pend = wl.serve(en, w, now, pend)
		}
	}
	return pend
}

// serve decides w, a request of the key of en that waited for a grant that did not
// cover it, from the grants the key holds, or refuses it if its window is known spent,
// or makes it wait for the next grant. It requires the key's lock and wl.mu.
func (wl *windowed) serve(en *entry, w *Waiter, now time.Time, pend []windowPending) []windowPending {
	st, ns := en.win, now.UnixNano()
	switch {
	case st.grants >= w.n && en.pre.TokensAt(ns) < float64(w.n):
		return append(pend, windowPending{w: w, d: wl.lm.preDenied(en, ns, w.n)})
	case st.grants >= w.n:
		st.grants -= w.n
		en.pre.AllowN(ns, w.n)
		return append(pend, windowPending{w: w, d: Decision{Allowed: true, Remaining: st.grants, Source: SourceGlobal, Reason: ReasonGranted}, win: st.win})
	case st.failed():
		return append(pend, windowPending{w: w, d: Decision{Source: SourceGlobal, Reason: ReasonPaced, RetryAfter: wl.retry(st, now)}})
	}
	wl.join(st, en.key, w, now)
	return pend
}

// judge reads a count answered for the key's window win, its current one or one ahead:
// what the current window has left bounds this server's admissions without asking
// (allowance); spent, this server refuses it until the window ends, and low, its
// requests ask; spent at four times its rate or more, over.
func (wl *windowed) judge(st *wkey, id string, win int64, count int, refused bool, now time.Time) {
	burst := wl.glim.Burst
	if win == st.win {
		st.room, st.roomWin = burst-count, win
	}
	spent := refused || count >= burst
	if !spent {
		return
	}
	// spent at four times its rate or more, over the part of the window this server has
	// seen: a key within its limit carrying a debt spends a window early, not that fast.
	// In float64: a burst of 10^6 and an hour's window take burst × elapsed past int64.
	start := wl.end(win-1, st.phase)
	elapsed := max(0, now.Sub(later(start, wl.start)))
	fast := float64(count)*float64(wl.w) >= 4*float64(burst)*float64(elapsed)
	wl.mark(st, id, win, spent, spent && fast, now)
}

// mark makes the key low until window win ends, win spent if spent, and the key over if
// over; what changes is announced, unless this server sees the key often (it then asks
// for it itself, and a server that sees it seldom learns from its own answers).
func (wl *windowed) mark(st *wkey, id string, win int64, spent, over bool, now time.Time) {
	if at(now) >= st.low && at(now) >= st.over && !st.failed() {
		wl.urgent = true // the key's first mark in a while goes at once
	}
	flags := 0
	if spent {
		st.spent = max(st.spent, win+1)
		flags |= wire.MarkSpent
	}
	if end := wl.endAt(win, st.phase); end > st.low {
		st.low = end
		flags |= wire.MarkLow
	}
	if over && time.Duration(at(now.Add(windowMemory))-st.over) > windowMemory/2 {
		st.over = at(now.Add(windowMemory))
		flags |= wire.MarkOver
	}
	if flags != 0 && !st.often {
		// all this server knows of the key and window: a key has one mark per window,
		// the last writer's
		if st.low >= wl.endAt(win, st.phase) {
			flags |= wire.MarkLow
		}
		if st.spent > win {
			flags |= wire.MarkSpent
		}
		if at(now) < st.over {
			flags |= wire.MarkOver
		}
		wl.announce[wmk{id, win}] |= flags
	}
}

// failed puts back op, which a failed round trip carried: admissions and carries of
// windows still open go again; requests waiting for its grants go to the policy.
func (wl *windowed) failed(now time.Time, op wop, err error, pend []windowPending) []windowPending {
	if !wl.lm.keys.Peek(op.id, func(en *entry, last int64) {
		wl.mu.Lock()
		defer wl.mu.Unlock()
		st := en.win
		wl.key(st, en.key, lastOf(now, last))
		pend = wl.unsent(op, st, st.win, err, pend)
	}) {
		// evicted while op was out: its admissions still count, its requests go to
		// the policy
		wl.mu.Lock()
		pend = wl.unsent(op, nil, wire.WindowIndex(wl.rnow(now), wire.WindowPhase(op.id, wl.wUs), wl.wUs), err, pend)
		wl.mu.Unlock()
	}
	return pend
}

// unsent puts back op, which a failed trip carried, for a key whose current window is
// cur and whose state is st (nil: no longer held). It requires wl.mu, and the key's lock
// if st is set.
func (wl *windowed) unsent(op wop, st *wkey, cur int64, err error, pend []windowPending) []windowPending {
	switch {
	case op.demand || op.n < 0:
	case !op.grant && op.win >= cur-1 && !op.dropped:
		// counted with the next trip: the window before the current one still has its
		// array, and its count is the current one's debt. A count of admissions joins
		// the key's count queued for its window, and the next admissions join it: one
		// count per key and window, however many trips fail.
		if !op.admits() {
			wl.queue(op)
		} else if !wl.merge(wl.admOp, op) {
			wl.push(wl.admOp, op)
		}
	case !op.grant && !op.carry:
		wl.answerOut(st, op.id, op.n)
	case op.grant:
		pend = wl.release(op, st, err, pend)
	}
	return pend
}

// now records the latest instant the limit has seen: a trip is built at it.
func (wl *windowed) now(t time.Time) { wl.nowAt(t.UnixNano()) }

// never is what wl.last holds before the limit has seen an instant: below every instant
// a Clock may read (1678 to 2261).
const never = math.MinInt64

// nowAt is now of the instant n (Unix nanoseconds).
func (wl *windowed) nowAt(n int64) {
	for {
		old := wl.last.Load()
		if n <= old || wl.last.CompareAndSwap(old, n) {
			return
		}
	}
}

// seen is nowAt for a hit: it records n only once n is a microsecond or more past the
// instant held, so that the keys' hits within a microsecond do not each make an atomic
// compare-and-swap on the limit's one cache line. What a trip is built at (latest) may
// then be up to a microsecond before a hit's instant: the marks it records and the times
// it keeps are milliseconds, and report intervals longer still.
func (wl *windowed) seen(n int64) {
	if last := wl.last.Load(); n-last >= 1000 || last == never {
		wl.nowAt(n)
	}
}

// latest is the latest instant seen (now).
func (wl *windowed) latest() time.Time {
	if n := wl.last.Load(); n != never {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// evicted gives back the grants a key held when its entry goes (Drain, or the key store
// full): they are counted in Redis, unused.
func (wl *windowed) evicted(en *entry) {
	st := en.win
	if !st.init {
		return
	}
	wl.mu.Lock()
	defer wl.mu.Unlock()
	if st.out > 0 {
		// its admissions not yet answered still count against c when it comes back
		wl.owe(en.key, st.out)
	}
	if st.grants > 0 {
		wl.queue(wop{id: en.key, win: st.win, n: -st.grants})
	}
	if st.next > 0 {
		wl.queue(wop{id: en.key, win: st.win + 1, n: -st.next})
	}
	if st.grants > 0 || st.next > 0 {
		wl.due.Store(true)
	}
	st.grants, st.next = 0, 0
}

// stop ends the limit's asking: queued requests are denied as closed, and what it
// admitted without asking goes with a last report.
func (wl *windowed) stop(pend []windowPending) []windowPending {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	wl.stopped.Store(true)
	keep := wl.ops[:0]
	for _, op := range wl.ops {
		if !op.grant {
			keep = append(keep, op)
			continue
		}
		pend = wl.release(op, nil, errClosed, pend)
	}
	wl.ops = keep
	wl.lastReport()
	return pend
}

// lastReport makes a last report due if anything is queued to go (counts, grants, marks),
// and nothing else. It requires wl.mu.
func (wl *windowed) lastReport() { wl.due.Store(len(wl.ops) > 0 || len(wl.announce) > 0) }

// windowsTick ticks the windowed limits and reports whether one wants a trip.
func (e *Engine) windowsTick(now time.Time) bool {
	due := false
	for _, lm := range e.limits.Load().list {
		if wl := lm.windowed(); wl != nil && wl.tick(now) {
			due = true
		}
	}
	return due
}

// windowsNextTick is the earliest of the windowed limits' next ticks, or t.
func (e *Engine) windowsNextTick(t time.Time) time.Time {
	for _, lm := range e.limits.Load().list {
		if wl := lm.windowed(); wl != nil {
			wl.mu.Lock()
			if n := wl.nextTickAt(); wl.started.Load() && !wl.stopped.Load() && n.Before(t) {
				t = n
			}
			wl.mu.Unlock()
		}
	}
	return t
}

// windowsStop stops the windowed limits, the retiring ones too: requests waiting for
// grants not yet sent are denied as closed.
func (e *Engine) windowsStop(now time.Time) {
	e.mu.Lock()
	wls := slices.Collect(e.windowed)
	e.mu.Unlock()
	var pend []windowPending
	for _, wl := range wls {
		pend = wl.stop(pend)
	}
	e.failPending(now, pend)
}

// failPending decides at now the requests of pend, whose grants will not come.
func (e *Engine) failPending(now time.Time, pend []windowPending) {
	for _, p := range pend {
		if e.decideFailed(now, p.w, nil, p.fail) && e.decided != nil {
			e.decided(p.w)
		}
	}
}
