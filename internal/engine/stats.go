package engine

import "sync/atomic"

// Stats are an engine's counters since New: hybrid.Stats documents them (all but its
// Breaker field, which is the driver's).
type Stats struct {
	PreCheck, Lease, Global, Fallback           int64 // decisions by source
	Canceled                                    int64
	Takes, RoundTrips, RefillErrors             int64
	Granted, Refunded, RefundsLost, RefundCalls int64
	Heartbeats                                  int64
	Servers                                     int
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
	bySource [NumSources]atomic.Int64
	_        [64 - 8*NumSources%64]byte
}

func (c *counters) count(slot uint8, s Source) {
	if s < NumSources {
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

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	c := &e.stats
	return Stats{
		PreCheck: c.decided(SourcePreCheck), Lease: c.decided(SourceLease), Global: c.decided(SourceGlobal), Fallback: c.decided(SourceFallback),
		Canceled: c.canceled.Load(),
		Takes:    c.takes.Load(), RoundTrips: c.roundTrips.Load(), RefillErrors: c.refillErrors.Load(),
		Granted: c.granted.Load(), Refunded: c.refunded.Load(), RefundsLost: c.refundsLost.Load(), RefundCalls: c.refundCalls.Load(),
		Heartbeats: c.heartbeats.Load(),
		Servers:    e.Servers(),
	}
}
