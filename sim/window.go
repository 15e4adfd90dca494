package sim

import (
	"math"
	"slices"
	"time"
)

// WindowModel is counted windows in a shared counter array: an experimental cold-key
// design (not the engine) whose Redis work per admission is two BITFIELD sub-commands,
// not a script's key.
//
// A key's limit is burst requests per window of burst/rate, its windows offset by a
// phase of its own. Redis holds, per window, one counter array for every key of the
// limit: a count-min sketch of two rows of BITFIELD u16 counters at hashes of the key,
// so that a key's count (the smaller of its two) is at least its true count. No script
// runs: a server sends, in one pipelined round trip, INCRBY for what it admitted without
// asking, for the grants it asks for (a grant stands when the count answered is within
// the burst; a refused grant is taken back in the next trip) and for its carries, one
// ZADD of the keys it found low or over, and every hotRead a read of the marks changed
// since its last (ZRANGEBYSCORE). Redis's time is what TestRedisCost measured of those
// commands (coldCost).
//
// A count answered over the burst is an overshoot, and the server whose increment it
// answered counts its own part of it (at most its increment) in the key's next window
// as well, its carry: the parts of all increments over the burst add up to at least what
// the window admitted over it (the count also holds refused grants not yet taken back), so a window's overshoot is taken from the next, and what that
// one cannot hold from the one after, however many windows it takes. Over any run of
// whole windows a key is admitted at most burst per window plus the debt still carried.
//
// A server admits a key it knows nothing against without asking, at most c of them per
// key and window unanswered, as hybrid-async does, once its read sent at warmAt or later
// is answered. A key whose count came within c of its burst is low until that window
// ends: each request asks, and waits. A server that knows a window spent refuses the key
// until the window ends. A key whose window was spent at four times its rate or more
// (the count over the time since the later of the window's start and the server's own
// start) is over for hotMemory: it is admitted only from grants, one asked ahead with the next
// round trip after each grant used; a request that finds none is refused, or, with
// windowDefer, asks in the next round trip and waits for it (its grant is counted in the
// window it asked in, and admits it up to a round trip later), or, with windowSample and
// unless low, is admitted without asking at odds that make the fleet admit up to about a
// burst a window.
//
// With windowRoute a key a server sees once a report interval or more is served, on
// that server, from grants of its window sized by the server's own rate, as a lease
// is sized (windowOpts.route), and the rules above are left to the keys it sees seldom;
// sample's odds then come from the fleet's count of an over key's requests, kept in a
// second sketch of one row, and marks but a key's first in a while go with the next
// report.
const WindowModel Strategy = "window-array"

// windowOpts are window-array's parameters.
type windowOpts struct {
	width     int           // counters per row of the sketch
	warmAt    time.Duration // a server admits without asking once a read sent this late is answered
	hotMemory time.Duration // how long a key stays over
	hotRead   time.Duration // how often a server reads the marks
	// sample admits an over key's request that finds no grant without asking, at odds
	// of burst / (S × this server's requests of the key per window), at most c of them
	// unanswered, instead of refusing it.
	sample bool
	// deferOver makes an over key's request that finds no grant ask in the next round
	// trip and wait for it, instead of being refused.
	deferOver bool
	// exact makes every request ask (no admission without asking, no grant asked
	// ahead): fixed windows enforced exactly, the yardstick of what windows cost the
	// keys within their limit.
	exact bool
	// route serves a key this server sees often (a request per report interval or more,
	// by its decayed count) from grants sized by its own rate, as a lease is, and leaves
	// the rules above to the keys it sees seldom. With it a read of the marks makes a
	// round trip of its own only while the server admits without asking, which only
	// fresh marks allow (else it goes with round trips that go anyway), and a refused
	// part of a grant is not taken back (below). Its odds for an over key it sees
	// seldom are burst over the fleet's count of the key's requests a window (odds).
	route bool
}

var windowDefaults = windowOpts{width: 1 << 18, warmAt: 25 * time.Millisecond, hotMemory: 30 * time.Second, hotRead: 250 * time.Millisecond}

