package engine

import (
	"math/rand/v2"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// TestPreCheckNeverDeniesWhatTheBucketWouldAllow drives the production decision path
// (Limit.decide: the pre-check and the lease under one key lock) for one server whose
// pre-check is the default, the limit's own rate and burst, against a global bucket (the
// Go model of the take and refund scripts) that answers refills at once, over random
// demand, costs, pauses, lease expiries and evictions. "The global bucket alone" is what
// the source article's script per request would hold: a token bucket of the same rate and
// burst that spends exactly the requests admitted (an x/time/rate Limiter, whose
// reservations may take it below zero). The
// pre-check must never deny a request that bucket would allow, so its tokens must never
// fall below that bucket's: a pre-check that spent on requests the lease then denied or
// made wait, or that started a new key less than full, would fail here.
//
// (It may deny what the lease-holding global bucket could still serve: that bucket refills
// while this server holds leased tokens, the L of the bound burst + rate·T + L. One server
// then admits at most burst + rate·T, as with the script per request.)
func TestPreCheckNeverDeniesWhatTheBucketWouldAllow(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 40
	}
	const eps = 1e-6
	for seed := range seeds {
		r := rand.New(rand.NewPCG(uint64(seed), 7))
		rateLimit := float64(1 + r.IntN(500))
		burst := 1 + r.IntN(200)
		lc, err := LeaseConfig{Rate: rateLimit, Burst: burst, Servers: 1,
			Lifetime: time.Duration(1+r.IntN(300)) * ms}.Normalize()
		if err != nil {
			t.Fatal(err)
		}
		sh := &Shape{cfg: LimitConfig{Rate: rateLimit, Burst: burst}, preRate: rateLimit, preBurst: burst}
		sh.lease.Store(&lc)
		lm := &Limit{seed: uint64(seed)}
		b := &bucket{lm: lm, spill: exact{}}
		lm.kind = b
		lm.cur.Store(&shapes{base: sh})
		var en entry
		now := t0
		lm.initEntry(&en, "k", now.UnixNano())
		g := newBucket(burst, rateLimit)
		alone := rate.NewLimiter(rate.Limit(rateLimit), burst) // the bucket alone: spends what is admitted
		alone.SetLimitAt(now, rate.Limit(rateLimit))
		maxCost := 1 + r.IntN(min(burst, 5))
		admitted, preDenied := 0, 0
		for step := range 3000 {
			now = now.Add(time.Duration(r.ExpFloat64() * float64(time.Second) / (rateLimit * 3)))
			if r.IntN(200) == 0 && alone.TokensAt(now) == float64(burst) {
				// Evicted once idle (the store's idle timeout outlasts a refill of the
				// pre-check): the lease is refunded, the key starts afresh and full.
				n, _ := en.lease.Drain()
				g.refund(now, n)
				lm.initEntry(&en, "k", now.UnixNano())
			}
			n := 1 + r.IntN(maxCost)
			var w *Waiter // the request's, once it waited
			for tries := 0; ; tries++ {
				if tries > 10 {
					t.Fatalf("seed %d step %d: no decision after 10 refills", seed, step)
				}
				var o outcome
				b.decideKey(&o, &en, now, "", n, w)
				d, st, f := o.d, o.st, o.f
				w = o.w
				g.refund(now, st.Refund)
				if o.w != nil {
					en.flight.waiters = nil // answered below, at once
				}
				if d.Source == SourcePreCheck {
					preDenied++
					if have := alone.TokensAt(now); have >= float64(n)-eps {
						t.Fatalf("seed %d step %d: the pre-check denied a cost of %d that the bucket alone (%.3f) would allow",
							seed, step, n, have)
					}
					break
				}
				if st.Refill.Want > 0 {
					ans := g.take(now, st.Refill.Want, st.Refill.Min)
					en.flight = nil
					g.refund(now, en.lease.Granted(&lc, now, f.seq, ans))
				}
				if st.Action == Allow {
					admitted++
					alone.ReserveN(now, n)
				}
				if st.Action != Wait {
					break
				}
			}
			if p, a := en.pre.TokensAt(now.UnixNano()), alone.TokensAt(now); p < a-eps {
				t.Fatalf("seed %d step %d: the pre-check holds %.4f, the bucket alone %.4f", seed, step, p, a)
			}
		}
		if seed == 0 {
			t.Logf("seed 0: rate %v burst %d: %d admitted, %d denied by the pre-check", rateLimit, burst, admitted, preDenied)
		}
	}
}

// TestPreCheckStartsFull: a key new to a server starts with its whole pre-check burst,
// however slow the rate (one a day; one in a thousand years).
func TestPreCheckStartsFull(t *testing.T) {
	for _, tc := range []struct {
		rate  float64
		burst int
	}{{1000, 1}, {1, 100}, {1.0 / 86400, 5}, {1e-11, 1 << 20}} {
		lm := &Limit{}
		lm.kind = &bucket{lm: lm, spill: exact{}}
		var en entry
		lm.initEntry(&en, "k", t0.UnixNano())
		lm.reshape(&en, &Shape{preRate: tc.rate, preBurst: tc.burst}, t0.UnixNano())
		if got := en.pre.TokensAt(t0.UnixNano()); got != float64(tc.burst) {
			t.Errorf("rate %v burst %d: a new key's pre-check holds %v, want %d", tc.rate, tc.burst, got, tc.burst)
		}
		if !en.pre.AllowN(t0.UnixNano(), tc.burst) || en.pre.AllowN(t0.UnixNano(), 1) {
			t.Errorf("rate %v burst %d: the burst must pass at once, then nothing", tc.rate, tc.burst)
		}
	}
}
