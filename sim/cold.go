package sim

import (
	"math"
	"slices"
	"time"
)

// coldCost is the Redis cost model of the cold-key designs, in the simulator's units (a
// one-key script call costs ScriptTime, 8 µs). Measured with TestRedisCost on redis-server
// 7.0.15 on the 2-vCPU machine of these figures:
//
//	go test ./sim -run TestRedisCost -v -args -rediscost
//
// lua.Take cost 13.6-14.2 µs per call there; the multi-key take 8.6-8.7 µs per key at
// 64-256 keys per call (14.3 µs with one key), and the leanest charge (one string per
// bucket, GET and SET PX) 7.3-7.6 µs per key. Scaled by 8 / 14 to the simulator's 8 µs
// per take call: 5 µs per key (call, key), and the 3 µs rest of a one-key call per call.
// The per-key work (three redis.call and the Lua arithmetic per key) is most of a
// script's cost: a multi-key script saves the per-call part only. A later run on the
// same machine (lua.Take 13.75 µs) measured the multi-key take at 5.2-5.5 µs per key
// and the leanest charge at 3.6-3.8: the model keeps the higher figures.
//
// The leanest token bucket a script can keep (arraySource: one GCRA cell per key in a
// BITFIELD array, all of a call's cells read and written by one BITFIELD each) cost
// 1.74 µs per key at 64-256 keys per call in that later run: 1.0 µs in the simulator's
// units. No script at all, window-array's commands cost (same run): BITFIELD 0.35 µs with
// one sub-command, 0.144 µs per sub-command; ZADD 0.18 µs + 0.23 per member; ZRANGEBYSCORE
// WITHSCORES 0.13 µs + 0.16 per member answered. Scaled by 8 / 14 and rounded up:
// bfCall, bfSub, zCall, zMember and zRead (TIME, ZREMRANGEBYSCORE and the marks'
// PEXPIRE cost zCall). PEXPIREAT after each BITFIELD, from INFO commandstats of
// 100,000 pipelined pairs on redis-server 7.0.15, four runs: 0.18-0.19 µs (BITFIELD with
// two sub-commands 0.54-0.76 µs, as the figures above give), scaled by 8 / 14 and
// rounded up to 10 ns: expire.
var coldCost = struct{ call, key, bfCall, bfSub, zCall, zMember, zRead, expire time.Duration }{
	call: 3 * time.Microsecond, key: 5 * time.Microsecond,
	bfCall: 300 * time.Nanosecond, bfSub: 100 * time.Nanosecond,
	zCall: 300 * time.Nanosecond, zMember: 200 * time.Nanosecond, zRead: 150 * time.Nanosecond,
	expire: 110 * time.Nanosecond,
}

// Experimental cold-key strategies: the exploration step of per-client ("cold") keys,
// compared by TestColdKeys (cold_test.go) and in docs/design.md, "Cold keys: designs
// compared". None of them is what hybrid.Limiter runs, except HybridMultiKey, which is
// the engine with another Redis cost model. The built-in suites never use them; the
// design that shipped from the comparison is HybridAsync (hybrid.ChargeLater).
const (
	// HybridMultiKey is the hybrid strategy (the engine, unchanged) with every round trip
	// charged as one multi-key script call: coldOpts.callTime per call plus
	// coldOpts.keyTime per key, instead of ScriptTime per take.
	HybridMultiKey Strategy = "hybrid-multikey"
	// HybridShares is a simplified lease model (not the engine) whose lease cap follows
	// the servers that took from the key within a lease lifetime, as the take script
	// could count them from its per-server records: max(cost, burst / takers).
	HybridShares Strategy = "hybrid-shares"
	// AsyncModel is asynchronous charging: a server admits from the credit its last
	// report's answer gave it (or, on a key it has no state for, one request on trust),
	// and every coldOpts.report it charges its hits for every key it saw in one multi-key
	// script call, whose answer is the next credit: a share of the bucket, not reserved,
	// while the bucket holds a cost for every server reporting the key; else one cost,
	// reserved (taken from the bucket), or nothing.
	AsyncModel Strategy = "async-model"
)

