package hybrid_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/metricstest"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// bucketLeft returns the tokens left in a bucket of burst b, read by taking them all
// (the bucket is then empty). The rates in these tests are so low that nothing refills.
func bucketLeft(t *testing.T, s *global.Store, name string, b int, key string) int {
	t.Helper()
	g, err := redisstore.Of(s).Take(context.Background(), redisstore.Limit(mustLimit(t, name, 1e-6, b)), key, b, 1)
	if err != nil {
		t.Fatal(err)
	}
	return g.Granted
}

// TestAllowMultiSpendsNothingOnDenial: when the second item denies after the first took
// its tokens (its global bucket was drained by someone else, so only Redis knows), the
// first item's tokens go back; after Close refunds the leases, Redis shows exactly the
// tokens of the admitted calls.
func TestAllowMultiSpendsNothingOnDenial(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		s := newStore(t, tg.Client)
		now := time.Now()
		l, err := hybrid.New(s, hybrid.Config{
			FleetSize: 2, // a lease holds at most half the tenant's burst
			Clock:     clockAt(func() time.Time { return now }),
			Breaker:   slowBreaker(t),
			Limits: []hybrid.Limit{
				{Name: "key", Rate: 1e-6, Burst: 50, Policy: breaker.FailClosed, MaxWait: time.Second},
				{Name: "tenant", Rate: 1e-6, Burst: 4, Policy: breaker.FailClosed, MaxWait: time.Second},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		items := []hybrid.Item{{Limit: "key", Key: "k1", Cost: 2}, {Limit: "tenant", Key: "t1", Cost: 1}}
		admitted := 0
		for range 2 {
			d, err := l.AllowMulti(ctx, items)
			if err != nil || !d.Allowed || d.Denied != -1 {
				t.Fatalf("AllowMulti = %+v, %v; want allowed", d, err)
			}
			admitted++
		}
		// Another server drains the tenant's bucket: this server's pre-check still has
		// tokens, so only the refill can tell.
		if g, err := redisstore.Of(s).Take(ctx, redisstore.Limit(mustLimit(t, "tenant", 1e-6, 4)), "t1", 4, 1); err != nil {
			t.Fatal(err)
		} else if g.Granted == 0 {
			t.Fatal("the tenant's bucket was empty already: the test would not reach Redis's answer")
		}
		denials := 0
		for range 5 {
			d, err := l.AllowMulti(ctx, items)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
				continue
			}
			denials++
			if d.Denied != 1 || d.Decision.Limit != "tenant" || d.RetryAfter <= 0 {
				t.Fatalf("denied %+v: want item 1 (tenant) with a retry-after", d)
			}
		}
		if denials == 0 {
			t.Fatal("no denial: the test did not exercise giving back")
		}
		st := l.Stats()
		if k := st.Limits[0]; k.GivenBack != int64(denials) || metricstest.Allowed(k)-k.GivenBack != int64(admitted) {
			t.Errorf("key limit: %d admitted, %d given back; want %d given back, %d let through", metricstest.Allowed(k), k.GivenBack, denials, admitted)
		}
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if left := bucketLeft(t, s, "key", 50, "k1"); left != 50-2*admitted {
			t.Errorf("key bucket holds %d after %d admitted calls of cost 2, want %d", left, admitted, 50-2*admitted)
		}
	})
}

