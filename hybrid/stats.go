package hybrid

import (
	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/internal/engine"
)

// Stats are a Limiter's counters since New, for metrics: a snapshot, each counter read
// atomically. docs/metrics.md names the metrics the adapters export from them.
type Stats struct {
	// Decisions by the tier that made them, over every limit.
	PreCheck, Lease, Global, Fallback int64
	// Canceled counts requests whose context ended while they waited for Redis.
	Canceled int64
	// Takes is the refills sent to Redis; RoundTrips the round trips that carried them.
	Takes, RoundTrips int64
	// RefillErrors counts refills that failed (breaker open, timeout, Redis error).
	RefillErrors int64
	// Granted is the tokens taken from Redis; Refunded those given back; RefundsLost not.
	Granted, Refunded, RefundsLost, RefundCalls int64
	// Heartbeats is the number of fleet heartbeats attempted.
	Heartbeats int64
	// Servers is the live server count the limits are divided by.
	Servers int
	// Breaker and BreakerStats are the breaker's, folded over the masters of a Cluster:
	// the state over the masters of now, the counters over every master the Limiter has
	// had a breaker for, so that a failover does not take them back.
	Breaker      breaker.State
	BreakerStats breaker.Stats
	// Nodes are the breakers of the Redis Cluster masters called; empty for a plain
	// client.
	Nodes []NodeStats
	// Limits are the counters of each limit, in the order of Config.Limits.
	Limits []LimitStats
}

// NodeStats are the breaker of one Redis Cluster master.
type NodeStats struct {
	Addr         string // the master's address, as the cluster announces it
	Breaker      breaker.State
	BreakerStats breaker.Stats
}

// LimitStats are one limit's counters on this server since New. A limit Reconfigure
// removes and adds again (a change of kind) goes on from its counters, and a removed
// limit's stay in Stats' totals: no counter goes back.
type LimitStats struct {
	// Name, Rate and Burst are the limit's.
	Name  string
	Rate  float64
	Burst int
	// DryRun reports that the limit only watches: its denials were admitted.
	DryRun bool
	// Representations is the number of ways the fleet counts the limit that this
	// server decides each of its requests on: 1, or more while servers disagree on its
	// kind or window, as while a release that changes them rolls out (docs/limits.md).
	Representations int
	// Decisions counts the decisions per outcome, source and reason, denied first.
	Decisions []DecisionCount
	// Takes is the refills sent to Redis for the limit; RefillErrors those that failed.
	Takes, RefillErrors int64
	// Granted is the tokens taken from Redis; Refunded those given back; RefundsLost
	// those whose refund failed; Recovered those of refills whose answer came after the
	// breaker's deadline, read then or by the key's next refill.
	Granted, Refunded, RefundsLost int64
	Recovered                      int64
	// Held is the leased tokens this server holds for the limit.
	Held int64
	// LostBuckets counts buckets Redis lost (evicted, flushed): they came back empty; and
	// a Windowed limit's window arrays found lost, which its servers count again.
	LostBuckets int64
	// GivenBack counts admitted AllowMulti items whose tokens went back because another
	// item denied (and a reservation of tokens on hand canceled at the instant it was
	// made): the allowed Decisions less GivenBack is what the limit let through.
	GivenBack int64
	// Reshaped counts keys re-shaped with another rate or burst (a tier change,
	// Reconfigure).
	Reshaped int64
	// Owed is the tokens a FailLocal policy or ChargeLater limit admitted and has yet to
	// charge; Charged those charged; Forgiven never.
	Owed, Charged, Forgiven int64
	// Reserved is the tokens reservations claimed from the buckets' refill and kept.
	Reserved int64
}

// DecisionCount is how many decisions had one outcome, source and reason.
type DecisionCount struct {
	Allowed bool
	Source  Source
	Reason  Reason
	Count   int64
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
		out.Limits = append(out.Limits, limitStats(lm, l.eng.StatsOf(lm)))
	}
	return out
}

// limitStats are lm's counters s as the user sees them.
func limitStats(lm *engine.Limit, s engine.LimitStats) LimitStats {
	out := LimitStats{
		Name: lm.Name(), Rate: lm.Rate(), Burst: lm.Burst(), DryRun: lm.Config().DryRun,
		Representations: 1 + len(lm.Companions()),
		Takes:           s.Takes, RefillErrors: s.RefillErrors,
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
