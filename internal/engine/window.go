package engine

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// Windowed limits (LimitConfig.Windowed).
//
// A windowed limit admits a key Burst requests per window of Burst/Rate, its windows
// offset by a phase of its own, on Redis's clock (package global, "Windowed limits"):
// Redis counts each key's admissions per window in a shared counter array, and no
// script runs. A server admits without asking Redis, counts what it admitted in its
// next report, and learns from the counts and from the fleet's marks which keys to ask
// for:
//
//   - A key it knows nothing against is admitted without asking, at most c =
//     max(1, ceil(Burst/servers)) of it unanswered, once its marks are fresh; once a
//     count was answered for its window, at most what that window had left (its
//     allowance), so that with one server a key is decided here up to its burst.
//   - A window known spent is refused until it ends; a key marked low (a debt carried
//     into its window) asks for each request, and waits.
//   - A key whose window was spent at four times its rate or more is over for
//     windowMemory, admitted only from grants or, when this server sees it seldom, at
//     odds of burst over the fleet's count of its requests a window.
//   - A key this server sees at least once a report interval is served from grants of
//     its window sized by this server's rate, as a lease is sized, asked as they run out
//     and, near the window's end, for the next window.
//   - A count answered over the burst is carried: the server whose increment it answered
//     counts its own part of the excess in the key's next window as well.
//
// Shards: a limit counted in several (LimitConfig.WindowShards; the driver counts in
// wire.WindowShards on a Redis Cluster) keeps a key's arrays in its shard and its marks
// in its shard's group's (wire.WindowMarksShard), each under a hash tag of its own. A
// trip then carries an item per shard with work, each answered on its own (the driver
// sends the items one master serves in one round trip to it); a shard that fails
// puts back its counts and marks to go again and lets its marks go stale (fresh is per
// set of marks), and the other shards' answers stand. Servers that count a limit in
// another number of shards write other keys: another representation (reps.go).
//
// Bound: 2·Burst + Rate·W + S·c over any window W, argued in docs/design.md §11 and
// measured by the simulator (sim.HybridWindow).
//
// Concurrency: a key's window state lives in its entry, under the key's shard lock; the
// limit's queue of work for Redis and what it knows of the fleet (marks, clock, reads)
// live in windowed, under windowed.mu, taken under a key's lock or alone and never
// around anything else. Every decision of a windowed limit takes that one mutex: the
// mode trades some parallelism for its Redis savings.

// Constants of windowed limits.
const (
	// minWindowWidth is the smallest LimitConfig.WindowWidth.
	minWindowWidth = 1 << 8
	// windowMemory is how long a key stays over, and how long the set of marks keeps one.
	windowMemory = 30 * time.Second
	// windowRead is how often a server reads the fleet's marks while it admits without
	// asking; its marks are fresh while its last read went within twice that.
	windowRead = 250 * time.Millisecond
	// windowWarm: a server admits without asking once a read sent this long after its
	// start is answered, so that a fleet started together has marked its hot keys.
	windowWarm = 25 * time.Millisecond
	// windowClock is how often a trip asks for Redis's time.
	windowClock = time.Second
	// windowOverlap is how far before its last read's time a read starts: a mark is
	// recorded at its writer's estimate of Redis's time, sent at that instant, and one
	// that reaches Redis up to this much later is still read.
	windowOverlap = 25 * time.Millisecond
)

// Bounds of a windowed limit's window, Burst/Rate, and of its report interval.
//
// Redis keeps an array for each window of the limit until a second after the end of the
// window after it, so at most 4 + ceil(1s/W) arrays at a time, each of
// wire.WindowRows × WindowWidth counters of wire.WindowBits(Burst) bits: with the
// default width and a burst up to 16,384, 1.5 MB an array, 21 MB a limit at MinWindow and
// 7.5 MB at a window of a second. A window shorter than MinWindow would hold more arrays
// than keys need; one longer than MaxWindow would keep a spent key's array past a day.
// A report must reach Redis while the window it counts still has its array (an
// admission counted after that is lost), so the report interval is at most half the
// window, and at most MaxWindowReport.
const (
	MinWindow       = 100 * time.Millisecond
	MaxWindow       = 24 * time.Hour
	MaxWindowReport = 10 * time.Second
)

// checkWindowed reports what a windowed limit c asks for that the kind cannot do: tiers,
// a burst its counters cannot hold, a width of its arrays not a power of two in range,
// a window or report interval out of bounds (checkWindow).
func checkWindowed(c LimitConfig) error {
	switch {
	case len(c.Tiers) > 0:
		return fmt.Errorf("limit %q: Tiers: a Windowed limit has no tiers", c.Name)
	case c.Burst > redisstore.MaxWindowBurst:
		return fmt.Errorf("limit %q: Burst %d: a Windowed limit counts at most %d per window", c.Name, c.Burst, redisstore.MaxWindowBurst)
	case c.WindowShards < 0 || c.WindowShards > redisstore.MaxWindowShards:
		return fmt.Errorf("limit %q: WindowShards %d is not from 0 to %d", c.Name, c.WindowShards, redisstore.MaxWindowShards)
	case c.WindowWidth != 0 && (c.WindowWidth < minWindowWidth || c.WindowWidth > redisstore.MaxWindowWidth || c.WindowWidth&(c.WindowWidth-1) != 0):
		return fmt.Errorf("limit %q: WindowWidth %d is not a power of two from %d to %d", c.Name, c.WindowWidth, minWindowWidth, redisstore.MaxWindowWidth)
	}
	return checkWindow(c)
}

