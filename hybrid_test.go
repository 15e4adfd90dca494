package fleetlimit_test

// End-to-end tests of the whole stack wired as a user wires it: a go-redis client per
// server, global.Store, a breaker, hybrid.Limiter with local pre-checks and a failure
// policy per limit, on miniredis and on a real Redis.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.uber.org/goleak"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/lua"
)

// server is one member of a simulated fleet: its own client (pool), store and limiter.
type server struct {
	client  redis.UniversalClient // a *redis.Client, or a *redis.ClusterClient (TestClusterFailover)
	store   *global.Store
	limiter *hybrid.Limiter
	brk     *breaker.Breaker
}

func TestMain(m *testing.M) {
	// go-redis logs every failed dial; the outage test makes hundreds on purpose.
	redis.SetLogger(quiet{})
	m.Run()
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func randomPrefix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "e2e" + hex.EncodeToString(b[:]) + ":"
}

// newServer builds a fleet member on the Redis at addr. prefix keeps the test's keys
// apart on a shared Redis (it is never flushed).
func newServer(t *testing.T, addr, prefix string, counter *redistest.Counter, brk breaker.Settings, cfg hybrid.Config) *server {
	t.Helper()
	c := redis.NewClient(redistest.Options(addr))
	if counter != nil {
		c.AddHook(counter)
	}
	t.Cleanup(func() { _ = c.Close() })
	return newServerOn(t, c, prefix, brk, cfg)
}