// coldOpts are a scenario's options for the cold-key comparison.
type coldOpts struct {
	on bool
	// abuse adds one key (the last, index Keys-1) with steady demand of abuse requests/s
	// on top of Demand, from abuseAt on; the Zipf spread covers the other keys.
	abuse   float64
	abuseAt time.Duration
	// abuseServers, if set, sends the abusive key's requests to that many servers only
	// (the first live ones), as a client holding a few dozen connections does.
	abuseServers int
	// callTime and keyTime are the Redis time of a multi-key script call: per call and
	// per key in it (TestRedisCost).
	callTime, keyTime time.Duration
	// report is async-model's and window-array's reporting interval per server.
	report time.Duration
	// hotRead is how often window-array reads the marks (windowDefaults if 0);
	// windowExact makes every window-array request ask (windowOpts.exact).
	hotRead     time.Duration
	windowExact bool
	// windowDefer makes a window-array over key's request that finds no grant ask in
	// the next round trip and wait for it (windowOpts.deferOver); windowSample admits it
	// at odds instead (windowOpts.sample).
	windowDefer, windowSample bool
	// windowRoute serves a key a server sees often from grants sized by its rate
	// (windowOpts.route).
	windowRoute bool
}

func (o coldOpts) abuseKeys() int {
	if o.abuse > 0 {
		return 1
	}
	return 0
}

// ColdResult is what only the cold-key comparison measures.
type ColdResult struct {
	// UnderLimitWaited is the share of the requests of keys within their limit (requests
	// ≤ burst + rate·T) decided after waiting for Redis; UnderLimitWaitedAfter1s the same
	// over the requests that arrived 1 s into the run or later, past the fleet's start.
	UnderLimitWaited        float64 `json:"under_limit_waited"`
	UnderLimitWaitedAfter1s float64 `json:"under_limit_waited_after_1s"`
	// OverLimitAdmitted is, over the Zipf keys that asked more than burst + rate·T, their
	// admissions decided within the run over burst + rate·T each: what a key over its
	// limit gets of it (a limit honoured from below as well as from above).
	OverLimitAdmitted float64 `json:"over_limit_admitted"`
	// HotWorst and AbuseWorst are, for the hottest Zipf key and the abusive key, the
	// largest admissions in any window of length W over 2·burst + rate·W, W in
	// coldWindows; HotWorstW and AbuseWorstW the W that gave it.
	HotWorst    float64       `json:"hot_worst"`
	HotWorstW   time.Duration `json:"hot_worst_w"`
	AbuseWorst  float64       `json:"abuse_worst,omitempty"`
	AbuseWorstW time.Duration `json:"abuse_worst_w,omitempty"`
	// AbuseOverBound is the abusive key's admissions over burst + rate·T.
	AbuseOverBound float64 `json:"abuse_over_bound,omitempty"`
	// HotWorstAsync and AbuseWorstAsync are HotWorst and AbuseWorst over the bound of a
	// limit with Async, 2·burst + rate·W + S·c (S servers, c = max(1, ceil(burst/S))):
	// the largest over every W, which may be another W than theirs.
	HotWorstAsync   float64 `json:"hot_worst_async,omitempty"`
	AbuseWorstAsync float64 `json:"abuse_worst_async,omitempty"`
	// AnyWorst and AnyWorstAsync are the same over every key: the largest admissions of
	// any key in any window over 2·burst + rate·W, and over 2·burst + rate·W + S·c.
	AnyWorst      float64       `json:"any_worst"`
	AnyWorstW     time.Duration `json:"any_worst_w"`
	AnyWorstAsync float64       `json:"any_worst_async"`
	// AnyWorstAfter1s is AnyWorst over the windows that start 1 s into the run or later:
	// past the fleet's cold start.
	AnyWorstAfter1s float64 `json:"any_worst_after_1s"`
}

// coldWindows are the window lengths over which the keys' admissions are checked.
var coldWindows = []time.Duration{10 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond,
	500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second}

