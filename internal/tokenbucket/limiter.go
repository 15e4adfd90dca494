package tokenbucket

import (
	"math"
	"time"
)

// Inf is the rate of a bucket that never limits: golang.org/x/time/rate.Inf, as a
// float64.
const Inf = math.MaxFloat64

// Bucket is golang.org/x/time/rate.Limiter's token bucket without its mutex, for state
// its caller already guards: the engine's pre-check lives under its key store's shard
// lock, and a second lock per decision cost about a fifth of a lease hit. Its methods
// compute what rate.Limiter's of the same names compute, in the same order of
// floating-point operations, so a Bucket and a rate.Limiter given the same calls give
// the same answers and hold the same tokens (FuzzBucketMatchesRate), save that a wait too
// long for a time.Duration denies (Duration), where x/time/rate's, at exactly 2^63 ns
// (its cap lets that one through), wraps negative and admits: a negative cost
// gives tokens back, up to the burst at the next refill; an instant before the last one
// refills nothing; rate Inf admits any cost up to any burst without spending.
//
// Its instants are nanoseconds on one scale of the caller's (the engine's: Unix
// nanoseconds, time.Time.UnixNano), so that a decision compares and subtracts integers
// where time.Time's Sub costs a call and an overflow check; the difference of two
// instants is the time.Duration between them, as Sub of the times would be.
//
// The zero value holds no tokens and refills at rate 0: it denies every positive cost,
// as a zero rate.Limiter does. A Bucket is 32 bytes (a rate.Limiter, 80). It is not safe
// for concurrent use.
type Bucket struct {
	rate   float64 // tokens per second; Inf: no limit
	burst  int
	tokens float64
	last   int64 // when tokens was last set, in nanoseconds
}

// AllowN reports whether n tokens may be taken at t, and takes them if so: there are n
// tokens at t (the tokens the bucket held, refilled since, up to its burst) and n is at
// most the burst. It is rate.Limiter.AllowN.
func (b *Bucket) AllowN(t int64, n int) bool {
	if b.rate == Inf {
		return true
	}
	tokens := b.advance(t) - float64(n)
	if n > b.burst || tokens < 0 && Duration(-tokens, b.rate) > 0 {
		return false
	}
	b.last, b.tokens = t, tokens
	return true
}

// TokensAt returns the tokens the bucket holds at t, without changing it. It is
// rate.Limiter.TokensAt.
func (b *Bucket) TokensAt(t int64) float64 { return b.advance(t) }

// Take takes n tokens at t from a bucket that holds tokens then, as TokensAt(t) read it
// with no change since, and at least n of them (n at most the burst): what AllowN(t, n)
// does in that case, without computing the tokens again.
func (b *Bucket) Take(t int64, tokens float64, n int) {
	if b.rate == Inf {
		return
	}
	b.last, b.tokens = t, tokens-float64(n)
}

// SetRateAt refills the bucket up to t at its old rate, then sets its rate to r tokens
// per second (Inf: no limit). It is rate.Limiter.SetLimitAt.
func (b *Bucket) SetRateAt(t int64, r float64) {
	b.tokens, b.last = b.advance(t), t
	b.rate = r
}

// SetBurstAt refills the bucket up to t at its rate, then sets its burst. It is
// rate.Limiter.SetBurstAt.
func (b *Bucket) SetBurstAt(t int64, burst int) {
	b.tokens, b.last = b.advance(t), t
	b.burst = burst
}

// Reset makes the bucket full at t, with rate r and burst: what a rate.Limiter made by
// rate.NewLimiter(r, burst) at t holds. (A zero rate.Limiter fills only by refilling, which
// for a slow rate takes longer than a time.Duration holds.)
func (b *Bucket) Reset(t int64, r float64, burst int) {
	*b = Bucket{rate: r, burst: burst, tokens: float64(burst), last: t}
}

// advance is the tokens the bucket holds at t.
func (b *Bucket) advance(t int64) float64 {
	delta := 0.0
	// An instant before the last adds nothing, as in x/time/rate, which reads
	// t.Before(last) to learn what the sign of the difference says.
	if el := time.Duration(t - b.last); b.rate > 0 && el > 0 {
		delta = el.Seconds() * b.rate
	}
	tokens := b.tokens + delta
	if burst := float64(b.burst); tokens > burst {
		tokens = burst
	}
	return tokens
}
