package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

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
	processes(t)
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

	// What each limit holds on lease when Redis dies, its refills' late answers read
	// (a half-open probe's take, answered when Redis resumed) included.
	held := func() map[string]int64 {
		m := map[string]int64{}
		for _, ls := range l.Stats().Limits {
			m[ls.Name] = ls.Held
		}
		return m
	}
	heldBefore := held()
	srv.Kill()
	heldAfter := held()
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
	// FailClosed: nothing beyond the tokens leased when Redis died.
	// FailLocal: this server's share, 400/4 = 100/s, burst 10, plus the lease on hand.
	secs := step.Seconds()
	leased := func(name string) float64 { return float64(max(heldBefore[name], heldAfter[name])) }
	t.Logf("on lease when Redis died: %v (before the kill), %v (after)", heldBefore, heldAfter)
	for _, name := range []string{"open", "closed", "local"} {
		// What a lease holds, and a late answer's grant beside it: each at most the burst.
		if h := leased(name); h > 2*40 {
			t.Errorf("%s: %.0f tokens on lease when Redis died, more than twice the burst", name, h)
		}
	}
	checks := []struct {
		name   string
		lo, hi float64
	}{
		{"open", 0.8 * 400 * secs, 40 + 400*secs + 1},
		{"closed", 0, leased("closed")},
		{"local", 0.5 * 100 * secs, 10 + 100*secs + leased("local")},
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
	processes(t)
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
