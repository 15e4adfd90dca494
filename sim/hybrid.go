package sim

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/internal/engine"
	"github.com/fleetlimit/fleetlimit/internal/luascript"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// limitName names the simulated limit, and fleetName the fleet, in the engine and in
// Redis keys; keyPrefix is global.Store's default prefix.
const (
	limitName = "sim"
	fleetName = "sim"
	keyPrefix = "fl:"
)

// hybridStrat runs, on every simulated server, the engine hybrid.Limiter runs (package
// internal/engine: pre-check, leases, refills and the requests waiting for them, refunds,
// lease expiry, the failure policy), and carries out its round trips as hybrid.Limiter
// does: one at a time, through the server's own breaker.Breaker, to the simulated Redis
// that runs the scripts of package lua (on miniredis or the Go model). What stays here is
// only what a Limiter does with goroutines and timers, in virtual time: the background
// loop that ticks the engine and makes its trips, and each waiting request's MaxWait.
type hybridStrat struct {
	f *fleet
	s scripts
	b *bubble
	breakerLog
	// alsoKeys are the key names of the scenario's AlsoLimits, by limit and key.
	alsoKeys [][]string
	// wr is the Redis of windowed limits (Scenario.Windowed).
	wr *windowRedis
}

// breakerLog records the breaker state changes of every server, and the breakers
// themselves, for the report.
type breakerLog struct {
	mu          sync.Mutex   // guards transitions: OnStateChange runs on the calls' goroutines
	transitions []transition // by time
	breakers    map[brkID]*breaker.Breaker
}

// brkID names one breaker: server's, for master (0 on one Redis).
type brkID struct{ server, master int }

// track adds server id's breaker for master m to the report.
func (l *breakerLog) track(id, m int, brk *breaker.Breaker) {
	if l.breakers == nil {
		l.breakers = map[brkID]*breaker.Breaker{}
	}
	l.breakers[brkID{id, m}] = brk
}

// onChange returns the OnStateChange of server id's breaker for master m, which reads
// the virtual clock as the bubble's.
func (l *breakerLog) onChange(b *bubble, id, m int) func(from, to breaker.State) {
	return func(from, to breaker.State) {
		tr := transition{at: time.Since(b.base), brkID: brkID{id, m}, from: from, to: to}
		l.mu.Lock()
		l.transitions = append(l.transitions, tr)
		l.mu.Unlock()
	}
}

// transition is a breaker state change of one server's breaker.
type transition struct {
	at time.Duration
	brkID
	from, to breaker.State
}

// hybridServer is what one server of the hybrid strategy holds: the engine and the state
// of the loop that drives it (hybrid.Limiter's background goroutine).
type hybridServer struct {
	eng      *engine.Engine
	lim      *engine.Limit
	brks     []*breaker.Breaker // by master: one, or a Cluster's (Scenario.Masters)
	waiting  map[*engine.Waiter]*request
	also     []*engine.Limit              // the scenario's AlsoLimits
	multi    map[*engine.Waiter]*multiReq // requests of several limits, by the waiter of the item they wait for
	claims   map[*engine.Waiter]claimReq  // reservations waiting for their claim's answer (Scenario.Reserve)
	busy     bool                         // a trip is out
	poked    bool                         // the engine queued I/O since the loop last looked
	timer    uint64                       // generation of the armed tick timer; 0: none
	gen      uint64
	leaving  bool // Close was called: the loop stops after the trip out
	seq      uint64
	unread   int64 // tokens Redis granted to takes whose answers came after Do gave up
	readLate int64 // of those, the tokens read by their call after all (Engine.Late)
}

func newHybrid(f *fleet, s scripts, b *bubble) *hybridStrat {
	return &hybridStrat{f: f, s: s, b: b, wr: newWindowRedis()}
}

func policyOf(p Policy) breaker.Policy {
	switch p {
	case FailOpen:
		return breaker.FailOpen
	case FailClosed:
		return breaker.FailClosed
	}
	return breaker.FailLocal()
}