// checkWindowedChange reports why c cannot replace oc, both windowed: a window's length
// and counters are Burst/Rate and the width, the fleet's arrays, and its report interval
// is fixed with them.
func checkWindowedChange(c, oc LimitConfig) error {
	if c.Windowed != oc.Windowed || c.WindowWidth != oc.WindowWidth || max(c.WindowShards, 1) != max(oc.WindowShards, 1) {
		return fmt.Errorf("limit %q: Mode: a Windowed limit's Mode (and WindowWidth, WindowShards) cannot change at run time: remove the limit and add it again", c.Name)
	}
	if c.Rate != oc.Rate || c.Burst != oc.Burst {
		return fmt.Errorf("limit %q: Rate: a Windowed limit's Rate and Burst cannot change at run time; remove the limit and add it again", c.Name)
	}
	return nil
}

// checkWindow reports what is wrong with the window and report interval of the windowed
// limit c.
func checkWindow(c LimitConfig) error {
	w := time.Duration(wire.WindowMicros(c.Rate, c.Burst)) * time.Microsecond
	switch {
	case w < MinWindow:
		return fmt.Errorf("limit %q: Burst/Rate %d/%g: a Windowed limit's window is %v, shorter than %v: Redis would keep up to %d arrays of it at once (raise Burst, or use a token bucket)",
			c.Name, c.Burst, c.Rate, w, MinWindow, 4+int((time.Second+w-1)/w))
	case w > MaxWindow:
		return fmt.Errorf("limit %q: Burst/Rate %d/%g: a Windowed limit's window is %v, longer than %v", c.Name, c.Burst, c.Rate, w, MaxWindow)
	case c.Windowed > MaxWindowReport:
		return fmt.Errorf("limit %q: Mode: Windowed(%v) reports further apart than %v", c.Name, c.Windowed, MaxWindowReport)
	case c.Windowed > w/2:
		return fmt.Errorf("limit %q: Mode: Windowed(%v) is more than half the window, Burst/Rate = %v: an admission reported that late may reach Redis after its window's array is gone (report every %v or less)",
			c.Name, c.Windowed, w, w/2)
	}
	return nil
}

// wkey is one key's window state on this server, allocated with its entry. Its instants
// are 8 bytes each, not a time.Time's 24: a windowed limit holds one per key.
type wkey struct {
	phase     int64 // µs: the key's windows start where (Redis time + phase) is a multiple of w
	win       int64 // the window it was last decided in (setWin)
	lo, hi    int64 // win's start and end on Redis's clock, µs: a hit compares, not divides
	ewc       float64
	ewAt      instant
	grants    int   // grants held for win
	next      int   // grants held for win + 1
	nextFull  int64 // a window ahead that refused a grant of it
	spent     int64 // the last window known spent, plus one (0: none)
	out       int   // admitted without asking, not yet answered
	ask       *wask // the grant asked ahead, queued or on the wire; nil: none
	perSec    float64
	demWin    int64 // the window of dem, the fleet's count of its requests for odds,
	dem       int   // as the last answer said,
	demAt     instant
	low, over instant // until when it is low, over
	room      int     // what window roomWin had left, as the last count answered for it said
	roomWin   int64   // 0: no count answered for the current window
	passed    bool    // the last grant of a next window was refused outright
	skipped   bool    // the last next window was refused without asking
	nextAsked bool    // a grant of win + 1 is asked
	often     bool    // its last request found it seen often
	init      bool
	gen       uint64 // the limit's marksGen when it last learnt its marks (key)
	// mine is what this server's answered ops added to the key's count in window
	// mineWin: a count answered below it means the window's array was lost (own).
	mine    int
	mineWin int64
}

// instant is an instant on this server's clock, in nanoseconds since 1970 (0: never).
type instant int64

// at is t as an instant; the zero time is never.
func at(t time.Time) instant {
	if t.IsZero() {
		return 0
	}
	return instant(t.UnixNano())
}

// wask is a grant asked ahead and the requests waiting for it.
type wask struct {
	waiters []*Waiter
	now     bool // it goes at once: a request waits for it
}

// wop is one item of a windowed limit's queue for Redis.
type wop struct {
	id      string
	win     int64
	n       int
	grant   bool // asks: stands as far as the count is within the burst
	carry   bool // an overshoot counted in the next window as well
	nextWin bool // a grant of the window after the key's current one
	demand  bool // requests of an over key, counted for odds
	now     bool // goes at once
	ask     *wask
	w       *Waiter // the request a grant is for (asked at once, not ahead)
	dropped bool    // not sent: its window ended long ago
}

// wmk names a mark to send: a key and a window.
type wmk struct {
	id  string
	win int64
}

// wmark is what the fleet's marks say of a key: until when it is low or over (this
// server's clock), and the last window known spent, plus one.
type wmark struct {
	low, over time.Time
	spent     int64
	at        time.Time // when it was last heard
}