// TestAllowMultiLooksFirst: an item whose pre-check is empty, or whose cost is above its
// burst, denies the call before anything is spent, with the longest Retry-After.
func TestAllowMultiLooksFirst(t *testing.T) {
	_, c := redistest.Mini(t)
	s := newStore(t, c)
	now := time.Now()
	l := newLimiter(t, s, hybrid.Config{
		FleetSize: 1,
		Clock:     clockAt(func() time.Time { return now }),
		Limits: []hybrid.Limit{
			{Name: "a", Rate: 1, Burst: 10, Policy: breaker.FailClosed, MaxWait: time.Second},
			{Name: "b", Rate: 2, Burst: 1, Policy: breaker.FailClosed, MaxWait: time.Second},
		},
	})
	ctx := context.Background()
	if d, err := l.Allow(ctx, "b", "x"); err != nil || !d.Allowed {
		t.Fatalf("Allow b = %+v, %v", d, err)
	}
	d, err := l.AllowMulti(ctx, []hybrid.Item{{Limit: "a", Key: "x", Cost: 1}, {Limit: "b", Key: "x", Cost: 1}})
	if err != nil || d.Allowed || d.Denied != 1 || d.Decision.Reason != hybrid.ReasonPreCheck || d.RetryAfter != 500*time.Millisecond {
		t.Fatalf("AllowMulti = %+v, %v; want denied by b's pre-check, retry after 500ms", d, err)
	}
	if a := l.Stats().Limits[0]; a.Takes != 0 || metricstest.Allowed(a) != 0 {
		t.Fatalf("limit a spent on a denied call: %+v", a)
	}
	d, err = l.AllowMulti(ctx, []hybrid.Item{{Limit: "b", Key: "y", Cost: 2}, {Limit: "a", Key: "y", Cost: 1}})
	if err != nil || d.Denied != 0 || d.RetryAfter != hybrid.InfDuration || d.Decision.Reason != hybrid.ReasonExceedsBurst {
		t.Fatalf("cost above burst: %+v, %v", d, err)
	}
	// Twice the same (limit, key), 6 + 6 from a burst of 10: never, and said so.
	d, err = l.AllowMulti(ctx, []hybrid.Item{{Limit: "a", Key: "z", Cost: 6}, {Limit: "a", Key: "z", Cost: 6}})
	if err != nil || d.Allowed || d.RetryAfter != hybrid.InfDuration || d.Decision.Reason != hybrid.ReasonExceedsBurst {
		t.Fatalf("one bucket named twice beyond its burst: %+v, %v; want never", d, err)
	}
	// One item that must wait, one that never can: the answer names the one that never can.
	d, err = l.AllowMulti(ctx, []hybrid.Item{{Limit: "b", Key: "x", Cost: 1}, {Limit: "a", Key: "w", Cost: 11}})
	if err != nil || d.Denied != 1 || d.Decision.Limit != "a" || d.RetryAfter != hybrid.InfDuration {
		t.Fatalf("a wait and a never: %+v, %v; want item 1 (a), never", d, err)
	}
	// An invalid item is an error before anything is looked at or counted.
	before := l.Stats().Limits[1]
	if _, err := l.AllowMulti(ctx, []hybrid.Item{{Limit: "b", Key: "x", Cost: 1}, {Limit: "nope", Key: "x"}}); !errors.Is(err, hybrid.ErrUnknownLimit) {
		t.Fatalf("unknown limit: %v", err)
	}
	if after := l.Stats().Limits[1]; metricstest.Denied(after) != metricstest.Denied(before) {
		t.Fatalf("a call that failed validation was counted: %d denials before, %d after", metricstest.Denied(before), metricstest.Denied(after))
	}
	for _, tc := range []struct {
		items []hybrid.Item
		want  error
	}{
		{nil, hybrid.ErrInvalidCost},
		{[]hybrid.Item{{Limit: "a", Key: "x", Cost: -1}}, hybrid.ErrInvalidCost},
		{[]hybrid.Item{{Limit: "a", Key: "x", Cost: 1}, {Limit: "nope", Key: "x", Cost: 1}}, hybrid.ErrUnknownLimit},
	} {
		if _, err := l.AllowMulti(ctx, tc.items); !errors.Is(err, tc.want) {
			t.Errorf("AllowMulti(%v) error %v, want %v", tc.items, err, tc.want)
		}
	}
}

