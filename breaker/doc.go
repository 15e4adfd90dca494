// Package breaker guards the calls fleetlimit makes to Redis, and holds the
// failure policies that decide requests while Redis cannot answer.
//
// A Breaker is one circuit breaker per Redis client, shared by every limit
// that uses the client, built on github.com/sony/gobreaker/v2 with what a
// limiter needs on top:
//
//   - Every call gets its own deadline (Settings.Timeout, default 10 ms),
//     and Do returns by it even if the call has not: go-redis does not
//     apply a context deadline to a command in flight unless
//     ContextTimeoutEnabled is set, and with it set every timeout closes a
//     connection. Calls left running are bounded (Settings.MaxInFlight);
//     beyond the bound Do returns ErrOverloaded at once, so a stalled Redis
//     cannot pile up goroutines or connections.
//   - Only store failures count towards opening (Settings.IsFailure, by
//     default the rule of global.IsUnavailable, less a Cluster node's MOVED
//     and ASK replies, which it answered with): a denied request or a
//     script's error is an answer, and the caller's own cancellation or
//     too-short deadline is neither success nor failure (gobreaker's
//     IsExcluded).
//   - While open, Do returns ErrOpen without calling the store. After
//     Settings.OpenTimeout it lets Settings.HalfOpenProbes probes through;
//     their success closes it, a failure opens it again. A probe's call has
//     ten times Settings.Timeout to answer (at most half the open time):
//     the first call after an outage pays a new connection's dial and
//     handshake, and after a restart Redis loading the scripts again. Do
//     returns to the probe's caller at Timeout as for any call; the call
//     goes on and its answer settles the breaker's state.
//   - State changes reach Settings.OnStateChange in order, after the locks
//     are released (gobreaker calls its own callback under its mutex, where
//     reading the breaker deadlocks).
//
// A Policy is what one limit does while the store cannot answer: FailOpen,
// FailClosed, or FailLocal (a conservative per-server limit). The zero
// Policy is invalid, so a limit without a chosen policy is a configuration
// error. Package hybrid applies each limit's Policy to its requests.
//
// # Time
//
// A Breaker reads the time and sets its deadlines through one Clock
// (Settings.Clock, the system clock when nil), an interface small enough for
// the caller's own timers too. A manual Clock makes a Breaker's deadlines
// virtual. gobreaker, underneath, reads time.Now and cannot be given a
// clock, so the open period follows the system clock; the tests and the
// simulator run the whole breaker in testing/synctest bubbles, where the
// system clock is virtual.
package breaker