// engineConfig is the engine configuration of server id of scenario sc.
func engineConfig(sc *Scenario, id int) engine.Config {
	own := engine.LimitConfig{
		Name: limitName, Rate: sc.Rate, Burst: sc.Burst, Policy: policyOf(sc.Policy),
		PreRate: sc.PreRate, PreBurst: sc.PreBurst, MaxWait: sc.MaxWait, MaxCost: sc.Cost,
		RefillInterval: sc.RefillInterval, Lifetime: sc.Lifetime, LowWatermark: sc.LowWatermark,
		MaxKeys: sc.MaxKeys, Async: sc.Async, Windowed: sc.Windowed, WindowShards: sc.WindowShards,
		LowShards: sc.LowShards,
	}
	return engine.Config{
		Limits:            append([]engine.LimitConfig{own}, alsoConfigs(sc, own)...),
		Servers:           sc.Servers,
		HeartbeatInterval: sc.Heartbeat,
		Fleet:             fleetOf(sc),
		Seed:              mix(sc.Seed, uint64(id)),
		Shards:            1,
	}
}

// fleetOf is the fleet name of sc's servers: with heartbeats they count each other in Redis.
func fleetOf(sc *Scenario) string {
	if sc.Heartbeat > 0 {
		return fleetName
	}
	return ""
}

func (h *hybridStrat) join(s *server) error {
	sc := h.f.sc
	id := s.id
	hs := &hybridServer{waiting: make(map[*engine.Waiter]*request), multi: make(map[*engine.Waiter]*multiReq),
		claims: make(map[*engine.Waiter]claimReq)}
	// One breaker per master, as hybrid.Limiter keeps on a Cluster, named after its
	// server and master; on one Redis, the server's one breaker.
	for m := range sc.Masters {
		name := s.name
		if sc.Masters > 1 {
			name += " m" + strconv.Itoa(m)
		}
		st := sc.Breaker.settings(name, h.onChange(h.b, id, m))
		if id < sc.StarvedServers {
			st.Clock = starvedClock{sc: sc, id: id, b: h.b}
		}
		brk, err := breaker.New(st)
		if err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		h.track(id, m, brk)
		hs.brks = append(hs.brks, brk)
	}
	cfg := engineConfig(sc, id)
	cfg.NextSeq = func() uint64 { hs.seq++; return hs.seq }
	cfg.BreakerOpen = func() bool {
		h.b.sync()
		for _, brk := range hs.brks {
			if brk.State() == breaker.StateOpen {
				return true
			}
		}
		return false
	}
	if sc.Masters > 1 {
		cfg.KeyOpen = func(limit, key string) bool { // as hybrid.Limiter's, by the key's master
			h.b.sync()
			return hs.brks[sc.masterOf(wire.BucketKeyOfID("", limit, key))].State() == breaker.StateOpen
		}
	}
	var err error
	cfg.Notify = func() { hs.poked = true }
	cfg.Decided = func(w *engine.Waiter) { h.decided(s, hs, w) }
	if hs.eng, err = engine.New(cfg); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	hs.lim = hs.eng.Limit(limitName)
	for _, a := range sc.AlsoLimits {
		hs.also = append(hs.also, hs.eng.Limit(a.Name))
	}
	s.state = hs
	h.ready(s, hs)
	h.scheduleChanges(s, hs)
	h.run(s, hs)
	return nil
}

// ready is what hybrid.Limiter.Ready waits for before the server takes traffic, made
// at once and not counted, as its dials and script loads are not: the first read of the
// fleet's record of representations (the engine's first trip).
func (h *hybridStrat) ready(s *server, hs *hybridServer) {
	now := s.clock(h.f.e.now)
	t := hs.eng.Next()
	if t == nil {
		return
	}
	if t.Kind != engine.HeartbeatTrip || t.Reps == nil || t.Fleet != "" {
		h.f.fail(fmt.Errorf("sim: %s: the first trip is %v, not the record of representations", s.name, t.Kind))
		return
	}
	t.RepsGot = h.s.Low(epoch.Add(h.f.e.now), wire.RepsKey(keyPrefix), t.RepsLive.Milliseconds(), t.Reps, nil)
	t.Answered = true
	hs.eng.Done(now, t)
}

