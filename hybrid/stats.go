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

// counterShards spreads the per-decision counters over cache lines by key, so that
// goroutines deciding for different keys do not write one line.
const counterShards = 16

type counters struct {
	decisions                                   [counterShards]decisionCounters
	canceled                                    atomic.Int64
	takes, roundTrips, refillErrors             atomic.Int64
	granted, refunded, refundsLost, refundCalls atomic.Int64
	heartbeats                                  atomic.Int64
}

type decisionCounters struct {
	bySource [SourceFallback + 1]atomic.Int64
	_        [64 - 8*(SourceFallback+1)%64]byte
}

func (c *counters) count(slot uint8, s Source) {
	if s <= SourceFallback {
		c.decisions[slot%counterShards].bySource[s].Add(1)
	}
}

func (c *counters) decided(s Source) int64 {
	var n int64
	for i := range c.decisions {
		n += c.decisions[i].bySource[s].Load()
	}
	return n
}

// Stats returns the Limiter's counters.
func (l *Limiter) Stats() Stats {
	c := &l.stats
	return Stats{
		PreCheck: c.decided(SourcePreCheck), Lease: c.decided(SourceLease), Global: c.decided(SourceGlobal), Fallback: c.decided(SourceFallback),
		Canceled: c.canceled.Load(),
		Takes:    c.takes.Load(), RoundTrips: c.roundTrips.Load(), RefillErrors: c.refillErrors.Load(),
		Granted: c.granted.Load(), Refunded: c.refunded.Load(), RefundsLost: c.refundsLost.Load(), RefundCalls: c.refundCalls.Load(),
		Heartbeats: c.heartbeats.Load(),
		Servers:    int(l.servers.Load()),
		Breaker:    l.brk.State(),
	}
}