type windowStrat struct {
	f     *fleet
	o     windowOpts
	w     time.Duration          // window length, burst/rate
	arr   map[int64]*[2][]uint16 // Redis: the sketch of each window index
	dem   map[int64]*[2][]uint16 // Redis, route: the requests of over keys counted for odds, one row of counters
	marks map[int]windowMark     // Redis: the marks' sorted set
	c     int                    // admissions without asking per key, window and server
}

// windowMark is what the mark set says of a key: until when it is low, until when
// over, and the last window known spent, plus one (0: none); at is when it last changed.
type windowMark struct {
	low, over time.Duration
	spent     int64
	at        time.Duration
}

type windowServer struct {
	start    time.Duration // when it joined: it has seen no count older
	keys     map[int]*windowKey
	marks    map[int]windowMark // learnt from reads
	ops      []windowOp         // for the next round trip
	announce map[int]windowMark // marks to send
	busy     bool
	warm     bool          // a read of the marks sent at interval/2 or later was answered
	free     bool          // it admitted without asking since its last read was sent
	urgent   bool          // a mark to send is a key's first in a while
	lastRead time.Duration // when the last read was sent
	readAt   time.Duration // Redis's time of the last read answered: the next reads what changed since
	sent     time.Duration // when the last round trip was sent
	touched  map[int64]bool
	demOp    map[int]int // route: a key's demand op in ops, by index
}

type windowKey struct {
	win       int64
	ewc       float64       // this server's requests of the key, decayed over 4 windows
	ewAt      time.Duration // when ewc was last decayed
	grants    int           // grants held for win
	next      int           // route: grants held for the window after win
	nextFull  int64         // route: a window ahead that refused a grant of it
	passed    bool          // route: the last grant of a next window was refused outright
	skipped   bool          // route: the last next window was refused without asking
	nextAsked bool          // route: a grant of the window after win is asked
	spent     int64         // the last window this server knows spent, plus one (0: none)
	out       int           // admitted in win (with route: at all) without asking, not yet answered
	asking    bool          // a grant asked ahead is in ops or on the wire
	often     bool          // route: its last request found it seen often
	perSec    float64       // route: this server's requests of it per second, as last reckoned
	waiting   []*request    // route: requests waiting for the grant asked
	demWin    int64         // route: the window of dem, the fleet's requests of the key counted for odds,
	dem       int           // as the last answer said, at demAt
	demAt     time.Duration
	low, over time.Duration
	last      time.Duration
}

type windowOp struct {
	key      int
	win      int64
	n        int  // counted (negative: a refused grant taken back)
	grant    bool // asks: stands as far as the count is within the burst
	carry    bool // what an earlier op admitted over its window's burst, counted in the next
	ahead    bool // the key's grant asked ahead (windowKey.asking)
	now      bool // goes at once, after the round trip out if there is one
	nextWin  bool // route's grant of the window after the one its server is in
	demand   bool // route: requests of an over key counted for odds, in the demand sketch
	deferred bool // a request waiting for the next round trip, which it does not hasten
	q        *request
	// answers
	count int
	got   int // of a grant, what stands: min(n, what the burst held before it)
}

func newWindow(f *fleet) *windowStrat {
	sc := f.sc
	w := time.Duration(float64(sc.Burst) / sc.Rate * float64(time.Second))
	o := windowDefaults
	if sc.cold.hotRead > 0 {
		o.hotRead = sc.cold.hotRead
	}
	o.exact, o.deferOver, o.sample, o.route = sc.cold.windowExact, sc.cold.windowDefer, sc.cold.windowSample, sc.cold.windowRoute
	return &windowStrat{f: f, o: o, w: w, arr: map[int64]*[2][]uint16{}, dem: map[int64]*[2][]uint16{}, marks: map[int]windowMark{},
		c: max(1, (sc.Burst+sc.Servers-1)/sc.Servers)}
}