// starvedClock is the breaker clock of a starved server: the bubble's time, read when the
// server's process runs, and timers that fire when the process next runs at or after
// they are due (Scenario.runsAt), as a process that is not scheduled runs its timers only
// once it is. Do then sees the deadline of a call as late as its process did, and
// classifies the timeout by that, with the breaker's own rule.
type starvedClock struct {
	sc *Scenario
	id int
	b  *bubble
}

func (c starvedClock) Now() time.Time { return time.Now() }

func (c starvedClock) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	now := time.Since(c.b.base)
	return time.AfterFunc(c.sc.runsAt(c.id, now+d)-now, f).Stop
}

// mix derives a well-spread 64-bit seed from xs (splitmix64 finalizer over a running sum),
// so every (run, server) gets its own pacing jitter, the same in every run.
func mix(xs ...uint64) uint64 {
	var z uint64
	for _, x := range xs {
		z += x + 0x9e3779b97f4a7c15
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
	}
	return z
}

// later runs fn at virtual instant t, or when s's process next runs after it.
func (h *hybridStrat) later(s *server, t time.Duration, fn func()) {
	h.f.e.at(h.f.sc.runsAt(s.id, t), fn)
}

// starved reports whether s's process is not running now; then fn runs when it does.
func (h *hybridStrat) starved(s *server, fn func()) bool {
	now := h.f.e.now
	if at := h.f.sc.runsAt(s.id, now); at > now {
		h.f.e.at(at, fn)
		return true
	}
	return false
}

func (h *hybridStrat) handle(s *server, q *request) {
	if h.starved(s, func() { h.handle(s, q) }) {
		return // the request waits to be read
	}
	hs := s.state.(*hybridServer)
	f := h.f
	if len(f.sc.AlsoLimits) > 0 || hs.lim.Companions() != nil {
		// Several limits, or one the fleet counts in several representations (a
		// change of its kind rolling out): all or nothing, as hybrid.Limiter does.
		h.handleMulti(s, hs, q)
		h.wake(s, hs)
		return
	}
	var d engine.Decision
	if w := hs.eng.Decide(s.clock(f.e.now).UnixNano(), hs.lim, "", f.keyName(q.key), q.n, &d); w == nil {
		h.settle(s, hs, q, d)
	} else {
		hs.waiting[w] = q
		h.later(s, f.e.now+hs.lim.Config().MaxWait, func() { // the request's own wait timeout
			if q, ok := hs.waiting[w]; ok {
				delete(hs.waiting, w)
				h.settle(s, hs, q, hs.eng.GiveUp(s.clock(f.e.now), w, engine.ReasonTimeout))
			}
		})
	}
	h.wake(s, hs)
}

// decided records the decision the engine made for a waiting request.
func (h *hybridStrat) decided(s *server, hs *hybridServer, w *engine.Waiter) {
	if h.multiDecided(s, hs, w) {
		return
	}
	if r, ok := hs.claims[w]; ok {
		delete(hs.claims, w)
		h.claimed(r, w.Decision())
		return
	}
	if q, ok := hs.waiting[w]; ok {
		delete(hs.waiting, w)
		d := w.Decision()
		if h.f.sc.Reserve && d.Claimable() {
			// The claim is made once the engine call that decided w has returned (the
			// callback must not call the engine), at the same instant.
			h.f.e.after(0, func() { h.settle(s, hs, q, d); h.wake(s, hs) })
			return
		}
		h.record(q, d)
	}
}

