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
}

var windowDefaults = windowOpts{width: 1 << 18, warmAt: 25 * time.Millisecond, hotMemory: 30 * time.Second, hotRead: 250 * time.Millisecond}

type windowStrat struct {
	f     *fleet
	o     windowOpts
	w     time.Duration          // window length, burst/rate
	arr   map[int64]*[2][]uint16 // Redis: the sketch of each window index
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
	lastRead time.Duration // when the last read was sent
	readAt   time.Duration // Redis's time of the last read answered: the next reads what changed since
	sent     time.Duration // when the last round trip was sent
	touched  map[int64]bool
}

type windowKey struct {
	win       int64
	ewc       float64       // this server's requests of the key, decayed over 4 windows
	ewAt      time.Duration // when ewc was last decayed
	grants    int           // grants held for win
	spent     int64         // the last window this server knows spent, plus one (0: none)
	out       int           // admitted in win without asking, not yet answered
	asking    bool          // a grant asked ahead is in ops or on the wire
	low, over time.Duration
	last      time.Duration
}

type windowOp struct {
	key      int
	win      int64
	n        int  // counted (negative: a refused grant taken back)
	grant    bool // asks: stands if the count is within the burst
	carry    bool // what an earlier op admitted over its window's burst, counted in the next
	deferred bool // a request waiting for the next round trip, which it does not hasten
	q        *request
	// answers
	count   int
	granted bool
}

