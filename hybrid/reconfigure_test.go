package hybrid_test

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/metricstest"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// TestChangeRules: the changes of a limit Reconfigure accepts and refuses, and that a
// refused change changes nothing.
func TestChangeRules(t *testing.T) {
	_, c := redistest.Mini(t)
	base := hybrid.Limit{Name: "api", Rate: 10, Burst: 20, Policy: breaker.FailOpen, Version: 3,
		Tiers: []hybrid.Tier{{Name: "paid", Rate: 100, Burst: 200}}}
	with := func(f func(*hybrid.Limit)) hybrid.Limit {
		l := base
		l.Tiers = append([]hybrid.Tier(nil), base.Tiers...)
		f(&l)
		return l
	}
	tests := []struct {
		name string
		lim  hybrid.Limit
		ok   bool
	}{
		{"same", base, true},
		{"MaxWait only, same version", with(func(l *hybrid.Limit) { l.MaxWait = time.Second }), true},
		{"policy only, same version", with(func(l *hybrid.Limit) { l.Policy = breaker.FailLocal() }), true},
		{"rate, same version", with(func(l *hybrid.Limit) { l.Rate = 5 }), false},
		{"tier burst, same version", with(func(l *hybrid.Limit) { l.Tiers[0].Burst = 100 }), false},
		{"tier added, same version", with(func(l *hybrid.Limit) { l.Tiers = append(l.Tiers, hybrid.Tier{Name: "x", Rate: 1, Burst: 1}) }), false},
		{"rate, higher version", with(func(l *hybrid.Limit) { l.Rate, l.Version = 5, 4 }), true},
		{"lower version", with(func(l *hybrid.Limit) { l.Version = 2 }), false},
		{"MaxKeys", with(func(l *hybrid.Limit) { l.MaxKeys = 10 }), false},
		{"MaxKeys named at its default", with(func(l *hybrid.Limit) { l.MaxKeys = 100_000 }), true},
		{"invalid burst", with(func(l *hybrid.Limit) { l.Burst, l.Version = 0, 4 }), false},
		{"tier without a name", with(func(l *hybrid.Limit) { l.Tiers[0].Name, l.Version = "", 4 }), false},
		{"tier twice", with(func(l *hybrid.Limit) { l.Tiers, l.Version = append(l.Tiers, l.Tiers[0]), 4 }), false},
		{"tier pre-check looser than its limit", with(func(l *hybrid.Limit) { l.Tiers[0].PreBurst, l.Version = 300, 4 }), false},
		{"version above 2^53", with(func(l *hybrid.Limit) { l.Rate, l.Version = 5, 1<<53 }), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{base}})
			before := l.Limits()
			err := l.Reconfigure([]hybrid.Limit{tt.lim})
			if (err == nil) != tt.ok {
				t.Fatalf("Reconfigure(%s) = %v, want ok %v", tt.name, err, tt.ok)
			}
			if err != nil {
				if !errors.Is(err, hybrid.ErrInvalidConfig) {
					t.Errorf("error %v does not wrap ErrInvalidConfig", err)
				}
				if got := l.Limits(); !reflect.DeepEqual(got, before) {
					t.Errorf("a refused change changed the limits: %+v, was %+v", got, before)
				}
				// Beside a new limit it is refused too, and changes nothing either, not
				// even the limit it would have added.
				if err := l.Reconfigure([]hybrid.Limit{tt.lim, {Name: "new", Rate: 1, Burst: 1, Policy: breaker.FailOpen}}); err == nil {
					t.Error("Reconfigure accepted it")
				}
				if got := l.Limits(); !reflect.DeepEqual(got, before) {
					t.Errorf("a refused Reconfigure changed the limits: %+v", got)
				}
				return
			}
			got := l.Limits()[0]
			if got.Rate != tt.lim.Rate || got.Version != tt.lim.Version || got.Policy != tt.lim.Policy ||
				tt.lim.MaxWait != 0 && got.MaxWait != tt.lim.MaxWait {
				t.Errorf("Limits() = %+v after Reconfigure(%+v)", got, tt.lim)
			}
		})
	}

	l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{base}})
	if _, err := l.AllowTier(context.Background(), "api", "gold", "k", 1); !errors.Is(err, hybrid.ErrUnknownTier) {
		t.Errorf("AllowTier of an unknown tier: %v", err)
	}
}

