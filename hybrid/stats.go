package hybrid

import "github.com/fleetlimit/fleetlimit/breaker"

// Stats are a Limiter's counters since New, for metrics: a snapshot, each counter read
// atomically but not all at one instant.
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

// Stats returns the Limiter's counters.
func (l *Limiter) Stats() Stats {
	s := l.eng.Stats()
	return Stats{
		PreCheck: s.PreCheck, Lease: s.Lease, Global: s.Global, Fallback: s.Fallback,
		Canceled: s.Canceled,
		Takes:    s.Takes, RoundTrips: s.RoundTrips, RefillErrors: s.RefillErrors,
		Granted: s.Granted, Refunded: s.Refunded, RefundsLost: s.RefundsLost, RefundCalls: s.RefundCalls,
		Heartbeats: s.Heartbeats,
		Servers:    s.Servers,
		Breaker:    l.brk.State(),
	}
}