// claimReq is a reservation waiting for its claim: the request, and the lease's denial.
type claimReq struct {
	q *request
	d engine.Decision
}

// settle records q's decision d or, for a reservation (Scenario.Reserve) the lease
// denied but that may pass later, makes the claim hybrid.Limiter.ReserveN makes: at most
// the limit's MaxWait for its answer.
func (h *hybridStrat) settle(s *server, hs *hybridServer, q *request, d engine.Decision) {
	f := h.f
	if !f.sc.Reserve || !d.Claimable() {
		h.record(q, d)
		return
	}
	r := claimReq{q: q, d: d}
	var cd engine.Decision
	w := hs.eng.Claim(s.clock(f.e.now), hs.lim, f.keyName(q.key), q.n, &cd)
	if w == nil {
		h.claimed(r, cd)
		return
	}
	hs.claims[w] = r
	h.later(s, f.e.now+hs.lim.Config().MaxWait, func() {
		if r, ok := hs.claims[w]; ok {
			delete(hs.claims, w)
			h.claimed(r, hs.eng.GiveUp(s.clock(f.e.now), w, engine.ReasonTimeout))
		}
	})
}

// claimed records the reservation r once its claim was decided cd: admitted when its
// holder acts, cd.RetryAfter from now; else denied as the lease denied it.
func (h *hybridStrat) claimed(r claimReq, cd engine.Decision) {
	if !cd.Allowed {
		h.record(r.q, r.d)
		return
	}
	h.f.e.after(cd.RetryAfter, func() { h.f.decide(r.q, true, srcReserved) })
}

// record counts q's decision now.
func (h *hybridStrat) record(q *request, d engine.Decision) {
	h.f.decide(q, d.Allowed, sourceOf(d))
}

// sourceOf is the simulator's source of a decision of the engine.
func sourceOf(d engine.Decision) source {
	switch {
	case d.Reason == engine.ReasonClosed:
		return srcClosed
	case d.Source == engine.SourcePreCheck:
		return srcPrecheck
	case d.Source == engine.SourceLease && d.Reason == engine.ReasonPaced:
		return srcPaced
	case d.Source == engine.SourceLease:
		return srcLease
	case d.Source == engine.SourceGlobal:
		return srcGlobal
	}
	return srcFallback
}

// wake runs the server's loop if the engine queued I/O and the loop is idle: what the
// Limiter's poke does.
func (h *hybridStrat) wake(s *server, hs *hybridServer) {
	if hs.poked && !hs.busy {
		h.run(s, hs)
	}
}

// run is one wake-up of hybrid.Limiter's background goroutine: tick the engine and make
// its round trips, one at a time, until it has none; then sleep until its next tick.
func (h *hybridStrat) run(s *server, hs *hybridServer) {
	f := h.f
	hs.poked = false
	hs.timer = 0
	if hs.leaving {
		h.close(s, hs)
		return
	}
	now := s.clock(f.e.now)
	hs.eng.Tick(now)
	t := hs.eng.Next()
	if t == nil {
		if f.e.now > f.sc.Duration+10*time.Second {
			return // the run is over: let the event queue drain
		}
		hs.gen++
		gen := hs.gen
		hs.timer = gen
		h.later(s, f.e.now+max(hs.eng.NextTick().Sub(now), time.Millisecond), func() {
			if hs.timer == gen && !hs.busy {
				h.run(s, hs)
			}
		})
		return
	}
	hs.busy = true
	h.trip(s, hs, t, func() {
		hs.eng.Done(s.clock(f.e.now), t)
	}, func() {
		hs.busy = false
		h.run(s, hs)
	})
}

