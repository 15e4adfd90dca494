package engine

import (
	"time"

	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
)

// InfDuration is the retry-after of a request that can never be allowed, such as one
// asking for more tokens than the limit's burst.
const InfDuration = tokenbucket.InfDuration

// Source says which tier made a decision. The values are those of hybrid.Source, which
// names them for users.
type Source uint8

// Decision sources.
const (
	SourcePreCheck Source = iota + 1 // the per-server pre-check denied; Redis was not asked
	SourceLease                      // tokens this server held (or paced); Redis was not asked
	SourceGlobal                     // decided after waiting for a refill
	SourceFallback                   // Redis did not answer: the limit's policy decided
	NumSources                       // one past the last source
)

// Reason says why a decision was made. The values are those of hybrid.Reason, which
// names them for users.
type Reason uint8

// Decision reasons. The first six come from the lease core ([Lease]), the others from
// the engine around it.
const (
	ReasonNone         Reason = iota // the zero Reason
	ReasonLease                      // served from tokens on hand
	ReasonRefill                     // no tokens on hand; a refill is in flight
	ReasonPaced                      // no tokens on hand, paced after contention
	ReasonExceedsBurst               // the cost exceeds the limit's burst
	ReasonInvalidCost                // the cost is negative
	ReasonPreCheck                   // the key's pre-check bucket is empty
	ReasonGranted                    // a refill answered and served the request
	ReasonBreakerOpen                // the breaker is open; no Redis call was made
	ReasonTimeout                    // Redis did not answer within the limit's MaxWait
	ReasonUnavailable                // the Redis call failed
	ReasonCanceled                   // the caller's context ended while it waited
	ReasonClosed                     // the engine is stopped
	ReasonAsync                      // admitted without Redis, to be charged later (LimitConfig.Async)
	NumReasons                       // one past the last reason
)

// Decision is the answer to one request: 32 bytes, the three small fields in one word,
// since every decision is copied from the engine to its caller.
type Decision struct {
	Allowed    bool
	Source     Source
	Reason     Reason
	Remaining  int           // tokens left for the key fleet-wide, as best known here
	RetryAfter time.Duration // when denied: until the request may pass (InfDuration: never)
	Servers    int           // the live server count the limit was divided by
}
