package sim

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid"
)

// Constants of hybrid.Limiter that the simulation repeats (they are not exported).
const (
	maxBatch = 256 // refills in one pipelined round trip
)

// hybridStrat runs, on every simulated server, what hybrid.Limiter does around the lease
// core: the pre-check (a local.Limiter at the limit's own rate and burst, looked at first
// and spent only if the lease allows), the lease (hybrid.Lease, the library's own state
// machine), one background refiller per server that sends pending refills (several keys
// in one pipelined round trip) through the server's breaker.Breaker, then the queued
// refunds (summed per key, up to maxBatch keys per pipelined round trip), and expires leases every Lifetime/4; requests
// that wait for a refill give up after the limit's timeout; when Redis does not answer,
// breaker.Fallback applies the limit's policy. The lua.Take and lua.Refund scripts run on
// miniredis (or the Go model).
type hybridStrat struct {
	f   *fleet
	s   scripts
	b   *bubble
	cfg *hybrid.LeaseConfig // the live server count as the fleet knows it

	mu          sync.Mutex   // guards transitions: OnStateChange runs on the calls' goroutines
	transitions []transition // by time
}

// transition is a breaker state change of one server.
type transition struct {
	at       time.Duration
	server   int
	from, to breaker.State
}

// hserver is one server's hybrid.Limiter.
type hserver struct {
	keys     map[int]*hkey
	brk      *breaker.Breaker
	fb       *breaker.Fallback
	pending  []*flight
	refunds  []refundReq
	expiries []expiryReq
	busy     bool // the refiller is working
	wake     bool // work arrived while it was
	tick     bool // an expiry tick arrived while it was
	closed   bool
}

// hkey is one server's entry for one key: its lease and the refill in flight.
type hkey struct {
	lease  hybrid.Lease
	flight *flight
}

// flight is one refill on its way; waiters are the requests waiting for it.
type flight struct {
	key       int
	seq       uint64
	want, min int
	waiters   []*waiter
}

// waiter is a request waiting for a refill, with its own timeout.
type waiter struct {
	q       *request
	decided bool
}

type refundReq struct{ key, n int }

type expiryReq struct {
	key int
	at  time.Time
}