// trip makes round trip t through the server's breaker to the simulated Redis, as
// hybrid.Limiter's do does, then calls done (the engine's Done) and next. On a Cluster
// (Scenario.Masters) it splits t by master as the Limiter does: one call per master its
// items' keys go to, each through that master's breaker, all sent at once; an item of a
// part that was not answered carries its part's error, and done runs once every part has
// its outcome. A take's answer that comes after Do gave up on its call is read, as the
// Limiter reads it (lateTake): when it comes, or right after done if it came before.
func (h *hybridStrat) trip(s *server, hs *hybridServer, t *engine.Trip, done, next func()) {
	parts := h.split(t)
	left := len(parts)
	tripDone := false
	var lates []func()
	late := func(read func()) {
		if tripDone {
			read()
		} else {
			lates = append(lates, read)
		}
	}
	for i := range parts {
		h.call(s, hs, t, &parts[i], late, func() {
			if left--; left > 0 {
				return
			}
			// As the Limiter's outcome: a trip of several parts is answered, its items
			// carrying their parts' errors (failPart), whether or not any part was.
			t.Answered, t.Err = len(parts) > 1 && t.Kind != engine.HeartbeatTrip, nil
			for _, p := range parts {
				if t.Kind == engine.HeartbeatTrip && p.idx[0] == 1 {
					if !p.answered { // as the Limiter reads it: an answer Do gave up on is none
						t.RepsGot, t.RepsErr = nil, p.err
					}
					if t.Fleet != "" {
						continue // the record's outcome is its own, not the heartbeat's
					}
				}
				t.Answered = t.Answered || p.answered
				t.Err = cmp.Or(t.Err, p.err)
			}
			done()
			tripDone = true
			for _, read := range lates {
				read()
			}
			next()
		})
	}
}

// part is the items of a trip that go to one master (idx nil: every item), and what
// its call said.
type part struct {
	m        int
	idx      []int
	answered bool
	err      error
}

// split routes t's items to their masters by the Redis keys they touch, as
// hybrid.Limiter's nodes.split does: one part per master, in the order the masters are
// first met; one part with every item on one Redis.
func (h *hybridStrat) split(t *engine.Trip) []part {
	sc := h.f.sc
	if t.Kind == engine.HeartbeatTrip {
		// Two calls of their own, as the Limiter makes them: the heartbeat (item 0) and
		// the record of representations (item 1).
		var parts []part
		if t.Fleet != "" {
			parts = append(parts, part{m: sc.masterOf(wire.FleetKey("", t.Fleet)), idx: []int{0}})
		}
		if t.Reps != nil {
			parts = append(parts, part{m: sc.masterOf(wire.RepsKey("")), idx: []int{1}})
		}
		return parts
	}
	if sc.Masters == 1 {
		return []part{{}}
	}
	var n int
	var key func(i int) string
	switch t.Kind {
	case engine.TakeTrip:
		n, key = len(t.Takes), func(i int) string { return wire.BucketKeyOfID("", t.Takes[i].Limit.Name, string(t.Takes[i].ID)) }
	case engine.RefundTrip:
		n, key = len(t.Refunds), func(i int) string { return wire.BucketKeyOfID("", t.Refunds[i].Limit.Name, string(t.Refunds[i].ID)) }
	case engine.LowTrip:
		n, key = len(t.Lows), func(i int) string {
			x := &t.Lows[i]
			return wire.LowKey("", x.Limit, x.Shards, x.Shard)
		}
	case engine.WindowsTrip:
		n, key = len(t.Windows), func(i int) string {
			x := &t.Windows[i]
			return wire.MarksKey("", x.Limit.Name, x.Shards, x.Shard)
		}
	default:
		n, key = 1, func(int) string { return wire.FleetKey("", t.Fleet) }
	}
	var parts []part
	for i := range n {
		m := sc.masterOf(key(i))
		j := slices.IndexFunc(parts, func(p part) bool { return p.m == m })
		if j < 0 {
			j = len(parts)
			parts = append(parts, part{m: m})
		}
		parts[j].idx = append(parts[j].idx, i)
	}
	if len(parts) == 1 {
		parts[0].idx = nil
	}
	return parts
}