// windowTimes are a windowed limit's durations, and what its decisions derive from
// them, computed once (timesOf): rate and fastDecide are on the path of every request.
type windowTimes struct {
	w             time.Duration // the window: Burst / Rate
	wUs           int64         // w in microseconds
	iv            time.Duration // report interval (LimitConfig.Windowed)
	tau           time.Duration // the decay time of a key's count (rate)
	tauSec, ivSec float64       // tau and iv in seconds
	perTau        float64       // 1/tau, per nanosecond: a multiplication where a division is slow
	young         time.Duration // the least age rate counts: min(w/10, iv)
	counted       time.Duration // countedAfter decay times
	ahead         time.Duration // iv/20: how far ahead an often key's grants are to last
	aheadSec      float64       // ahead in seconds
}

// timesOf is the windowTimes of windows of wUs microseconds and reports every iv.
func timesOf(wUs int64, iv time.Duration) windowTimes {
	w := time.Duration(wUs) * time.Microsecond
	tau := decayTime(w)
	return windowTimes{
		w: w, wUs: wUs, iv: iv, tau: tau, tauSec: tau.Seconds(), ivSec: iv.Seconds(), perTau: 1 / float64(tau),
		young: min(w/10, iv), counted: countedAfter * tau, ahead: iv / 20, aheadSec: (iv / 20).Seconds(),
	}
}

// windowed is a windowed limit's server-wide state.
type windowed struct {
	lm *Limit
	windowTimes
	width  int // counters per row of a shard's array (redisstore.ShardWidth)
	shards int // LimitConfig.WindowShards
	glim   redisstore.Limit

	// Read by a decision under its key's lock alone (fastDecide), written under mu:
	started  atomic.Bool  // the first decision came (begin); start is set before it
	stopped  atomic.Bool  // Stop: nothing would answer what it asks
	warm     atomic.Bool  // a read after the warm-up was answered
	due      atomic.Bool  // a trip is wanted now
	offset   atomic.Int64 // Redis's clock minus this server's, in nanoseconds, as last measured
	marksGen atomic.Uint64
	last     atomic.Int64 // the latest instant seen, in Unix nanoseconds: a trip is built at it
	// ageAt and ageExp hold e^-(a/tau) (ageExp's bits) for an age a = ageAt > 0 of the
	// limit (rate's share of tau counted, in a server's first countedAfter decay times),
	// for expAge. ageSeq counts their writes, twice each: odd while a decision writes
	// them, 0 before the first (a sequence lock).
	ageSeq atomic.Uint64
	ageAt  atomic.Int64
	ageExp atomic.Uint64

	mu sync.Mutex
	// guarded by mu:
	ops      []wop
	announce map[wmk]int      // marks to send: flags by key and window
	demOp    map[string]int   // the queued demand op of a key, by index in ops
	admOp    map[string]int   // the queued count of a key's admissions, by index in ops
	marks    map[string]wmark // learnt from reads; marksGen counts their changes
	gone     map[string]int   // keys evicted with admissions unanswered: how many (below 0: answered before the eviction was)
	goneMax  int              // the most keys gone has held since it was last made
	start    time.Time
	startAt  instant     // start as an instant: rate reads it on every hit, where at(start) costs a hit ~15 instructions
	busy     bool        // its trip is out
	free     bool        // admitted without asking since the last read went
	urgent   bool        // a mark to send is a key's first in a while
	lastRead []time.Time // by shard that holds marks: when its last read went
	since    []time.Time // by shard that holds marks: Redis's time its next read starts at; zero: every mark kept
	skip     []int       // by shard that holds marks: the marks at since its next read leaves out (WindowTrip.Skip)
	tidyAt   []time.Time // by shard that holds marks: when its last tidy went
	sent     time.Time   // when the last trip went (a report: when it was due)
	report   time.Time   // the instant of the report due, until it goes
	nextTick time.Time
	warmAt   [2]time.Time // the warm-up reads
	clockAt  time.Time    // when offset was measured; zero: never
	rng      uint64
}

// off is Redis's clock minus this server's, as last measured.
func (wl *windowed) off() time.Duration { return time.Duration(wl.offset.Load()) }

// decayTime is the decay time of a key's count (rate) in windows of w: four windows, at
// most 4 s.
func decayTime(w time.Duration) time.Duration { return min(4*w, 4*time.Second) }

// windowed returns the limit's windowed state, nil if the limit is of another kind.
func (lm *Limit) windowed() *windowed {
	wl, _ := lm.kind.(*windowed)
	return wl
}

func newWindowed(lm *Limit, c LimitConfig, seed uint64) *windowed {
	shards := max(c.WindowShards, 1)
	wl := &windowed{
		lm: lm, windowTimes: timesOf(wire.WindowMicros(c.Rate, c.Burst), c.Windowed),
		width:  redisstore.ShardWidth(cmpOr(c.WindowWidth, wire.DefaultWindowWidth), shards),
		shards: shards, lastRead: make([]time.Time, shards), since: make([]time.Time, shards), skip: make([]int, shards), tidyAt: make([]time.Time, shards),
		glim:     redisstore.Limit{Name: c.Name, Rate: c.Rate, Burst: c.Burst, Version: c.Version},
		announce: map[wmk]int{}, demOp: map[string]int{}, admOp: map[string]int{}, marks: map[string]wmark{}, gone: map[string]int{},
		rng: seed ^ 0x77696e64,
	}
	wl.last.Store(never)
	return wl
}

// share is c: the admissions without asking per key a server may have unanswered.
func (wl *windowed) share() int { return shareOf(wl.glim.Burst, wl.lm.e.Servers()) }

