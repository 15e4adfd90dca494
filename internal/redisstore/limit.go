package redisstore

import (
	"fmt"

	"github.com/fleetlimit/fleetlimit/internal/storeerr"
	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
)

// MaxNameLen is the longest limit or fleet name accepted, in bytes.
const MaxNameLen = 64

// Limit is global.Limit, which documents its fields: one fleet-wide token bucket. Store
// methods validate the Limit they are given.
type Limit struct {
	Name    string
	Rate    float64
	Burst   int
	Version uint64
}

// MaxVersion is the largest Limit.Version: the scripts hold it in a Lua number.
const MaxVersion = 1<<53 - 1

// NewLimit returns a validated Limit, or an error wrapping ErrInvalidLimit.
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
		return fmt.Errorf("%w: limit %q: %w", storeerr.ErrInvalidLimit, l.Name, err)
	}
	if l.Version > MaxVersion {
		return fmt.Errorf("%w: limit %q: version %d above %d", storeerr.ErrInvalidLimit, l.Name, l.Version, uint64(MaxVersion))
	}
	return nil
}

// CheckCost reports whether one request may cost n tokens: n must be at least 1 and at
// most Burst (a request larger than the bucket could never pass). The error wraps
// ErrInvalidLimit.
func (l Limit) CheckCost(n int) error {
	if n < 1 || n > l.Burst {
		return fmt.Errorf("%w: limit %q: cost %d must be between 1 and the burst %d", storeerr.ErrInvalidLimit, l.Name, n, l.Burst)
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
		return fmt.Errorf("%w: %s is empty", storeerr.ErrInvalidLimit, what)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: %s %.20q... is %d bytes, longer than %d", storeerr.ErrInvalidLimit, what, name, len(name), MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c > '~' || c == '{' || c == '}' || c == ':' || c == '#' {
			return fmt.Errorf("%w: %s %q: byte %q at %d is not allowed (printable ASCII without space, '{', '}', ':', '#')",
				storeerr.ErrInvalidLimit, what, name, c, i)
		}
	}
	return nil
}
