package hybrid

import (
	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/internal/engine"
)

// Stats are a Limiter's counters since New, for metrics: a snapshot, each counter read
// atomically but not all at one instant. Package-level totals come first; Limits has
// them per limit. docs/metrics.md names the metrics the adapters export from them.
type Stats struct {
	// Decisions by the tier that made them, over every limit. Fallback does not count
	// the requests whose caller gave up while they waited for Redis; Canceled does.
	PreCheck, Lease, Global, Fallback int64
	// Canceled counts requests whose context ended while they waited for Redis.
	Canceled int64
	// Takes is the number of refills sent to Redis; RoundTrips the round trips that
	// carried them (several refills share one pipelined round trip).
	Takes, RoundTrips int64
	// RefillErrors counts refills that failed (breaker open, timeout, Redis error).
	RefillErrors int64
	// Granted is the tokens taken from the global buckets; Refunded those given back;
	// RefundsLost those whose refund failed (they stay spent); RefundCalls the calls.
	Granted, Refunded, RefundsLost, RefundCalls int64
	// Heartbeats is the number of fleet heartbeats attempted.
	Heartbeats int64
	// Servers is the live server count the limits are divided by.
	Servers int
	// Breaker is the breaker's state (its String method names it), BreakerStats its
	// counters, state changes included. A breaker shared by several Limiters counts
	// the calls of all of them. On a Redis Cluster they fold every breaker: Config's
	// and each master's (Nodes): the state is the worst (open, then half-open), the
	// counters are summed (MaxInFlight is the largest).
	Breaker      breaker.State
	BreakerStats breaker.Stats
	// Nodes, on a Redis Cluster, are the breakers of the masters the Limiter called
	// and that are masters still, in the order they were first called; empty for a
	// plain client.
	Nodes []NodeStats
	// Limits are the counters of each limit, in the order of Config.Limits.
	Limits []LimitStats
}

// NodeStats are the breaker of one Redis Cluster master: a failed master fails only
// the calls for the keys whose slots it serves.
type NodeStats struct {
	Addr         string // the master's address, as the cluster announces it
	Breaker      breaker.State
	BreakerStats breaker.Stats
}

// LimitStats are one limit's counters on this server since New.
type LimitStats struct {
	// Name, Rate and Burst are the limit's.
	Name  string
	Rate  float64
	Burst int
	// DryRun reports that the limit only watches (Limit.DryRun): its denials in
	// Decisions were admitted.
	DryRun bool
	// Decisions counts the decisions made for the limit, one entry per combination of
	// outcome, source and reason that occurred, in a fixed order (denied before
	// allowed, then by source and reason).
	Decisions []DecisionCount
	// Takes is the refills sent to Redis for the limit; RefillErrors those that failed.
	Takes, RefillErrors int64
	// Granted is the tokens taken from the limit's global buckets; Refunded those given
	// back; RefundsLost those whose refund failed (they stay spent). Recovered is the part
	// of Granted that refills whose answer was lost to a timeout had been granted, read
	// back by the next refill, which goes under the lost one's sequence number (when the
	// failure policy admitted none of the requests that waited for it).
	Granted, Refunded, RefundsLost int64
	Recovered                      int64
	// Held is the leased tokens this server holds for the limit, over every key: taken
	// from Redis and not yet spent, given back or lost.
	Held int64
	// LostBuckets counts the limit's buckets found lost in Redis: a refill answered that
	// the bucket held no record of this server, which had taken from it within the
	// bucket's lifetime. Redis evicted, flushed or deleted it, and it came back full, so
	// the fleet may admit up to a burst more than the limit: see docs/operations.md
	// (maxmemory-policy).
	LostBuckets int64
	// GivenBack counts admitted items of AllowMulti calls whose tokens went back because
	// another item was denied. Decisions counts them as admitted (the counters only
	// grow): Allowed() - GivenBack is what the limit let through.
	GivenBack int64
	// Reshaped counts keys this server re-shaped with another rate or burst: decided
	// under another tier than before, or after SetLimit changed them. Their leased
	// tokens were given back.
	Reshaped int64
	// Owed is the tokens a FailLocal policy, or a ChargeLater limit, admitted without the
	// bucket that this server has yet to charge to it (FailLocal's once Redis answers
	// again, ChargeLater's within its duration); Charged those it charged, as debts;
	// Forgiven those it never will (more than Burst + Rate·10 s for one key, more than
	// 100,000 keys owing, or the Limiter closed first). Redis itself forgives a FailLocal
	// debt the refill the bucket lost meanwhile (docs/failure-policies.md); a ChargeLater
	// charge, nothing.
	Owed, Charged, Forgiven int64
	// Reserved is the tokens this server's reservations claimed from the buckets' refill
	// (ReserveN, when its lease could not serve them) and did not give back.
	Reserved int64
}

// DecisionCount is how many decisions had one outcome, source and reason.
type DecisionCount struct {
	Allowed bool
	Source  Source
	Reason  Reason
	Count   int64
}

// Allowed returns the limit's admitted requests; Denied its denied ones.
func (s LimitStats) Allowed() int64 { return s.sum(true) }

// Denied returns the limit's denied requests, canceled ones included.
func (s LimitStats) Denied() int64 { return s.sum(false) }

func (s LimitStats) sum(allowed bool) int64 {
	var n int64
	for _, d := range s.Decisions {
		if d.Allowed == allowed {
			n += d.Count
		}
	}
	return n
}

// Stats returns the Limiter's counters.
func (l *Limiter) Stats() Stats {
	s := l.eng.Stats()
	out := Stats{
		PreCheck: s.PreCheck, Lease: s.Lease, Global: s.Global, Fallback: s.Fallback,
		Canceled: s.Canceled,
		Takes:    s.Takes, RoundTrips: s.RoundTrips, RefillErrors: s.RefillErrors,
		Granted: s.Granted, Refunded: s.Refunded, RefundsLost: s.RefundsLost, RefundCalls: s.RefundCalls,
		Heartbeats: s.Heartbeats,
		Servers:    s.Servers,
	}
	out.Breaker, out.BreakerStats, out.Nodes = l.nodes.stats()
	for _, lm := range l.eng.Limits() {
		out.Limits = append(out.Limits, limitStats(lm))
	}
	return out
}

// limitStats are lm's counters as the user sees them.
func limitStats(lm *engine.Limit) LimitStats {
	s := lm.Stats()
	out := LimitStats{
		Name: lm.Name(), Rate: lm.Rate(), Burst: lm.Burst(), DryRun: lm.Config().DryRun,
		Takes: s.Takes, RefillErrors: s.RefillErrors,
		Granted: s.Granted, Refunded: s.Refunded, RefundsLost: s.RefundsLost, Recovered: s.Recovered, Held: s.Held,
		LostBuckets: s.LostBuckets, GivenBack: s.GivenBack, Reshaped: s.Reshaped,
		Owed: s.Owed, Charged: s.Charged, Forgiven: s.Forgiven, Reserved: s.Reserved,
	}
	for a := range s.Decisions {
		for src := range s.Decisions[a] {
			for r, n := range s.Decisions[a][src] {
				if n > 0 {
					out.Decisions = append(out.Decisions, DecisionCount{Allowed: a == 1, Source: Source(src), Reason: Reason(r), Count: n})
				}
			}
		}
	}
	return out
}