func (s *windowStrat) interval() time.Duration {
	if s.f.sc.cold.report > 0 {
		return s.f.sc.cold.report
	}
	return 100 * time.Millisecond
}

func (s *windowStrat) phase(k int) time.Duration {
	return time.Duration(mix(s.f.sc.Seed, uint64(k), 7) % uint64(s.w))
}

func (s *windowStrat) idx(k, row int) int {
	return int(mix(s.f.sc.Seed, uint64(k), uint64(row)+11) % uint64(s.o.width))
}

// win is key k's window index at instant t.
func (s *windowStrat) win(k int, t time.Duration) int64 { return int64((t + s.phase(k)) / s.w) }

func (s *windowStrat) join(sv *server) error {
	hs := &windowServer{start: s.f.e.now, keys: map[int]*windowKey{}, marks: map[int]windowMark{}, announce: map[int]windowMark{},
		touched: map[int64]bool{}, demOp: map[int]int{}}
	sv.state = hs
	iv := s.interval()
	var tick func()
	tick = func() {
		now := s.f.e.now
		for k, st := range hs.keys { // forget idle keys
			if now-st.last > s.o.hotMemory && now > st.low && now > st.over && !st.asking && st.out == 0 {
				delete(hs.keys, k)
			}
		}
		// deferred requests and carries go with the next tick whatever was sent since
		if now-hs.sent >= iv || !hs.warm || slices.ContainsFunc(hs.ops, func(o windowOp) bool { return o.deferred || o.carry }) {
			s.send(sv, hs)
		}
		if now < s.f.sc.Duration+2*time.Second {
			s.f.e.after(iv, tick)
		}
	}
	// reads at warmAt/2 and warmAt: until the second is answered the server asks for
	// every request
	j := time.Duration(mix(s.f.sc.Seed, uint64(sv.id)) % uint64(s.o.warmAt/4))
	s.f.e.after(s.o.warmAt/2+j, func() { s.send(sv, hs) })
	s.f.e.after(s.o.warmAt+j, func() { s.send(sv, hs) })
	s.f.e.after(iv+j, tick)
	return nil
}

func (s *windowStrat) leave(*server) {}

func (s *windowStrat) key(hs *windowServer, k int, now time.Duration) *windowKey {
	st := hs.keys[k]
	if st == nil {
		st = &windowKey{}
		hs.keys[k] = st
	}
	if j := s.win(k, now); st.win != j {
		st.grants = 0
		if j == st.win+1 {
			st.grants = st.next
		}
		if st.nextFull == j {
			st.spent = max(st.spent, j+1)
		}
		st.win, st.next = j, 0
		if !s.o.route {
			st.out = 0
		}
	}
	if m, ok := hs.marks[k]; ok {
		s.learn(st, m)
	}
	st.last = now
	return st
}

func (s *windowStrat) learn(st *windowKey, m windowMark) {
	st.low, st.over, st.spent = max(st.low, m.low), max(st.over, m.over), max(st.spent, m.spent)
}

// failed reports whether the key's current window is known spent: the last window known
// spent is this one or one ahead. What is judged of a window ahead is a carry's count
// (route's grants of the next window are not judged), and a carry into it comes only
// from an overshoot of the current one, so one spent ahead means the current one
// counted twice its burst or more.
func (st *windowKey) failed() bool { return st.spent > st.win }

