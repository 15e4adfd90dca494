package breaker

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// TestRedisStall runs guarded PINGs against a redis-server of the test's
// own, freezes it with SIGSTOP (connections stay open, nothing answers, as
// with a paused VM or a long script), and resumes it with SIGCONT.
//
// While it is frozen: every guarded call returns by its deadline (the
// client's read timeout is a second, and go-redis does not apply the
// context's deadline to a command in flight); the breaker opens and then
// refuses calls without touching Redis; calls left running in go-redis and
// the connections dialled stay under MaxInFlight. After SIGCONT the
// breaker closes again.
func TestRedisStall(t *testing.T) {
	if testing.Short() {
		t.Log("-short: a shorter stall")
	}
	srv := redistest.StartServer(t)

	const (
		timeout     = 10 * time.Millisecond
		maxInFlight = 48
		poolSize    = 8 // fewer than MaxInFlight: calls also wait in the pool queue
		openTimeout = 100 * time.Millisecond
		workers     = 64 // more than MaxInFlight: the first wave overflows
		readTimeout = time.Second
	)
	stall := time.Second
	if testing.Short() {
		stall = 300 * time.Millisecond
	}

	var dials atomic.Int64
	client := srv.Client(func(o *redis.Options) {
		o.PoolSize = poolSize
		o.ReadTimeout = readTimeout
		o.WriteTimeout = readTimeout
		d := &net.Dialer{Timeout: time.Second}
		o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return d.DialContext(ctx, network, addr)
		}
	})

	var (
		mu      sync.Mutex
		changes []string
	)
	b, err := New(Settings{
		Name: srv.Addr, Timeout: timeout, MaxInFlight: maxInFlight,
		FailureThreshold: 5, OpenTimeout: openTimeout,
		OnStateChange: func(from, to State) {
			mu.Lock()
			changes = append(changes, from.String()+"->"+to.String())
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}

	var inStore, maxInStore atomic.Int64
	ping := func(ctx context.Context) error {
		n := inStore.Add(1)
		defer inStore.Add(-1)
		for m := maxInStore.Load(); n > m && !maxInStore.CompareAndSwap(m, n); m = maxInStore.Load() {
		}
		return client.Ping(ctx).Err()
	}

	ctx := context.Background()
	// Warm up the pool without the breaker: a first dial and handshake
	// under -race on a busy machine can take longer than 10 ms.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := client.Ping(wctx).Err(); err != nil {
		t.Fatalf("warm-up PING: %v", err)
	}
	warm := 0
	for range 20 {
		if b.Do(ctx, ping) == nil {
			warm++
		}
	}
	if warm == 0 {
		t.Fatalf("no guarded PING succeeded before the stall; stats %+v", b.Stats())
	}
	dialsBefore := dials.Load()

	// Freeze Redis and hammer it.
	srv.Stop()
	type sample struct {
		took time.Duration
		err  error
	}
	samples := make([][]sample, workers)
	end := time.Now().Add(stall)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for time.Now().Before(end) {
				start := time.Now()
				err := b.Do(ctx, ping)
				samples[w] = append(samples[w], sample{time.Since(start), err})
				time.Sleep(time.Millisecond) // pace: at most 1,000 calls/s per worker
			}
		})
	}
	wg.Wait()
	stStalled := b.Stats()
	stateStalled := b.State()

	var all, reached []time.Duration
	counts := map[string]int{}
	for _, ws := range samples {
		for _, s := range ws {
			all = append(all, s.took)
			switch {
			case s.err == nil:
				counts["ok"]++
			case errors.Is(s.err, ErrOpen):
				counts["open"]++
				continue
			case errors.Is(s.err, ErrOverloaded):
				counts["overloaded"]++
				continue
			case errors.Is(s.err, ErrTimeout):
				counts["timeout"]++
			default:
				counts["other"]++
				t.Errorf("a call failed with %v: not open, overloaded or timed out", s.err)
			}
			reached = append(reached, s.took)
		}
	}
	p := func(ds []time.Duration, q float64) time.Duration {
		if len(ds) == 0 {
			return 0
		}
		slices.Sort(ds)
		return ds[min(len(ds)-1, int(q*float64(len(ds))))]
	}
	t.Logf("stall of %v, %d workers: %d calls: %v", stall, workers, len(all), counts)
	t.Logf("calls that went to Redis (%d): p50 %v, p99 %v, max %v (deadline %v)",
		len(reached), p(reached, 0.5), p(reached, 0.99), p(reached, 1), timeout)
	t.Logf("all guarded calls: p50 %v, p99 %v, max %v", p(all, 0.5), p(all, 0.99), p(all, 1))
	t.Logf("breaker during the stall: %v, stats %+v; dials during the stall: %d; most PINGs in go-redis at once: %d",
		stateStalled, stStalled, dials.Load()-dialsBefore, maxInStore.Load())

	if counts["ok"] > 0 {
		t.Errorf("%d PINGs succeeded against a stopped server", counts["ok"])
	}
	if counts["timeout"] == 0 || counts["open"] == 0 {
		t.Errorf("want timeouts, then rejections while open: %v", counts)
	}
	// Wide ceilings: the point is milliseconds, not the client's second. A
	// busy machine (CI runs packages in parallel on two cores) may delay a
	// timer now and then, so the slowest call gets more room than the p99.
	if q := p(reached, 0.99); q > 10*timeout {
		t.Errorf("p99 of calls to Redis %v, want under 10× the %v deadline", q, timeout)
	}
	if worst := p(all, 1); worst > readTimeout/2 {
		t.Errorf("slowest guarded call took %v, want well under the client's %v read timeout", worst, readTimeout)
	}
	if n := maxInStore.Load(); n > maxInFlight {
		t.Errorf("%d calls in go-redis at once, bound %d", n, maxInFlight)
	}
	if n := dials.Load() - dialsBefore; n > min(poolSize, maxInFlight) {
		t.Errorf("%d connections dialled during the stall, bound %d", n, min(poolSize, maxInFlight))
	}
	mu.Lock()
	sawOpen, seen := slices.Contains(changes, "closed->open"), slices.Clone(changes)
	mu.Unlock()
	if !sawOpen {
		t.Errorf("the breaker never opened: %v", seen)
	}

	// Resume Redis: the breaker closes once a probe gets through.
	srv.Cont()
	resumed := time.Now()
	for b.State() != StateClosed {
		if time.Since(resumed) > 10*time.Second {
			t.Fatalf("breaker still %v 10 s after SIGCONT; stats %+v", b.State(), b.Stats())
		}
		if err := b.Do(ctx, ping); errors.Is(err, ErrOpen) {
			<-time.After(openTimeout / 4) // the open period must pass in real time
		}
	}
	mu.Lock() // a probe's call may still settle the breaker, and report, on its own goroutine
	t.Logf("closed %v after SIGCONT; state changes: %v", time.Since(resumed).Round(time.Millisecond), changes)
	mu.Unlock()
	// Closed, it lets calls through: one of five gets its answer within the deadline (a
	// loaded machine may hold any one call past 10 ms; not five in a row).
	for range 5 {
		if err = b.Do(ctx, ping); err == nil {
			break
		}
	}
	if err != nil {
		t.Errorf("PING after recovery, five times: %v", err)
	}
}
