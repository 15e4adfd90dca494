package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/luascript"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// TestNoGoroutineOutlivesClose: a limiter with traffic, refills, a fleet heartbeat and
// expiring leases leaves no goroutine behind once Close returns.
func TestNoGoroutineOutlivesClose(t *testing.T) {
	m, c := redistest.Mini(t)
	_ = c.Ping(context.Background()).Err()
	before := goleak.IgnoreCurrent()
	cl := redis.NewClient(redistest.Options(m.Addr()))
	st, err := global.New(cl, global.Prefix(randomPrefix()))
	if err != nil {
		t.Fatal(err)
	}
	// Not a test of timing: a breaker with room for -race on a loaded machine, where
	// miniredis (in this process) once took over 10ms for 5 calls in a row, the default
	// breaker opened, and Close could not refund.
	brk, err := breaker.New(breaker.Settings{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l, err := hybrid.New(st, hybrid.Config{
		FleetSize: 2, Fleet: "leak-test", HeartbeatInterval: 10 * time.Millisecond, Breaker: brk,
		Limits: []hybrid.Limit{{Name: "api", Rate: 1000, Burst: 100, Policy: breaker.FailLocal(), Lease: hybrid.LeaseTuning{Lifetime: 20 * time.Millisecond}, MaxWait: time.Second}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				_, _ = l.Allow(context.Background(), "api", fmt.Sprintf("k%d", (g*200+i)%37))
			}
		}()
	}
	wg.Wait()
	if err := l.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := l.Allow(context.Background(), "api", "k"); !errors.Is(err, hybrid.ErrClosed) {
		t.Fatalf("Allow after Close: %v, want ErrClosed", err)
	}
	if err := cl.Close(); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, before)
}

// TestCloseRefundsLeases: the tokens a server holds go back to the bucket on Close.
func TestCloseRefundsLeases(t *testing.T) {
	targets(t, func(t *testing.T, addr string, real bool) {
		prefix := randomPrefix()
		s := newServer(t, addr, prefix, nil, breaker.Settings{Timeout: time.Second}, hybrid.Config{
			FleetSize: 1,
			Limits:    []hybrid.Limit{{Name: "api", Rate: 0.01, Burst: 100, Policy: breaker.FailClosed, MaxWait: time.Second}},
		})
		ctx := context.Background()
		// A burst of requests grows the batch: the lease ends up holding tokens.
		for range 30 {
			if d, _ := s.limiter.Allow(ctx, "api", "k"); !d.Allowed {
				t.Fatalf("denied: %+v", d)
			}
		}
		lim := redisstore.Limit{Name: "api", Rate: 0.01, Burst: 100}
		before, err := redisstore.Of(s.store).Take(ctx, lim, "k", 1, 1) // what the bucket holds now (minus 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.limiter.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		st := s.limiter.Stats()
		after, err := redisstore.Of(s.store).Take(ctx, lim, "k", 1, 1)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("bucket %.2f before Close, %.2f after; stats %+v", before.Remaining, after.Remaining, st)
		if st.Granted-st.Refunded != 30 {
			t.Errorf("granted %d − refunded %d != 30 admitted", st.Granted, st.Refunded)
		}
		if got, want := after.Remaining, before.Remaining-1+float64(st.Refunded); got < want-0.5 || got > want+0.5 {
			t.Errorf("bucket after Close %.2f, want about %.2f (the refunds back)", got, want)
		}
		if after.Remaining < 100-30-2-0.5 {
			t.Errorf("bucket after Close %.2f: leased tokens were not all refunded", after.Remaining)
		}
	})
}

// TestCloseRefundsInFewRoundTrips: a server holding leases for many keys gives every
// unused token back on Close in pipelined batches, not one call per key, and every
// bucket ends where the admitted requests left it.
func TestCloseRefundsInFewRoundTrips(t *testing.T) {
	const perKey = 30
	targets(t, func(t *testing.T, addr string, real bool) {
		keys := 1000 // miniredis runs scripts slowly: fewer keys there
		if !real {
			keys = 300
		}
		if testing.Short() {
			keys /= 3
		}
		prefix := randomPrefix()
		counter := &redistest.Counter{}
		s := newServer(t, addr, prefix, counter, breaker.Settings{Timeout: 5 * time.Second}, hybrid.Config{
			FleetSize: 1,
			Limits: []hybrid.Limit{{Name: "api", Rate: 0.001, Burst: 100, Policy: breaker.FailClosed,
				MaxWait: 5 * time.Second, MaxKeys: 2 * keys,
				// Long-lived leases sized for seconds of demand: every key holds spare
				// tokens at Close, and none expire before.
				Lease: hybrid.LeaseTuning{RefillInterval: 5 * time.Second, Lifetime: time.Minute}}},
		})
		ctx := context.Background()
		var wg sync.WaitGroup
		for k := range keys {
			wg.Go(func() {
				// A burst of requests grows the key's batch: its lease ends up holding tokens.
				for range perKey {
					if d, err := s.limiter.Allow(ctx, "api", fmt.Sprint("k", k)); err != nil || !d.Allowed {
						t.Errorf("key %d denied: %+v %v", k, d, err)
						return
					}
				}
			})
		}
		wg.Wait()
		before := s.limiter.Stats()
		trips, cmds, scriptKeys := counter.Trips.Load(), counter.Cmds.Load(), counter.ScriptKeys.Load()
		if err := s.limiter.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		closeTrips, closeCmds, closeKeys := counter.Trips.Load()-trips, counter.Cmds.Load()-cmds, counter.ScriptKeys.Load()-scriptKeys
		st := s.limiter.Stats()
		t.Logf("%d keys: Close refunded %d tokens to %d keys with %d commands in %d round trips (%d refund calls); stats %+v",
			keys, st.Refunded-before.Refunded, closeKeys, closeCmds, closeTrips, st.RefundCalls-before.RefundCalls, st)
		if st.Granted-st.Refunded != int64(keys*perKey) || st.RefundsLost != 0 {
			t.Errorf("granted %d − refunded %d != %d admitted (lost %d)", st.Granted, st.Refunded, keys*perKey, st.RefundsLost)
		}
		if closeKeys < int64(keys) {
			t.Errorf("Close refunded to %d keys of %d: some keys held no lease, the test proves less", closeKeys, keys)
		}
		// The refunds of many keys go in script calls of several keys each.
		if closeCmds >= int64(keys)/4 {
			t.Errorf("Close sent %d commands for %d keys: want calls of several keys each", closeCmds, keys)
		}
		// One pipeline per 256 keys, plus a few for whatever was in flight (a heartbeat,
		// an expiry tick).
		if limit := int64((keys+255)/256 + 3); closeTrips > limit {
			t.Errorf("Close made %d round trips for %d keys, want at most %d", closeTrips, keys, limit)
		}
		checkLevels(t, s.store, "api", keys, 100-perKey)
	})
}

// slowRefunds holds back the answer of the first refund pipeline until the next refund
// pipeline goes out: the refunds have run in Redis, but the limiter's breaker gave up on
// them (a slow answer), and the limiter sends them again.
type slowRefunds struct {
	first  atomic.Bool
	resent chan struct{}
	once   sync.Once
}

func (h *slowRefunds) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *slowRefunds) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *slowRefunds) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == 0 || cmds[0].Name() != "evalsha" || cmds[0].Args()[1] != luascript.Refund.Hash() {
			return next(ctx, cmds)
		}
		if !h.first.CompareAndSwap(false, true) {
			h.once.Do(func() { close(h.resent) })
			return next(ctx, cmds)
		}
		err := next(ctx, cmds)
		select {
		case <-h.resent:
		case <-time.After(10 * time.Second): // the limiter never sent them again: the test fails below
		}
		return err
	}
}