func (s *windowStrat) handle(sv *server, q *request) {
	f := s.f
	hs := sv.state.(*windowServer)
	now := f.e.now
	st := s.key(hs, q.key, now)
	tau := 4 * s.w // this server's requests of the key, this one included, decayed over tau
	var perSec float64
	if s.o.sample || s.o.route { // only sample's odds and route's sizes read it
		st.ewc = st.ewc*math.Exp(-float64(now-st.ewAt)/float64(tau)) + 1
		st.ewAt = now
		// its rate is the decayed count over the time the server has been counting every
		// key (since it started), which weighs at most tau. Counting this request makes a
		// key the server sees rarely look faster than it is.
		counted := 1 - math.Exp(-float64(max(now-hs.start, s.w/10))/float64(tau))
		perSec = st.ewc / counted / tau.Seconds()
	}
	over, low := now < st.over, now < st.low
	if s.o.exact {
		over, low = false, true
	}
	iv := s.interval()
	often := s.o.route && hs.warm && perSec*iv.Seconds() >= 1
	st.often, st.perSec = often, perSec
	fresh := s.fresh(hs, now)
	if s.o.route && over && !often {
		s.countDemand(hs, st, q)
	}
	// an over key's request is refused while its grant comes, which can wait for the
	// next report unless windows are short against reports
	urgent := !over || s.w < 4*iv
	switch {
	case st.grants >= q.n:
		st.grants -= q.n
		f.decide(q, true, srcLease)
		switch {
		case often:
			if float64(st.grants) < s.need(q.key, st, perSec, iv/20, now) {
				s.askGrant(sv, hs, q, st, perSec, urgent) // before they run out
			}
		case over:
			s.ask(hs, q.key, st, q.n) // the next one
		}
	case st.failed():
		f.decide(q, false, srcPaced)
		if often { // its first requests of the next window find grants
			s.askNext(hs, q, st, perSec)
		}
	case often && over: // refused; asks for the next
		f.decide(q, false, srcPaced)
		s.askGrant(sv, hs, q, st, perSec, urgent)
	case often && fresh && !low && st.out == 0 && s.mayFree(st, q): // one, while its grant comes
		s.admitFree(hs, st, q)
		s.askGrant(sv, hs, q, st, perSec, true)
	case often:
		s.wait(sv, hs, q, st)
	case over && fresh && s.o.sample && !low:
		// admitted without asking, at odds that make the fleet admit up to about a burst
		// a window: each server sees about 1/S of the key's requests. Counting this
		// request makes its odds lower than a burst a window would need, never higher.
		p := s.odds(q.key, st, perSec, now)
		x := float64(mix(s.f.sc.Seed, uint64(sv.id), uint64(q.key), uint64(now))%1e9) / 1e9
		if x < p && s.mayFree(st, q) {
			s.admitFree(hs, st, q)
		} else {
			f.decide(q, false, srcPaced)
		}
	case over && hs.warm && s.o.deferOver: // asks in the next round trip, and waits for it
		hs.ops = append(hs.ops, windowOp{key: q.key, win: st.win, n: q.n, grant: true, q: q, deferred: true})
	case over && hs.warm:
		f.decide(q, false, srcPaced)
		s.ask(hs, q.key, st, q.n)
	case !low && fresh && s.mayFree(st, q):
		s.admitFree(hs, st, q)
	default: // ask now and wait for the answer
		hs.ops = append(hs.ops, windowOp{key: q.key, win: st.win, n: q.n, grant: true, q: q})
		s.send(sv, hs)
	}
}

// countDemand counts q, a request of an over key this server sees seldom, in the
// fleet's requests of the key for odds (route), sent with the next round trip.
func (s *windowStrat) countDemand(hs *windowServer, st *windowKey, q *request) {
	if i, ok := hs.demOp[q.key]; ok && hs.ops[i].win == st.win {
		hs.ops[i].n += q.n
		return
	}
	hs.demOp[q.key] = len(hs.ops)
	hs.ops = append(hs.ops, windowOp{key: q.key, win: st.win, n: q.n, demand: true})
}

// odds is the chance that sample admits a request of key k, an over key this server
// sees seldom: burst over the key's requests a window. Without route, or before an
// answer has told the fleet's count, that is S times this server's rate: each server
// sees about 1/S of the key's requests. With route it is the fleet's count of the key's
// requests answered in this window or the one before, over the part of that window it
// covers (a quarter at least).
func (s *windowStrat) odds(k int, st *windowKey, perSec float64, now time.Duration) float64 {
	burst := float64(s.f.sc.Burst)
	if s.o.route && st.demWin >= st.win-1 && st.dem > 0 {
		start := time.Duration(st.demWin)*s.w - s.phase(k)
		if part := float64(st.demAt-start) / float64(s.w); part >= 0.25 {
			return min(1, burst*min(1, part)/float64(st.dem))
		}
	}
	return min(1, burst/(float64(s.f.sc.Servers)*perSec*s.w.Seconds()))
}