func (r *recorder) coldDecide(q *request, now, lat time.Duration, allowed bool) {
	if lat > 0 {
		r.keyWait[q.key]++
	}
	if now-lat >= time.Second {
		r.keyReqLate[q.key]++
		if lat > 0 {
			r.keyWaitLate[q.key]++
		}
	}
	if allowed && now <= r.sc.Duration {
		r.keyAt[q.key] = append(r.keyAt[q.key], now)
	}
}

// worstWindow returns the largest count of ats in a window of length w over
// 2·burst + rate·w + extra, for w in coldWindows, and the w.
func (r *recorder) worstWindow(ats []time.Duration, extra float64) (float64, time.Duration) {
	return r.worstWindowFrom(ats, extra, 0)
}

// worstWindowFrom is worstWindow over the windows that start at from or later.
func (r *recorder) worstWindowFrom(ats []time.Duration, extra float64, from time.Duration) (float64, time.Duration) {
	slices.Sort(ats)
	var worst float64
	var at time.Duration
	for _, w := range coldWindows {
		n := 0
		eachWindow(ats, w, func(start time.Duration, k int) {
			if start >= from {
				n = max(n, k)
			}
		})
		if x := float64(n) / (2*float64(r.sc.Burst) + r.sc.Rate*w.Seconds() + extra); x > worst {
			worst, at = x, w
		}
	}
	return worst, at
}

// asyncExtra is what a limit with Async may admit over 2·burst + rate·W: one share of
// the burst per server, max(1, ceil(burst/S)) each.
func (r *recorder) asyncExtra() float64 {
	s := r.sc.Servers
	return float64(s * max(1, (r.sc.Burst+s-1)/s))
}

func (r *recorder) coldResult() *ColdResult {
	c := &ColdResult{}
	var req, wait, reqLate, waitLate float64
	for k := range r.keyReq {
		if float64(r.keyReq[k]) <= r.sc.bound() {
			req += float64(r.keyReq[k])
			wait += float64(r.keyWait[k])
			reqLate += float64(r.keyReqLate[k])
			waitLate += float64(r.keyWaitLate[k])
		}
	}
	if req > 0 {
		c.UnderLimitWaited = wait / req
	}
	var adm, due float64
	for k := range r.sc.Keys - r.sc.cold.abuseKeys() {
		if float64(r.keyReq[k]) > r.sc.bound() {
			adm += float64(r.keyAdm[k])
			due += r.sc.bound()
		}
	}
	if due > 0 {
		c.OverLimitAdmitted = adm / due
	}
	if reqLate > 0 {
		c.UnderLimitWaitedAfter1s = waitLate / reqLate
	}
	c.HotWorst, c.HotWorstW = r.worstWindow(r.keyAt[0], 0)
	c.HotWorstAsync, _ = r.worstWindow(r.keyAt[0], r.asyncExtra())
	for _, ats := range r.keyAt {
		if w, at := r.worstWindow(ats, 0); w > c.AnyWorst {
			c.AnyWorst, c.AnyWorstW = w, at
		}
		w, _ := r.worstWindow(ats, r.asyncExtra())
		late, _ := r.worstWindowFrom(ats, 0, time.Second)
		c.AnyWorstAsync, c.AnyWorstAfter1s = max(c.AnyWorstAsync, w), max(c.AnyWorstAfter1s, late)
	}
	if r.sc.cold.abuse > 0 {
		abusive := r.keyAt[r.sc.Keys-1]
		c.AbuseWorst, c.AbuseWorstW = r.worstWindow(abusive, 0)
		c.AbuseWorstAsync, _ = r.worstWindow(abusive, r.asyncExtra())
		c.AbuseOverBound = float64(r.keyAdm[r.sc.Keys-1]) / r.sc.bound()
	}
	return c
}

