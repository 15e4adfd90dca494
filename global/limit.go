package global

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// MaxNameLen is the longest limit or fleet name accepted, in bytes.
const MaxNameLen = 64

// maxExact is the largest integer a Redis Lua number (a float64) holds exactly.
const maxExact = 1 << 53

// maxTTLms is the longest bucket TTL, in milliseconds, that a time.Duration holds.
const maxTTLms = float64(math.MaxInt64 / int64(time.Millisecond))

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
	// Burst is the bucket's capacity: at least 1. It is also the largest cost one
	// request may have.
	Burst int
}

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
	switch {
	case math.IsNaN(l.Rate) || math.IsInf(l.Rate, 0):
		return l.invalid("rate " + strconv.FormatFloat(l.Rate, 'g', -1, 64) + " is not a finite number")
	case l.Rate <= 0:
		return l.invalid("rate " + strconv.FormatFloat(l.Rate, 'g', -1, 64) + " must be > 0 tokens per second")
	case l.Burst < 1:
		return l.invalid("burst " + strconv.Itoa(l.Burst) + " must be at least 1")
	case l.Burst > maxExact:
		return l.invalid("burst " + strconv.Itoa(l.Burst) + " exceeds 2^53, the largest count Redis Lua numbers hold exactly")
	}
	// The scripts set PEXPIRE ceil(burst/rate*1000)+1000 ms; keep it an exact integer,
	// and a time.Duration: every wait the scripts report is at most the time to refill
	// the bucket, and a refill longer than 292 years would wrap (miniredis's TTLs too).
	if ttl := math.Ceil(float64(l.Burst)/l.Rate*1000) + 1000; !(ttl < maxExact && ttl < maxTTLms) {
		return l.invalid("burst/rate (" + strconv.FormatFloat(float64(l.Burst)/l.Rate, 'g', 4, 64) +
			" s to refill) is too long for a Redis TTL (at most about 292 years)")
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
	return int64(math.Ceil(float64(l.Burst)/l.Rate*1000)) + 1000
}

func (l Limit) invalid(what string) error {
	return fmt.Errorf("%w: limit %q: %s", ErrInvalidLimit, l.Name, what)
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