// fresh reports whether the server's marks are fresh enough to admit without asking:
// it is warm and, with route, which reads only while it admits without asking, its
// last read was sent within two read periods.
func (s *windowStrat) fresh(hs *windowServer, now time.Duration) bool {
	return hs.warm && (!s.o.route || now-hs.lastRead <= 2*s.o.hotRead)
}

// need is what a server that sees key k at perSec admits in the next d of its window.
func (s *windowStrat) need(k int, st *windowKey, perSec float64, d, now time.Duration) float64 {
	end := time.Duration(st.win+1)*s.w - s.phase(k)
	return perSec * min(d, end-now).Seconds()
}

// mayFree reports whether the server may admit q without asking: at most c of its key
// unanswered, in the window or, with route, at all. Without route a key that turns hot
// across the fleet just before its window ends is admitted c by each server in each of
// the two windows before any server knows it low: 2·S·c in a moment.
func (s *windowStrat) mayFree(st *windowKey, q *request) bool {
	return st.out+q.n <= s.c
}

// admitFree admits q without asking, counted with the next round trip.
func (s *windowStrat) admitFree(hs *windowServer, st *windowKey, q *request) {
	hs.free = true
	st.out += q.n
	hs.ops = append(hs.ops, windowOp{key: q.key, win: st.win, n: q.n})
	s.f.decide(q, true, srcLease)
}

// wait makes q, a request of a key the server sees often that its grants cannot
// serve, wait: for the grant asked already if there is one, which then goes at once, or
// for one it asks now, sized for itself and what the server's rate wants.
func (s *windowStrat) wait(sv *server, hs *windowServer, q *request, st *windowKey) {
	if st.asking {
		st.waiting = append(st.waiting, q)
		for i := range hs.ops {
			if hs.ops[i].ahead && hs.ops[i].key == q.key {
				hs.ops[i].now = true
			}
		}
	} else {
		st.asking = true
		hs.ops = append(hs.ops, windowOp{key: q.key, win: st.win, n: s.size(q, st, st.perSec, s.f.e.now), grant: true, ahead: true, q: q})
	}
	s.send(sv, hs)
}

// size is the grant route asks for a key this server sees often: what its rate wants
// in the next two report intervals of the window, less three standard deviations of
// that count (what it holds at the window's end is lost), less the grants it holds, at
// least the request's cost and at most the burst. Sized to the whole want, a server
// held a few unused at the end of each window, 5% of a hot key's limit on hot-key; a
// server asks again as its grants run out.
func (s *windowStrat) size(q *request, st *windowKey, perSec float64, now time.Duration) int {
	need := s.need(q.key, st, perSec, 2*s.interval(), now)
	want := int(math.Ceil(need-3*math.Sqrt(need))) - st.grants
	return min(max(want, q.n), s.f.sc.Burst)
}

// askGrant asks for the grant route sizes, at once if urgent, as a lease refill goes
// at once (a grant asked with the next report could come after a window shorter than
// the report interval), else with the next report.
//
// A grant asked within two report intervals of the window's end goes with one of the
// next window, sized for that window's first two intervals: its first requests then
// find grants, and a server that sees a hot key makes about one round trip for it a
// window instead of two.
func (s *windowStrat) askGrant(sv *server, hs *windowServer, q *request, st *windowKey, perSec float64, urgent bool) {
	if !st.asking && !st.failed() {
		now := s.f.e.now
		s.ask(hs, q.key, st, s.size(q, st, perSec, now))
		hs.ops[len(hs.ops)-1].now = urgent
		if end := time.Duration(st.win+1)*s.w - s.phase(q.key); end-now < 2*s.interval() {
			s.askNext(hs, q, st, perSec)
		}
		if urgent {
			s.send(sv, hs)
		}
	}
}

