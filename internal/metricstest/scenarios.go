package metricstest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// Want is what an adapter must export after a scenario: by metric (its Prometheus name,
// as in Metrics), the value of each series by its one label's value.
type Want map[string]map[string]float64

// newLimiter is a ready Limiter of a fleet of servers over a miniredis of the test's own,
// with the limits given and brk; it returns the store and its client too.
func newLimiter(t testing.TB, servers int, brk *breaker.Breaker, limits ...hybrid.Limit) (*hybrid.Limiter, *global.Store, *redis.Client) {
	t.Helper()
	_, c := redistest.Mini(t)
	store, err := global.New(c)
	if err != nil {
		t.Fatal(err)
	}
	l, err := hybrid.New(store, hybrid.Config{FleetSize: servers, Breaker: brk, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	if err := l.Ready(context.Background()); err != nil {
		t.Fatal(err)
	}
	return l, store, c
}

// PerLimit returns a Limiter whose per-limit counters, which Busy's leaves at 0, differ
// limit by limit, and what they must be exported as: the dry-run gauge 1 for the limit
// that only watches ("watch") and 0 for the others; 3 decisions given back by "key"
// (AllowMulti items whose "tenant" item was denied, its bucket drained by another
// server, after "key"'s admitted); 1 bucket lost by "refill" (deleted between two of its
// refills).
func PerLimit(t testing.TB) (*hybrid.Limiter, Want) {
	t.Helper()
	brk, err := breaker.New(breaker.Settings{Timeout: 2 * time.Second}) // room for a loaded machine
	if err != nil {
		t.Fatal(err)
	}
	every := hybrid.LeaseTuning{RefillInterval: time.Nanosecond, LowWatermark: -1} // every request refills
	// Of 2 servers: a lease holds at most half the tenant's burst.
	l, store, c := newLimiter(t, 2, brk,
		hybrid.Limit{Name: "watch", Rate: 1e-6, Burst: 1, Policy: breaker.FailClosed, MaxWait: time.Second, DryRun: true},
		hybrid.Limit{Name: "key", Rate: 1e-6, Burst: 50, Policy: breaker.FailClosed, MaxWait: time.Second},
		hybrid.Limit{Name: "tenant", Rate: 1e-6, Burst: 4, Policy: breaker.FailClosed, MaxWait: time.Second},
		hybrid.Limit{Name: "refill", Rate: 1, Burst: 100, Policy: breaker.FailClosed, MaxWait: time.Second, Lease: every})
	ctx := context.Background()
	items := []hybrid.Item{{Limit: "key", Key: "k", Cost: 1}, {Limit: "tenant", Key: "t", Cost: 1}}
	for range 2 {
		if d, err := l.AllowMulti(ctx, items); err != nil || !d.Allowed {
			t.Fatalf("AllowMulti = %+v, %v; want allowed", d, err)
		}
	}
	// Another server drains the tenant's bucket: this server's pre-check still has
	// tokens, so the tenant's item is denied by the refill, after the key's was
	// admitted, which then goes back.
	tenant, err := global.NewLimit("tenant", 1e-6, 4)
	if err != nil {
		t.Fatal(err)
	}
	for drained := false; !drained; {
		r, err := store.AllowN(ctx, tenant, "t", 1)
		if err != nil {
			t.Fatal(err)
		}
		drained = !r.Allowed
	}
	for i, denied := 0, 0; denied < 3; i++ { // the lease may hold a token still
		d, err := l.AllowMulti(ctx, items)
		switch {
		case err != nil:
			t.Fatal(err)
		case i == 10:
			t.Fatalf("AllowMulti = %+v: the tenant still admits after its bucket was drained", d)
		case !d.Allowed && d.Denied != 1:
			t.Fatalf("AllowMulti = %+v; want denied by the tenant's item", d)
		case !d.Allowed:
			denied++
		}
	}
	// A bucket deleted while this server takes from it is found lost by the next refill.
	for range 3 {
		if _, err := l.Allow(ctx, "refill", "k"); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Del(ctx, store.Key("refill", "k")).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(ctx, "refill", "k"); err != nil {
		t.Fatal(err)
	}
	return l, Want{
		"fleetlimit_limit_dry_run":              {"watch": 1, "key": 0, "tenant": 0, "refill": 0},
		"fleetlimit_decisions_given_back_total": {"watch": 0, "key": 3, "tenant": 0, "refill": 0},
		"fleetlimit_buckets_lost_total":         {"watch": 0, "key": 0, "tenant": 0, "refill": 1},
	}
}

// Breaker returns a Limiter and walk, which drives the Limiter's breaker through every
// state and call result, to counts that differ pairwise (which Busy's breaker, opened
// once, never half-open, nothing overloaded or excluded, does not): it calls state with
// the name of each state (as fleetlimit_breaker_state labels it: closed, open,
// half-open) while the breaker is in it, and returns what the transition and call
// counters must be exported as, by "to" and by "result", the Limiter's own calls
// included. The Limiter is idle meanwhile: every call is the walk's.
func Breaker(t testing.TB) (*hybrid.Limiter, func(state func(string)) Want) {
	t.Helper()
	errDown := errors.New("down")
	brk, err := breaker.New(breaker.Settings{Timeout: 10 * time.Second, FailureThreshold: 1, OpenTimeout: time.Second,
		MaxInFlight: 1, IsFailure: func(err error) bool { return errors.Is(err, errDown) }})
	if err != nil {
		t.Fatal(err)
	}
	l, _, _ := newLimiter(t, 1, brk, hybrid.Limit{Name: "api", Rate: 1, Burst: 10, Policy: breaker.FailClosed, MaxWait: time.Second})
	ctx := context.Background()
	do := func(err error) error { return brk.Do(ctx, func(context.Context) error { return err }) }
	halfOpen := func() {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		// Nothing signals the end of the open period: State moves the breaker on once
		// OpenTimeout has passed, so it is polled.
		for brk.State() != breaker.StateHalfOpen {
			if time.Now().After(deadline) {
				t.Fatalf("the breaker is %v long after its OpenTimeout", brk.State())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return l, func(state func(string)) Want {
		t.Helper()
		base := brk.Stats() // the Limiter's own calls, readying Redis
		state("closed")
		// 1 call excluded (its context ended before it started), 2 overloaded (one call
		// in flight, MaxInFlight 1), 6 successes.
		canceled, cancel := context.WithCancel(ctx)
		cancel()
		_ = brk.Do(canceled, func(context.Context) error { return nil })
		started, release, held := make(chan struct{}), make(chan struct{}), make(chan error)
		go func() {
			held <- brk.Do(ctx, func(context.Context) error { close(started); <-release; return nil })
		}()
		<-started // running: its slot is taken
		for range 2 {
			if err := do(nil); !errors.Is(err, breaker.ErrOverloaded) {
				t.Fatalf("a call beyond MaxInFlight: %v", err)
			}
		}
		close(release)
		if err := <-held; err != nil {
			t.Fatal(err)
		}
		for range 5 {
			if err := do(nil); err != nil {
				t.Fatal(err)
			}
		}
		// A failure opens it; 4 calls are rejected while it is open.
		_ = do(errDown)
		for range 4 {
			if err := do(nil); !errors.Is(err, breaker.ErrOpen) {
				t.Fatalf("a call while open: %v", err)
			}
		}
		state("open")
		halfOpen()
		state("half-open")
		_ = do(errDown) // the probe fails: open again
		halfOpen()
		if err := do(nil); err != nil { // the probe succeeds: closed
			t.Fatal(err)
		}
		_ = do(errDown) // and a failure opens it a third time

		// Opened 3, half-opened 2, closed 1; 7 successes, 3 failures, 4 rejected, 2
		// overloaded, 1 excluded, besides the Limiter's.
		want := Want{
			"fleetlimit_breaker_transitions_total": {"closed": 1, "half-open": 2, "open": 3},
			"fleetlimit_breaker_calls_total": {"success": float64(base.Successes + 7), "failure": float64(base.Failures + 3),
				"rejected": float64(base.Rejected + 4), "overloaded": float64(base.Overloaded + 2), "excluded": float64(base.Excluded + 1)},
		}
		b := l.Stats().BreakerStats // what the adapters read: it must agree
		got := Want{
			"fleetlimit_breaker_transitions_total": {"closed": float64(b.Closed), "half-open": float64(b.HalfOpened), "open": float64(b.Opened)},
			"fleetlimit_breaker_calls_total": {"success": float64(b.Successes), "failure": float64(b.Failures), "rejected": float64(b.Rejected),
				"overloaded": float64(b.Overloaded), "excluded": float64(b.Excluded)},
		}
		for name, w := range want {
			for k, v := range w {
				if got[name][k] != v {
					t.Fatalf("the Limiter's breaker stats %+v: %s{%s} = %v, want %v", b, name, k, got[name][k], v)
				}
			}
		}
		return want
	}
}

// Label is the one label of metric name's series in Metrics, which a scenario's Want
// tells them apart by.
func Label(t testing.TB, name string) string {
	t.Helper()
	for _, m := range Metrics {
		if m.Name == name && len(m.Labels) == 1 {
			return m.Labels[0]
		}
	}
	t.Fatalf("metricstest: %s is not a metric of one label", name)
	return ""
}
