package tokenbucket

import (
	"math"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// FuzzBucketMatchesRate gives a Bucket and a rate.Limiter the same calls, decoded from
// the input, and requires the same answers and the same tokens after every call: costs
// negative, zero, past the burst; instants that go back; rates 0, tiny, huge and Inf.
// Take, after TokensAt found the tokens, must do what AllowN does.
func FuzzBucketMatchesRate(f *testing.F) {
	f.Add([]byte{0, 3, 1, 10, 2, 5, 3, 1, 0, 1, 0, 1, 0, 1, 4, 200, 0, 1})
	f.Add([]byte{2, 9, 3, 40, 1, 255, 0, 7, 0, 7, 4, 0, 0, 250, 1, 1})
	f.Add([]byte{1, 6, 2, 1, 0, 1, 4, 128, 0, 2, 5, 200, 0, 1, 0, 1})
	f.Add([]byte{1, 4, 2, 9, 6, 5, 6, 8, 3, 30, 6, 4, 6, 15, 1, 9, 6, 6})
	f.Fuzz(matchRate)
}

// matchRate runs the calls ops encodes (FuzzBucketMatchesRate) on a Bucket and a
// rate.Limiter, and fails t at the first answer or token count where they differ.
func matchRate(t *testing.T, ops []byte) {
	var b Bucket
	var r rate.Limiter
	// The Bucket is given the instants' Unix nanoseconds, the rate.Limiter the instants:
	// with no monotonic reading (Sub of walls), and every other check one with.
	now := time.Unix(1_700_000_000, 0)
	mono := time.Now()
	check := func(i int, what string) {
		t.Helper()
		at := now
		if i%2 == 1 {
			at = mono.Add(now.Sub(time.Unix(1_700_000_000, 0)))
		}
		got, want := b.TokensAt(at.UnixNano()), r.TokensAt(at)
		if got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
			t.Fatalf("op %d (%s): TokensAt %v, rate.Limiter's %v", i, what, got, want)
		}
	}
	for i := 0; i+1 < len(ops); i += 2 {
		op, arg := ops[i]%7, ops[i+1]
		switch op {
		case 0: // AllowN, cost -3..12
			n := int(arg%16) - 3
			if g, w := b.AllowN(now.UnixNano(), n), r.AllowN(now, n); g != w {
				t.Fatalf("op %d: AllowN(%d) = %v, rate.Limiter's %v", i, n, g, w)
			}
		case 1: // SetRateAt
			v := rates[int(arg)%len(rates)]
			b.SetRateAt(now.UnixNano(), v)
			r.SetLimitAt(now, rate.Limit(v))
		case 2: // SetBurstAt
			n := int(arg%20) - 2
			b.SetBurstAt(now.UnixNano(), n)
			r.SetBurstAt(now, n)
		case 3: // time forward, up to 1.3 s
			now = now.Add(time.Duration(arg) * time.Duration(arg) * 20 * time.Microsecond)
		case 4: // time back
			now = now.Add(-time.Duration(arg) * time.Millisecond)
		case 5: // a nanosecond
			now = now.Add(time.Nanosecond)
		case 6: // Take what TokensAt found, as a windowed key's admission does; AllowN if not found
			n := int(arg%16) - 3
			if tokens := b.TokensAt(now.UnixNano()); n >= 1 && n <= b.burst && tokens >= float64(n) {
				b.Take(now.UnixNano(), tokens, n)
				if !r.AllowN(now, n) {
					t.Fatalf("op %d: Take(%d) of %v tokens, where rate.Limiter's AllowN refuses", i, n, tokens)
				}
			} else if g, w := b.AllowN(now.UnixNano(), n), r.AllowN(now, n); g != w {
				t.Fatalf("op %d: AllowN(%d) = %v, rate.Limiter's %v", i, n, g, w)
			}
		}
		check(i, [...]string{"AllowN", "SetRateAt", "SetBurstAt", "forward", "back", "1ns", "Take"}[op])
	}
}

var rates = []float64{0, 1e-9, 0.5, 1, 3, 10, 400, 1e6, 1e12, Inf, math.SmallestNonzeroFloat64, -1}

// TestBucketMatchesRateCases holds FuzzBucketMatchesRate's rule on named call sequences
// (its encoding: op, arg pairs) at the edges of the arithmetic: a wait that rounds to 0 ns
// admits, a cost past the burst never does, a refill stops at the burst, a change of burst
// moves the bucket's time, a rate <= 0 refills nothing, and Take at rate Inf spends nothing.
func TestBucketMatchesRateCases(t *testing.T) {
	const (
		allow, setRate, setBurst, forward, back, ns, take = 0, 1, 2, 3, 4, 5, 6
		burst5, rate1, rate1e12, rateInf, rateNeg         = 7, 3, 8, 9, 11
	)
	tests := []struct {
		name string
		ops  []byte
	}{
		{"deficit of under a nanosecond admits", []byte{setBurst, burst5, setRate, rate1e12, allow, 5 + 3}},
		{"cost past the burst refused at any rate", []byte{setBurst, burst5, setRate, rate1e12, allow, 6 + 3}},
		{"refill capped at the burst", []byte{setBurst, 2 + 2, setRate, rate1, allow, 1 + 3, forward, 255, forward, 255}},
		{"SetBurstAt moves the bucket's time", []byte{setBurst, 12, setRate, rate1, forward, 255, setBurst, 12, forward, 255}},
		{"negative rate refills nothing", []byte{setBurst, 12, setRate, rate1, forward, 255, setRate, rateNeg, forward, 255}},
		{"Take at rate Inf spends nothing", []byte{setBurst, burst5, setRate, rateInf, ns, 0, take, 3 + 3}},
		{"Take, then time back", []byte{setBurst, burst5, setRate, rate1, forward, 255, forward, 255, take, 2 + 3, back, 200}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { matchRate(t, tt.ops) })
	}
}

// TestBucketReset: Reset leaves what rate.NewLimiter makes: a full bucket of the rate and
// burst, which spends its burst at once and then refills at the rate.
func TestBucketReset(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	for _, tt := range []struct {
		rate  float64
		burst int
	}{{1, 1}, {10, 5}, {0.5, 3}, {Inf, 4}} {
		var b Bucket
		b.AllowN(now.UnixNano(), 1) // state Reset must replace
		b.Reset(now.UnixNano(), tt.rate, tt.burst)
		r := rate.NewLimiter(rate.Limit(tt.rate), tt.burst)
		for i, d := range []time.Duration{0, 0, time.Second, 3 * time.Second} {
			at := now.Add(d)
			if got, want := b.TokensAt(at.UnixNano()), r.TokensAt(at); got != want {
				t.Fatalf("Reset(%v, %d), step %d: TokensAt %v, rate.NewLimiter's %v", tt.rate, tt.burst, i, got, want)
			}
			if got, want := b.AllowN(at.UnixNano(), tt.burst), r.AllowN(at, tt.burst); got != want {
				t.Fatalf("Reset(%v, %d), step %d: AllowN(burst) = %v, rate.NewLimiter's %v", tt.rate, tt.burst, i, got, want)
			}
		}
	}
}

// TestInfIsRates: the rate of no limit is x/time/rate's.
func TestInfIsRates(t *testing.T) {
	if Inf != float64(rate.Inf) {
		t.Fatalf("Inf = %v, x/time/rate's is %v", Inf, float64(rate.Inf))
	}
}
