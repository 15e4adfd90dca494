package hybrid_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// TestReserve: a reservation is served from the lease when it can (delay 0), else as a
// claim on the bucket's refill, one token's refill time later for each token claimed,
// down to minus the burst and no further; a claim canceled before its instant gives its
// tokens back, and the bucket shows exactly what the reservations that stand took.
func TestReserve(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		s := newStore(t, tg.Client)
		// A token a second: the delays measured are whole seconds, and the time the test
		// itself takes (milliseconds, on a real Redis whose clock runs) hardly moves them.
		const rate, burst = 1.0, 5
		l := newLimiter(t, s, hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{
			{Name: "jobs", Rate: rate, Burst: burst, Policy: breaker.FailClosed, MaxWait: time.Second}}})
		ctx := context.Background()

		r, err := l.ReserveN(ctx, "jobs", "k", 1)
		if err != nil || !r.OK() || r.Delay() != 0 {
			t.Fatalf("first reservation: ok %v, delay %v, %v; want tokens on hand", r.OK(), r.Delay(), err)
		}
		r.Cancel() // at once: its tokens count as used (TestCancelAfterTheInstantToAct)
		for {      // drain the bucket
			d, err := l.Allow(ctx, "jobs", "k")
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				break
			}
		}
		// Claims on the refill: the k-th waits about k tokens' refill.
		var claims []*hybrid.Reservation
		for k := 1; k <= burst; k++ {
			r, err := l.ReserveN(ctx, "jobs", "k", 1)
			if err != nil || !r.OK() {
				t.Fatalf("claim %d: ok %v, %v", k, r.OK(), err)
			}
			want := time.Duration(k) * time.Second
			if d := r.Delay(); d < want-500*time.Millisecond || d > want {
				t.Fatalf("claim %d: delay %v, want about %v", k, d, want)
			}
			if d := r.Decision(); !d.Allowed || d.Source != hybrid.SourceGlobal {
				t.Fatalf("claim %d: decision %+v", k, d)
			}
			claims = append(claims, r)
		}
		// Minus the burst claimed: no more.
		if r, err := l.ReserveN(ctx, "jobs", "k", 1); err != nil || r.OK() || r.Delay() != hybrid.InfDuration {
			t.Fatalf("a claim past minus the burst: ok %v, delay %v, %v", r.OK(), r.Delay(), err)
		}
		if got := l.Stats().Limits[0].Reserved; got != burst {
			t.Errorf("Reserved = %d, want %d", got, burst)
		}
		claims[burst-1].Cancel() // the last claim goes back
		claims[burst-1].Cancel() // once
		if got := l.Stats().Limits[0].Reserved; got != burst-1 {
			t.Errorf("Reserved = %d after a cancel, want %d", got, burst-1)
		}
		// Above the burst: never.
		if r, err := l.ReserveN(ctx, "jobs", "k", burst+1); err != nil || r.OK() {
			t.Fatalf("a reservation above the burst: ok %v, %v", r.OK(), err)
		}
		if r, err := l.ReserveN(ctx, "nope", "k", 1); !errors.Is(err, hybrid.ErrUnknownLimit) || r.OK() || r.Decision().Limit != "nope" {
			t.Fatalf("unknown limit: ok %v, decision %+v, %v", r.OK(), r.Decision(), err)
		}
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
		// The bucket: 4 claims stand. Read it with a claim of one: it waits for the
		// bucket to refill from minus 4 (and what refilled since) plus one token.
		g, err := redisstore.Of(s).TakeOne(ctx, globalTake("jobs", rate, burst, "k"))
		if err != nil || g.Granted != 1 {
			t.Fatalf("reading the bucket: %+v, %v", g, err)
		}
		if g.Remaining > -4 || g.Remaining < -5 {
			t.Fatalf("bucket at %v after four claims stood and one was canceled, want between -5 and -4", g.Remaining)
		}
	})
}

// globalTake is a take of one token for key that may leave the bucket down to minus its
// burst: it reads the bucket's level after it.
func globalTake(name string, rate float64, burst int, key string) redisstore.TakeRequest {
	return redisstore.TakeRequest{Limit: redisstore.Limit{Name: name, Rate: rate, Burst: burst}, Key: key, Want: 1, Min: 1, Floor: burst}
}

// TestCancelAfterTheInstantToAct: as x/time/rate's, a reservation canceled at its
// instant to act gives its tokens back; canceled after it, when the holder may have
// acted, it gives nothing back: its tokens count as used. A reservation served from the
// lease may act at once.
func TestCancelAfterTheInstantToAct(t *testing.T) {
	_, c := redistest.Mini(t)
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1, Clock: clockAt(func() time.Time { return time.Unix(0, now.Load()) }),
		Limits: []hybrid.Limit{{Name: "jobs", Rate: 1000, Burst: 1000, Policy: breaker.FailClosed, MaxWait: time.Second}}})
	ctx := context.Background()
	if d, _ := l.Allow(ctx, "jobs", "k"); !d.Allowed { // the lease holds tokens
		t.Fatalf("%+v", d)
	}
	held := func() int64 { return l.Stats().Limits[0].Held }
	for _, tc := range []struct {
		name  string
		after time.Duration // from the reservation to its Cancel
		back  bool
	}{
		{"at the instant to act", 0, true},
		{"after it", time.Millisecond, false},
	} {
		r, err := l.ReserveN(ctx, "jobs", "k", 10)
		if err != nil || !r.OK() || r.Delay() != 0 {
			t.Fatalf("%s: ok %v, delay %v, %v; want tokens on hand", tc.name, r.OK(), r.Delay(), err)
		}
		before := held()
		now.Add(int64(tc.after))
		r.Cancel()
		if got := held() - before; (got == 10) != tc.back || got != 0 && got != 10 {
			t.Fatalf("%s: the lease holds %d more after Cancel, want 10 back: %v", tc.name, got, tc.back)
		}
	}
}