// askNext queues a grant of the window after the current one, sized for that window's
// first two report intervals as size sizes, unless one is asked or held already or
// that window refused one.
//
// An over key whose last grant of a next window was refused outright is not asked for
// every window: every other one the server refuses without asking, as one known full.
// A server that sees an abusive client among 200 others then makes a round trip for
// it every other window, not every window; what the fleet admits of it is the burst
// a window either way, taken by the servers that do ask.
func (s *windowStrat) askNext(hs *windowServer, q *request, st *windowKey, perSec float64) {
	need := perSec * min(2*s.interval(), s.w).Seconds()
	if n := int(math.Ceil(need - 3*math.Sqrt(need))); n >= q.n && !st.nextAsked && st.next == 0 && st.nextFull <= st.win {
		if st.passed && !st.skipped && s.f.e.now < st.over {
			st.nextFull, st.skipped = st.win+1, true
			return
		}
		st.nextAsked, st.skipped = true, false
		hs.ops = append(hs.ops, windowOp{key: q.key, win: st.win + 1, n: min(n, s.f.sc.Burst), grant: true, nextWin: true})
	}
}

// ask queues a grant of n of key k's window for the next round trip, unless one is
// asked already.
func (s *windowStrat) ask(hs *windowServer, k int, st *windowKey, n int) {
	if !st.asking && !st.failed() {
		st.asking = true
		hs.ops = append(hs.ops, windowOp{key: k, win: st.win, n: n, grant: true, ahead: true})
	}
}

// count is key k's count in window j of Redis's sketch, after adding n.
func (s *windowStrat) count(k int, j int64, n int) int { return s.countIn(s.arr, 2, k, j, n) }

// countIn is key k's count in window j of sketches arr, of their first rows, after adding n.
func (s *windowStrat) countIn(arr map[int64]*[2][]uint16, rows, k int, j int64, n int) int {
	a := arr[j]
	if a == nil {
		if n == 0 {
			return 0
		}
		a = &[2][]uint16{make([]uint16, s.o.width), make([]uint16, s.o.width)}
		arr[j] = a
		for old := range arr { // expired (PEXPIRE): no key's window that old is counted any more
			if old < int64(s.f.e.now/s.w)-2 {
				delete(arr, old)
			}
		}
	}
	c := 1 << 16
	for r := range rows {
		x := &a[r][s.idx(k, r)]
		*x = uint16(min(max(int(*x)+n, 0), 1<<16-1))
		c = min(c, int(*x))
	}
	return c
}