// each calls f with the index in the trip of each item part p holds of n items of one
// kind (a trip carries items of one kind: n is 0 for the others).
func (p *part) each(n int, f func(i int)) {
	if n == 0 {
		return
	}
	if p.idx == nil {
		for i := range n {
			f(i)
		}
		return
	}
	for _, i := range p.idx {
		f(i)
	}
}

// call makes part p of trip t through master p.m's breaker, then calls done.
func (h *hybridStrat) call(s *server, hs *hybridServer, t *engine.Trip, p *part, late func(read func()), done func()) {
	f, sc := h.f, h.f.sc
	brk := hs.brks[p.m]
	deadline := sc.runsAt(s.id, f.e.now+sc.Breaker.Timeout)
	// granted counts the tokens Redis granted to the part's takes; gaveUp that Do
	// returned without the answer: such grants are spent in Redis and not leased, unless
	// a later take sent under the same number (Refill.Resend) reads them back: replayed
	// counts those, taken off the unread once this trip's answer is read.
	var granted, replayed int64
	gaveUp := false
	// A take lingers: its answer, read after Do gave up on it, goes to the engine
	// (Engine.Late), and what the engine takes of it (a refill's grant, a reservation's
	// claim's to give back) is read after all.
	var readLate func()
	if t.Kind == engine.TakeTrip {
		readLate = func() {
			late(func() {
				now := s.clock(f.e.now)
				p.each(len(t.Takes), func(i int) {
					r := t.TakeResults[i]
					r.Err = nil // a part's error (failPart), not Redis's answer
					if hs.eng.Late(now, t, i, &r) {
						hs.unread -= int64(r.Granted)
						hs.readLate += int64(r.Granted)
					}
				})
			})
		}
	}
	h.b.callLate(brk, deadline, readLate, func(answered func()) {
		if sc.cutOff(s.id, f.e.now) {
			return // the call goes nowhere: the breaker's deadline ends it
		}
		if s.id < sc.StarvedServers {
			reply := answered
			answered = func() {
				if !h.starved(s, reply) { // else the answer waits to be read
					reply()
				}
			}
		}
		var n int
		var cost time.Duration
		switch t.Kind {
		case engine.LowTrip:
			p.each(len(t.Lows), func(i int) {
				c, d := lowCost(sc, &t.Lows[i])
				n, cost = n+c, cost+d
			})
		case engine.WindowsTrip:
			txs := 0
			p.each(len(t.Windows), func(i int) {
				c, d := windowCost(&t.Windows[i])
				n, cost, txs = n+c, cost+d, txs+1
			})
			if sc.Masters == 1 {
				txs = min(txs, 1) // one transaction for every trip (redisstore.Store.WindowsBatch)
			}
			n += 2 * txs // each transaction's MULTI and EXEC: counted, their Redis time is not
		case engine.HeartbeatTrip: // the heartbeat, or the record of representations
			n, cost = 1, sc.ScriptTime
			if p.idx[0] == 1 { // luascript.Low: a command's time for each member
				cost += time.Duration(len(t.Reps)) * sc.CommandTime
			}
		default:
			p.each(max(len(t.Takes), len(t.Refunds), 1), func(int) { n++ })
			cost = time.Duration(n) * sc.ScriptTime
			if t.Kind == engine.RefundTrip && sc.Masters <= 1 {
				// redisstore.Store.RefundBatch: up to RefundsPerCall refunds a script call
				// on one Redis; on a Cluster, only buckets of one hash slot share a call,
				// which a trip's few keys seldom do: counted one a call, an upper bound.
				// Each refund is still priced as a call of its own, an upper bound too.
				n = (n + redisstore.RefundsPerCall - 1) / redisstore.RefundsPerCall
			}
		}
		f.redis.roundTrip(p.m, n, cost, func(at time.Time) {
			p.each(len(t.Takes), func(i int) {
				r := t.Takes[i]
				bkey := wire.BucketKeyOfID(keyPrefix, r.Limit.Name, string(r.ID))
				take := func(seq uint64) takeReply {
					return h.s.Take(at, bkey, float64(r.Limit.Burst), r.Limit.Rate, r.Want, r.Min, s.name, seq, r.Limit.Version, r.Floor, r.Seen)
				}
				g := take(r.Seq)
				if g.Flag == luascript.Stale { // overtaken: it runs under a fresh number, as global.Store's does
					g = take(h.seq(hs))
				}
				t.TakeResults[i].Granted, t.TakeResults[i].Remaining = g.Granted, g.Tokens
				t.TakeResults[i].Wait = tokenbucket.FromMillis(float64(g.WaitMS))
				t.TakeResults[i].First = g.Flag == luascript.First
				t.TakeResults[i].Replayed = g.Flag == luascript.Replayed
				t.TakeResults[i].Version, t.TakeResults[i].Credit = g.Version, g.Credit
				t.TakeResults[i].Now = time.UnixMilli(g.NowMS)
				if g.Flag == luascript.Replayed {
					replayed += int64(g.Granted) // spent when it first ran, counted unread then
					return
				}
				granted += int64(g.Granted)
			})
			if gaveUp {
				hs.unread += granted
			}
			p.each(len(t.Refunds), func(i int) {
				r := t.Refunds[i]
				g := h.s.Refund(at, wire.BucketKeyOfID(keyPrefix, r.Limit.Name, string(r.ID)), float64(r.Limit.Burst), r.Limit.Rate, r.N, s.name, r.Seq, r.Limit.Version, r.DebtFloor(), r.Reference())
				t.RefundResults[i].Remaining, t.RefundResults[i].Seq = g.Tokens, r.Seq
			})
			if t.Kind == engine.HeartbeatTrip && p.idx[0] == 0 {
				t.Live = h.s.Heartbeat(at, wire.FleetKey(keyPrefix, t.Fleet), s.name, t.TTL.Milliseconds())
			}
			if t.Kind == engine.HeartbeatTrip && p.idx[0] == 1 { // luascript.Low, as redisstore.Store's Reps
				t.RepsGot = h.s.Low(at, wire.RepsKey(keyPrefix), t.RepsLive.Milliseconds(), t.Reps, nil)
			}
			p.each(len(t.Windows), func(i int) {
				x := &t.Windows[i]
				h.wr.run(at, x)
				f.redis.extend(p.m, readCost(x)) // the read's time, known once Redis has it
			})
			p.each(len(t.Lows), func(i int) {
				x := &t.Lows[i]
				key := wire.LowKey(keyPrefix, x.Limit, x.Shards, x.Shard)
				var got []string
				if x.ReadOnly() {
					got = h.s.LowRead(at, key, x.ReadAt.UnixMilli())
				} else {
					got = h.s.Low(at, key, engine.LowShare.Milliseconds(), idStrings(x.Mark), idStrings(x.Unmark))
				}
				x.Got = make([]redisstore.KeyID, len(got))
				for j, id := range got {
					x.Got[j] = redisstore.KeyID(id)
				}
			})
		}, answered)
	}, func(err error) {
		p.answered, p.err = err == nil, err
		if err != nil {
			gaveUp = true
			hs.unread += granted // granted already, the answer on its way back
			if p.idx != nil {
				h.failPart(t, p, err)
			}
		} else {
			hs.unread -= replayed
		}
		done()
	})
}