// allowance is how many of key st's requests this server may admit without asking,
// unanswered, in its current window: its share c, and no more than the window had left
// at the last count answered for it (each later admission is in st.out).
//
// st.out is not reset when the key's window changes: c bounds what this server has
// unanswered at any instant, not in each window. Reset at each window, a key that turns
// hot across the fleet just before its window ends would be admitted c by each server in
// each of the two windows before any server knows it low: 2·S·c in a moment.
func (wl *windowed) allowance(st *wkey) int {
	if st.roomWin != st.win {
		return wl.share()
	}
	return min(wl.share(), st.room)
}

// rnow is Redis's time at this server's now, as last measured, in Unix microseconds.
func (wl *windowed) rnow(now time.Time) int64 { return shiftMicro(now, wl.off()) }

// rnowAt is rnow of the instant ns (Unix nanoseconds), for a hit (fastDecide): the
// shifted nanoseconds' microseconds, rounded down as UnixMicro rounds.
func (wl *windowed) rnowAt(ns int64) int64 { return floorMicro(ns + int64(wl.off())) }

// floorMicro is the microsecond of the instant n (Unix nanoseconds), rounded down as
// UnixMicro rounds: before 1970 too.
func floorMicro(n int64) int64 {
	us := n / 1000
	if n%1000 < 0 {
		us--
	}
	return us
}

// shiftMicro is now.Add(off).UnixMicro() without building the instant (Time.Add's
// carries cost the path of every windowed request more than the rest of this): now's
// whole microseconds, off's, and the carry of their nanoseconds below a microsecond,
// rounded down as UnixMicro rounds.
func shiftMicro(now time.Time, off time.Duration) int64 {
	us := now.UnixMicro() + int64(off/time.Microsecond)
	switch ns := int64(now.Nanosecond()%1000) + int64(off%time.Microsecond); {
	case ns < 0:
		us--
	case ns >= 1000:
		us++
	}
	return us
}

// end is when window win of a key of phase ends, on this server's clock.
func (wl *windowed) end(win, phase int64) time.Time {
	return time.UnixMicro(wire.WindowStart(win+1, phase, wl.wUs)).Add(-wl.off())
}

// endAt is at(wl.end(win, phase)) without building the time.Time: Unix nanoseconds
// wrap the same way for every instant (Lease.at), so it equals it even where the
// nanoseconds overflow; but for a window that ends at the zero Time itself, which at
// reads as never.
func (wl *windowed) endAt(win, phase int64) instant {
	return instant(wire.WindowStart(win+1, phase, wl.wUs)*1000 - int64(wl.off()))
}

// left is the time from the instant ns (Unix nanoseconds) to the end of the key's
// window (st.hi, setWin): wl.end(st.win, st.phase).Sub(timeAt(ns)), without building
// either instant, on the path of every request a key's grants serve. Unix nanoseconds
// wrap the same way for every instant (Lease.at), so the difference is exact wherever
// Sub does not saturate: a difference within 292 years, which a window shorter than 146
// years keeps it. It requires a key made by key (st.init).
func (wl *windowed) left(st *wkey, ns int64) time.Duration {
	return time.Duration(st.hi*1000 - int64(wl.off()) - ns)
}

// begin starts the server's schedule at its first request or Tick; it requires wl.mu.
func (wl *windowed) begin(now time.Time) {
	if wl.started.Load() {
		return
	}
	wl.start, wl.startAt = now, at(now)
	j := time.Duration(uniform(&wl.rng) * float64(windowWarm/4))
	wl.warmAt = [2]time.Time{now.Add(windowWarm/2 + j), now.Add(windowWarm + j)}
	wl.nextTick = now.Add(wl.iv + j)
	wl.started.Store(true) // after start: a decision that sees it reads start
}

// key brings st, key id's state, to now: its window, what the marks say of it.
// It requires wl.mu.
func (wl *windowed) key(st *wkey, id string, now time.Time) {
	if !st.init {
		*st = wkey{init: true, phase: wire.WindowPhase(id, wl.wUs)}
		st.setWin(wire.WindowIndex(wl.rnow(now), st.phase, wl.wUs), wl.wUs)
		// Evicted with admissions unanswered: they count here. Below zero, answers came
		// before the old entry's eviction was recorded, which will cancel them: left
		// for it, else the eviction would leave a count no answer takes off.
		if out := wl.gone[id]; out > 0 {
			st.out = out
			wl.forget(id)
		}
	}
	if j := wire.WindowIndex(wl.rnow(now), st.phase, wl.wUs); st.win != j {
		st.grants = 0
		if j == st.win+1 {
			st.grants = st.next
		}
		if st.nextFull == j {
			st.spent = max(st.spent, j+1)
		}
		st.next = 0
		st.setWin(j, wl.wUs)
	}
	if m, ok := wl.marks[id]; ok {
		st.learn(m)
	}
	st.gen = wl.marksGen.Load()
}

// setWin makes win, of windows of w µs, the key's window, with its bounds.
func (st *wkey) setWin(win, w int64) {
	st.win, st.lo, st.hi = win, wire.WindowStart(win, st.phase, w), wire.WindowStart(win+1, st.phase, w)
}

func (st *wkey) learn(m wmark) {
	st.low, st.over, st.spent = max(st.low, at(m.low)), max(st.over, at(m.over)), max(st.spent, m.spent)
}