func newHybrid(f *fleet, s scripts, b *bubble) (*hybridStrat, error) {
	cfg, err := hybrid.LeaseConfig{Rate: f.sc.Rate, Burst: f.sc.Burst, Servers: f.sc.Servers}.Normalize()
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	return &hybridStrat{f: f, s: s, b: b, cfg: &cfg}, nil
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

func (h *hybridStrat) join(s *server) error {
	sc := h.f.sc
	pre, err := newLocalLimiter(sc, rate.Limit(sc.Rate), sc.Burst)
	if err != nil {
		return err
	}
	s.local = pre
	fb, err := breaker.NewFallback(policyOf(sc.Policy), breaker.FallbackConfig{
		Rate: sc.Rate, Burst: sc.Burst, Servers: h.cfg.Servers, MaxCost: sc.Cost, MaxKeys: max(sc.Keys, 1024),
	})
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	id := s.id
	brk, err := breaker.New(breaker.Settings{
		Name:    s.name,
		Timeout: sc.Deadline,
		OnStateChange: func(from, to breaker.State) {
			// The bubble's clock is the virtual one (the event loop keeps it there).
			tr := transition{at: time.Since(h.b.base), server: id, from: from, to: to}
			h.mu.Lock()
			h.transitions = append(h.transitions, tr)
			h.mu.Unlock()
		},
	})
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	hs := &hserver{keys: make(map[int]*hkey), brk: brk, fb: fb}
	s.state = hs
	h.scheduleTick(s, hs)
	return nil
}

// scheduleTick runs the refiller's expiry ticker: every Lifetime/4.
func (h *hybridStrat) scheduleTick(s *server, hs *hserver) {
	h.f.e.after(max(h.cfg.Lifetime/4, time.Millisecond), func() {
		if hs.closed || h.f.e.now > h.f.sc.Duration+10*time.Second {
			return
		}
		hs.tick = true
		h.kick(s, hs)
		h.scheduleTick(s, hs)
	})
}

// leave closes s as Limiter.Close does: refills not yet sent fail, every lease is drained,
// and the unused tokens are refunded.
func (h *hybridStrat) leave(s *server) {
	hs := s.state.(*hserver)
	hs.closed = true
	for _, fl := range hs.pending {
		h.settle(s, fl, nil, errClosed)
	}
	hs.pending = nil
	for _, k := range slices.Sorted(maps.Keys(hs.keys)) { // map order would make runs differ
		st := hs.keys[k]
		st.flight = nil
		h.queueRefund(hs, k, st.lease.Drain())
	}
	h.sendRefunds(s, hs, func() {})
}

var errClosed = errors.New("sim: server closed")

// resize tells every live server the new fleet size (what the heartbeat reports).
func (h *hybridStrat) resize(n int) {
	c := *h.cfg
	c.Servers = n
	h.cfg = &c
	for _, s := range h.f.live {
		_ = s.state.(*hserver).fb.SetServersAt(s.clock(h.f.e.now), n)
	}
}

func (h *hybridStrat) entry(s *server, k int) *hkey {
	hs := s.state.(*hserver)
	st := hs.keys[k]
	if st == nil {
		st = &hkey{lease: hybrid.NewLease(mix(h.f.sc.Seed, uint64(s.id), uint64(k)))}
		hs.keys[k] = st
	}
	return st
}

// mix derives a well-spread 64-bit seed from xs (splitmix64 finalizer over a running sum),
// so every (run, server, key) gets its own pacing jitter, the same in every run.
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

func (h *hybridStrat) handle(s *server, q *request) {
	h.pass(s, q, nil, true)
}

// pass is Limiter.pass: decide under the key's entry, then queue the refund and send the
// refill the step asks for. A request that must wait joins its flight's waiters (w is nil
// until a request first waits).
func (h *hybridStrat) pass(s *server, q *request, w *waiter, first bool) {
	f, hs := h.f, s.state.(*hserver)
	now := s.clock(f.e.now)
	key := f.keyName(q.key)
	st := h.entry(s, q.key)
	var step hybrid.Step
	if st.lease.CanServe(h.cfg, now, q.n) {
		if !s.local.AllowN(now, key, q.n) {
			h.decide(q, w, false, srcPrecheck)
			return
		}
		step = st.lease.Acquire(h.cfg, now, q.n)
	} else {
		if q.n > 0 && s.local.TokensAt(now, key) < float64(q.n) {
			h.decide(q, w, false, srcPrecheck)
			return
		}
		if first {
			step = st.lease.Acquire(h.cfg, now, q.n)
		} else {
			step = st.lease.Recheck(h.cfg, now, q.n)
		}
		if step.Action == hybrid.Allow {
			s.local.AllowN(now, key, q.n)
		}
	}
	var fl *flight
	if step.Refill.Want > 0 {
		fl = &flight{key: q.key, seq: step.Refill.Seq, want: step.Refill.Want, min: step.Refill.Min}
		st.flight = fl
	} else if step.Action == hybrid.Wait {
		fl = st.flight
	}
	h.queueRefund(hs, q.key, step.Refund)
	if step.Action == hybrid.Wait && fl != nil {
		if w == nil {
			w = &waiter{q: q}
		}
		fl.waiters = append(fl.waiters, w)
		if first {
			f.e.after(f.sc.Deadline, func() { // the request's own wait timeout
				if !w.decided {
					h.fallback(s, q, w)
				}
			})
		}
	}
	if step.Refill.Want > 0 {
		h.send(s, hs, fl)
	}
	switch step.Action {
	case hybrid.Allow:
		src := srcLease
		if !first {
			src = srcGlobal
		}
		h.decide(q, w, true, src)
	case hybrid.Deny:
		src := srcLease
		switch {
		case !first: // as Limiter.decide: denied after waiting for a refill
			src = srcGlobal
		case step.Reason == hybrid.ReasonPaced:
			src = srcPaced
		}
		h.decide(q, w, false, src)
	case hybrid.Wait:
		if fl == nil { // cannot happen: a Wait always has a flight; be safe
			h.fallback(s, q, w)
		}
	}
	h.kick(s, hs)
}

// decide records q's decision, once (w, if the request waited, remembers it was decided).
func (h *hybridStrat) decide(q *request, w *waiter, allowed bool, src source) {
	if w != nil {
		if w.decided {
			return
		}
		w.decided = true
	}
	h.f.decide(q, allowed, src)
}

// fallback is Limiter.fallback: the policy decides; an admitted request still spends its
// pre-check tokens.
func (h *hybridStrat) fallback(s *server, q *request, w *waiter) {
	if w != nil && w.decided {
		return
	}
	f, hs := h.f, s.state.(*hserver)
	now := s.clock(f.e.now)
	key := f.keyName(q.key)
	allowed := hs.fb.AllowN(now, key, q.n)
	if allowed && q.n > 0 && !s.local.AllowN(now, key, q.n) {
		h.decide(q, w, false, srcPrecheck)
		return
	}
	h.decide(q, w, allowed, srcFallback)
}

// send is Limiter.send: with the breaker open the refill fails at once; else it waits for
// the refiller.
func (h *hybridStrat) send(s *server, hs *hserver, fl *flight) {
	h.b.sync()
	if hs.brk.State() == breaker.StateOpen {
		h.settle(s, fl, nil, breaker.ErrOpen)
		return
	}
	if hs.closed {
		h.settle(s, fl, nil, errClosed)
		return
	}
	hs.pending = append(hs.pending, fl)
	h.kick(s, hs)
}

func (h *hybridStrat) queueRefund(hs *hserver, k, n int) {
	if n > 0 {
		hs.refunds = append(hs.refunds, refundReq{key: k, n: n})
	}
}

// kick wakes the refiller.
func (h *hybridStrat) kick(s *server, hs *hserver) {
	if hs.busy {
		hs.wake = true
		return
	}
	if len(hs.pending) == 0 && len(hs.refunds) == 0 && !hs.tick {
		return
	}
	h.loop(s, hs)
}

// loop is one turn of Limiter.refiller: expire (on a tick), send every pending refill,
// then the refunds; again if work arrived meanwhile.
func (h *hybridStrat) loop(s *server, hs *hserver) {
	hs.busy, hs.wake = true, false
	if hs.tick {
		hs.tick = false
		h.expire(s, hs)
	}
	h.refill(s, hs, func() {
		h.sendRefunds(s, hs, func() {
			hs.busy = false
			if hs.wake || hs.tick {
				h.loop(s, hs)
			}
		})
	})
}

// expire is Limiter.expire: refund leased tokens whose lifetime has passed.
func (h *hybridStrat) expire(s *server, hs *hserver) {
	now := s.clock(h.f.e.now)
	i := 0
	for i < len(hs.expiries) && !hs.expiries[i].at.After(now) {
		i++
	}
	due := hs.expiries[:i:i]
	hs.expiries = hs.expiries[i:]
	for _, x := range due {
		if st := hs.keys[x.key]; st != nil {
			h.queueRefund(hs, x.key, st.lease.Expire(h.cfg, now))
		}
	}
}

// refill sends the pending refills, up to maxBatch per pipelined round trip, one round
// trip at a time, then calls next.
func (h *hybridStrat) refill(s *server, hs *hserver, next func()) {
	if len(hs.pending) == 0 || hs.closed {
		next()
		return
	}
	f, sc := h.f, h.f.sc
	batch := hs.pending
	if len(batch) > maxBatch {
		batch = batch[:maxBatch:maxBatch]
		hs.pending = hs.pending[maxBatch:]
	} else {
		hs.pending = nil
	}
	grants := make([]takeReply, len(batch))
	h.b.call(hs.brk, func(answered func()) {
		f.redis.roundTrip(len(batch), time.Duration(len(batch))*sc.ScriptTime, func(at time.Time) {
			for i, fl := range batch {
				grants[i] = h.s.Take(at, f.keyName(fl.key), float64(sc.Burst), sc.Rate, fl.want, fl.min, s.name, fl.seq)
			}
		}, answered)
	}, func(err error) {
		for i, fl := range batch {
			h.settle(s, fl, &grants[i], err)
		}
		h.refill(s, hs, next)
	})
}

// settle is Limiter.finish: apply the answer of refill fl if its key still holds that
// flight (else the tokens go back), then let the waiting requests pass again, or go to the
// policy if the refill failed.
func (h *hybridStrat) settle(s *server, fl *flight, g *takeReply, err error) {
	hs := s.state.(*hserver)
	now := s.clock(h.f.e.now)
	st := hs.keys[fl.key]
	back := 0
	if st != nil && st.flight == fl {
		st.flight = nil
		if err != nil {
			st.lease.Failed(fl.seq)
		} else {
			back = st.lease.Granted(h.cfg, now, fl.seq, hybrid.Grant{
				Granted: g.Granted, Remaining: g.Tokens, Wait: time.Duration(g.WaitMS) * time.Millisecond})
		}
	} else if err == nil {
		back = g.Granted
	}
	h.queueRefund(hs, fl.key, back)
	if err == nil && g.Granted > back {
		hs.expiries = append(hs.expiries, expiryReq{key: fl.key, at: now.Add(h.cfg.Lifetime)})
	}
	for _, w := range fl.waiters {
		switch {
		case w.decided:
		case errors.Is(err, errClosed):
			h.decide(w.q, w, false, srcClosed)
		case err != nil:
			h.fallback(s, w.q, w)
		default:
			h.pass(s, w.q, w, false)
		}
	}
	fl.waiters = nil
}

// sendRefunds is Limiter.sendRefunds: the queued refunds, summed per key (at most a
// burst), up to maxBatch keys per pipelined round trip (global.Store.RefundBatch), one
// round trip at a time through the breaker; then next. Failed refunds are dropped.
func (h *hybridStrat) sendRefunds(s *server, hs *hserver, next func()) {
	queued := hs.refunds
	hs.refunds = nil
	if len(queued) == 0 {
		next()
		return
	}
	sum := map[int]int{}
	var order []int
	for _, r := range queued {
		if _, ok := sum[r.key]; !ok {
			order = append(order, r.key)
		}
		sum[r.key] += r.n
	}
	f, sc := h.f, h.f.sc
	var trip func()
	trip = func() {
		if len(order) == 0 {
			next()
			return
		}
		batch := order[:min(len(order), maxBatch)]
		order = order[len(batch):]
		h.b.call(hs.brk, func(answered func()) {
			f.redis.roundTrip(len(batch), time.Duration(len(batch))*sc.ScriptTime, func(at time.Time) {
				for _, k := range batch {
					h.s.Refund(at, f.keyName(k), float64(sc.Burst), sc.Rate, min(sum[k], sc.Burst), s.name, h.refundSeq(s))
				}
			}, answered)
		}, func(error) { trip() })
	}
	trip()
}

// refundSeq numbers the refunds of server s (increasing, as global.Store's are).
func (h *hybridStrat) refundSeq(s *server) uint64 {
	s.seq++
	return s.seq
}

// report adds what only the hybrid strategy knows to res: breaker transitions over time.
func (h *hybridStrat) report(res *Result) {
	h.mu.Lock()
	defer h.mu.Unlock()
	slices.SortStableFunc(h.transitions, func(a, b transition) int { return cmp.Compare(a.at, b.at) })
	res.BreakerTransitions = len(h.transitions)
	state := map[int]breaker.State{}
	notClosed := 0
	ti := 0
	for i := range res.Timeline {
		end := time.Duration((res.Timeline[i].AtS + binWidth.Seconds()) * float64(time.Second))
		for ; ti < len(h.transitions) && h.transitions[ti].at < end; ti++ {
			tr := h.transitions[ti]
			if state[tr.server] != breaker.StateClosed {
				notClosed--
			}
			state[tr.server] = tr.to
			if tr.to != breaker.StateClosed {
				notClosed++
			}
		}
		res.Timeline[i].BreakersOpen = notClosed
	}
	o := res.Outage
	if o == nil {
		return
	}
	w := h.f.sc.Outage
	o.BreakerOpenS, o.BreakerClosedS = -1, -1
	for _, tr := range h.transitions {
		if tr.to == breaker.StateOpen && tr.at >= w.Start && o.BreakerOpenS < 0 {
			o.BreakerOpenS = (tr.at - w.Start).Seconds()
		}
		if tr.to == breaker.StateClosed && tr.at >= w.End {
			o.BreakerClosedS = (tr.at - w.End).Seconds()
		}
	}
}