func newWindow(f *fleet) *windowStrat {
	sc := f.sc
	w := time.Duration(float64(sc.Burst) / sc.Rate * float64(time.Second))
	o := windowDefaults
	if sc.cold.hotRead > 0 {
		o.hotRead = sc.cold.hotRead
	}
	o.exact, o.deferOver, o.sample = sc.cold.windowExact, sc.cold.windowDefer, sc.cold.windowSample
	return &windowStrat{f: f, o: o, w: w, arr: map[int64]*[2][]uint16{}, marks: map[int]windowMark{},
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
		touched: map[int64]bool{}}
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
		st.win, st.grants, st.out = j, 0, 0
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
// spent is this one or one ahead, and a window ahead holds carries only, so one spent
// ahead means every window before it counted twice its burst or more.
func (st *windowKey) failed() bool { return st.spent > st.win }

func (s *windowStrat) handle(sv *server, q *request) {
	f := s.f
	hs := sv.state.(*windowServer)
	now := f.e.now
	st := s.key(hs, q.key, now)
	tau := 4 * s.w  // this server's requests of the key, this one included, decayed over tau
	if s.o.sample { // only sample's odds read it
		st.ewc = st.ewc*math.Exp(-float64(now-st.ewAt)/float64(tau)) + 1
		st.ewAt = now
	}
	over, low := now < st.over, now < st.low
	if s.o.exact {
		over, low = false, true
	}
	switch {
	case st.grants >= q.n:
		st.grants -= q.n
		f.decide(q, true, srcLease)
		if over {
			s.ask(hs, q.key, st) // the next one
		}
	case st.failed():
		f.decide(q, false, srcPaced)
	case over && hs.warm && s.o.sample && !low:
		// admitted without asking, at odds that make the fleet admit up to about a burst
		// a window: each server sees about 1/S of the key's requests. Its rate per window
		// is its decayed count, this request included, over the time the server has been
		// counting every key (since it started), which weighs at most tau.
		// Counting this request makes a key the server sees rarely look faster than it
		// is: its odds are lower than a burst a window would need, never higher.
		counted := 1 - math.Exp(-float64(max(now-hs.start, s.w/10))/float64(tau))
		perWindow := st.ewc / counted * float64(s.w) / float64(tau)
		p := min(1, float64(s.f.sc.Burst)/(float64(s.f.sc.Servers)*perWindow))
		x := float64(mix(s.f.sc.Seed, uint64(sv.id), uint64(q.key), uint64(now))%1e9) / 1e9
		if x < p && st.out+q.n <= s.c {
			st.out += q.n
			hs.ops = append(hs.ops, windowOp{key: q.key, win: st.win, n: q.n})
			f.decide(q, true, srcLease)
		} else {
			f.decide(q, false, srcPaced)
		}
	case over && hs.warm && s.o.deferOver: // asks in the next round trip, and waits for it
		hs.ops = append(hs.ops, windowOp{key: q.key, win: st.win, n: q.n, grant: true, q: q, deferred: true})
	case over && hs.warm:
		f.decide(q, false, srcPaced)
		s.ask(hs, q.key, st)
	case !low && hs.warm && st.out+q.n <= s.c:
		st.out += q.n
		hs.ops = append(hs.ops, windowOp{key: q.key, win: st.win, n: q.n})
		f.decide(q, true, srcLease)
	default: // ask now and wait for the answer
		hs.ops = append(hs.ops, windowOp{key: q.key, win: st.win, n: q.n, grant: true, q: q})
		s.send(sv, hs)
	}
}

// ask queues a grant of key k's window for the next round trip.
func (s *windowStrat) ask(hs *windowServer, k int, st *windowKey) {
	if !st.asking && !st.failed() {
		st.asking = true
		hs.ops = append(hs.ops, windowOp{key: k, win: st.win, n: s.f.sc.Cost, grant: true})
	}
}

// count is key k's count in window j of Redis's sketch, after adding n.
func (s *windowStrat) count(k int, j int64, n int) int {
	a := s.arr[j]
	if a == nil {
		if n == 0 {
			return 0
		}
		a = &[2][]uint16{make([]uint16, s.o.width), make([]uint16, s.o.width)}
		s.arr[j] = a
		for old := range s.arr { // expired (PEXPIRE): no key's window that old is counted any more
			if old < int64(s.f.e.now/s.w)-2 {
				delete(s.arr, old)
			}
		}
	}
	c := 1 << 16
	for r := range 2 {
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
	if hs.busy || (len(hs.ops) == 0 && len(hs.announce) == 0 && !read) {
		return
	}
	ops, announce := hs.ops, hs.announce
	hs.ops, hs.announce = nil, map[int]windowMark{}
	hs.sent = t
	if read {
		hs.lastRead = t
	}
	// Redis time (TestRedisCost): a BITFIELD per window touched (and a PEXPIRE the first
	// time this server touches it), two sub-commands per op; one ZADD of the marks; the
	// read of the marks changed since the last.
	cmds := 0
	var cost time.Duration
	wins := map[int64]bool{}
	for _, op := range ops {
		if j := op.win; !wins[j] {
			wins[j] = true
			cmds++
			cost += coldCost.bfCall
			if !hs.touched[j] {
				hs.touched[j] = true
				cmds++
				cost += coldCost.zCall
			}
		}
		cost += 2 * coldCost.bfSub
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
			op.count = s.count(op.key, op.win, op.n)
			op.granted = op.grant && op.count <= sc.Burst
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
			cur := st.win == op.win
			switch {
			case op.carry:
			case !op.grant:
				if cur {
					st.out = max(0, st.out-op.n)
				}
			case op.q != nil:
				f.decide(op.q, op.granted, srcGlobal)
			default:
				st.asking = false
				if cur && op.granted {
					st.grants += op.n
				}
			}
			refused := op.grant && !op.granted
			if refused { // take the refused grant back
				hs.ops = append(hs.ops, windowOp{key: op.key, win: op.win, n: -op.n})
			} else if x := min(op.n, op.count-sc.Burst); x > 0 {
				// its part of an overshoot: counted in the next window as well
				hs.ops = append(hs.ops, windowOp{key: op.key, win: op.win + 1, n: x, carry: true})
			}
			if op.win >= st.win {
				s.judge(hs, op.key, st, op.win, op.count, refused, now)
			}
		}
		if len(hs.announce) > 0 || slices.ContainsFunc(hs.ops, func(o windowOp) bool { return o.q != nil && !o.deferred }) {
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
	var m windowMark
	if spent { // win is the current window or one ahead of it: either way this one is spent
		st.spent = max(st.spent, win+1)
		m.spent = win + 1
	}
	start := time.Duration(win)*s.w - s.phase(k)
	if end := start + s.w; end > st.low {
		st.low, m.low = end, end
	}
	// spent at four times its rate or more, over the part of the window this server has
	// seen: a key within its limit carrying a debt from its last window spends this one
	// early, but not four times as fast
	fast := time.Duration(count)*s.w >= 4*time.Duration(burst)*max(0, now-max(start, hs.start))
	if spent && fast && now+s.o.hotMemory-st.over > s.o.hotMemory/2 {
		st.over, m.over = now+s.o.hotMemory, now+s.o.hotMemory
	}
	if m.low > 0 || m.over > 0 || spent {
		old := hs.announce[k]
		hs.announce[k] = windowMark{low: max(old.low, m.low), over: max(old.over, m.over), spent: max(old.spent, m.spent)}
	}
}