// TestLimitRoundTrip: Limits returns every field the Limiter was configured with.
func TestLimitRoundTrip(t *testing.T) {
	_, c := redistest.Mini(t)
	lims := []hybrid.Limit{
		{Name: "api", Rate: 10, Burst: 20, Policy: breaker.FailLocal(), PreRate: 5, PreBurst: 10,
			MaxWait: time.Second, MaxCost: 2, MaxKeys: 1000, Version: 7, Mode: hybrid.ChargeLater(50 * time.Millisecond),
			Lease: hybrid.LeaseTuning{RefillInterval: time.Second, Lifetime: 2 * time.Second, LowWatermark: 0.25},
			Tiers: []hybrid.Tier{{Name: "paid", Rate: 100, Burst: 200, PreRate: 50, PreBurst: 100}}},
		{Name: "win", Rate: 10, Burst: 10, Policy: breaker.FailOpen, PreRate: 5, PreBurst: 5,
			MaxWait: time.Second, MaxCost: 2, MaxKeys: 1000, Version: 7, Mode: hybrid.Windowed(100 * time.Millisecond)},
	}
	l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1, Limits: lims})
	if got := l.Limits(); !reflect.DeepEqual(got, lims) {
		t.Fatalf("Limits() = %+v, want %+v", got, lims)
	}
}

// TestTierChangeUnderLoad: a key leased on three servers under a tier of burst 200 moves
// to a tier of burst 20, and goroutines on every server go on asking under it while the
// servers still hold leases of the old tier. From the change on, the key admits at most
// the new burst (nothing refills: the rates are tiny), the servers give back what they
// leased under the old tier (Redis adds none of it: the bucket was re-shaped), and once
// they have closed, the bucket holds exactly the new burst minus what the new tier
// admitted.
func TestTierChangeUnderLoad(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		const servers, goroutines = 3, 8
		// Leases as large as they come (a third of the burst each) and that never expire:
		// at the change the servers hold nearly all of the old tier's tokens.
		lim := hybrid.Limit{Name: "api", Rate: 1e-6, Burst: 200, Policy: breaker.FailClosed, MaxWait: 2 * time.Second,
			Lease: hybrid.LeaseTuning{RefillInterval: time.Hour, Lifetime: time.Hour},
			Tiers: []hybrid.Tier{{Name: "free", Rate: 1e-6, Burst: 20}}}
		s := newStore(t, tg.Client)
		var lims []*hybrid.Limiter
		for range servers {
			l, err := hybrid.New(s, hybrid.Config{FleetSize: servers, Breaker: slowBreaker(t), Limits: []hybrid.Limit{lim}})
			if err != nil {
				t.Fatal(err)
			}
			lims = append(lims, l)
		}
		ctx := context.Background()
		var before, after, denied atomic.Int64
		load := func(tier string, done func() bool) {
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					l := lims[g%servers]
					for !done() {
						d, err := l.AllowTier(ctx, "api", tier, "k", 1)
						switch {
						case err != nil:
							t.Error(err)
							return
						case d.Tier != tier:
							t.Errorf("decision %+v under tier %q", d, tier)
							return
						case !d.Allowed:
							denied.Add(1)
						case tier == "":
							before.Add(1)
						default:
							after.Add(1)
						}
					}
				})
			}
			wg.Wait()
		}
		load("", func() bool { return before.Load() >= 50 })
		load("free", func() bool { return denied.Load() >= 300 })
		if n := after.Load(); n > 20 {
			t.Fatalf("%d admitted under the new tier, over its burst 20", n)
		}
		reshaped := int64(0)
		for _, l := range lims {
			reshaped += l.Stats().Limits[0].Reshaped
			if err := l.Close(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if reshaped == 0 {
			t.Error("no key re-shaped")
		}
		// What the new tier admitted and what the bucket holds once every lease went
		// back are within its burst: the old tier's leases added nothing.
		if left := bucketLeft(t, s, "api", 20, "k"); int64(left)+after.Load() > 20 {
			t.Fatalf("bucket holds %d after %d admitted under the new tier: over its burst 20", left, after.Load())
		}
		t.Logf("%d admitted before the change, %d after; %d keys re-shaped", before.Load(), after.Load(), reshaped)
	})
}