// failed reports whether the key's current window is known spent: the last window known
// spent is this one or one ahead. A window ahead is judged only from a carry's count (a
// grant of the next window sets nextFull, not spent), and a carry into it comes only
// from an overshoot of the current one, so one spent ahead means the current one counted
// past its burst: twice its burst or more, but for grants of the next window counted
// there.
func (st *wkey) failed() bool { return st.spent > st.win }

// fresh reports whether the marks of key id (its shard's, wire.WindowMarksShard) are
// fresh enough to admit it without
// asking: the server is warm and its last read of the shard went within two read
// periods. A shard whose master does not answer goes stale alone.
func (wl *windowed) fresh(now time.Time, id string) bool {
	return wl.warm.Load() && now.Sub(wl.lastRead[wire.WindowMarksShard(id, wl.shards)]) <= 2*windowRead
}

// wdecision is what decide found under the key's lock.
type wdecision struct {
	d    Decision
	w    *Waiter
	wake bool
	pre  float64 // the key's pre-check tokens at now, at least the request's cost
}

// admit admits a request of cost n for the key of en (state st) at now (Unix
// nanoseconds), for r: its pre-check spends, and the decision says what grants the key
// holds after it.
func (o *wdecision) admit(en *entry, st *wkey, now int64, n int, r Reason) {
	en.pre.Take(now, o.pre, n)
	o.d = Decision{Allowed: true, Remaining: max(0, st.grants), Source: SourceLease, Reason: r}
}

// hitKey is decideKey's common path on its own: a request of a valid cost whose
// pre-check has its tokens, which the key's grants serve with nothing to ask
// (fastDecide). It reports false, changing nothing, for any other request. Like
// bucket.hitKey it cannot panic: arithmetic on the key's own fields (its window state is
// made with the entry: initKey) and the limit's atomics, with no index, map, or division
// by a variable but the window's length, at least 1 µs. It requires the key's lock.
func (wl *windowed) hitKey(o *wdecision, en *entry, ns int64, n int) bool {
	if n <= 0 || n > wl.glim.Burst {
		return false
	}
	if o.pre = en.pre.TokensAt(ns); o.pre < float64(n) {
		return false
	}
	return wl.fastDecide(o, en, ns, n)
}

// decideKey decides a request of cost n of the key of entry en at ns (Unix nanoseconds)
// that its hit (hitKey) did not decide, or that came with a new shape; it requires the
// key's lock and takes wl.mu for any request of a valid cost whose pre-check has its
// tokens. What fastDecide would decide it decides the same way (fastDecide's comment).
func (wl *windowed) decideKey(o *wdecision, en *entry, ns int64, n int) {
	burst := wl.glim.Burst
	switch {
	case n < 0:
		o.d = Decision{Source: SourceLease, Reason: ReasonInvalidCost, RetryAfter: InfDuration}
		return
	case n == 0:
		o.d = Decision{Allowed: true, Source: SourceLease, Reason: ReasonLease}
		return
	}
	if n > burst {
		o.d = Decision{Source: SourceLease, Reason: ReasonExceedsBurst, RetryAfter: InfDuration}
		return
	}
	// The pre-check's tokens, read once: admit spends from them.
	if o.pre = en.pre.TokensAt(ns); o.pre < float64(n) {
		o.d = wl.lm.preDenied(en, ns, n)
		return
	}
	now := timeAt(ns)
	wl.mu.Lock()
	defer wl.mu.Unlock()
	if wl.stopped.Load() { // nothing would answer what it asks
		o.d = Decision{Reason: ReasonClosed}
		return
	}
	wl.now(now)
	wl.begin(now)
	st := en.win
	wl.key(st, en.key, now)
	var perSec float64
	t := instant(ns)
	st.ewc, perSec = wl.rate(st, t)
	st.ewAt = t
	over, low := t < st.over, t < st.low
	often := wl.warm.Load() && perSec*wl.ivSec >= 1
	st.often, st.perSec = often, perSec
	fresh := wl.fresh(now, en.key)
	if over && !often {
		// The fleet's requests of the key a window: its last count, or S times this
		// server's rate where that is lower (a count from a flood long past).
		fleet := min(float64(st.dem), float64(wl.lm.e.Servers())*perSec*wl.w.Seconds())
		wl.countDemand(st, en.key, n, fleet, now)
	}
	// An over key's request is refused while its grant comes, which can then wait for the
	// next report, unless windows are short against reports (under four report intervals).
	urgent := !over || wl.w < 4*wl.iv
	admit := func(r Reason) { o.admit(en, st, ns, n, r) }
	deny := func() {
		o.d = Decision{Source: SourceLease, Reason: ReasonPaced, RetryAfter: wl.retry(st, now)}
	}
	// free admits without asking, counted in the next report; with the queue full it
	// refuses instead, to ask again once the next report has gone (maxQueued).
	free := func() bool {
		if !wl.count(en.key, st.win, n) {
			o.d = Decision{Source: SourceLease, Reason: ReasonPaced, RetryAfter: wl.iv}
			return false
		}
		wl.free = true
		st.out += n
		admit(ReasonAsync)
		return true
	}
	switch {
	case st.grants >= n:
		st.grants -= n
		admit(ReasonLease)
		switch {
		case often:
			if float64(st.grants) < wl.need(st, perSec, wl.ahead, now) {
				wl.askGrant(st, en.key, n, perSec, urgent, now)
			}
		case over:
			wl.ask(st, en.key, n)
		}
	case st.failed():
		deny()
		if often {
			wl.askNext(st, en.key, n, perSec, now)
		}
	case often && over:
		deny()
		wl.askGrant(st, en.key, n, perSec, urgent, now)
	case often && fresh && !low && st.out == 0 && st.out+n <= wl.allowance(st):
		if free() {
			wl.askGrant(st, en.key, n, perSec, true, now)
		}
	case often:
		o.w = wl.wait(st, en, n, now)
	case over && fresh && !low:
		// admitted without asking at odds that make the fleet admit up to about a burst
		// a window
		p := wl.odds(st, perSec, now)
		x := float64(mix3(wl.lm.seed, hashKey(en.key), uint64(now.UnixNano()))%1e9) / 1e9
		if x < p && st.out+n <= wl.allowance(st) {
			free()
		} else {
			deny()
		}
	case over && wl.warm.Load():
		deny()
		wl.ask(st, en.key, n)
	case !low && fresh && st.out+n <= wl.allowance(st):
		free()
	default: // ask now and wait for the answer
		o.w = &Waiter{lim: wl.lm, key: en.key, n: n, ch: make(chan struct{})}
		wl.queue(wop{id: en.key, win: st.win, n: n, grant: true, w: o.w, now: true})
		wl.due.Store(true)
	}
	o.wake = wl.due.Load()
}

