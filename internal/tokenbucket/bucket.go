// Package tokenbucket is the token-bucket arithmetic the tiers of fleetlimit share: which
// (rate, burst) pairs are valid, how long a number of tokens takes to refill, and how long
// a bucket lives after its last use. The Redis tier (global.Limit.Validate, its
// Retry-After and wait conversions), the in-process tier (local.NewLimiter and its idle
// timeout) and the Go model of the scripts (internal/luamodel) take these rules from here;
// the Redis scripts (package lua) compute WaitMillis and TTLMillis in Lua, in the same
// order of operations.
//
// Every function is pure and never panics. Durations saturate: a time too long for a
// time.Duration, or one computed from a NaN, an infinity or a rate that never refills, is
// InfDuration ("never"), never a wrapped or negative Duration.
package tokenbucket

import (
	"errors"
	"math"
	"strconv"
	"time"
)

// InfDuration is the longest time.Duration (about 292 years). The functions of this
// package return it for a time that never comes or does not fit in a Duration; a caller
// reads it as "never". It equals golang.org/x/time/rate.InfDuration.
const InfDuration = time.Duration(math.MaxInt64)

// MaxBurst is the largest burst: 2^53, the largest integer a float64 holds exactly. Token
// counts are float64 in every tier (Lua numbers in Redis, x/time/rate's tokens in
// process); past 2^53 taking one token from a full bucket leaves it full.
const MaxBurst = 1 << 53

// maxMillis is the longest time, in whole milliseconds, that a time.Duration holds.
const maxMillis = float64(math.MaxInt64 / int64(time.Millisecond))

// Check reports what is wrong with a token bucket of burst tokens refilled at rate tokens
// per second, or nil when nothing is:
//
//   - the rate is a finite number > 0;
//   - the burst is between 1 and MaxBurst (CheckBurst);
//   - the bucket's TTL (TTLMillis: the time an empty bucket takes to fill, plus one
//     second) fits in a time.Duration, so that every wait the bucket can report does too.
//
// The error is plain and says what is wrong ("rate 0 must be > 0 tokens per second"); the
// caller wraps it with its own sentinel and context.
func Check(rate float64, burst int) error {
	r := strconv.FormatFloat(rate, 'g', -1, 64)
	switch {
	case math.IsNaN(rate) || math.IsInf(rate, 0):
		return errors.New("rate " + r + " is not a finite number")
	case rate <= 0:
		return errors.New("rate " + r + " must be > 0 tokens per second")
	}
	if err := CheckBurst(burst); err != nil {
		return err
	}
	if !(TTLMillis(float64(burst), rate) < maxMillis) {
		return errors.New("burst/rate (" + strconv.FormatFloat(float64(burst)/rate, 'g', 4, 64) +
			" s to refill) is too long for a bucket TTL (at most about 292 years)")
	}
	return nil
}

// MinRate is the least rate Check accepts for burst (a valid burst): the rate whose
// refill of burst takes as long as a bucket's TTL may.
func MinRate(burst int) float64 {
	ok := func(r float64) bool { return TTLMillis(float64(burst), r) < maxMillis }
	r := float64(burst) * 1000 / (maxMillis - 1001) // about it: within a few ulps
	for !ok(r) {
		r = math.Nextafter(r, math.Inf(1))
	}
	for ok(math.Nextafter(r, 0)) {
		r = math.Nextafter(r, 0)
	}
	return r
}

// CheckBurst reports what is wrong with a burst alone (it must be between 1 and MaxBurst),
// or nil: Check's rule for a bucket whose rate needs no check, such as
// golang.org/x/time/rate.Inf. The error is plain, as Check's.
func CheckBurst(burst int) error {
	switch {
	case burst < 1:
		return errors.New("burst " + strconv.Itoa(burst) + " must be at least 1 (an empty bucket admits nothing)")
	case burst > MaxBurst:
		return errors.New("burst " + strconv.Itoa(burst) + " exceeds 2^53, the largest count a float64 (a Redis Lua number) holds exactly")
	}
	return nil
}

// Duration is the time tokens take to refill at rate tokens per second, to the nanosecond
// (rounded down, as golang.org/x/time/rate rounds): 0 when tokens <= 0 or rate is +Inf.
// It is InfDuration when tokens is NaN or ±Inf, when rate is NaN or <= 0 (never refills),
// and when the time does not fit in a Duration.
func Duration(tokens, rate float64) time.Duration {
	switch {
	case math.IsNaN(tokens) || math.IsInf(tokens, 0) || math.IsNaN(rate) || rate <= 0:
		return InfDuration
	case tokens <= 0:
		return 0
	}
	ns := tokens / rate * float64(time.Second)
	if !(ns < float64(math.MaxInt64)) { // float64(MaxInt64) is 2^63: every smaller float fits
		return InfDuration
	}
	return time.Duration(ns)
}

// WaitMillis is the scripts' wait: the whole milliseconds tokens take to refill at rate
// tokens per second, ceil(tokens / rate * 1000), computed in the order internal/luascript/take.lua
// computes it, so a Go copy of a script answers the same number; 0 when tokens <= 0.
// It is a float64, as a Lua number is: pass it to FromMillis for a Duration.
func WaitMillis(tokens, rate float64) float64 {
	if tokens <= 0 {
		return 0
	}
	return math.Ceil(tokens / rate * 1000)
}

// TTLMillis is a bucket's time to live after its last use, in milliseconds: the time an
// empty bucket of capacity tokens takes to fill at rate tokens per second, rounded up to
// the millisecond, plus one second, ceil(capacity / rate * 1000) + 1000 (the source
// article's rule, which every script passes to PEXPIRE). A bucket that has refilled is the
// same as no bucket, so it may go. The in-process tier uses the same time as its default
// idle timeout.
func TTLMillis(capacity, rate float64) float64 {
	return math.Ceil(capacity/rate*1000) + 1000
}

// FromMillis converts ms milliseconds, as the scripts count them, to a Duration. It is
// InfDuration for a value too long for a Duration, for NaN and ±Inf, and for a negative
// value: the scripts never report one, and Redis turns a Lua number past 2^63 into an
// integer reply that reads as negative, so a negative wait is an overflowed one.
func FromMillis(ms float64) time.Duration {
	if !(ms >= 0 && ms <= maxMillis) {
		return InfDuration
	}
	return time.Duration(ms) * time.Millisecond
}