// send makes the round trip of the queued work and, when due, a read of the marks, if
// no round trip is out.
func (s *windowStrat) send(sv *server, hs *windowServer) {
	f, sc := s.f, s.f.sc
	t := f.e.now
	read := t-hs.lastRead >= s.o.hotRead || !hs.warm
	// with route a read makes a round trip of its own only while the server admits
	// without asking; otherwise it goes with one that goes anyway
	alone := read && (!s.o.route || hs.free || !hs.warm)
	if hs.busy || (len(hs.ops) == 0 && len(hs.announce) == 0 && !alone) {
		return
	}
	ops, announce := hs.ops, hs.announce
	hs.ops, hs.announce, hs.urgent = nil, map[int]windowMark{}, false
	clear(hs.demOp)
	hs.sent = t
	if read {
		hs.lastRead, hs.free = t, false
	}
	// Redis time (TestRedisCost): a BITFIELD per window touched (and a PEXPIRE the first
	// time this server touches it), two sub-commands per op; one ZADD of the marks; the
	// read of the marks changed since the last.
	cmds := 0
	var cost time.Duration
	wins := map[int64]bool{}
	for _, op := range ops {
		j := op.win
		if op.demand { // the demand sketch is a key of its own
			j = -1 - j
		}
		if !wins[j] {
			wins[j] = true
			cmds++
			cost += coldCost.bfCall
			if !hs.touched[j] {
				hs.touched[j] = true
				cmds++
				cost += coldCost.zCall
			}
		}
		if op.demand { // one row: a collision only lowers the odds
			cost += coldCost.bfSub
		} else {
			cost += 2 * coldCost.bfSub
		}
	}
	if len(announce) > 0 {
		cmds++
		cost += coldCost.zCall + time.Duration(len(announce))*coldCost.zMember
	}
	var got map[int]windowMark
	warms := read && t >= s.o.warmAt // the fleet had time to mark its hot keys
	since := hs.readAt
	if read {
		cmds++
	}
	hs.busy = true
	f.redis.roundTrip(cmds, cost, func(at time.Time) {
		rnow := redisNow(at)
		for k, m := range announce {
			old := s.marks[k]
			s.marks[k] = windowMark{low: max(old.low, m.low), over: max(old.over, m.over), spent: max(old.spent, m.spent), at: rnow}
		}
		for i := range ops {
			op := &ops[i]
			if op.demand {
				op.count = s.countIn(s.dem, 1, op.key, op.win, op.n)
				continue
			}
			op.count = s.count(op.key, op.win, op.n)
			if op.grant {
				op.got = min(op.n, max(0, sc.Burst-(op.count-op.n)))
			}
		}
		if read {
			got = map[int]windowMark{}
			for k, m := range s.marks {
				switch {
				case m.low <= rnow && m.over <= rnow:
					delete(s.marks, k) // ZREMRANGEBYSCORE, now and then
				case m.at >= since:
					got[k] = m
				}
			}
			// the read's time, known once Redis has it: it delays what follows
			rc := coldCost.zCall + time.Duration(len(got))*coldCost.zRead
			f.redis.busyUntil += rc
			if f.e.now < sc.Duration {
				f.redis.busy += rc
			}
			since = rnow
		}
	}, func() {
		hs.busy = false
		now := f.e.now
		if got != nil {
			hs.warm, hs.readAt = hs.warm || warms, since
			for k, m := range got {
				hs.marks[k] = m
				if st := hs.keys[k]; st != nil {
					s.learn(st, m)
				}
			}
		}
		for _, op := range ops {
			if op.n < 0 {
				continue
			}
			st := s.key(hs, op.key, now)
			if op.demand {
				if op.win >= st.demWin {
					st.demWin, st.dem, st.demAt = op.win, op.count, now
				}
				continue
			}
			cur := st.win == op.win
			if op.ahead {
				st.asking = false
			}
			got := op.got // of a grant, what stands
			switch {
			case op.carry:
			case !op.grant:
				if cur || s.o.route {
					st.out = max(0, st.out-op.n)
				}
			case op.q != nil:
				if got < op.q.n {
					got = 0 // all of it is taken back
				}
				f.decide(op.q, got > 0, srcGlobal)
				if cur && got > 0 {
					st.grants += got - op.q.n
				}
			case op.win == st.win+1: // route's grant of the next window
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
			refused := op.grant && got < op.n
			// A grant is refused in part only if the count before it, and so after it, is
			// within its n of the burst or past it: once it stands, what the window holds
			// in grants, admissions and debt carried into it reaches the burst, and counts
			// only grow. route leaves such a part counted: the count overstates the
			// window by what is not taken back, which refuses nothing the burst would
			// allow (but for a waiting request's grant smaller than its cost, left unused)
			// and carries the same (every later overshoot is whole either way).
			if refused && !s.o.route { // take the refused part of the grant back
				hs.ops = append(hs.ops, windowOp{key: op.key, win: op.win, n: got - op.n})
			} else if x := min(op.n, op.count-sc.Burst); x > 0 && !op.grant {
				// its part of an overshoot: counted in the next window as well
				hs.ops = append(hs.ops, windowOp{key: op.key, win: op.win + 1, n: x, carry: true})
			}
			if op.nextWin && op.win > st.win {
				// a window ahead full of grants says nothing of the current one
				if refused || op.count-(op.n-got) >= sc.Burst {
					st.nextFull = op.win
				}
			} else if s.o.route && !op.grant && !op.carry && op.win+1 == st.win && op.count > sc.Burst {
				// An admission's count past the burst of the window before is a debt
				// carried into this one, or less: that count may hold grants refused
				// there and left counted. Judged as this window's count, but never
				// making the key over, which a count early in a window would.
				if debt := op.count - sc.Burst; debt+s.c > sc.Burst {
					s.mark(hs, op.key, st, st.win, debt >= sc.Burst, false, now)
				}
			} else if op.win >= st.win {
				count := op.count
				if op.grant && s.o.route { // as it stands, the refused part left counted
					count -= op.n - got
				}
				s.judge(hs, op.key, st, op.win, count, refused, now)
			}
			if op.ahead && len(st.waiting) > 0 { // served from what it got, or wait again
				w := st.waiting
				st.waiting = nil
				for _, q := range w {
					switch {
					case st.grants >= q.n:
						st.grants -= q.n
						f.decide(q, true, srcGlobal)
					case st.failed():
						f.decide(q, false, srcGlobal)
					default:
						s.wait(sv, hs, q, st)
					}
				}
			}
		}
		// With route a key's first mark in a while goes at once, and the others with the
		// next report: a round trip of their own puts the report off by an interval (a
		// report goes an interval after the last round trip): with every mark sent at
		// once the admissions without asking on many-keys were answered 90 ms after on
		// average instead of 70, and more requests found one unanswered. A first mark
		// held back as well let a key turning hot at once past the bound with S·c
		// (seeds 11 and 15).
		if (len(hs.announce) > 0 && (!s.o.route || hs.urgent)) || slices.ContainsFunc(hs.ops, func(o windowOp) bool { return o.now || o.q != nil && !o.deferred }) {
			s.send(sv, hs)
		}
	})
}

// judge reads a count answered for key k's window win, the current one or one ahead of
// it (a carry's; refused: a grant was refused): a window within c of the burst makes the key
// low until it ends; spent, the server refuses the key until it ends; spent at four
// times the key's rate or more, over. What changes is announced.
func (s *windowStrat) judge(hs *windowServer, k int, st *windowKey, win int64, count int, refused bool, now time.Duration) {
	burst := s.f.sc.Burst
	spent := refused || count >= burst
	if !spent && count+s.c <= burst {
		return
	}
	// spent at four times its rate or more, over the part of the window this server has
	// seen: a key within its limit carrying a debt from its last window spends this one
	// early, but not four times as fast
	start := time.Duration(win)*s.w - s.phase(k)
	fast := time.Duration(count)*s.w >= 4*time.Duration(burst)*max(0, now-max(start, hs.start))
	s.mark(hs, k, st, win, spent, spent && fast, now)
}

// mark makes key k low until window win ends, win spent if spent, and the key over if
// over; what changes is announced.
func (s *windowStrat) mark(hs *windowServer, k int, st *windowKey, win int64, spent, over bool, now time.Duration) {
	var m windowMark
	if now >= st.low && now >= st.over && !st.failed() {
		hs.urgent = true // the key's first mark in a while: route sends it at once
	}
	if spent { // win is the current window or one ahead of it: either way this one is spent
		st.spent = max(st.spent, win+1)
		m.spent = win + 1
	}
	if end := time.Duration(win+1)*s.w - s.phase(k); end > st.low {
		st.low, m.low = end, end
	}
	if over && now+s.o.hotMemory-st.over > s.o.hotMemory/2 {
		st.over, m.over = now+s.o.hotMemory, now+s.o.hotMemory
	}
	// with route a key this server sees often is not announced: a server that sees it
	// often asks for it itself, and one that sees it seldom learns from its own answer
	// to its admission without asking, one per window
	if (m.low > 0 || m.over > 0 || spent) && !st.often {
		old := hs.announce[k]
		hs.announce[k] = windowMark{low: max(old.low, m.low), over: max(old.over, m.over), spent: max(old.spent, m.spent)}
	}
}