// countedAfter is how many decay times (rate's tau) after its start a server has counted
// every key: from then on 1 - exp(-t/tau) is 1 in float64 (exp(-38) < 2^-53), so rate
// leaves the exponential out, and its answers are the same.
const countedAfter = 38

// rate is the key's count of requests with this one, decayed, and this server's rate of
// it at t. It reads start: the limit must have started (begin).
func (wl *windowed) rate(st *wkey, t instant) (ewc, perSec float64) {
	// This server's rate of the key: its requests, this one included, decayed over four
	// windows (at most 4 s), over the time it has been counting every key (since its
	// start; at least a tenth of a window or a report interval, the shorter), which
	// weighs at most tau. A key it sees for the first time after a while is slow, not
	// fast, and a window of an hour does not make every key slow for its first minutes;
	// in a server's first tenth of a window (or report interval) a key's first request
	// may count as often, and ask a grant with its admission. Counting this request makes
	// a key this server sees rarely look faster than it is.
	ewc = st.ewc*expNeg(float64(t-st.ewAt)*wl.perTau) + 1
	counted := 1.0
	if d := max(time.Duration(t-wl.startAt), wl.young); d < wl.counted {
		counted = 1 - wl.expAge(d)
	}
	return ewc, ewc / (counted * wl.tauSec)
}

// expAge returns e^-(d/tau) for the limit's age d > 0. Every request of a server's
// first minutes reads it, and math.Exp was a sixth of their hit: an age within 2^-10
// tau after the one held (ageAt) costs a multiplication by expNeg of the difference,
// within two ulps of 1 of math.Exp (TestExpAge; rate reads 1 - e^-x, whose scale is
// 1); other ages call math.Exp and are held for the next (so what is held is always
// math.Exp's own value). Decisions read and write it at once, under their keys' locks
// alone: a reader takes the age and value held only if ageSeq reads the same even count
// before and after them, and one writer at a time claims ageSeq (odd) to write them.
func (wl *windowed) expAge(d time.Duration) float64 {
	seq := wl.ageSeq.Load()
	if seq != 0 && seq%2 == 0 {
		a, e := time.Duration(wl.ageAt.Load()), math.Float64frombits(wl.ageExp.Load())
		if wl.ageSeq.Load() == seq && d >= a {
			if x := float64(d-a) * wl.perTau; x < 0x1p-10 {
				return e * expNeg(x)
			}
		}
	}
	e := math.Exp(-float64(d) / float64(wl.tau))
	if seq%2 == 0 && wl.ageSeq.CompareAndSwap(seq, seq+1) {
		wl.ageAt.Store(int64(d))
		wl.ageExp.Store(math.Float64bits(e))
		wl.ageSeq.Store(seq + 2)
	}
	return e
}

// expNeg returns e^-x. A key a server sees often decays its count over a few
// microseconds at a time, x below 2^-10, where e^-x is the series 1 - x + x²/2 - x³/6 +
// x⁴/24 to within 2 ulps of math.Exp (the terms left out are below x⁵/120 < 2^-56), at
// a fraction of math.Exp's cost (BenchmarkWindowRate), on the path of every request a
// key's grants serve.
func expNeg(x float64) float64 {
	if x >= 0 && x < 0x1p-10 {
		return 1 - x*(1-x*(0.5-x*(1.0/6-x*(1.0/24))))
	}
	return math.Exp(-x)
}