// newServerOn builds a fleet member on client c, which the test closes.
func newServerOn(t *testing.T, c redis.UniversalClient, prefix string, brk breaker.Settings, cfg hybrid.Config) *server {
	t.Helper()
	st, err := global.New(c, global.Prefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	if brk.IsFailure == nil {
		brk.IsFailure = global.IsUnavailable
	}
	b, err := breaker.New(brk)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Breaker = b
	l, err := hybrid.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return &server{client: c, store: st, limiter: l, brk: b}
}

// target is a Redis address for the test: miniredis, and the shared real Redis when one
// answers (under CI a missing one fails).
func targets(t *testing.T, fn func(t *testing.T, addr string, real bool)) {
	t.Run("miniredis", func(t *testing.T) {
		m, _ := redistest.Mini(t)
		fn(t, m.Addr(), false)
	})
	t.Run("redis", func(t *testing.T) {
		redistest.Real(t) // skips (or fails under CI) when no Redis answers
		fn(t, redistest.Addr(), true)
	})
}

// hammer has goroutines goroutines, spread over fleet, ask for key of limit "api" until
// run has passed, and calls decided with each decision (from those goroutines); it
// returns how long they ran. A request does some work: without it 64 goroutines spinning
// on a small machine starve the refiller and the Redis client (and, on miniredis, Redis
// itself) of CPU, and the breaker, seeing timeouts, rightly opens. 20µs was not enough
// under -race on 2 loaded CPUs (286 refills timed out, 73% of rate·T admitted); 500µs
// still asks for up to 64× the limit.
func hammer(t *testing.T, fleet []*server, key string, goroutines int, run time.Duration, decided func(hybrid.Decision)) time.Duration {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	deadline := start.Add(run)
	var wg sync.WaitGroup
	for g := range goroutines {
		l := fleet[g%len(fleet)].limiter
		wg.Go(func() {
			for time.Now().Before(deadline) {
				d, err := l.Allow(ctx, "api", key)
				if err != nil {
					t.Error(err)
					return
				}
				decided(d)
				time.Sleep(500 * time.Microsecond)
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// TestFleetHoldsTheLimit: 8 limiter instances (8 servers) share one Redis; 64 goroutines
// hammer one key (each request also sleeps 500µs, as a handler does some work) with a
// fleet limit far below their demand. The fleet admits no more
// than the documented bound burst + rate·T + L (L <= burst: at most 2·burst + rate·T),
// and at least 90% of rate·T; the Redis calls per admitted request are reported.
func TestFleetHoldsTheLimit(t *testing.T) {
	run := 3 * time.Second
	if testing.Short() {
		run = time.Second
	}
	const (
		servers    = 8
		goroutines = 64
		rateLimit  = 2000.0
		burst      = 400
	)
	targets(t, func(t *testing.T, addr string, real bool) {
		prefix := randomPrefix()
		var counter redistest.Counter
		fleet := make([]*server, servers)
		for i := range fleet {
			// The floor holds while Redis answers in time. A loaded test machine (2 CPUs,
			// -race, miniredis in this very process) may not answer in the default 10ms,
			// and an outage is TestRedisDiesMidRun's subject, not this test's: 100ms.
			fleet[i] = newServer(t, addr, prefix, &counter, breaker.Settings{Timeout: 100 * time.Millisecond}, hybrid.Config{
				FleetSize: servers,
				Limits: []hybrid.Limit{{Name: "api", Rate: rateLimit, Burst: burst, MaxWait: 100 * time.Millisecond,
					// Fail closed: a timed-out refill must not admit, so the bound is exact.
					Policy: breaker.FailClosed}},
			})
		}
		var admitted, requests, fallbacks atomic.Int64
		ctx := context.Background()
		elapsed := hammer(t, fleet, "hot-client", goroutines, run, func(d hybrid.Decision) {
			requests.Add(1)
			if d.Allowed {
				admitted.Add(1)
			}
			if d.Source == hybrid.SourceFallback {
				fallbacks.Add(1)
			}
		})
		for _, s := range fleet {
			if err := s.limiter.Close(ctx); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
		bound := 2*burst + rateLimit*elapsed.Seconds()
		floor := 0.9 * rateLimit * elapsed.Seconds()
		a := float64(admitted.Load())
		t.Logf("%d servers x %d goroutines for %v: %d requests, %d admitted (%.0f%% of rate·T; bound %.0f, floor %.0f), %d by fallback",
			servers, goroutines, elapsed.Round(time.Millisecond), requests.Load(), admitted.Load(), 100*a/(rateLimit*elapsed.Seconds()), bound, floor, fallbacks.Load())
		t.Logf("Redis: %d round trips, %d commands; %.4f round trips per admitted request, %.5f per request (one script per request: 1)",
			counter.Trips.Load(), counter.Cmds.Load(), float64(counter.Trips.Load())/a, float64(counter.Trips.Load())/float64(requests.Load()))
		if a > bound {
			t.Errorf("admitted %.0f > 2·burst + rate·T = %.0f", a, bound)
		}
		// The floor holds while Redis answers within the deadline. miniredis runs in this
		// process, and under the race detector its Lua scripts cost milliseconds of CPU
		// each: beside other packages' tests on 2 CPUs, refills timed out (245-286 of
		// them) and 73-74% of rate·T was admitted, twice in 14 runs. There the floor is
		// reported, not asserted; it is asserted on real Redis (with or without -race)
		// and on miniredis without -race, and TestFleetModel and go test ./sim check it
		// in virtual time.
		if real || !raceEnabled {
			if a < floor {
				t.Errorf("admitted %.0f < 90%% of rate·T = %.0f", a, floor)
			}
			if r := float64(requests.Load()); r < 5*rateLimit*elapsed.Seconds() {
				t.Errorf("%.0f requests: demand was not far above the limit (want at least 5× rate·T), the floor says nothing", r)
			}
		} else {
			t.Logf("floor not asserted (miniredis in this process, -race): %.0f admitted, floor %.0f", a, floor)
		}
	})
}

// latencies collects decision latencies.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) summary() (p50, p99, worst time.Duration, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0, 0, 0, 0
	}
	s := slices.Clone(l.d)
	slices.Sort(s)
	return s[len(s)/2], s[len(s)*99/100], s[len(s)-1], len(s)
}

// quantile returns the q-quantile of the latencies (0 when there are none).
func (l *latencies) quantile(q float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	s := slices.Clone(l.d)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)]
}

// phase counts what the limits did in one phase of the outage test.
type phase struct {
	name      string
	admitted  [3]atomic.Int64 // per limit: open, closed, local
	requests  [3]atomic.Int64
	bySource  [3][5]atomic.Int64
	latencies latencies
}

// TestRedisDiesMidRun stalls (SIGSTOP), then kills the Redis under a running limiter:
// each policy behaves as configured, decisions stay fast (latency reported; only wide
// ceilings asserted), the breaker opens, and after a restart (empty script cache, no
// data) the limiter recovers by itself.
func TestRedisDiesMidRun(t *testing.T) {
	step := 1500 * time.Millisecond
	if testing.Short() {
		step = 700 * time.Millisecond
	}
	srv := redistest.StartServer(t)
	names := [3]string{"open", "closed", "local"}
	const servers = 4
	var changes []string
	var chMu sync.Mutex
	s := newServer(t, srv.Addr, randomPrefix(), nil, breaker.Settings{
		OpenTimeout: 200 * time.Millisecond,
		OnStateChange: func(from, to breaker.State) {
			chMu.Lock()
			changes = append(changes, fmt.Sprintf("%v->%v", from, to))
			chMu.Unlock()
		},
	}, hybrid.Config{
		FleetSize: servers,
		Limits: []hybrid.Limit{
			{Name: names[0], Rate: 400, Burst: 40, Policy: breaker.FailOpen},
			{Name: names[1], Rate: 400, Burst: 40, Policy: breaker.FailClosed},
			{Name: names[2], Rate: 400, Burst: 40, Policy: breaker.FailLocal()},
		},
	})
	l := s.limiter
	ctx := context.Background()

	// hammer runs 4 goroutines per limit on one key each for d, counting into p.
	hammer := func(p *phase, d time.Duration) {
		var wg sync.WaitGroup
		end := time.Now().Add(d)
		for i, name := range names {
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Now().Before(end) {
						t0 := time.Now()
						dec, err := l.Allow(ctx, name, "client")
						p.latencies.add(time.Since(t0))
						if err != nil {
							t.Error(err)
							return
						}
						p.requests[i].Add(1)
						if dec.Allowed {
							p.admitted[i].Add(1)
						}
						p.bySource[i][dec.Source].Add(1)
						time.Sleep(100 * time.Microsecond) // a client, not a spin loop
					}
				}()
			}
		}
		wg.Wait()
	}
	report := func(p *phase, d time.Duration) {
		p50, p99, worst, n := p.latencies.summary()
		t.Logf("%s (%v): decision latency p50 %v p99 %v max %v over %d decisions", p.name, d, p50, p99, worst, n)
		for i, name := range names {
			t.Logf("  %-6s %5d of %5d admitted; pre-check %d, lease %d, global %d, fallback %d", name,
				p.admitted[i].Load(), p.requests[i].Load(), p.bySource[i][hybrid.SourcePreCheck].Load(),
				p.bySource[i][hybrid.SourceLease].Load(), p.bySource[i][hybrid.SourceGlobal].Load(), p.bySource[i][hybrid.SourceFallback].Load())
		}
		if worst > time.Second {
			t.Errorf("%s: a decision took %v; the ceiling is 1s (the limit's timeout is 10ms)", p.name, worst)
		}
	}

	healthy := &phase{name: "healthy"}
	hammer(healthy, step)
	report(healthy, step)

	srv.Stop() // SIGSTOP: connections stay open, nothing answers
	stalled := &phase{name: "redis stalled"}
	hammer(stalled, step)
	srv.Cont()
	report(stalled, step)
	if p50, _, _, _ := stalled.latencies.summary(); p50 > 100*time.Millisecond {
		t.Errorf("stalled Redis: median decision %v; the limit's timeout is 10ms", p50)
	}
	waitRecovered := func(key string) {
		t.Helper()
		start := time.Now()
		for {
			d, err := l.Allow(ctx, "closed", key)
			if err != nil {
				t.Fatal(err)
			}
			if d.Source != hybrid.SourceFallback {
				t.Logf("recovered %v after Redis came back (breaker %v)", time.Since(start).Round(time.Millisecond), s.brk.State())
				return
			}
			if time.Since(start) > 20*time.Second {
				t.Fatalf("still in fallback 20s after Redis came back: %+v, breaker %v", d, s.brk.State())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitRecovered("after-stall")

	srv.Kill()
	down := &phase{name: "redis killed"}
	hammer(down, step)
	report(down, step)
	chMu.Lock()
	opened := slices.Contains(changes, "closed->open")
	chMu.Unlock()
	if !opened || s.brk.State() == breaker.StateClosed {
		t.Errorf("the breaker did not open during the outage: changes %v, state %v", changes, s.brk.State())
	}
	// FailOpen: only the pre-check (the fleet's own 400/s, burst 40) limits.
	// FailClosed: nothing beyond the tokens already leased when Redis died.
	// FailLocal: this server's share, 400/4 = 100/s, burst 10, plus the lease on hand.
	secs := step.Seconds()
	leased := 40/servers + 1
	checks := []struct {
		name   string
		lo, hi float64
	}{
		{"open", 0.8 * 400 * secs, 40 + 400*secs + 1},
		{"closed", 0, float64(leased)},
		{"local", 0.5 * 100 * secs, 10 + 100*secs + float64(leased)},
	}
	for i, c := range checks {
		a := float64(down.admitted[i].Load())
		if a < c.lo || a > c.hi {
			t.Errorf("%s during the outage: %.0f admitted, want between %.0f and %.0f", c.name, a, c.lo, c.hi)
		}
	}

	srv.Restart() // empty data, empty script cache
	waitRecovered("after-restart")
	after := &phase{name: "restarted"}
	hammer(after, step)
	report(after, step)
	for i, name := range names {
		if fb := after.bySource[i][hybrid.SourceFallback].Load(); fb > after.requests[i].Load()/10 {
			t.Errorf("%s after recovery: %d of %d decisions still by fallback", name, fb, after.requests[i].Load())
		}
	}
	chMu.Lock()
	t.Logf("breaker state changes: %v", changes)
	chMu.Unlock()
}

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
		lim, _ := global.NewLimit("api", 0.01, 100)
		before, err := s.store.Take(ctx, lim, "k", 1, 1) // what the bucket holds now (minus 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.limiter.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		st := s.limiter.Stats()
		after, err := s.store.Take(ctx, lim, "k", 1, 1)
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
		trips, cmds := counter.Trips.Load(), counter.Cmds.Load()
		if err := s.limiter.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		closeTrips, closeCmds := counter.Trips.Load()-trips, counter.Cmds.Load()-cmds
		st := s.limiter.Stats()
		t.Logf("%d keys: Close refunded %d tokens with %d commands in %d round trips (%d refund calls); stats %+v",
			keys, st.Refunded-before.Refunded, closeCmds, closeTrips, st.RefundCalls-before.RefundCalls, st)
		if st.Granted-st.Refunded != int64(keys*perKey) || st.RefundsLost != 0 {
			t.Errorf("granted %d − refunded %d != %d admitted (lost %d)", st.Granted, st.Refunded, keys*perKey, st.RefundsLost)
		}
		if closeCmds < int64(keys) {
			t.Errorf("Close sent %d commands for %d keys: some keys held no lease, the test proves less", closeCmds, keys)
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
		if len(cmds) == 0 || cmds[0].Name() != "evalsha" || cmds[0].Args()[1] != lua.Refund.Hash() {
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
		s := newServer(t, addr, randomPrefix(), nil, breaker.Settings{Timeout: 200 * time.Millisecond}, hybrid.Config{
			FleetSize: 1,
			Limits: []hybrid.Limit{{Name: "api", Rate: 0.001, Burst: 100, Policy: breaker.FailClosed,
				MaxWait: 200 * time.Millisecond, Lease: hybrid.LeaseTuning{RefillInterval: 5 * time.Second, Lifetime: time.Minute}}},
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
		g, err := st.Take(context.Background(), lim, fmt.Sprint("k", k), 100, 1)
		if err != nil {
			t.Fatal(err)
		}
		if g.Granted != want {
			t.Fatalf("bucket of key %d holds %d after Close, want %d: leases refunded twice or not at all", k, g.Granted, want)
		}
	}
}

// TestRecoveryAfterLongOutage: a Limiter on a client built with global.Configure admits
// again within the breaker's open time plus 200 ms of Redis coming back after an outage
// in which the client's pool failed PoolSize dials. go-redis then answers every new
// connection with its last dial error, without dialling, until a background dial it
// retries once a second succeeds; a breaker probe in between fails at once, and recovery
// takes up to another open time.
//
// The pool is small (4) so that the few calls before the breaker opens fail that many
// dials; with the default (10 per CPU) a longer outage does the same. The open time is
// 600 ms, out of step with go-redis's 1 s: the pool's background dials start with the
// failures that open the breaker (~0 s) and retry at 1 s and 2 s; the breaker probes at
// 0.6, 1.2, 1.8, 2.4 s. Redis comes back just after the probe at 1.2 s fails, so the
// probe at 1.8 s comes 200 ms before the pool dials again.
func TestRecoveryAfterLongOutage(t *testing.T) {
	const (
		open   = 600 * time.Millisecond
		target = open + 200*time.Millisecond
		// slack for scheduling on a loaded machine: the request loop's 1 ms sleep, the
		// probe's round trips (a dial, EVALSHA answered NOSCRIPT, EVAL).
		slack = 50 * time.Millisecond
	)
	srv := redistest.StartServer(t)
	o := &redis.Options{Addr: srv.Addr, PoolSize: 4,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}}
	global.Configure(o)
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	st, err := global.New(c, global.Prefix(randomPrefix()))
	if err != nil {
		t.Fatal(err)
	}
	reopened := make(chan struct{}, 16) // a probe failed: half-open -> open
	brk, err := breaker.New(breaker.Settings{Timeout: 200 * time.Millisecond, OpenTimeout: open,
		OnStateChange: func(from, to breaker.State) {
			if from == breaker.StateHalfOpen && to == breaker.StateOpen {
				reopened <- struct{}{}
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := hybrid.New(st, hybrid.Config{FleetSize: 1, Breaker: brk,
		Limits: []hybrid.Limit{{Name: "api", Rate: 100_000, Burst: 10_000, Policy: breaker.FailClosed,
			MaxWait: 100 * time.Millisecond, Lease: hybrid.LeaseTuning{Lifetime: 100 * time.Millisecond}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })

	// One caller, a request a millisecond, each on a key of its own: every request
	// needs Redis. admitted receives the instant of a decision Redis answered.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	admitted := make(chan time.Time, 1)
	go func() {
		for i := 0; ctx.Err() == nil; i++ {
			d, _ := l.Allow(ctx, "api", fmt.Sprint("k", i))
			if d.Allowed && d.Source != hybrid.SourceFallback {
				select {
				case admitted <- time.Now():
				default:
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()
	next := func(after time.Time) (time.Time, bool) {
		deadline := time.After(10 * time.Second)
		for {
			select {
			case at := <-admitted:
				if at.After(after) {
					return at, true
				}
			case <-deadline:
				return time.Time{}, false
			}
		}
	}
	if _, ok := next(time.Now()); !ok {
		t.Fatal("no request admitted before the outage")
	}
	killed := time.Now()
	srv.Kill()
	for range 2 { // two probes fail: 1.2 s of outage, requests coming all along
		select {
		case <-reopened:
		case <-time.After(10 * time.Second):
			t.Fatalf("the breaker did not probe twice; stats %+v", brk.Stats())
		}
	}
	srv.Restart()
	back := time.Now()
	at, ok := next(back)
	if !ok {
		t.Fatalf("nothing admitted within 10 s of Redis coming back; stats %+v", l.Stats())
	}
	took := at.Sub(back)
	t.Logf("outage %v; admitting again %v after Redis came back (target %v + %v slack); breaker %+v",
		back.Sub(killed), took, target, slack, brk.Stats())
	if took > target+slack {
		t.Errorf("recovery took %v, want at most the open time + 200 ms = %v (+ %v slack)", took, target, slack)
	}
}
