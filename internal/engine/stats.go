package engine

import (
	"slices"
	"sync/atomic"
	"unsafe"
)

// Stats are an engine's counters since New, summed over its limits: hybrid.Stats
// documents them (all but its Breaker fields, which are the driver's).
type Stats struct {
	PreCheck, Lease, Global, Fallback           int64 // decisions by source, Canceled not included
	Canceled                                    int64
	Takes, RoundTrips, RefillErrors             int64
	Granted, Refunded, RefundsLost, RefundCalls int64
	Heartbeats                                  int64
	Servers                                     int
}

// LimitStats are one limit's counters on this server since New.
type LimitStats struct {
	// Decisions counts decisions by [allowed][source][reason]; allowed is 1 for an
	// admitted request. A request its caller gave up on counts as denied by
	// SourceFallback with ReasonCanceled.
	Decisions [2][NumSources][NumReasons]int64
	// Takes counts refills sent, RefillErrors those that failed.
	Takes, RefillErrors int64
	// Granted is the tokens leased from the global bucket, Refunded those given back,
	// RefundsLost those whose refund failed (they stay spent). Recovered is the part of
	// Granted that takes whose answer was lost (a timeout) had been granted, read when
	// the answer came late (Engine.Late) or by sending the take again (Lease.Lost).
	Granted, Refunded, RefundsLost int64
	Recovered                      int64
	// Held is the leased tokens not yet spent, given back or lost: what this server may
	// still admit without asking Redis (including tokens queued for a refund, a
	// canceled claim's among them until they go).
	Held int64
	// LostBuckets counts buckets found lost: a take answered that the bucket held no
	// record of this server, which had taken from it within the record's lifetime; and
	// window arrays found lost: a count answered below what this server alone added.
	LostBuckets int64
	// GivenBack counts admitted decisions undone by Engine.Return (another item of an
	// all-or-nothing request was denied). They stay counted in Decisions as admitted.
	GivenBack int64
	// Reshaped counts keys re-shaped with other bucket parameters (another tier, or a
	// configuration SetLimit replaced): their leased tokens were given back.
	Reshaped int64
	// Owed is the tokens FailLocal or Async admitted without the bucket and not yet
	// charged to it; Charged those charged (as debts: FailLocal's once Redis answered
	// again, Async's once due; or paid by the grant of the refill the requests had waited
	// for, which Redis ran); Forgiven those that never will be (past the debt floor, too
	// many keys, or the engine finished).
	Owed, Charged, Forgiven int64
	// Reserved is the tokens reservations claimed from the buckets' refill and did not
	// give back (Engine.Claim, Engine.CancelClaim).
	Reserved int64
}

// counterShards spreads the per-decision counters over cache lines by goroutine
// (stripe), so that goroutines deciding on different cores rarely write one line.
const counterShards = 1 << counterBits

const counterBits = 4

// stripe is the caller's shard of a limit's decision counters: a hash of its stack
// address, so mostly one per goroutine (a goroutine counts from a few call depths, which
// may fall in a few shards). Goroutines have stacks of their own, so two goroutines
// deciding at once, on two cores, write the same line only when their stacks hash alike
// (about one pair in counterShards); a goroutine whose stack moved (it grew) counts in
// another shard from then on, which changes no sum: every reader sums the shards. Where
// each core runs the same few goroutines (a worker pool, a stream's handler, a
// benchmark), a line stays on its core, where a stripe by key would have every core write
// every line (docs/hot-path.md measures it). Where every request has a goroutine of its
// own, a line's consecutive writers are any goroutines on any core, whatever the stripe.
func stripe() uintptr {
	var x byte
	return uintptr(uint64(uintptr(unsafe.Pointer(&x))>>11) * 0x9E3779B97F4A7C15 >> (64 - counterBits))
}

// counters are the engine-wide counters; per-limit ones are in limitCounters.
type counters struct {
	roundTrips, refundCalls atomic.Int64
	heartbeats              atomic.Int64
}

// limitCounters are one limit's counters.
type limitCounters struct {
	decisions                      [counterShards]decisionCounters
	takes, refillErrors            atomic.Int64
	granted, refunded, refundsLost atomic.Int64
	recovered                      atomic.Int64
	lostBuckets                    atomic.Int64
	givenBack                      atomic.Int64
	reshaped                       atomic.Int64
	owed, charged, forgiven        atomic.Int64
	reserved                       atomic.Int64
	claimsBack                     atomic.Int64 // claimed tokens queued back to their buckets: refunds of tokens never leased
	paid                           atomic.Int64 // leased tokens a grant spent on what the failure policy had admitted (Engine.settle)
}

// decisionCounters are one shard of a limit's decision counters. extra is the tokens
// spent from leases beyond one per admitted lease decision, so that a request of cost 1
// (the common case) costs one atomic add.
type decisionCounters struct {
	n        [2][NumSources][NumReasons]atomic.Int64
	extra    atomic.Int64
	returned atomic.Int64 // leased tokens of admitted decisions given back (Engine.Return)
	_        [64 - 8*(2*int(NumSources)*int(NumReasons)+2)%64]byte
}