// startAbuse schedules the abusive key's steady stream, if the scenario has one.
func (f *fleet) startAbuse() {
	a := f.sc.cold.abuse
	if a <= 0 {
		return
	}
	var next func(int64)
	next = func(i int64) {
		t := f.sc.cold.abuseAt + time.Duration((float64(i)+0.5)/a*float64(time.Second))
		if t >= f.sc.Duration {
			return
		}
		f.e.atArg(t, func(i int64) {
			sv := f.pick()
			if k := f.sc.cold.abuseServers; k > 0 {
				sv = f.live[f.rng.IntN(min(k, len(f.live)))]
			}
			f.sendTo(f.sc.Keys-1, sv)
			next(i + 1)
		}, i)
	}
	next(0)
}

// coldBucket is one key's bucket in the experimental strategies' Redis, modelled in Go:
// tokens (possibly negative once hybrid-async charges hits it admitted on trust), the
// instant of the last refill, and when each server last took from or reported on it.
type coldBucket struct {
	tokens float64
	ts     time.Duration
	who    map[int]time.Duration
}

// coldRedis is the experimental strategies' view of the buckets in Redis.
type coldRedis struct {
	f *fleet
	b map[int]*coldBucket
}

// open refills key k's bucket at Redis instant now, records server s, and returns the
// bucket and the servers recorded within window.
func (c *coldRedis) open(k, s int, now, window time.Duration) (*coldBucket, int) {
	sc := c.f.sc
	b := c.b[k]
	if b == nil {
		b = &coldBucket{tokens: float64(sc.Burst), ts: now, who: map[int]time.Duration{}}
		c.b[k] = b
	}
	b.tokens = math.Min(float64(sc.Burst), b.tokens+(now-b.ts).Seconds()*sc.Rate)
	b.ts = max(b.ts, now)
	b.who[s] = now
	n := 0
	for id, at := range b.who {
		if now-at <= window {
			n++
		} else if len(b.who) > 64 {
			delete(b.who, id)
		}
	}
	return b, n
}

// redisNow is the virtual instant of a Redis clock reading.
func redisNow(at time.Time) time.Duration { return at.Sub(epoch) }

// ---- hybrid-shares ----

type sharesStrat struct {
	f *fleet
	r coldRedis
}

type sharesServer struct {
	keys map[int]*sharesKey
	pend []coldOp
	busy bool
	rng  uint64
}

type sharesKey struct {
	tokens   int
	expires  time.Duration
	inflight bool
	waiters  []*request
	paced    time.Duration
	last     time.Duration
}

// coldOp is one key's item in a round trip: a take (want tokens), a refund (n tokens), or
// for hybrid-async a report (hits charged, n refunded).
type coldOp struct {
	key  int
	take bool
	n    int
	hits int
	// answers
	granted int
	left    float64
	servers int
	pre     bool
}

func newShares(f *fleet) *sharesStrat {
	return &sharesStrat{f: f, r: coldRedis{f: f, b: map[int]*coldBucket{}}}
}

func (h *sharesStrat) join(s *server) error {
	hs := &sharesServer{keys: map[int]*sharesKey{}, rng: mix(h.f.sc.Seed, uint64(s.id))}
	s.state = hs
	lt := h.lifetime()
	var sweep func()
	sweep = func() { // expire leases nobody asked about, and forget idle keys
		now := h.f.e.now
		for k, st := range hs.keys {
			if st.tokens > 0 && now >= st.expires {
				hs.pend = append(hs.pend, coldOp{key: k, n: st.tokens})
				st.tokens = 0
			}
			if st.tokens == 0 && !st.inflight && now-st.last > 2*lt {
				delete(hs.keys, k)
			}
		}
		h.kick(s, hs)
		if now < h.f.sc.Duration+2*lt {
			h.f.e.after(lt, sweep)
		}
	}
	h.f.e.after(time.Duration(hs.rng%uint64(lt)), sweep)
	return nil
}

func (h *sharesStrat) leave(*server) {}

func (h *sharesStrat) lifetime() time.Duration {
	if h.f.sc.Lifetime > 0 {
		return h.f.sc.Lifetime
	}
	return time.Second
}