// failPart writes err into every item of part p of t, one of several parts, that was
// not answered: the trip, answered by another part, reads its items' errors there.
func (h *hybridStrat) failPart(t *engine.Trip, p *part, err error) {
	p.each(len(t.Takes), func(i int) { t.TakeResults[i].Err = err })
	p.each(len(t.Refunds), func(i int) { t.RefundResults[i].Err = err })
	p.each(len(t.Lows), func(i int) { t.Lows[i].Err = err })
	p.each(len(t.Windows), func(i int) { t.WindowErrs[i] = err })
}

// lowCost is the calls and Redis time of a low-key exchange with one set, as
// redisstore.Store.LowBatch makes it: a read, one plain command; or a script call for
// every wire.MaxLowWrite keys marked or unmarked (the last answers the marked keys),
// plus a plain command's time per key (a ZADD, a ZREM).
func lowCost(sc *Scenario, x *engine.LowExchange) (calls int, cost time.Duration) {
	if x.ReadOnly() {
		return 1, sc.CommandTime
	}
	keys := len(x.Mark) + len(x.Unmark)
	calls = wire.LowRuns(keys)
	return calls, time.Duration(calls)*sc.ScriptTime + time.Duration(keys)*sc.CommandTime
}

// idStrings returns ids as strings.
func idStrings(ids []redisstore.KeyID) []string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = string(id)
	}
	return s
}

