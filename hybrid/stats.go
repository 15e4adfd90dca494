package hybrid

import (
	"sync/atomic"

	"github.com/fleetlimit/fleetlimit/breaker"
)

// Stats are a Limiter's counters since New, for metrics.
type Stats struct {
	// Decisions by the tier that made them.
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
	// Breaker is the breaker's state.
	Breaker breaker.State
}

type counters struct {
	preCheck, lease, global, fallback, canceled atomic.Int64
	takes, roundTrips, refillErrors             atomic.Int64
	granted, refunded, refundsLost, refundCalls atomic.Int64
	heartbeats                                  atomic.Int64
}

func (c *counters) count(s Source) {
	switch s {
	case SourcePreCheck:
		c.preCheck.Add(1)
	case SourceLease:
		c.lease.Add(1)
	case SourceGlobal:
		c.global.Add(1)
	case SourceFallback:
		c.fallback.Add(1)
	}
}

// Stats returns the Limiter's counters.
func (l *Limiter) Stats() Stats {
	c := &l.stats
	return Stats{
		PreCheck: c.preCheck.Load(), Lease: c.lease.Load(), Global: c.global.Load(), Fallback: c.fallback.Load(),
		Canceled: c.canceled.Load(),
		Takes:    c.takes.Load(), RoundTrips: c.roundTrips.Load(), RefillErrors: c.refillErrors.Load(),
		Granted: c.granted.Load(), Refunded: c.refunded.Load(), RefundsLost: c.refundsLost.Load(), RefundCalls: c.refundCalls.Load(),
		Heartbeats: c.heartbeats.Load(),
		Servers:    int(l.servers.Load()),
		Breaker:    l.brk.State(),
	}
}