func (h *sharesStrat) handle(s *server, q *request) {
	f := h.f
	hs := s.state.(*sharesServer)
	now := f.e.now
	st := hs.keys[q.key]
	if st == nil {
		st = &sharesKey{}
		hs.keys[q.key] = st
	}
	st.last = now
	if st.tokens > 0 && now >= st.expires {
		hs.pend = append(hs.pend, coldOp{key: q.key, n: st.tokens})
		st.tokens = 0
	}
	switch {
	case st.tokens >= q.n:
		st.tokens -= q.n
		f.decide(q, true, srcLease)
		return
	case now < st.paced:
		f.decide(q, false, srcPaced)
		return
	}
	st.waiters = append(st.waiters, q)
	f.e.after(f.sc.MaxWait, func() {
		if i := slices.Index(st.waiters, q); i >= 0 {
			st.waiters = slices.Delete(st.waiters, i, i+1)
			f.decide(q, false, srcFallback)
		}
	})
	if !st.inflight {
		st.inflight = true
		hs.pend = append(hs.pend, coldOp{key: q.key, take: true, n: q.n})
	}
	h.kick(s, hs)
}

// kick sends the pending takes and refunds, up to 256, in one pipelined round trip of
// one script call each, if no trip is out.
func (h *sharesStrat) kick(s *server, hs *sharesServer) {
	if hs.busy || len(hs.pend) == 0 {
		return
	}
	f, sc := h.f, h.f.sc
	n := min(len(hs.pend), 256)
	ops := slices.Clone(hs.pend[:n])
	hs.pend = hs.pend[n:]
	hs.busy = true
	lt := h.lifetime()
	f.redis.roundTrip(n, time.Duration(n)*sc.ScriptTime, func(at time.Time) {
		now := redisNow(at)
		for i := range ops {
			op := &ops[i]
			b, takers := h.r.open(op.key, s.id, now, lt)
			if !op.take {
				b.tokens = math.Min(float64(sc.Burst), b.tokens+float64(op.n))
				continue
			}
			want := max(op.n, sc.Burst/max(takers, 1))
			switch {
			case b.tokens >= float64(want):
				op.granted = want
			case math.Floor(b.tokens) >= float64(op.n):
				op.granted = int(b.tokens)
			}
			b.tokens -= float64(op.granted)
			op.left, op.servers = b.tokens, takers
		}
	}, func() {
		hs.busy = false
		now := f.e.now
		for _, op := range ops {
			st := hs.keys[op.key]
			if !op.take {
				continue
			}
			if st == nil { // forgotten meanwhile: give the grant back
				hs.pend = append(hs.pend, coldOp{key: op.key, n: op.granted})
				continue
			}
			st.inflight = false
			st.tokens += op.granted
			st.expires = now + lt
			for len(st.waiters) > 0 && st.tokens >= st.waiters[0].n {
				st.tokens -= st.waiters[0].n
				f.decide(st.waiters[0], true, srcGlobal)
				st.waiters = st.waiters[1:]
			}
			if len(st.waiters) > 0 || op.granted == 0 {
				for _, q := range st.waiters {
					f.decide(q, false, srcGlobal)
				}
				st.waiters = nil
				// pace: until the bucket could refill one round of the takers' batches,
				// at most a bucket, jittered in ×[0.5, 1.5)
				round := math.Min(float64(max(op.n, sc.Burst/max(op.servers, 1))*op.servers), float64(sc.Burst))
				wait := math.Max(round-op.left, float64(op.n)) / sc.Rate
				hs.rng = mix(hs.rng)
				j := 0.5 + float64(hs.rng>>11)/(1<<53)
				st.paced = now + time.Duration(wait*j*float64(time.Second))
			}
		}
		h.kick(s, hs)
	})
}

// ---- hybrid-async ----

type asyncStrat struct {
	f *fleet
	r coldRedis
}

type asyncServer struct {
	keys  map[int]*asyncKey
	dirty []int
	busy  bool
}

type asyncKey struct {
	credit int  // tokens this server may admit until the next answer
	pre    bool // credit was taken from the bucket (refunded if unused), not charged later
	hits   int  // admitted on trust or from charged credit, not yet reported
	dirty  bool // in the next report
	out    bool // in the report on the wire
	last   time.Duration
}