// TestChangeLive: a limit's burst lowered on a running Limiter that holds a lease: the
// lease goes back, the bucket takes the new burst and version at the next refill, and a
// server still on the old configuration is answered on the new one.
func TestChangeLive(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		lim := hybrid.Limit{Name: "api", Rate: 1e-6, Burst: 100, Policy: breaker.FailClosed, MaxWait: 2 * time.Second,
			Lease: hybrid.LeaseTuning{RefillInterval: time.Hour, Lifetime: time.Hour}} // a lease of half the burst, kept
		s := newStore(t, tg.Client)
		changed := newLimiter(t, s, hybrid.Config{FleetSize: 2, Limits: []hybrid.Limit{lim}})
		stale := newLimiter(t, s, hybrid.Config{FleetSize: 2, Limits: []hybrid.Limit{lim}})
		ctx := context.Background()
		for range 30 {
			if d, err := changed.Allow(ctx, "api", "k"); err != nil || !d.Allowed {
				t.Fatalf("before the change: %+v, %v", d, err)
			}
		}
		lim.Burst, lim.Version = 10, 1
		if err := changed.Reconfigure([]hybrid.Limit{lim}); err != nil {
			t.Fatal(err)
		}
		admitted := 0
		for range 40 {
			d, err := changed.Allow(ctx, "api", "k")
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
				if d.Quota != 10 {
					t.Fatalf("decision %+v: want the new Quota 10", d)
				}
			}
		}
		if admitted > 10 || admitted == 0 {
			t.Fatalf("%d admitted after the burst went to 10", admitted)
		}
		if st := changed.Stats().Limits[0]; st.Reshaped != 1 {
			t.Errorf("Reshaped = %d, want 1", st.Reshaped)
		}
		// The server that has not heard of it asks Redis for its old share (50): the
		// bucket answers on version 1, which holds at most 10 - admitted.
		staleAdmitted := 0
		for range 60 {
			if d, _ := stale.Allow(ctx, "api", "k"); d.Allowed {
				staleAdmitted++
			}
		}
		if admitted+staleAdmitted > 10 {
			t.Fatalf("%d + %d admitted after the change, over the new burst 10", admitted, staleAdmitted)
		}
		for _, l := range []*hybrid.Limiter{changed, stale} {
			if err := l.Close(ctx); err != nil {
				t.Fatal(err)
			}
		}
		key := s.Key("api", "k")
		p, err := tg.Client.HGet(ctx, key, "p").Result()
		if err != nil || p[:5] != "1 10 " {
			t.Fatalf("bucket parameters %q, %v: want version 1, burst 10", p, err)
		}
		if left := bucketLeft(t, s, "api", 10, "k"); left+admitted+staleAdmitted > 10 {
			t.Fatalf("bucket holds %d after %d+%d admitted: over the new burst 10", left, admitted, staleAdmitted)
		}
	})
}