// fastDecide decides, under the key's lock alone, a request the key's grants serve with
// nothing to ask, as decideKey would under the limit's lock: the limit started and not
// stopped, the key's state current (its window, the marks it learnt), the key not over
// its limit and, seen often, its grants after this request still what it needs for the
// next twentieth of a report interval. It reports whether it decided; if not, it changed
// nothing. This is the path of a key served from its grants: no decision of one key
// there waits for another's.
func (wl *windowed) fastDecide(o *wdecision, en *entry, now int64, n int) bool {
	st := en.win
	// us outside [lo, hi): the key's window is no longer win
	if us := wl.rnowAt(now); !wl.started.Load() || wl.stopped.Load() || !st.init || st.gen != wl.marksGen.Load() || st.grants < n ||
		us < st.lo || us >= st.hi {
		return false
	}
	t := instant(now)
	ewc, perSec := wl.rate(st, t)
	often := wl.warm.Load() && perSec*wl.ivSec >= 1
	// need is at most perSec·d, d the twentieth: the grants left above that need no window
	// end read; below it, need itself, inline (a helper calling need is past the inliner's
	// budget, and costs a hit about 35 instructions), the end from the key's bounds
	left := float64(st.grants - n)
	if t < st.over || often && left < perSec*wl.aheadSec && left < perSec*min(wl.ahead, wl.left(st, now)).Seconds() {
		return false
	}
	wl.seen(now)
	st.ewc, st.ewAt = ewc, t
	st.often, st.perSec = often, perSec
	st.grants -= n
	o.admit(en, st, now, n, ReasonLease)
	o.wake = wl.due.Load()
	return true
}

// retry is how long a request refused for st waits before a try may pass: the end of its
// window when it is known spent, else about one request's refill.
func (wl *windowed) retry(st *wkey, now time.Time) time.Duration {
	if st.failed() {
		return max(0, wl.left(st, now.UnixNano()))
	}
	return wl.refill()
}

// refill is how long the limit takes to refill one request: Burst/Rate over Burst.
func (wl *windowed) refill() time.Duration {
	return time.Duration(float64(wl.w) / float64(wl.glim.Burst))
}

// demandSalt makes countDemand's draws its own, apart from the limit's other draws
// from its seed (odds', rng's).
const demandSalt = 0x64656d616e64

// demandCounts is about how many counts of an over key's requests the fleet sends Redis
// a window for odds (countDemand).
const demandCounts = 64

// countDemand counts n requests of an over key this server sees seldom, for odds. Once
// fleet, the fleet's requests of the key a window as this server knows them, is over
// demandCounts·n, a request is counted at odds q of demandCounts·n over fleet, weighing
// n/q (rounded at random, so that it weighs n/q on average): the count stays an
// estimate of the key's requests with no bias and about 1/√demandCounts of error, and a
// key over its limit on every server costs Redis about demandCounts counts a window
// rather than about one a request. fleet too high would leave the estimate unbiased but
// lumpy (a few requests of great weight), so the caller takes the lower of the last
// count and what this server's own rate says. Its draws are a hash of the key and the
// instant, as odds' are. It requires wl.mu.
func (wl *windowed) countDemand(st *wkey, id string, n int, fleet float64, now time.Time) {
	if fleet > float64(demandCounts*n) {
		q := float64(demandCounts*n) / fleet
		h := mix3(wl.lm.seed^demandSalt, hashKey(id), uint64(now.UnixNano()))
		if unit(h) >= q {
			return
		}
		w := float64(n) / q
		n = int(w)
		if unit(mix3(h, 1, 0)) < w-float64(n) {
			n++
		}
	}
	if op := (wop{id: id, win: st.win, n: n, demand: true}); !wl.merge(wl.demOp, op) {
		wl.push(wl.demOp, op)
	}
}

// odds is the chance of admitting a request of an over key this server sees seldom:
// burst over the fleet's count of the key's requests a window, from the count answered
// in this window or the one before over the part of it that count covers (a quarter at
// least); before such an answer, burst over S times this server's rate, as each server
// sees about 1/S of the key's requests. This server's rate counts the request being
// decided, which makes the odds lower than a burst a window would need, never higher.
func (wl *windowed) odds(st *wkey, perSec float64, now time.Time) float64 {
	burst := float64(wl.glim.Burst)
	if st.demWin >= st.win-1 && st.dem > 0 {
		if part := float64(st.demAt-wl.endAt(st.demWin-1, st.phase)) / float64(wl.w); part >= 0.25 {
			return min(1, burst*min(1, part)/float64(st.dem))
		}
	}
	return min(1, burst/(float64(wl.lm.e.Servers())*perSec*wl.w.Seconds()))
}

// need is what this server, seeing the key at perSec, admits in the next d of its window.
func (wl *windowed) need(st *wkey, perSec float64, d time.Duration, now time.Time) float64 {
	return perSec * min(d, wl.left(st, now.UnixNano())).Seconds()
}

// maxQueued is the most ops a windowed limit's queue holds for Redis (about 4 MB) before
// it takes no new key's count: a burst of new keys faster than the reports go, or an
// outage under FailLocal, may not grow it past that.
const maxQueued = 1 << 16

// count queues n admissions of key id in window win for the next trip, added to the
// key's count already queued for that window if there is one: the queue holds one count
// per key and window, however many requests the key makes between two reports. With
// maxQueued ops queued it only adds to a count queued already, and reports whether it
// counted n.
func (wl *windowed) count(id string, win int64, n int) bool {
	op := wop{id: id, win: win, n: n}
	if wl.merge(wl.admOp, op) {
		return true
	}
	if len(wl.ops) >= maxQueued {
		return false
	}
	wl.push(wl.admOp, op)
	return true
}