// count counts a decision d of cost n, in the calling goroutine's shard.
func (c *limitCounters) count(d *Decision, n int) {
	sh := &c.decisions[stripe()]
	if d.Allowed {
		if d.Source < NumSources && d.Reason < NumReasons {
			sh.n[1][d.Source][d.Reason].Add(1)
		}
		if n != 1 && spends(d.Reason) {
			sh.extra.Add(int64(n - 1))
		}
		return
	}
	if d.Source < NumSources && d.Reason < NumReasons {
		sh.n[0][d.Source][d.Reason].Add(1)
	}
}

// gaveBack counts n leased tokens of admitted decisions given back (Engine.Return), in
// the calling goroutine's shard.
func (c *limitCounters) gaveBack(n int) { c.decisions[stripe()].returned.Add(int64(n)) }

// spends reports whether an admitted decision of reason r spent leased tokens.
func spends(r Reason) bool { return r == ReasonLease || r == ReasonGranted }

// LostBuckets returns LimitStats.LostBuckets without reading the other counters.
func (lm *Limit) LostBuckets() int64 { return lm.stats.lostBuckets.Load() }

// Stats returns the limit's counters on this server.
func (lm *Limit) Stats() LimitStats {
	c := &lm.stats
	var s LimitStats
	spent := int64(0)
	for i := range c.decisions {
		sh := &c.decisions[i]
		for a := range sh.n {
			for src := range sh.n[a] {
				for r := range sh.n[a][src] {
					v := sh.n[a][src][r].Load()
					s.Decisions[a][src][r] += v
					if a == 1 && spends(Reason(r)) {
						spent += v
					}
				}
			}
		}
		spent += sh.extra.Load() - sh.returned.Load()
	}
	s.Takes, s.RefillErrors = c.takes.Load(), c.refillErrors.Load()
	s.Granted, s.Refunded, s.RefundsLost = c.granted.Load(), c.refunded.Load(), c.refundsLost.Load()
	s.Recovered = c.recovered.Load()
	// A claim's tokens given back go out as refunds, but were never leased.
	s.Held = max(s.Granted-spent-c.paid.Load()-s.Refunded-s.RefundsLost+c.claimsBack.Load(), 0)
	s.Reshaped = c.reshaped.Load()
	s.Owed, s.Charged, s.Forgiven = c.owed.Load(), c.charged.Load(), c.forgiven.Load()
	s.Reserved = c.reserved.Load()
	s.LostBuckets = c.lostBuckets.Load()
	s.GivenBack = c.givenBack.Load()
	return s
}

// StatsOf returns lm's counters with those of the limits of its name RemoveLimit removed
// before it was added (a change of kind is a removal and an addition): the counters of a
// name never go back, as a metric's series must not.
func (e *Engine) StatsOf(lm *Limit) LimitStats {
	s := lm.Stats()
	e.removedMu.Lock()
	defer e.removedMu.Unlock()
	for _, old := range e.past {
		if old != lm && old.Name() == lm.Name() {
			s.add(old.Stats())
		}
	}
	return s
}

// add adds o's counters to s.
func (s *LimitStats) add(o LimitStats) {
	for a := range s.Decisions {
		for src := range s.Decisions[a] {
			for r := range s.Decisions[a][src] {
				s.Decisions[a][src][r] += o.Decisions[a][src][r]
			}
		}
	}
	s.Takes += o.Takes
	s.RefillErrors += o.RefillErrors
	s.Granted += o.Granted
	s.Refunded += o.Refunded
	s.RefundsLost += o.RefundsLost
	s.Recovered += o.Recovered
	s.Held += o.Held
	s.LostBuckets += o.LostBuckets
	s.GivenBack += o.GivenBack
	s.Reshaped += o.Reshaped
	s.Owed += o.Owed
	s.Charged += o.Charged
	s.Forgiven += o.Forgiven
	s.Reserved += o.Reserved
}

// Stats returns the engine's counters, summed over its limits and those RemoveLimit
// removed.
func (e *Engine) Stats() Stats {
	s := Stats{
		RoundTrips: e.stats.roundTrips.Load(), RefundCalls: e.stats.refundCalls.Load(),
		Heartbeats: e.stats.heartbeats.Load(),
		Servers:    e.Servers(),
	}
	e.removedMu.Lock()
	all := append(slices.Clip(e.Limits()), e.past...)
	e.removedMu.Unlock()
	for _, lm := range all {
		ls := lm.Stats()
		for a := range ls.Decisions {
			for src := range ls.Decisions[a] {
				for r, v := range ls.Decisions[a][src] {
					switch {
					case Reason(r) == ReasonCanceled:
						s.Canceled += v
					case Source(src) == SourcePreCheck:
						s.PreCheck += v
					case Source(src) == SourceLease:
						s.Lease += v
					case Source(src) == SourceGlobal:
						s.Global += v
					case Source(src) == SourceFallback:
						s.Fallback += v
					}
				}
			}
		}
		s.Takes += ls.Takes
		s.RefillErrors += ls.RefillErrors
		s.Granted += ls.Granted
		s.Refunded += ls.Refunded
		s.RefundsLost += ls.RefundsLost
	}
	return s
}
