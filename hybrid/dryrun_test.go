package hybrid_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// TestDryRun: a DryRun limit decides and counts as an enforced one, but admits what it
// denies (WouldDeny); a reservation it admits that way holds nothing to give back; in
// AllowMulti it never blocks the enforced items and is not decided when they deny; the
// Logger hears how many it would have denied; Reconfigure turns enforcement on.
func TestDryRun(t *testing.T) {
	_, c := redistest.Mini(t)
	var logs syncBuffer
	var mu sync.Mutex
	var heard []hybrid.Decision
	lim := func(name string, burst int, dry bool) hybrid.Limit {
		return hybrid.Limit{Name: name, Rate: 1e-3, Burst: burst, Policy: breaker.FailClosed, MaxWait: time.Second, DryRun: dry}
	}
	l := newLimiter(t, newStore(t, c), hybrid.Config{
		FleetSize: 1, Logger: slog.New(slog.NewJSONHandler(&logs, nil)), LogInterval: time.Millisecond,
		Limits: []hybrid.Limit{lim("new", 2, true), lim("api", 3, false), lim("tenant", 1, true)},
		OnDecision: func(key string, d hybrid.Decision) {
			mu.Lock()
			heard = append(heard, d)
			mu.Unlock()
		},
	})
	ctx := context.Background()

	// AllowN: two within the burst, then admitted as WouldDeny.
	for i, want := range []bool{false, false, true, true} {
		d, err := l.Allow(ctx, "new", "k")
		if err != nil || !d.Allowed || d.WouldDeny != want || d.RetryAfter != 0 {
			t.Fatalf("request %d: %+v, %v; want admitted, WouldDeny %v", i, d, err, want)
		}
	}
	if denied := deniedOf(l, "new"); denied != 2 {
		t.Errorf("the limit counted %d denials, want the 2 it would have made", denied)
	}
	// An invalid cost is the caller's error, not a denial a dry run admits.
	if d, err := l.AllowN(ctx, "new", "k", -1); !errors.Is(err, hybrid.ErrInvalidCost) || d.Allowed || d.WouldDeny {
		t.Errorf("a negative cost: %+v, %v; want not allowed, ErrInvalidCost", d, err)
	}
	if md, err := l.AllowMulti(ctx, []hybrid.Item{{Limit: "new", Key: "k", Cost: -1}}); !errors.Is(err, hybrid.ErrInvalidCost) || md.Allowed {
		t.Errorf("AllowMulti, a negative cost: %+v, %v; want not allowed, ErrInvalidCost", md, err)
	}
	mu.Lock()
	if n := len(heard); n != 4 || !heard[3].WouldDeny {
		t.Errorf("OnDecision heard %d decisions (last %+v), want 4, the last WouldDeny", n, heard[n-1])
	}
	mu.Unlock()
	waitFor(t, "the dry-run line", func() bool { return logs.has(t, "dry-run limit would have denied requests") })

	// A reservation admitted as WouldDeny holds nothing: cancelling it gives nothing back.
	r, err := l.ReserveN(ctx, "new", "k", 1)
	if err != nil || !r.OK() || r.Delay() != 0 || !r.Decision().WouldDeny {
		t.Fatalf("ReserveN: %+v, %v; want OK at once, WouldDeny", r.Decision(), err)
	}
	r.Cancel()
	if d, _ := l.Allow(ctx, "new", "k"); !d.WouldDeny {
		t.Fatalf("after a cancelled dry-run reservation: %+v, want still WouldDeny (nothing given back)", d)
	}

	// AllowMulti: the dry-run tenant limit never blocks the enforced api limit.
	items := []hybrid.Item{{Limit: "tenant", Key: "acme", Cost: 1}, {Limit: "api", Key: "k", Cost: 1}}
	for i := range 3 {
		md, err := l.AllowMulti(ctx, items)
		if err != nil || !md.Allowed || md.Decision.WouldDeny != (i > 0) {
			t.Fatalf("multi %d: %+v, %v; want admitted by api, tenant WouldDeny from the second", i, md, err)
		}
	}
	before := deniedOf(l, "tenant")
	md, err := l.AllowMulti(ctx, items) // api's burst of 3 is spent: denied, by item 1
	if err != nil || md.Allowed || md.Denied != 1 || md.Decision.Limit != "api" {
		t.Fatalf("multi over api's burst: %+v, %v; want denied by item 1, api", md, err)
	}
	if deniedOf(l, "tenant") != before {
		t.Error("the dry-run item was decided though the enforced items denied")
	}

	// Enforcing: Reconfigure turns DryRun off.
	if err := setLimit(l, lim("new", 2, false)); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.Allow(ctx, "new", "k"); d.Allowed || d.WouldDeny {
		t.Fatalf("enforced: %+v, want denied", d)
	}
}