// TestAddRemoveLimit: a limit Reconfigure adds to a running Limiter decides at once;
// removed, its calls fail with ErrUnknownLimit, its leased tokens go back to Redis and its
// counters leave Stats.
func TestAddRemoveLimit(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		s := newStore(t, tg.Client)
		l := newLimiter(t, s, hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{{Name: "a", Rate: 1, Burst: 1, Policy: breaker.FailOpen}}})
		ctx := context.Background()
		a := hybrid.Limit{Name: "a", Rate: 1, Burst: 1, Policy: breaker.FailOpen}
		b := hybrid.Limit{Name: "b", Rate: 1e-6, Burst: 50, Policy: breaker.FailClosed, MaxWait: 2 * time.Second}
		if err := l.Reconfigure([]hybrid.Limit{a, b}); err != nil {
			t.Fatal(err)
		}
		for range 5 {
			if d, err := l.Allow(ctx, "b", "k"); err != nil || !d.Allowed {
				t.Fatalf("Allow on the added limit: %+v, %v", d, err)
			}
		}
		if err := l.Reconfigure([]hybrid.Limit{b}); err != nil { // removes "a"
			t.Fatal(err)
		}
		if _, err := l.Allow(ctx, "a", "k"); !errors.Is(err, hybrid.ErrUnknownLimit) {
			t.Fatalf("Allow on a removed limit: %v", err)
		}
		if err := l.Reconfigure([]hybrid.Limit{a}); err != nil { // adds "a", removes "b"
			t.Fatal(err)
		}
		if _, err := l.Allow(ctx, "b", "k"); !errors.Is(err, hybrid.ErrUnknownLimit) {
			t.Fatalf("Allow on a removed limit: %v", err)
		}
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if left := bucketLeft(t, s, "b", 50, "k"); left != 45 {
			t.Fatalf("bucket holds %d after 5 admitted and the limit removed: want 45 (the lease refunded)", left)
		}
		if got := l.Stats().Limits; len(got) != 1 || got[0].Name != "a" {
			t.Errorf("Stats().Limits = %+v after b was removed, want a's alone", got)
		}
	})
}

// TestCountersSurviveRemoval: a limit's counters never go back: removed, its counts
// stay in Stats' totals; added again under its name (as a change of kind is made), it
// goes on from them, so a metric's series is not reset.
func TestCountersSurviveRemoval(t *testing.T) {
	_, c := redistest.Mini(t)
	a := hybrid.Limit{Name: "a", Rate: 10, Burst: 20, Policy: breaker.FailOpen}
	b := hybrid.Limit{Name: "b", Rate: 10, Burst: 20, Policy: breaker.FailOpen}
	l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{a, b}})
	ctx := context.Background()
	admitted := func(st hybrid.Stats, name string) int64 {
		for _, ls := range st.Limits {
			if ls.Name == name {
				return metricstest.Allowed(ls)
			}
		}
		return 0
	}
	for range 5 {
		l.Allow(ctx, "a", "k")
	}
	before := l.Stats()
	if admitted(before, "a") != 5 || before.Granted == 0 {
		t.Fatalf("before: a admitted %d, granted %d", admitted(before, "a"), before.Granted)
	}
	if err := l.Reconfigure([]hybrid.Limit{b}); err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.Granted < before.Granted || st.Lease < before.Lease {
		t.Errorf("a removed: totals granted %d, lease %d; want at least %d, %d", st.Granted, st.Lease, before.Granted, before.Lease)
	}
	if err := l.Reconfigure([]hybrid.Limit{a, b}); err != nil {
		t.Fatal(err)
	}
	l.Allow(ctx, "a", "k")
	after := l.Stats()
	if got := admitted(after, "a"); got != 6 {
		t.Errorf("a added again: %d admitted, want its 5 and 1 more", got)
	}
	for _, ls := range after.Limits {
		if ls.Name == "a" && ls.Granted < before.Limits[0].Granted {
			t.Errorf("a added again: granted %d, want at least %d", ls.Granted, before.Limits[0].Granted)
		}
	}
}

// TestReconfigureAfterClose: after Close, Reconfigure changes nothing, and says why:
// it removed limits before it found it could add none.
func TestReconfigureAfterClose(t *testing.T) {
	_, c := redistest.Mini(t)
	a := hybrid.Limit{Name: "a", Rate: 1, Burst: 1, Policy: breaker.FailOpen}
	l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{a}})
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	b := hybrid.Limit{Name: "b", Rate: 1, Burst: 1, Policy: breaker.FailOpen}
	if err := l.Reconfigure([]hybrid.Limit{b}); !errors.Is(err, hybrid.ErrClosed) {
		t.Fatalf("Reconfigure after Close: %v, want ErrClosed", err)
	}
	if got := l.Limits(); len(got) != 1 || got[0].Name != "a" {
		t.Fatalf("limits after a refused Reconfigure: %+v, want a alone", got)
	}
}