// TestRefundTimeoutResendsOnce: a refund batch whose answer comes too late for the
// breaker is sent again with the same sequence numbers (in halves): Redis answers the
// resend as a replay, so every bucket gets its tokens back exactly once.
func TestRefundTimeoutResendsOnce(t *testing.T) {
	targets(t, func(t *testing.T, addr string, real bool) {
		const keys, perKey = 20, 30
		hook := &slowRefunds{resent: make(chan struct{})}
		// A second's deadline: the refills before Close must not time out on a loaded
		// machine, and the held refund batch times out all the same.
		s := newServer(t, addr, randomPrefix(), nil, breaker.Settings{Timeout: time.Second}, hybrid.Config{
			FleetSize: 1,
			Limits: []hybrid.Limit{{Name: "api", Rate: 0.001, Burst: 100, Policy: breaker.FailClosed,
				MaxWait: time.Second, Lease: hybrid.LeaseTuning{RefillInterval: 5 * time.Second, Lifetime: time.Minute}}},
		})
		ctx := context.Background()
		for k := range keys {
			for range perKey {
				if d, err := s.limiter.Allow(ctx, "api", fmt.Sprint("k", k)); err != nil || !d.Allowed {
					t.Fatalf("key %d denied: %+v %v", k, d, err)
				}
			}
		}
		s.client.AddHook(hook)
		before := s.limiter.Stats()
		if err := s.limiter.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		st := s.limiter.Stats()
		t.Logf("Close: %d refund round trips, %d tokens refunded; stats %+v", st.RefundCalls-before.RefundCalls, st.Refunded-before.Refunded, st)
		if !hook.first.Load() {
			t.Fatal("no refund pipeline went out")
		}
		select {
		case <-hook.resent:
		default:
			t.Fatal("the timed-out refund batch was not sent again")
		}
		if st.RefundsLost != 0 || st.Granted-st.Refunded != keys*perKey {
			t.Errorf("granted %d − refunded %d != %d admitted (lost %d)", st.Granted, st.Refunded, keys*perKey, st.RefundsLost)
		}
		checkLevels(t, s.store, "api", keys, 100-perKey)
	})
}