// deniedOf returns the denials the limit named name counted.
func deniedOf(l *hybrid.Limiter, name string) int64 {
	var n int64
	for _, ls := range l.Stats().Limits {
		if ls.Name == name {
			for _, dc := range ls.Decisions {
				if !dc.Allowed {
					n += dc.Count
				}
			}
		}
	}
	return n
}

// TestOnDecisionOncePerMultiWithDryRun: OnDecision hears one decision per AllowMulti
// call, the one it returns, with its item's key, also when some items are of DryRun
// limits (decided on their own after the others), and when none is; an item of cost 0
// is admitted as AllowN's is.
func TestOnDecisionOncePerMultiWithDryRun(t *testing.T) {
	_, c := redistest.Mini(t)
	type heard struct {
		key string
		d   hybrid.Decision
	}
	var got []heard
	l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1,
		OnDecision: func(key string, d hybrid.Decision) { got = append(got, heard{key, d}) },
		Limits: []hybrid.Limit{{Name: "a", Rate: 100, Burst: 100, Policy: breaker.FailOpen, MaxWait: time.Second},
			{Name: "d", Rate: 100, Burst: 100, Policy: breaker.FailOpen, MaxWait: time.Second, DryRun: true}}})
	for _, items := range [][]hybrid.Item{
		{{Limit: "a", Key: "k", Cost: 1}, {Limit: "d", Key: "k", Cost: 1}, {Limit: "d", Key: "k2", Cost: 5}},
		{{Limit: "d", Key: "k", Cost: 1}, {Limit: "d", Key: "k3", Cost: 1}},
		{{Limit: "a", Key: "k4", Cost: 1}, {Limit: "a", Key: "k5", Cost: 0}},
	} {
		got = got[:0]
		md, err := l.AllowMulti(context.Background(), items)
		if err != nil || !md.Allowed {
			t.Fatalf("%v: %+v, %v", items, md, err)
		}
		if len(got) != 1 || got[0].d != md.Decision {
			t.Fatalf("%v: OnDecision heard %+v, want once, the decision returned %+v", items, got, md.Decision)
		}
		found := false
		for _, it := range items {
			found = found || it.Key == got[0].key && it.Limit == md.Decision.Limit
		}
		if !found {
			t.Fatalf("%v: OnDecision heard key %q for limit %q, not an item's", items, got[0].key, md.Decision.Limit)
		}
	}
}

// TestAllowMultiDryOnlyFails: an AllowMulti of DryRun items alone whose item cannot be
// decided (its context ends while it waits for Redis) fails as AllowN on that limit
// does: not allowed, that item denying, with the context's error; a DryRun limit turns
// a denial into an admission, never a call that did not decide.
func TestAllowMultiDryOnlyFails(t *testing.T) {
	_, c := redistest.Mini(t)
	slow := &slowTakes{}
	c.AddHook(slow)
	l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{
		{Name: "d1", Rate: 10, Burst: 20, Policy: breaker.FailClosed, MaxWait: time.Second, DryRun: true},
		{Name: "d2", Rate: 10, Burst: 20, Policy: breaker.FailClosed, MaxWait: time.Second, DryRun: true}}})
	slow.delay.Store(int64(300 * time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	md, err := l.AllowMulti(ctx, []hybrid.Item{{Limit: "d1", Key: "k", Cost: 1}, {Limit: "d2", Key: "k", Cost: 1}})
	if md.Allowed || md.Denied != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("AllowMulti of DryRun items, its context ended: %+v, %v; want not allowed, item 0, DeadlineExceeded", md, err)
	}
}