// TestReconfigurePolicyTakesEffect: a change of a limit's failure policy, or of its
// MaxCost, with its bucket the same, is what decides requests once Redis does not
// answer: not only what Limits reports. Each case runs with Redis gone (connections
// refused), so that every new key's request goes to the policy.
func TestReconfigurePolicyTakesEffect(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		before, now hybrid.Limit
		cost        int
		allowed     bool
	}{
		{"FailClosed to FailOpen",
			hybrid.Limit{Name: "api", Rate: 10, Burst: 10, Policy: breaker.FailClosed, MaxWait: 10 * time.Millisecond},
			hybrid.Limit{Name: "api", Rate: 10, Burst: 10, Policy: breaker.FailOpen, MaxWait: 10 * time.Millisecond}, 1, true},
		{"FailOpen to FailClosed",
			hybrid.Limit{Name: "api", Rate: 10, Burst: 10, Policy: breaker.FailOpen, MaxWait: 10 * time.Millisecond},
			hybrid.Limit{Name: "api", Rate: 10, Burst: 10, Policy: breaker.FailClosed, MaxWait: 10 * time.Millisecond}, 1, false},
		{"FailLocal's MaxCost raised",
			hybrid.Limit{Name: "api", Rate: 10, Burst: 10, Policy: breaker.FailLocal(), MaxWait: 10 * time.Millisecond, MaxCost: 1},
			hybrid.Limit{Name: "api", Rate: 10, Burst: 10, Policy: breaker.FailLocal(), MaxWait: 10 * time.Millisecond, MaxCost: 5}, 5, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, c := redistest.Mini(t)
			// Ten servers: FailLocal's share of burst 10 is max(1, MaxCost).
			l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 10, Limits: []hybrid.Limit{tc.before}})
			m.Close()
			if err := l.Reconfigure([]hybrid.Limit{tc.now}); err != nil {
				t.Fatal(err)
			}
			d, err := l.AllowN(ctx, "api", "new-key", tc.cost)
			if err != nil {
				t.Fatal(err)
			}
			if d.Source != hybrid.SourceFallback || d.Allowed != tc.allowed {
				t.Errorf("after Reconfigure to %v, MaxCost %d: allowed %v from %v (%v); want %v from the policy",
					tc.now.Policy, tc.now.MaxCost, d.Allowed, d.Source, d.Reason, tc.allowed)
			}
		})
	}
}

// TestLimitsRoundTripMovesThePreCheck: a pre-check left to its default follows the limit
// through the round trip the docs give for changing one limit (Limits, one field
// changed, Reconfigure): raising the burst admits the new burst, and lowering it is
// accepted, not refused as a pre-check looser than the limit.
func TestLimitsRoundTripMovesThePreCheck(t *testing.T) {
	_, c := redistest.Mini(t)
	l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1,
		Limits: []hybrid.Limit{{Name: "api", Rate: 1e-3, Burst: 5, Policy: breaker.FailClosed, MaxWait: time.Second}}})
	change := func(burst int, version uint64) error {
		lims := l.Limits()
		if lims[0].PreRate != 0 || lims[0].PreBurst != 0 {
			t.Errorf("Limits() gives a pre-check of %v/s, burst %d; want the default, 0", lims[0].PreRate, lims[0].PreBurst)
		}
		lims[0].Burst, lims[0].Version = burst, version
		return l.Reconfigure(lims)
	}
	if err := change(50, 1); err != nil {
		t.Fatal(err)
	}
	if admitted := admittedOf(t, l, "api", "k", 60); admitted != 50 {
		t.Errorf("burst raised to 50: %d of 60 admitted, want 50", admitted)
	}
	if err := change(3, 2); err != nil {
		t.Errorf("burst lowered to 3: %v", err)
	}
}