// checkLevels checks that the buckets of keys k0..k<keys-1> of limit name (rate 0.001,
// burst 100) each hold want whole tokens: every leased token refunded exactly once.
func checkLevels(t *testing.T, st *global.Store, name string, keys, want int) {
	t.Helper()
	lim, _ := global.NewLimit(name, 0.001, 100)
	for k := range keys {
		g, err := redisstore.Of(st).Take(context.Background(), redisstore.Limit(lim), fmt.Sprint("k", k), 100, 1)
		if err != nil {
			t.Fatal(err)
		}
		if g.Granted != want {
			t.Fatalf("bucket of key %d holds %d after Close, want %d: leases refunded twice or not at all", k, g.Granted, want)
		}
	}
}

// failing is a go-redis hook that fails every script call while on is set, as a stalled
// Redis does, before it reaches Redis.
type failing struct{ on atomic.Bool }

func (*failing) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *failing) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if f.on.Load() {
			cmd.SetErr(context.DeadlineExceeded)
			return cmd.Err()
		}
		return next(ctx, cmd)
	}
}
func (f *failing) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if f.on.Load() {
			for _, c := range cmds {
				c.SetErr(context.DeadlineExceeded)
			}
			return context.DeadlineExceeded
		}
		return next(ctx, cmds)
	}
}

// stallable is a server of cfg on the Redis at addr whose calls time out while the hook
// it returns is on, with a breaker that opens after 2 such calls and probes 300 ms on.
func stallable(t *testing.T, addr string, cfg hybrid.Config) (*server, *failing) {
	c := redis.NewClient(redistest.Options(addr))
	t.Cleanup(func() { _ = c.Close() })
	stall := &failing{}
	c.AddHook(stall)
	return newServerOn(t, c, randomPrefix(), breaker.Settings{Timeout: time.Second, FailureThreshold: 2, OpenTimeout: 300 * time.Millisecond}, cfg), stall
}