// TestAllowMultiReportsTheClosestLimit: an admitted AllowMulti with DryRun items reports
// the decision of the limit closest to its end: one that would have denied (WouldDeny)
// before any other, else the fewest tokens remaining, enforced or DryRun alike, the
// enforced items' decision when no DryRun item has fewer.
func TestAllowMultiReportsTheClosestLimit(t *testing.T) {
	_, c := redistest.Mini(t)
	lim := func(name string, burst int, dry bool) hybrid.Limit {
		return hybrid.Limit{Name: name, Rate: 1e-3, Burst: burst, Policy: breaker.FailClosed, MaxWait: time.Second, DryRun: dry}
	}
	l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{
		lim("one", 1, false), lim("big", 100, false), lim("dryOne", 1, true), lim("dryMid", 50, true), lim("dryBig", 100, true)}})
	ctx := context.Background()
	if d, err := l.Allow(ctx, "dryOne", "spent"); err != nil || !d.Allowed || d.WouldDeny {
		t.Fatalf("spending dryOne: %+v, %v", d, err)
	}
	for _, tc := range []struct {
		name      string
		items     []hybrid.Item
		limit     string
		wouldDeny bool
	}{
		{"fewest remaining, DryRun", []hybrid.Item{{Limit: "big", Key: "a"}, {Limit: "dryMid", Key: "a"}, {Limit: "dryBig", Key: "a"}}, "dryMid", false},
		{"fewest remaining, enforced", []hybrid.Item{{Limit: "dryBig", Key: "b"}, {Limit: "big", Key: "b"}}, "big", false},
		{"DryRun only", []hybrid.Item{{Limit: "dryBig", Key: "c"}, {Limit: "dryMid", Key: "c"}}, "dryMid", false},
		{"would deny", []hybrid.Item{{Limit: "one", Key: "spent"}, {Limit: "dryOne", Key: "spent"}}, "dryOne", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range tc.items {
				tc.items[i].Cost = 1
			}
			md, err := l.AllowMulti(ctx, tc.items)
			if err != nil || !md.Allowed || md.Denied != -1 || md.Decision.Limit != tc.limit || md.Decision.WouldDeny != tc.wouldDeny {
				t.Errorf("%+v, %v; want admitted, reporting %s (WouldDeny %v)", md, err, tc.limit, tc.wouldDeny)
			}
		})
	}
}

// TestDryRunReservationCancelGivesNothingBack: a reservation a DryRun limit admitted as
// WouldDeny took nothing, so cancelling it gives nothing back, even at the instant it was
// made (the clock frozen), when a reservation that took tokens would return them.
func TestDryRunReservationCancelGivesNothingBack(t *testing.T) {
	m, c := redistest.Mini(t)
	frozen := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m.SetTime(frozen)
	l := newLimiter(t, newStore(t, c), hybrid.Config{
		FleetSize: 1,
		Clock:     clockAt(func() time.Time { return frozen }),
		Limits:    []hybrid.Limit{{Name: "dry", Rate: 1e-9, Burst: 1, Policy: breaker.FailClosed, MaxWait: time.Second, DryRun: true}},
	})
	ctx := context.Background()
	if d, err := l.Allow(ctx, "dry", "k"); err != nil || !d.Allowed || d.WouldDeny {
		t.Fatalf("the first request: %+v, %v; want admitted", d, err)
	}
	r, err := l.ReserveN(ctx, "dry", "k", 1)
	if err != nil || !r.OK() || r.Delay() != 0 || !r.Decision().WouldDeny {
		t.Fatalf("ReserveN: %+v, %v; want OK at once, WouldDeny", r.Decision(), err)
	}
	r.Cancel()
	if d, _ := l.Allow(ctx, "dry", "k"); !d.WouldDeny {
		t.Fatalf("after a cancelled dry-run reservation: %+v, want still WouldDeny (nothing given back)", d)
	}
	if s := l.Stats(); s.Limits[0].GivenBack != 0 {
		t.Errorf("GivenBack %d after cancelling a reservation that took nothing, want 0", s.Limits[0].GivenBack)
	}
}
