package global

import (
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
)

// A Limit is one fleet-wide token bucket: Burst tokens at most, refilled at Rate tokens
// per second. Name identifies it in Redis keys, so every server that uses the limit must
// give it the same Name, Rate and Burst; two limits with one Name share their buckets.
//
// A Limit is a plain value. Build it with NewLimit, which checks it, or as a literal:
// every Store method validates the Limit it is given and answers ErrInvalidLimit
// without calling Redis when it is not valid.
type Limit struct {
	// Name is the limit's name in keys: 1 to 64 printable ASCII bytes, without
	// space, '{', '}', ':' or '#' (those delimit the key's parts and its hash tag).
	Name string
	// Rate is the refill rate in tokens per second: finite and > 0.
	Rate float64
	// Burst is the bucket's capacity: at least 1 and at most 2^53 (the largest count a
	// Redis Lua number holds exactly). It is also the largest cost one request may have.
	Burst int
	// Version orders changes of Rate and Burst across the fleet: a bucket keeps the Rate
	// and Burst of the highest Version that took from or refunded to it, and answers a
	// caller with a lower Version on those. A
	// higher Version, or the same Version with another Rate or Burst, re-shapes the
	// bucket on Redis's clock: it refills on the old Rate up to that instant, then holds
	// at most the new Burst, so a change never adds tokens. Give each change a higher
	// Version (a config revision, or its Unix time); 0 is fine for a limit that never
	// changes. At most 2^53 - 1 (the scripts hold it in a Lua number).
	Version uint64
}

// NewLimit returns a validated Limit, or an error wrapping ErrInvalidLimit that says
// what is wrong.
func NewLimit(name string, rate float64, burst int) (Limit, error) {
	l := Limit{Name: name, Rate: rate, Burst: burst}
	return l, redisstore.Limit(l).Validate()
}