// seq numbers the takes of a server (increasing, as global.Store's are).
func (h *hybridStrat) seq(hs *hybridServer) uint64 {
	hs.seq++
	return hs.seq
}

// leave closes s as Limiter.Close does: once the trip out is answered, the engine stops
// (refills not yet sent fail), lets go of every key, and its unused tokens are refunded.
func (h *hybridStrat) leave(s *server) {
	hs := s.state.(*hybridServer)
	hs.leaving = true
	if !hs.busy {
		h.close(s, hs)
	}
}

// close is the rest of Limiter.Close, from the loop's stop.
func (h *hybridStrat) close(s *server, hs *hybridServer) {
	f := h.f
	hs.timer = 0
	hs.eng.Stop(s.clock(f.e.now))
	hs.eng.Drain()
	var refund func()
	refund = func() {
		t := hs.eng.Next()
		if t == nil {
			hs.eng.Finish()
			return
		}
		h.trip(s, hs, t, func() {
			hs.eng.Done(s.clock(f.e.now), t)
		}, refund)
	}
	refund()
}

// report adds the breaker transitions over time to res.
func (h *breakerLog) report(sc *Scenario, res *Result) {
	h.mu.Lock()
	defer h.mu.Unlock()
	slices.SortStableFunc(h.transitions, func(a, b transition) int { return cmp.Compare(a.at, b.at) })
	res.BreakerTransitions = len(h.transitions)
	state := map[brkID]breaker.State{}
	notClosed := 0
	ti := 0
	for i := range res.Timeline {
		end := time.Duration((res.Timeline[i].AtS + binWidth.Seconds()) * float64(time.Second))
		for ; ti < len(h.transitions) && h.transitions[ti].at < end; ti++ {
			tr := h.transitions[ti]
			if state[tr.brkID] != breaker.StateClosed {
				notClosed--
			}
			state[tr.brkID] = tr.to
			if tr.to != breaker.StateClosed {
				notClosed++
			}
		}
		res.Timeline[i].BreakersOpen = notClosed
	}
	o, _ := res.fault()
	if o == nil {
		return
	}
	w := sc.measured()
	o.BreakerOpenS, o.BreakerClosedS = -1, -1
	for _, tr := range h.transitions {
		if tr.to == breaker.StateOpen && tr.at >= w.Start && o.BreakerOpenS < 0 {
			o.BreakerOpenS = (tr.at - w.Start).Seconds()
		}
		if tr.to == breaker.StateClosed && tr.at >= w.End {
			o.BreakerClosedS = (tr.at - w.End).Seconds()
		}
		if tr.to == breaker.StateOpen && tr.at >= w.Start && sc.affected(tr.server, tr.master) {
			o.BreakerOpens++
		}
	}
	for id, brk := range h.breakers {
		if sc.affected(id.server, id.master) {
			st := brk.Stats()
			o.Timeouts += st.Timeouts
			o.StarvedTimeouts += st.Starved
		}
	}
}