// merge adds op, a count, to the count of its key, window and row that idx says is
// queued, if there is still one, and reports whether it did.
func (wl *windowed) merge(idx map[string]int, op wop) bool {
	if i, ok := idx[op.id]; ok && i < len(wl.ops) {
		if q := &wl.ops[i]; q.id == op.id && q.win == op.win && q.demand == op.demand && q.tally() {
			q.n += op.n
			return true
		}
	}
	return false
}

// push queues op, a count, and records it in idx for merge.
func (wl *windowed) push(idx map[string]int, op wop) {
	idx[op.id] = len(wl.ops)
	wl.ops = append(wl.ops, op)
}

// queue appends op, which is not a plain count, to the queue: a count queued after it
// is not merged into one queued before it, so that Redis sees the key's ops in order
// (a count taken back, a grant asked, then more admissions).
func (wl *windowed) queue(op wop) {
	if !op.demand {
		delete(wl.admOp, op.id)
	}
	wl.ops = append(wl.ops, op)
}

// tally reports whether op only adds to a count: admissions, or an over key's requests
// (demand).
func (op *wop) tally() bool { return !op.grant && !op.carry && op.n > 0 }

// admits reports whether op counts admissions: answered, they are no longer unanswered.
func (op *wop) admits() bool { return op.tally() && !op.demand }

// wait makes a request wait for the grant asked ahead, which then goes at once, or for
// one it asks now, sized for itself and this server's rate.
func (wl *windowed) wait(st *wkey, en *entry, n int, now time.Time) *Waiter {
	w := &Waiter{lim: wl.lm, key: en.key, n: n, ch: make(chan struct{})}
	wl.join(st, en.key, w, now)
	return w
}

// join makes w wait for the key's grant asked ahead, which then goes at once, or asks
// one now for w and what this server's rate wants: w is served first from it.
func (wl *windowed) join(st *wkey, id string, w *Waiter, now time.Time) {
	if st.ask == nil {
		st.ask = &wask{now: true}
		wl.queue(wop{id: id, win: st.win, n: wl.size(st, w.n, st.perSec, now), grant: true, ask: st.ask, w: w})
	} else {
		st.ask.waiters = append(st.ask.waiters, w)
		st.ask.now = true
	}
	wl.due.Store(true)
}

// size is the grant asked for a key this server sees often: what its rate wants in the
// next two report intervals of the window, less three standard deviations of that count
// (what it holds at the window's end is lost), less the grants it holds; at least n, at
// most the burst. Sized to the whole of what the rate wants, a server holds a few grants
// unused at the end of each window (5% of a hot key's limit on the simulator's hot-key
// suite); sized less, it asks again as its grants run out (decideKey).
func (wl *windowed) size(st *wkey, n int, perSec float64, now time.Time) int {
	need := wl.need(st, perSec, 2*wl.iv, now)
	want := int(math.Ceil(need-3*math.Sqrt(need))) - st.grants
	return min(max(want, n), wl.glim.Burst)
}

// askGrant asks for the grant size sizes, at once if urgent (as a lease refill goes at
// once), else with the next report; within two report intervals of the window's end,
// with one of the next window. At once, because a grant asked with the next report can
// come a report interval later, and a report interval may be half the window.
//
// The grant of the next window is sized for that window's first two report intervals:
// its first requests then find grants, and a server that sees a hot key makes about one
// round trip for it a window instead of two.
func (wl *windowed) askGrant(st *wkey, id string, n int, perSec float64, urgent bool, now time.Time) {
	if st.ask != nil || st.failed() {
		return
	}
	wl.ask(st, id, wl.size(st, n, perSec, now))
	st.ask.now = urgent
	if wl.left(st, now.UnixNano()) < 2*wl.iv {
		wl.askNext(st, id, n, perSec, now)
	}
	if urgent {
		wl.due.Store(true)
	}
}

// askNext queues a grant of the window after the key's current one, sized for that
// window's first two report intervals, unless one is asked or held or that window
// refused one. An over key whose last such grant was refused outright is asked every
// other window: on the other the server refuses it without asking, as one known full. A
// server that sees an abusive client among many that see it then makes a round trip for
// it every other window, not every window; what the fleet admits of the client is the
// burst a window either way, taken by the servers that do ask.
func (wl *windowed) askNext(st *wkey, id string, n int, perSec float64, now time.Time) {
	need := perSec * min(2*wl.iv, wl.w).Seconds()
	if x := int(math.Ceil(need - 3*math.Sqrt(need))); x >= n && !st.nextAsked && st.next == 0 && st.nextFull <= st.win {
		if st.passed && !st.skipped && at(now) < st.over {
			st.nextFull, st.skipped = st.win+1, true
			return
		}
		st.nextAsked, st.skipped = true, false
		wl.queue(wop{id: id, win: st.win + 1, n: min(x, wl.glim.Burst), grant: true, nextWin: true})
	}
}

// ask queues a grant of n asked ahead, for the next trip, unless one is asked already.
func (wl *windowed) ask(st *wkey, id string, n int) {
	if st.ask == nil && !st.failed() {
		st.ask = &wask{}
		wl.queue(wop{id: id, win: st.win, n: n, grant: true, ask: st.ask})
	}
}

// mix3 is a splitmix64 of a, b and c: the draw of sample's odds.
func mix3(a, b, c uint64) uint64 {
	var z uint64
	for _, x := range [3]uint64{a, b, c} {
		z += x + 0x9e3779b97f4a7c15
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
	}
	return z
}