func newAsync(f *fleet) *asyncStrat {
	return &asyncStrat{f: f, r: coldRedis{f: f, b: map[int]*coldBucket{}}}
}

func (a *asyncStrat) interval() time.Duration {
	if a.f.sc.cold.report > 0 {
		return a.f.sc.cold.report
	}
	return 100 * time.Millisecond
}

func (a *asyncStrat) join(s *server) error {
	hs := &asyncServer{keys: map[int]*asyncKey{}}
	s.state = hs
	iv := a.interval()
	phase := time.Duration(mix(a.f.sc.Seed, uint64(s.id)) % uint64(iv))
	var tick func()
	sweeps := 0
	tick = func() {
		now := a.f.e.now
		if sweeps++; sweeps%int(max(time.Second/iv, 1)) == 0 { // forget keys idle for asyncKeep
			for k, st := range hs.keys {
				if now-st.last > asyncKeep && !st.dirty && !st.out {
					if st.pre && st.credit > 0 {
						a.mark(hs, k, st) // refund the reserved credit first
						continue
					}
					delete(hs.keys, k)
				}
			}
		}
		a.send(s, hs)
		if now < a.f.sc.Duration+2*time.Second {
			a.f.e.after(iv, tick)
		}
	}
	a.f.e.after(phase, tick)
	return nil
}

func (a *asyncStrat) leave(*server) {}

// asyncKeep is how long a server keeps an idle key's state, and with it the key's last
// credit: a key it has forgotten gets one request on trust, so a key over its limit
// whose requests reach each server less often than this would be admitted on trust.
var asyncKeep = 10 * time.Second

func (a *asyncStrat) mark(hs *asyncServer, k int, st *asyncKey) {
	if !st.dirty {
		st.dirty = true
		hs.dirty = append(hs.dirty, k)
	}
}

func (a *asyncStrat) handle(s *server, q *request) {
	f := a.f
	hs := s.state.(*asyncServer)
	st := hs.keys[q.key]
	switch {
	case st == nil: // first sight: one request on trust, charged at the next report
		st = &asyncKey{hits: q.n}
		hs.keys[q.key] = st
		f.decide(q, true, srcLease)
	case st.credit >= q.n:
		st.credit -= q.n
		if !st.pre {
			st.hits += q.n
		}
		f.decide(q, true, srcLease)
	default:
		f.decide(q, false, srcPaced)
	}
	st.last = f.e.now
	a.mark(hs, q.key, st)
}

// send reports every dirty key in one multi-key script call, if no report is out.
func (a *asyncStrat) send(s *server, hs *asyncServer) {
	if hs.busy || len(hs.dirty) == 0 {
		return
	}
	f, sc := a.f, a.f.sc
	ops := make([]coldOp, 0, len(hs.dirty))
	for _, k := range hs.dirty {
		st := hs.keys[k]
		op := coldOp{key: k, hits: st.hits}
		if st.pre {
			op.n, st.credit = st.credit, 0 // unused reserved credit goes back
		}
		st.hits, st.dirty, st.out = 0, false, true
		ops = append(ops, op)
	}
	hs.dirty = hs.dirty[:0]
	hs.busy = true
	cost := sc.cold.callTime + time.Duration(len(ops))*sc.cold.keyTime
	cst := float64(sc.Cost)
	f.redis.roundTrip(1, cost, func(at time.Time) {
		now := redisNow(at)
		for i := range ops {
			op := &ops[i]
			b, n := a.r.open(op.key, s.id, now, time.Second)
			b.tokens = math.Min(float64(sc.Burst), b.tokens+float64(op.n)) - float64(op.hits)
			if b.tokens >= float64(n)*cst { // a cost for every reporter: share, charge later
				op.granted = int(b.tokens / float64(n))
			} else if b.tokens >= cst { // contended: one cost, reserved
				op.granted, op.pre = sc.Cost, true
				b.tokens -= cst
			}
			op.left, op.servers = b.tokens, n
		}
	}, func() {
		hs.busy = false
		for _, op := range ops {
			st := hs.keys[op.key]
			st.out = false
			st.credit, st.pre = op.granted, op.pre
		}
	})
}
