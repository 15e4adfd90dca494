package global

import (
	"fmt"

	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
)

// MaxNameLen is the longest limit or fleet name accepted, in bytes.
const MaxNameLen = 64

// A Limit is one fleet-wide token bucket: Burst tokens at most, refilled at Rate tokens
// per second. Name identifies it in Redis keys, so every server that uses the limit must
// give it the same Name, Rate and Burst; two limits with one Name share their buckets.
//
// A Limit is a plain value. Build it with NewLimit, or as a literal and call Validate:
// every Store method validates the Limit it is given and answers ErrInvalidLimit
// without calling Redis when it is not valid.
type Limit struct {
	// Name is the limit's name in keys: 1 to MaxNameLen printable ASCII bytes, without
	// space, '{', '}', ':' or '#' (those delimit the key's parts and its hash tag).
	Name string
	// Rate is the refill rate in tokens per second: finite and > 0.
	Rate float64
	// Burst is the bucket's capacity: at least 1 and at most 2^53 (the largest count a
	// Redis Lua number holds exactly). It is also the largest cost one request may have.
	Burst int
	// Version orders changes of Rate and Burst across the fleet: a bucket keeps the Rate
	// and Burst of the highest Version that took from or refunded to it, and answers a
	// caller with a lower Version on those (Grant.Version says which is in force). A
	// higher Version, or the same Version with another Rate or Burst, re-shapes the
	// bucket on Redis's clock: it refills on the old Rate up to that instant, then holds
	// at most the new Burst, so a change never adds tokens. Give each change a higher
	// Version (a config revision, or its Unix time); 0 is fine for a limit that never
	// changes. At most 2^53 - 1.
	Version uint64
}

// MaxVersion is the largest Limit.Version: the scripts hold it in a Lua number.
const MaxVersion = 1<<53 - 1

// NewLimit returns a validated Limit, or an error wrapping ErrInvalidLimit that says
// what is wrong.
func NewLimit(name string, rate float64, burst int) (Limit, error) {
	l := Limit{Name: name, Rate: rate, Burst: burst}
	return l, l.Validate()
}

// Validate reports what is wrong with l, as an error wrapping ErrInvalidLimit, or nil.
func (l Limit) Validate() error {
	if err := validName("limit name", l.Name); err != nil {
		return err
	}
	// The scripts keep token counts in Lua numbers (float64) and set PEXPIRE to the
	// TTL: tokenbucket.Check holds the burst to 2^53 and the TTL to a time.Duration, so every
	// wait the scripts report fits in one.
	if err := tokenbucket.Check(l.Rate, l.Burst); err != nil {
		return fmt.Errorf("%w: limit %q: %w", ErrInvalidLimit, l.Name, err)
	}
	if l.Version > MaxVersion {
		return fmt.Errorf("%w: limit %q: version %d above %d", ErrInvalidLimit, l.Name, l.Version, uint64(MaxVersion))
	}
	return nil
}

// CheckCost reports whether one request may cost n tokens: n must be at least 1 and at
// most Burst (a request larger than the bucket could never pass). The error wraps
// ErrInvalidLimit.
func (l Limit) CheckCost(n int) error {
	if n < 1 || n > l.Burst {
		return fmt.Errorf("%w: limit %q: cost %d must be between 1 and the burst %d", ErrInvalidLimit, l.Name, n, l.Burst)
	}
	return nil
}

// TTL is how long a bucket of this limit lives in Redis after its last use: the time it
// takes to refill completely, plus one second (the source article's rule). A bucket that
// has refilled is the same as no bucket.
func (l Limit) TTL() (ms int64) {
	return int64(tokenbucket.TTLMillis(float64(l.Burst), l.Rate))
}

// validName checks a limit or fleet name.
func validName(what, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: %s is empty", ErrInvalidLimit, what)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: %s %.20q... is %d bytes, longer than %d", ErrInvalidLimit, what, name, len(name), MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c > '~' || c == '{' || c == '}' || c == ':' || c == '#' {
			return fmt.Errorf("%w: %s %q: byte %q at %d is not allowed (printable ASCII without space, '{', '}', ':', '#')",
				ErrInvalidLimit, what, name, c, i)
		}
	}
	return nil
}