// TestCloseWaitsForAnOpenBreaker: a passing stall opened the breaker just before Close,
// on a Redis that answers again; Close waits for the breaker's probe and gives the leased
// tokens back, rather than losing them to the open breaker.
func TestCloseWaitsForAnOpenBreaker(t *testing.T) {
	targets(t, func(t *testing.T, addr string, real bool) {
		s, stall := stallable(t, addr, hybrid.Config{
			FleetSize: 1,
			Limits:    []hybrid.Limit{{Name: "api", Rate: 0.01, Burst: 100, Policy: breaker.FailClosed, MaxWait: time.Second}},
		})
		ctx := context.Background()
		for range 30 { // the lease of "k" ends up holding tokens
			if d, _ := s.limiter.Allow(ctx, "api", "k"); !d.Allowed {
				t.Fatalf("denied: %+v", d)
			}
		}
		stall.on.Store(true)
		for i := 0; s.brk.State() != breaker.StateOpen; i++ {
			if i == 100 {
				t.Fatal("the breaker did not open")
			}
			_, _ = s.limiter.Allow(ctx, "api", fmt.Sprintf("other-%d", i)) // a refill that fails
		}
		stall.on.Store(false)
		held := s.limiter.Stats().Limits[0].Held
		if held == 0 {
			t.Fatal("the lease holds nothing to give back")
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := s.limiter.Close(cctx); err != nil {
			t.Fatalf("Close with the breaker open on a Redis that answers: %v", err)
		}
		if st := s.limiter.Stats(); st.Refunded < held || st.RefundsLost != 0 {
			t.Fatalf("held %d at Close; refunded %d, lost %d", held, st.Refunded, st.RefundsLost)
		}
	})
}

// TestCloseChargesAfterAnOpenBreaker: charges (of a charge-later limit) and debts (of
// FailLocal) wait for Redis, not for refunds: with the breaker open at Close on a Redis
// that answers again, and no lease to refund, Close waits for the breaker's probe and
// sends them, rather than forgiving them untried.
func TestCloseChargesAfterAnOpenBreaker(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limit  hybrid.Limit
		admit  func(d hybrid.Decision) bool // a decision that owes the bucket
		before bool                         // owed before the stall (charge-later), or during it (FailLocal)
	}{
		{"charge-later", hybrid.Limit{Name: "api", Rate: 1000, Burst: 1000, Policy: breaker.FailClosed, MaxWait: time.Second,
			Mode: hybrid.ChargeLater(100 * time.Millisecond)},
			func(d hybrid.Decision) bool { return d.Allowed && d.Reason == hybrid.ReasonAsync }, true},
		{"FailLocal", hybrid.Limit{Name: "api", Rate: 1000, Burst: 1000, Policy: breaker.FailLocal(), MaxWait: time.Second},
			func(d hybrid.Decision) bool { return d.Allowed && d.Source == hybrid.SourceFallback }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			targets(t, func(t *testing.T, addr string, real bool) {
				s, stall := stallable(t, addr, hybrid.Config{FleetSize: 4, Limits: []hybrid.Limit{tc.limit}})
				ctx := context.Background()
				owe := func(prefix string) {
					t.Helper()
					admitted := 0
					deadline := time.Now().Add(5 * time.Second)
					for i := 0; admitted < 5; i++ {
						if time.Now().After(deadline) {
							t.Fatalf("admitted %d owing in 5 s", admitted)
						}
						if d, _ := s.limiter.Allow(ctx, "api", fmt.Sprintf("%s%d", prefix, i)); tc.admit(d) {
							admitted++
						}
					}
				}
				if tc.before { // warm (the low-key exchanges answered), the server admits keys uncharged
					owe("k")
				}
				stall.on.Store(true)
				for i := 0; s.brk.State() != breaker.StateOpen; i++ {
					if i == 100 {
						t.Fatal("the breaker did not open")
					}
					// above a server's share (250): asks Redis, a refill that fails
					_, _ = s.limiter.AllowN(ctx, "api", fmt.Sprintf("other-%d", i), 300)
				}
				if !tc.before { // the breaker open, FailLocal admits and owes
					owe("k")
				}
				stall.on.Store(false)
				owed := s.limiter.Stats().Limits[0].Owed
				if owed < 5 {
					t.Fatalf("owed %d with 5 admitted owing", owed)
				}
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				if err := s.limiter.Close(cctx); err != nil {
					t.Fatalf("Close with the breaker open on a Redis that answers: %v", err)
				}
				if st := s.limiter.Stats().Limits[0]; st.Forgiven != 0 || st.Charged < owed {
					t.Fatalf("owed %d at Close; charged %d, forgave %d", owed, st.Charged, st.Forgiven)
				}
			})
		})
	}
}
