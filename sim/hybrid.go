package sim

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"golang.org/x/time/rate"

	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/local"
)

// srcGlobal marks a decision taken after waiting for a refill from the global bucket.
const srcGlobal = "global"

// hybridStrat wires hybrid's lease core, local's limiters and the failure policy into the
// simulated fleet the way the production limiter does: pre-check, lease, refill through the
// call deadline (and the breaker), fallback. The lease decisions are hybrid.Lease's own.
type hybridStrat struct {
	f   *fleet
	s   scripts
	cfg *hybrid.LeaseConfig // the live server count as the fleet knows it

	takes, refunds int64
}

// hserver is one server's hybrid state.
type hserver struct {
	keys      map[int]*hkey
	fallback  *local.Limiter // FailLocal's limiter
	refundSeq uint64
	guard     guard
}

// hkey is one server's state for one key: the lease and the requests waiting on its refill.
type hkey struct {
	lease   hybrid.Lease
	waiters []*request
	flight  *flight
}

// flight is a refill in flight.
type flight struct {
	seq      uint64
	timedOut bool
	answered bool
}

func newHybrid(f *fleet, s scripts) (*hybridStrat, error) {
	cfg, err := hybrid.LeaseConfig{Rate: f.sc.Rate, Burst: f.sc.Burst, Servers: f.sc.Servers}.Normalize()
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	return &hybridStrat{f: f, s: s, cfg: &cfg}, nil
}

func (h *hybridStrat) join(s *server) error {
	sc := h.f.sc
	pre, err := newLocalLimiter(sc, h.rate(), sc.Burst)
	if err != nil {
		return err
	}
	s.local = pre
	r, b := local.FallbackLimit(sc.Rate, sc.Burst, h.cfg.Servers, sc.Cost)
	fb, err := newLocalLimiter(sc, r, b)
	if err != nil {
		return err
	}
	s.state = &hserver{keys: make(map[int]*hkey), fallback: fb, guard: h.f.newGuard(s)}
	return nil
}

// rate is the pre-check's rate: the limit's own fleet-wide rate, so that the pre-check
// never denies what the global bucket alone would allow.
func (h *hybridStrat) rate() rate.Limit { return rate.Limit(h.f.sc.Rate) }

// leave closes s gracefully, as Limiter.Close does: every lease is drained and refunded,
// and requests still waiting on a refill go to the failure policy.
func (h *hybridStrat) leave(s *server) {
	hs := s.state.(*hserver)
	for _, k := range slices.Sorted(maps.Keys(hs.keys)) { // map order would make runs differ
		st := hs.keys[k]
		h.refund(s, k, st.lease.Drain())
		h.toFallback(s, k, st)
	}
}

// resize tells every live server the new fleet size (what the heartbeat reports).
func (h *hybridStrat) resize(n int) {
	c := *h.cfg
	c.Servers = n
	h.cfg = &c
}

func (h *hybridStrat) key(s *server, k int) *hkey {
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
	f := h.f
	now := s.clock(f.e.now)
	if !s.local.AllowN(now, f.keyName(q.key), q.n) {
		f.decide(q, false, srcPrecheck)
		return
	}
	st := h.key(s, q.key)
	step := st.lease.Acquire(h.cfg, now, q.n)
	h.apply(s, q.key, st, q, step, srcLease)
}

// apply carries out one step of the lease core for q.
func (h *hybridStrat) apply(s *server, k int, st *hkey, q *request, step hybrid.Step, allowSrc string) {
	h.refund(s, k, step.Refund)
	switch step.Action {
	case hybrid.Allow:
		h.f.decide(q, true, allowSrc)
		if step.Refill.Want > 0 {
			h.refill(s, k, st, step.Refill)
		}
	case hybrid.Deny:
		h.f.decide(q, false, srcPaced)
	case hybrid.Wait:
		st.waiters = append(st.waiters, q)
		if step.Refill.Want > 0 {
			h.refill(s, k, st, step.Refill)
		}
	}
}

// refill sends lua.Take for the lease's refill rf, under the call deadline.
func (h *hybridStrat) refill(s *server, k int, st *hkey, rf hybrid.Refill) {
	f, sc := h.f, h.f.sc
	hs := s.state.(*hserver)
	if !hs.guard.allow(f.e.now) {
		st.lease.Failed(rf.Seq)
		h.toFallback(s, k, st)
		return
	}
	fl := &flight{seq: rf.Seq}
	st.flight = fl
	h.takes++
	var g takeReply
	key := f.keyName(k)
	f.redis.roundTrip(1, sc.ScriptTime, func(at time.Time) {
		g = h.s.Take(at, key, float64(sc.Burst), sc.Rate, rf.Want, rf.Min, s.name, rf.Seq)
	}, func() {
		fl.answered = true
		now := s.clock(f.e.now)
		grant := hybrid.Grant{Granted: g.Granted, Remaining: g.Tokens, Wait: time.Duration(g.WaitMS) * time.Millisecond}
		if fl.timedOut || !s.alive {
			h.refund(s, k, st.lease.Granted(h.cfg, now, rf.Seq, grant))
			return
		}
		hs.guard.done(f.e.now, true)
		st.flight = nil
		h.refund(s, k, st.lease.Granted(h.cfg, now, rf.Seq, grant))
		h.recheck(s, k, st)
	})
	f.e.after(sc.Deadline, func() {
		if fl.answered {
			return
		}
		fl.timedOut = true
		hs.guard.done(f.e.now, false)
		if st.flight == fl {
			st.flight = nil
		}
		st.lease.Failed(rf.Seq)
		h.toFallback(s, k, st)
	})
}

// recheck answers the requests that waited on a refill.
func (h *hybridStrat) recheck(s *server, k int, st *hkey) {
	ws := st.waiters
	st.waiters = nil
	now := s.clock(h.f.e.now)
	for _, q := range ws {
		h.apply(s, k, st, q, st.lease.Recheck(h.cfg, now, q.n), srcGlobal)
	}
}

// toFallback decides every request waiting on st by the failure policy.
func (h *hybridStrat) toFallback(s *server, k int, st *hkey) {
	ws := st.waiters
	st.waiters = nil
	for _, q := range ws {
		h.fallback(s, q)
	}
}

func (h *hybridStrat) fallback(s *server, q *request) {
	f := h.f
	switch f.sc.Policy {
	case FailOpen:
		f.decide(q, true, srcFallback)
	case FailClosed:
		f.decide(q, false, srcFallback)
	default:
		hs := s.state.(*hserver)
		f.decide(q, hs.fallback.AllowN(s.clock(f.e.now), f.keyName(q.key), q.n), srcFallback)
	}
}

// refund gives n tokens back to key k's bucket (lua.Refund), unless the breaker is open.
func (h *hybridStrat) refund(s *server, k int, n int) {
	if n <= 0 {
		return
	}
	f, sc := h.f, h.f.sc
	hs := s.state.(*hserver)
	if !hs.guard.allow(f.e.now) {
		return
	}
	hs.refundSeq++
	seq := hs.refundSeq
	h.refunds++
	key := f.keyName(k)
	f.redis.roundTrip(1, sc.ScriptTime, func(at time.Time) {
		h.s.Refund(at, key, float64(sc.Burst), sc.Rate, n, s.name, seq)
	}, func() {})
}