// TestAllowMultiConcurrentConservesTokens: many goroutines call AllowMulti with
// overlapping items (per key, per tenant, one global) on several servers; afterwards
// every bucket in Redis shows exactly the tokens the admitted calls took.
func TestAllowMultiConcurrentConservesTokens(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		const servers, goroutines, calls = 3, 8, 150
		limits := []hybrid.Limit{
			{Name: "key", Rate: 1e-6, Burst: 40, Policy: breaker.FailClosed, MaxWait: 2 * time.Second},
			{Name: "tenant", Rate: 1e-6, Burst: 60, Policy: breaker.FailClosed, MaxWait: 2 * time.Second},
			{Name: "global", Rate: 1e-6, Burst: 150, Policy: breaker.FailClosed, MaxWait: 2 * time.Second},
		}
		burst := map[string]int{"key": 40, "tenant": 60, "global": 150}
		s := newStore(t, tg.Client)
		var lims []*hybrid.Limiter
		for range servers {
			l, err := hybrid.New(s, hybrid.Config{FleetSize: servers, Breaker: slowBreaker(t), Limits: limits})
			if err != nil {
				t.Fatal(err)
			}
			lims = append(lims, l)
		}
		ctx := context.Background()
		var mu sync.Mutex
		used := map[[2]string]int{} // (limit, key) -> tokens taken by admitted calls
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(g), 7))
				l := lims[g%servers]
				for range calls {
					k := rng.IntN(6)
					items := []hybrid.Item{
						{Limit: "key", Key: fmt.Sprintf("k%d", k), Cost: 1 + rng.IntN(2)},
						{Limit: "tenant", Key: fmt.Sprintf("t%d", k%2), Cost: 1},
						{Limit: "global", Key: "all", Cost: 1},
					}
					d, err := l.AllowMulti(ctx, items)
					if err != nil {
						t.Error(err)
						return
					}
					if !d.Allowed {
						continue
					}
					mu.Lock()
					for _, it := range items {
						used[[2]string{it.Limit, it.Key}] += it.Cost
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		admittedAny := false
		var givenBack int64
		for _, l := range lims {
			for _, ls := range l.Stats().Limits {
				givenBack += ls.GivenBack
			}
			if err := l.Close(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for _, b := range [][2]string{{"global", "all"}, {"tenant", "t0"}, {"tenant", "t1"},
			{"key", "k0"}, {"key", "k1"}, {"key", "k2"}, {"key", "k3"}, {"key", "k4"}, {"key", "k5"}} {
			want := burst[b[0]] - used[b]
			if used[b] > 0 {
				admittedAny = true
			}
			if left := bucketLeft(t, s, b[0], burst[b[0]], b[1]); left != want {
				t.Errorf("%s/%s: Redis holds %d, want %d (burst %d, admitted calls took %d)", b[0], b[1], left, want, burst[b[0]], used[b])
			}
		}
		if !admittedAny || givenBack == 0 {
			t.Errorf("%d calls' tokens given back, any admitted %v: the test must exercise both (used %v)", givenBack, admittedAny, used)
		}
		t.Logf("global bucket: %d of 150 taken by admitted calls; %d items given back", used[[2]string{"global", "all"}], givenBack)
	})
}

// TestPreCheckTakesTokensBack pins the x/time/rate behaviour AllowMulti's give-back
// relies on: AllowN with a negative cost adds the tokens, and the level is capped at
// the burst at the next use.
func TestPreCheckTakesTokensBack(t *testing.T) {
	now := time.Now()
	lim := rate.NewLimiter(1, 10)
	if !lim.AllowN(now, 7) {
		t.Fatal("AllowN 7 of 10")
	}
	lim.AllowN(now, -5)
	if got := lim.TokensAt(now); got != 8 {
		t.Fatalf("after giving 5 back: %v tokens, want 8", got)
	}
	lim.AllowN(now, -5)
	if got := lim.TokensAt(now); got != 10 {
		t.Fatalf("after giving 5 more back: %v tokens, want the burst, 10", got)
	}
}
