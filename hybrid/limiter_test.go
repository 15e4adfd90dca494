package hybrid_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mserver "github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/luascript"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// prefix returns a short key prefix unique to this run (the shared Redis is never flushed).
func prefix(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "hyt" + hex.EncodeToString(b[:]) + ":"
}

func newStore(t testing.TB, c redis.Scripter) *global.Store {
	t.Helper()
	s, err := global.New(c, global.Prefix(prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// slowBreaker has room for a slow machine (-race): tests that are not about timing
// must not see a 10ms timeout.
func slowBreaker(t testing.TB) *breaker.Breaker {
	b, err := breaker.New(breaker.Settings{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newLimiter(t testing.TB, s *global.Store, cfg hybrid.Config) *hybrid.Limiter {
	t.Helper()
	if cfg.Breaker == nil {
		cfg.Breaker = slowBreaker(t)
	}
	l, err := hybrid.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// admittedOf makes n requests of cost 1 for key under limit and returns how many were
// admitted; an error fails the test.
func admittedOf(t testing.TB, l *hybrid.Limiter, limit, key string, n int) int {
	t.Helper()
	admitted := 0
	for range n {
		d, err := l.Allow(context.Background(), limit, key)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	return admitted
}

// setLimit changes the limit named lim.Name, and only it, through Reconfigure.
func setLimit(l *hybrid.Limiter, lim hybrid.Limit) error {
	limits := l.Limits()
	i := slices.IndexFunc(limits, func(o hybrid.Limit) bool { return o.Name == lim.Name })
	if i < 0 {
		return fmt.Errorf("no limit %q", lim.Name)
	}
	limits[i] = lim
	return l.Reconfigure(limits)
}

func TestNewRejectsBadConfig(t *testing.T) {
	_, c := redistest.Mini(t)
	s := newStore(t, c)
	ok := hybrid.Limit{Name: "api", Rate: 10, Burst: 10, Policy: breaker.FailOpen}
	tests := []struct {
		name string
		cfg  hybrid.Config
		want error
	}{
		{"no limits", hybrid.Config{FleetSize: 1}, hybrid.ErrInvalidConfig},
		{"no fleet size", hybrid.Config{Limits: []hybrid.Limit{ok}}, hybrid.ErrInvalidConfig},
		{"no policy", hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{{Name: "api", Rate: 10, Burst: 10}}}, breaker.ErrNoPolicy},
		{"bad rate", hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{{Name: "api", Rate: 0, Burst: 10, Policy: breaker.FailOpen}}}, global.ErrInvalidLimit},
		{"bad name", hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{{Name: "a{b}", Rate: 1, Burst: 10, Policy: breaker.FailOpen}}}, global.ErrInvalidLimit},
		{"duplicate", hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{ok, ok}}, hybrid.ErrInvalidConfig},
		{"pre-check looser than the limit", hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{{Name: "api", Rate: 10, Burst: 10, PreRate: 20, Policy: breaker.FailOpen}}}, hybrid.ErrInvalidConfig},
		{"max cost above burst", hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{{Name: "api", Rate: 10, Burst: 10, MaxCost: 11, Policy: breaker.FailOpen}}}, hybrid.ErrInvalidConfig},
		{"bad fleet name", hybrid.Config{FleetSize: 1, Fleet: "a b", Limits: []hybrid.Limit{ok}}, hybrid.ErrInvalidConfig},
		{"heartbeat below a millisecond", hybrid.Config{FleetSize: 1, Fleet: "web", HeartbeatInterval: 100 * time.Microsecond, Limits: []hybrid.Limit{ok}}, hybrid.ErrInvalidConfig},
		{"negative heartbeat", hybrid.Config{FleetSize: 1, Fleet: "web", HeartbeatInterval: -time.Second, Limits: []hybrid.Limit{ok}}, hybrid.ErrInvalidConfig},
		{"clock at the zero Time", hybrid.Config{FleetSize: 1, Clock: clockAt(func() time.Time { return time.Time{} }), Limits: []hybrid.Limit{ok}}, hybrid.ErrInvalidConfig},
		{"clock past 2261", hybrid.Config{FleetSize: 1, Clock: clockAt(func() time.Time { return time.Date(2262, 6, 1, 0, 0, 0, 0, time.UTC) }), Limits: []hybrid.Limit{ok}}, hybrid.ErrInvalidConfig},
		{"windows of 1ms", hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{{Name: "api", Rate: 1000, Burst: 1, Policy: breaker.FailOpen, Mode: hybrid.Windowed(time.Millisecond)}}}, hybrid.ErrInvalidConfig},
		{"windowed reports over half the window", hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{{Name: "api", Rate: 10, Burst: 10, Policy: breaker.FailOpen, Mode: hybrid.Windowed(time.Second)}}}, hybrid.ErrInvalidConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := hybrid.New(s, tt.cfg)
			if !errors.Is(err, tt.want) {
				t.Fatalf("New = %v, want %v", err, tt.want)
			}
			if l != nil {
				t.Fatal("New returned a Limiter with an error")
			}
		})
	}
	if _, err := hybrid.New(nil, hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{ok}}); !errors.Is(err, hybrid.ErrInvalidConfig) {
		t.Fatalf("New(nil store) = %v", err)
	}
}

// TestLimiterSources walks one key through the tiers on a frozen clock: the first
// request waits for a refill (global), the next ones use the lease, the bucket runs dry.
func TestLimiterSources(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		s := newStore(t, tg.Client)
		now := time.Now()
		l := newLimiter(t, s, hybrid.Config{
			FleetSize: 1,
			Clock:     clockAt(func() time.Time { return now }),
			Limits:    []hybrid.Limit{{Name: "api", Rate: 0.001, Burst: 5, Policy: breaker.FailClosed, MaxWait: time.Second}},
		})
		ctx := context.Background()
		d, err := l.Allow(ctx, "api", "k")
		if err != nil || !d.Allowed || d.Source != hybrid.SourceGlobal || d.Reason != hybrid.ReasonGranted {
			t.Fatalf("first Allow = %+v, %v; want allowed by global", d, err)
		}
		admitted := 1
		for range 20 {
			d, err = l.Allow(ctx, "api", "k")
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted != 5 {
			t.Fatalf("admitted %d of a burst of 5", admitted)
		}
		if d.Allowed || d.RetryAfter <= 0 || d.Source == hybrid.SourceFallback {
			t.Fatalf("last Allow = %+v; want denied with a retry-after, not by fallback", d)
		}
		if _, err := l.AllowN(ctx, "api", "k", -1); !errors.Is(err, hybrid.ErrInvalidCost) {
			t.Fatalf("AllowN(-1) error %v", err)
		}
		if _, err := l.Allow(ctx, "nope", "k"); !errors.Is(err, hybrid.ErrUnknownLimit) {
			t.Fatalf("unknown limit error %v", err)
		}
		st := l.Stats()
		t.Logf("stats %+v", st)
		if st.Takes == 0 || st.Granted > 5 {
			t.Fatalf("stats %+v: want some takes, at most 5 granted", st)
		}
	})
}

// TestCostZeroOnANewKey: a cost-0 request on a key this server never asked Redis about
// knows nothing against a full bucket, and says so (Remaining the burst, Reset 0), as
// the first real request then does (burst - 1); it spends nothing and asks nothing.
func TestCostZeroOnANewKey(t *testing.T) {
	_, c := redistest.Mini(t)
	l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1,
		Limits: []hybrid.Limit{{Name: "api", Rate: 10, Burst: 20, Policy: breaker.FailClosed, MaxWait: time.Second}}})
	ctx := context.Background()
	d, err := l.AllowN(ctx, "api", "never-seen", 0)
	if err != nil || !d.Allowed || d.Remaining != 20 || d.Reset != 0 {
		t.Fatalf("AllowN(0) on a new key = %+v, %v; want allowed, Remaining 20, Reset 0", d, err)
	}
	if st := l.Stats(); st.Takes != 0 {
		t.Fatalf("a cost-0 request asked Redis: %d takes", st.Takes)
	}
	if d, err = l.AllowN(ctx, "api", "never-seen", 1); err != nil || !d.Allowed || d.Remaining != 19 {
		t.Fatalf("AllowN(1) after it = %+v, %v; want allowed, Remaining 19", d, err)
	}
}

// TestLimiterPolicies breaks Redis (miniredis SetError) and checks each policy.
func TestLimiterPolicies(t *testing.T) {
	m, c := redistest.Mini(t)
	s := newStore(t, c)
	// A frozen clock: at 100/s a slow run (-race on a loaded machine) would
	// otherwise refill a token mid-loop and admit 11 instead of 10.
	now := time.Now()
	l := newLimiter(t, s, hybrid.Config{
		FleetSize: 4,
		Clock:     clockAt(func() time.Time { return now }),
		Limits: []hybrid.Limit{
			{Name: "open", Rate: 100, Burst: 10, Policy: breaker.FailOpen},
			{Name: "closed", Rate: 100, Burst: 10, Policy: breaker.FailClosed},
			{Name: "local", Rate: 100, Burst: 8, Policy: breaker.FailLocal()},
		},
	})
	m.SetError("ERR injected outage")
	ctx := context.Background()
	for _, tc := range []struct {
		limit    string
		admitted int // of 20 requests on one key
	}{
		{"open", 10},  // the pre-check (the fleet's burst of 10) still holds
		{"closed", 0}, // nothing
		{"local", 2},  // burst 8 over 4 servers
	} {
		admitted := 0
		for range 20 {
			d, err := l.Allow(ctx, tc.limit, "k")
			if err != nil {
				t.Fatal(err)
			}
			if d.Source != hybrid.SourceFallback && (d.Source != hybrid.SourcePreCheck || d.Allowed) {
				t.Fatalf("%s: decision %+v during an outage, want fallback or a pre-check denial", tc.limit, d)
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted != tc.admitted {
			t.Errorf("%s: admitted %d of 20 during the outage, want %d", tc.limit, admitted, tc.admitted)
		}
	}
	m.SetError("")
}

// TestLimiterConcurrentWaiters: many goroutines on one cold key share one refill.
func TestLimiterConcurrentWaiters(t *testing.T) {
	_, c := redistest.Mini(t)
	s := newStore(t, c)
	l := newLimiter(t, s, hybrid.Config{
		FleetSize: 1,
		Limits:    []hybrid.Limit{{Name: "api", Rate: 0.001, Burst: 50, Policy: breaker.FailClosed, MaxWait: time.Second}},
	})
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 4 {
				d, err := l.Allow(context.Background(), "api", "k")
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					mu.Lock()
					admitted++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if admitted != 50 {
		t.Fatalf("admitted %d, want exactly the burst 50", admitted)
	}
	t.Logf("stats %+v", l.Stats())
}

// TestFleetDiscovery: limiters that share a Fleet name count each other through Redis's
// heartbeat, divide the limit by the live count, and keep the last count while Redis is
// away.
func TestFleetDiscovery(t *testing.T) {
	m, c := redistest.Mini(t)
	p := prefix(t)
	server := func(id string) *global.Store {
		s, err := global.New(c, global.Prefix(p), global.ServerID(id))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	cfg := func() hybrid.Config {
		return hybrid.Config{
			// A member lives three intervals, and 150ms outlasts the stalls of a -race
			// run on a loaded machine; a second's MaxWait keeps the decision Redis's.
			FleetSize: 1, Fleet: "web", HeartbeatInterval: 50 * time.Millisecond,
			Limits: []hybrid.Limit{{Name: "api", Rate: 100, Burst: 100, Policy: breaker.FailLocal(), MaxWait: time.Second}},
		}
	}
	a := newLimiter(t, server("a"), cfg())
	b := newLimiter(t, server("b"), cfg()) // another server: one Redis, its own id
	waitFor(t, "both servers to see two live members", func() bool {
		return a.Stats().Servers == 2 && b.Stats().Servers == 2
	})
	d, err := a.Allow(context.Background(), "api", "k")
	if err != nil || d.Servers != 2 {
		t.Fatalf("decision %+v, %v: want Servers 2", d, err)
	}
	m.SetError("LOADING going away")
	beats := a.Stats().Heartbeats
	waitFor(t, "more heartbeats while Redis is away", func() bool { return a.Stats().Heartbeats > beats+3 })
	if n := a.Stats().Servers; n != 2 {
		t.Fatalf("Servers %d while Redis is away, want the last known 2", n)
	}
	m.SetError("")
}

// TestRefillsShareRoundTrips: refills of many cold keys falling due together go out in
// pipelined round trips, fewer than the refills.
func TestRefillsShareRoundTrips(t *testing.T) {
	_, c := redistest.Mini(t)
	l := newLimiter(t, newStore(t, c), hybrid.Config{
		FleetSize: 1,
		Limits:    []hybrid.Limit{{Name: "api", Rate: 100, Burst: 100, Policy: breaker.FailClosed, MaxWait: time.Second}},
	})
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if d, err := l.Allow(context.Background(), "api", "key-"+strconv.Itoa(i)); err != nil || !d.Allowed {
				t.Errorf("key %d: %+v, %v", i, d, err)
			}
		}()
	}
	wg.Wait()
	st := l.Stats()
	t.Logf("%d refills in %d round trips", st.Takes, st.RoundTrips)
	if st.Takes < 200 || st.RoundTrips >= st.Takes {
		t.Fatalf("%d refills in %d round trips: want at least 200 refills, sharing round trips", st.Takes, st.RoundTrips)
	}
}

// TestIdleLeaseIsRefunded: tokens leased for a key nobody asks about again go back to the
// bucket once their lifetime ends, without a request to notice it.
func TestIdleLeaseIsRefunded(t *testing.T) {
	_, c := redistest.Mini(t)
	l := newLimiter(t, newStore(t, c), hybrid.Config{
		FleetSize: 1,
		Limits: []hybrid.Limit{{Name: "api", Rate: 1, Burst: 100, Policy: breaker.FailClosed, MaxWait: time.Second,
			Lease: hybrid.LeaseTuning{Lifetime: 20 * time.Millisecond, LowWatermark: -1}}},
	})
	ctx := context.Background()
	for range 20 { // demand grows the batch: the lease ends up holding tokens
		if d, _ := l.Allow(ctx, "api", "k"); !d.Allowed {
			t.Fatalf("denied: %+v", d)
		}
	}
	st := l.Stats()
	if st.Granted <= 20 {
		t.Skipf("the lease holds no spare tokens (granted %d): nothing to refund", st.Granted)
	}
	waitFor(t, "the idle lease to be refunded", func() bool {
		s := l.Stats()
		return s.Refunded == s.Granted-20
	})
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestExpiryFollowsEachLimitsLifetime: a grant of a limit with a short lease lifetime is
// refunded when it ends, even behind an earlier grant of a limit with a long one (an
// expiry queue in arrival order would stop at the first grant not due).
func TestExpiryFollowsEachLimitsLifetime(t *testing.T) {
	_, c := redistest.Mini(t)
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	l := newLimiter(t, newStore(t, c), hybrid.Config{
		FleetSize: 1,
		Clock:     clockAt(func() time.Time { return time.Unix(0, now.Load()) }),
		Limits: []hybrid.Limit{
			{Name: "slow", Rate: 1000, Burst: 1000, Policy: breaker.FailClosed, MaxWait: time.Second, Lease: hybrid.LeaseTuning{Lifetime: time.Hour, LowWatermark: -1}},
			{Name: "fast", Rate: 1000, Burst: 1000, Policy: breaker.FailClosed, MaxWait: time.Second, Lease: hybrid.LeaseTuning{Lifetime: 40 * time.Millisecond, LowWatermark: -1}},
		},
	})
	ctx := context.Background()
	for _, name := range []string{"slow", "fast"} { // slow's grants go first
		for range 20 {
			if d, err := l.Allow(ctx, name, "k"); err != nil || !d.Allowed {
				t.Fatalf("%s: %+v, %v", name, d, err)
			}
		}
	}
	st := l.Stats()
	if st.Granted <= 40 {
		t.Skipf("the leases hold no spare tokens (granted %d): nothing to refund", st.Granted)
	}
	now.Add(int64(time.Second)) // fast's lifetime is over; slow's has an hour to go
	waitFor(t, "fast's lease to be refunded", func() bool { return l.Stats().Refunded > 0 })
	t.Logf("granted %d, refunded %d", l.Stats().Granted, l.Stats().Refunded)
}

// TestShortTimeoutStillOpensTheBreaker: a limit whose Timeout is shorter than the
// breaker's MinCountedTimeout (2ms against 10ms, the breaker's Timeout being 20ms) still
// lets a stalled Redis open the breaker: the refill runs to the breaker's own deadline,
// which it counts, while each request gives up after 2ms. (When the refill carried the
// limit's Timeout as its deadline, 40 timeouts counted as the caller's own and the
// breaker never opened.)
func TestShortTimeoutStillOpensTheBreaker(t *testing.T) {
	m, c := redistest.Mini(t)
	m.Server().SetPreHook(func(_ *mserver.Peer, cmd string, _ ...string) bool {
		if cmd == "EVALSHA" || cmd == "EVAL" {
			time.Sleep(30 * time.Millisecond) // Redis answers, too late
		}
		return false
	})
	brk, err := breaker.New(breaker.Settings{Timeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	l := newLimiter(t, newStore(t, c), hybrid.Config{
		FleetSize: 1,
		Breaker:   brk,
		Limits:    []hybrid.Limit{{Name: "api", Rate: 100, Burst: 100, Policy: breaker.FailClosed, MaxWait: 2 * time.Millisecond}},
	})
	ctx := context.Background()
	for i := 0; brk.State() != breaker.StateOpen; i++ {
		if i == 200 {
			t.Fatalf("breaker still %v after %d requests against a stalled Redis (stats %+v)", brk.State(), i, brk.Stats())
		}
		d, err := l.Allow(ctx, "api", "k"+strconv.Itoa(i)) // a new key: a refill each time
		if err != nil || d.Allowed || d.Source != hybrid.SourceFallback {
			t.Fatalf("request %d: %+v, %v; want the policy's denial", i, d, err)
		}
	}
}

// clockAt is the system clock with Now replaced, for tests that freeze or step the time
// of decisions while timers run on the system clock.
type clockAt func() time.Time

func (c clockAt) Now() time.Time { return c() }

func (clockAt) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// heldRefunds is a go-redis hook that holds the first refund pipeline until release is
// closed, then lets it run or, with fail set, answers every command in it with fail.
type heldRefunds struct {
	refundSource string
	fail         error
	entered      chan struct{}
	release      chan struct{}
	once         sync.Once
}

func (h *heldRefunds) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *heldRefunds) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *heldRefunds) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == 0 || cmds[0].Name() != "evalsha" || cmds[0].Args()[1] != h.refundSource {
			return next(ctx, cmds)
		}
		first := false
		h.once.Do(func() { first = true; close(h.entered) })
		if first {
			<-h.release
		}
		if h.fail != nil {
			for _, c := range cmds {
				c.SetErr(h.fail)
			}
			return h.fail
		}
		return next(ctx, cmds)
	}
}

// TestConcurrentCloseWaitsForRefunds: a second Close while the first is still sending
// the refunds returns only once they are done, with the first call's result (a shutdown
// path that exits on whichever returns first must not lose them); a Close whose own ctx
// has ended returns at once with its ctx's error; a Close after the work returns the
// same result again.
func TestConcurrentCloseWaitsForRefunds(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail error
	}{
		{"refunds succeed", nil},
		{"refunds fail", errors.New("ERR refund refused by the test")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, c := redistest.Mini(t)
			l := newLimiter(t, newStore(t, c), hybrid.Config{
				FleetSize: 1,
				Limits:    []hybrid.Limit{{Name: "api", Rate: 0.01, Burst: 100, Policy: breaker.FailClosed, MaxWait: time.Second}},
			})
			ctx := context.Background()
			for range 30 { // demand grows the batch: the lease ends up holding tokens
				if d, _ := l.Allow(ctx, "api", "k"); !d.Allowed {
					t.Fatalf("denied: %+v", d)
				}
			}
			if st := l.Stats(); st.Granted <= 30 {
				t.Fatalf("the lease holds no spare tokens (granted %d): nothing to refund", st.Granted)
			}
			hook := &heldRefunds{refundSource: luascript.Refund.Hash(), fail: tc.fail,
				entered: make(chan struct{}), release: make(chan struct{})}
			c.AddHook(hook)

			type result struct {
				err      error
				refunded int64 // Stats().Refunded when Close returned
			}
			closeIn := func(ctx context.Context) <-chan result {
				ch := make(chan result, 1)
				go func() {
					err := l.Close(ctx)
					ch <- result{err, l.Stats().Refunded}
				}()
				return ch
			}
			first := closeIn(ctx)
			<-hook.entered // the first Close is sending the refunds, held by the hook
			second := closeIn(ctx)
			canceled, cancel := context.WithCancel(ctx)
			cancel()
			if r := <-closeIn(canceled); !errors.Is(r.err, context.Canceled) {
				t.Errorf("Close with an ended ctx during the refunds: %v, want context.Canceled", r.err)
			}
			// The second call must still be waiting. Not a wait for an event: one that
			// never happens can only be given time to.
			select {
			case r := <-second:
				t.Fatalf("second Close returned (%v, %d refunded) while the refunds were held", r.err, r.refunded)
			case <-time.After(50 * time.Millisecond):
			}
			close(hook.release)
			a, b := <-first, <-second
			again := l.Close(ctx)
			st := l.Stats()
			t.Logf("first %v; second %v; again %v; stats %+v", a.err, b.err, again, st)
			if (a.err == nil) != (tc.fail == nil) {
				t.Fatalf("first Close: %v, want an error: %v", a.err, tc.fail != nil)
			}
			for _, r := range []struct {
				name string
				err  error
			}{{"second", b.err}, {"later", again}} {
				if r.err != a.err {
					t.Errorf("%s Close: %v, want the first's result %v", r.name, r.err, a.err)
				}
			}
			if b.refunded != st.Refunded {
				t.Errorf("second Close returned with %d refunded, %d once the refunds were done", b.refunded, st.Refunded)
			}
			if tc.fail == nil && st.Granted-st.Refunded != 30 {
				t.Errorf("granted %d − refunded %d != 30 admitted", st.Granted, st.Refunded)
			}
		})
	}
}

// TestLongKeysKeepTheirBuckets: the Limiter holds a long key by its digest, and still
// spends from the Redis bucket the key always had (global.Store.Key, pinned by
// global's TestWireFormat), so servers of two versions share it; keys that differ only
// in their last byte of a megabyte do not share one.
func TestLongKeysKeepTheirBuckets(t *testing.T) {
	const burst = 5
	m, c := redistest.Mini(t)
	st := newStore(t, c)
	l := newLimiter(t, st, hybrid.Config{
		FleetSize: 1,
		Limits:    []hybrid.Limit{{Name: "api", Rate: 0.001, Burst: burst, Policy: breaker.FailClosed, MaxWait: time.Second}},
	})
	huge := strings.Repeat("x", 1<<20)
	ctx := context.Background()
	for _, tc := range []struct{ name, key string }{
		{"short", "alice"},
		{"64 bytes", strings.Repeat("k", 64)},
		{"65 bytes", strings.Repeat("k", 65)},
		{"brace", "a{b}"},
		{"like an ID", "{" + strings.Repeat("0", 32)},
		{"1 MB, a", huge + "a"},
		{"1 MB, b", huge + "b"},
	} {
		admitted := 0
		for range burst + 1 {
			key := strings.Clone(tc.key) // the same key in a new string each time
			d, err := l.Allow(ctx, "api", key)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted != burst {
			t.Errorf("%s: %d of %d admitted, want the burst %d: keys share a bucket, or one key has two", tc.name, admitted, burst+1, burst)
		}
		if !m.Exists(st.Key("api", tc.key)) {
			t.Errorf("%s: no bucket at %s: the key's Redis key moved (keys %v)", tc.name, st.Key("api", tc.key), m.Keys())
		}
	}
}

// lateTakes holds the first take until released, then sends it on the call's context:
// it runs in Redis, and its answer reaches the Limiter, after the breaker's deadline.
// With claims, it holds the first reservation's claim (a take with a floor) instead, once
// Redis has run it: only its answer is late.
type lateTakes struct {
	held, release chan struct{}
	claims        bool
	once          sync.Once
	// pass, while set, makes the hook pass every call through.
	pass atomic.Bool
}

func (h *lateTakes) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lateTakes) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		// EVALSHA sha 1 key, then the take's arguments: its floor (ARGV[8]) is args[11].
		args := cmd.Args()
		if len(args) < 2 || args[0] != "evalsha" || args[1] != luascript.Take.Hash() ||
			h.claims && (len(args) < 12 || fmt.Sprint(args[11]) == "0") || h.pass.Load() {
			return next(ctx, cmd)
		}
		first := false
		h.once.Do(func() { first = true })
		if !first {
			return next(ctx, cmd)
		}
		var err error
		if h.claims {
			err = next(context.WithoutCancel(ctx), cmd)
		}
		close(h.held)
		<-h.release
		if h.claims {
			return err
		}
		return next(ctx, cmd) // fails at once if the call's context ended with Do
	}
}
func (h *lateTakes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestLateTakeIsRead: a take whose answer comes after the breaker's deadline is still
// read: its call lingers, on a context that outlives Do, and the grant Redis spent goes
// to the key's lease (LimitStats.Recovered), whose tokens serve the next requests.
func TestLateTakeIsRead(t *testing.T) {
	_, c := redistest.Mini(t)
	h := &lateTakes{held: make(chan struct{}), release: make(chan struct{})}
	c.AddHook(h)
	brk, err := breaker.New(breaker.Settings{Timeout: 20 * time.Millisecond, FailureThreshold: 100, OpenTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1, Breaker: brk, Limits: []hybrid.Limit{
		// A minute's lease: the grant must outlive a loaded machine's wait for it.
		{Name: "api", Rate: 100, Burst: 100, Policy: breaker.FailClosed, MaxWait: time.Second, Lease: hybrid.LeaseTuning{Lifetime: time.Minute}},
	}})
	d, err := l.Allow(context.Background(), "api", "k")
	if err != nil || d.Allowed || d.Source != hybrid.SourceFallback {
		t.Fatalf("the request whose take timed out: %+v, %v; want denied by FailClosed", d, err)
	}
	<-h.held
	close(h.release)
	var st hybrid.LimitStats
	waitFor(t, "the late answer to be read", func() bool {
		st = l.Stats().Limits[0]
		return st.Recovered > 0
	})
	if st.Recovered != st.Granted || st.Takes != 1 {
		t.Errorf("recovered %d of %d granted in %d takes, want all of one take", st.Recovered, st.Granted, st.Takes)
	}
	// The grant is what the first take asked for, and its tokens are on hand.
	for i := range st.Recovered {
		if d, err := l.Allow(context.Background(), "api", "k"); err != nil || !d.Allowed || d.Source != hybrid.SourceLease {
			t.Fatalf("request %d after the late grant of %d: %+v, %v; want served by the lease", i, st.Recovered, d, err)
		}
	}
}

// TestLateClaimIsGivenBack: a reservation's claim whose answer comes after the
// breaker's deadline fails the reservation, but it ran in Redis: its answer is still
// read, and the tokens it took go back to the bucket.
func TestLateClaimIsGivenBack(t *testing.T) {
	_, c := redistest.Mini(t)
	h := &lateTakes{held: make(chan struct{}), release: make(chan struct{}), claims: true}
	c.AddHook(h)
	// A Timeout a loaded machine's calls stay within; the claim's answer, held, does not.
	brk, err := breaker.New(breaker.Settings{Timeout: 200 * time.Millisecond, FailureThreshold: 100, OpenTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, c)
	const rate, burst = 0.01, 5 // nothing refills while the test runs
	l := newLimiter(t, s, hybrid.Config{FleetSize: 1, Breaker: brk, Limits: []hybrid.Limit{
		{Name: "jobs", Rate: rate, Burst: burst, Policy: breaker.FailClosed, MaxWait: time.Second},
	}})
	ctx := context.Background()
	drain := globalTake("jobs", rate, burst, "k")
	drain.Want, drain.Min, drain.Floor = burst, burst, 0
	if g, err := redisstore.Of(s).TakeOne(ctx, drain); err != nil || g.Granted != burst {
		t.Fatalf("draining the bucket: %+v, %v", g, err)
	}
	r, err := l.ReserveN(ctx, "jobs", "k", 1)
	if err != nil || r.OK() {
		t.Fatalf("the reservation whose claim was answered late: ok %v, %+v, %v; want refused", r.OK(), r.Decision(), err)
	}
	<-h.held
	close(h.release)
	waitFor(t, "the claim's token to go back", func() bool { return l.Stats().Limits[0].Refunded >= 1 })
	if st := l.Stats().Limits[0]; st.Refunded != 1 || st.Reserved != 0 {
		t.Fatalf("refunded %d, reserved %d; want the claim's 1 given back, none kept", st.Refunded, st.Reserved)
	}
	// The bucket, read with a claim of one: drained, the late claim given back, it is at
	// minus one, not minus two.
	g, err := redisstore.Of(s).TakeOne(ctx, globalTake("jobs", rate, burst, "k"))
	if err != nil || g.Granted != 1 {
		t.Fatalf("reading the bucket: %+v, %v", g, err)
	}
	if g.Remaining < -1.5 || g.Remaining > 0 {
		t.Fatalf("bucket at %v after a late claim, want about -1: its token given back", g.Remaining)
	}
}

// leasing returns a Limiter on miniredis and brk whose lease of key k holds tokens
// that only a refund gives back (a limit of 0.01/s, burst 100: 30 requests admitted).
func leasing(t *testing.T, brk *breaker.Breaker) *hybrid.Limiter {
	t.Helper()
	_, c := redistest.Mini(t)
	l, err := hybrid.New(newStore(t, c), hybrid.Config{FleetSize: 1, Breaker: brk, Limits: []hybrid.Limit{
		{Name: "api", Rate: 0.01, Burst: 100, Policy: breaker.FailClosed, MaxWait: time.Second, Lease: hybrid.LeaseTuning{Lifetime: time.Minute}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for range 30 {
		if d, err := l.Allow(context.Background(), "api", "k"); err != nil || !d.Allowed {
			t.Fatalf("Allow: %+v, %v", d, err)
		}
	}
	if l.Stats().Limits[0].Held == 0 {
		t.Fatal("nothing leased: nothing to test")
	}
	return l
}

// TestCloseWithAnEndedContext: Close with a ctx that ended before it (a server's shutdown
// spent it) sends nothing, but still stops the limiter and counts the tokens it holds as
// not refunded: none stays held, and the error says so, matching ctx's error.
func TestCloseWithAnEndedContext(t *testing.T) {
	brk, err := breaker.New(breaker.Settings{Timeout: time.Second}) // a loaded machine's calls stay within it
	if err != nil {
		t.Fatal(err)
	}
	l := leasing(t, brk)
	ctx := context.Background()
	before := l.Stats().Limits[0]
	ended, cancel := context.WithCancel(ctx)
	cancel()
	err = l.Close(ended)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "not refunded") {
		t.Fatalf("Close(ended ctx) = %v, want the tokens not refunded, matching context.Canceled", err)
	}
	st := l.Stats().Limits[0]
	if st.Held != 0 || st.RefundsLost != before.Held {
		t.Fatalf("after Close: held %d, refunds lost %d; want 0 and the %d held", st.Held, st.RefundsLost, before.Held)
	}
	if err2 := l.Close(ctx); err2 != err {
		t.Fatalf("Close again = %v, want the first's %v", err2, err)
	}
}

// TestCloseWithAnEndedContextWaitsForTheLoop: Close with an ended ctx while a take is
// out waits for the loop to stop, which it does by the breaker's Timeout (here 300 ms,
// past Close's 100 ms floor), and then drains the leases: the tokens they held are
// counted lost, none stays held, rather than Close giving up on the loop and leaving them.
func TestCloseWithAnEndedContextWaitsForTheLoop(t *testing.T) {
	_, c := redistest.Mini(t)
	h := &lateTakes{held: make(chan struct{}), release: make(chan struct{})}
	h.pass.Store(true)
	c.AddHook(h)
	brk, err := breaker.New(breaker.Settings{Timeout: 300 * time.Millisecond, FailureThreshold: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer close(h.release) // before the Limiter's cleanup (t.Cleanup runs after deferred calls): the held call goes first
	l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1, Breaker: brk, Limits: []hybrid.Limit{
		{Name: "api", Rate: 0.01, Burst: 100, Policy: breaker.FailClosed, MaxWait: time.Second, Lease: hybrid.LeaseTuning{Lifetime: time.Minute}},
	}})
	ctx := context.Background()
	for range 30 {
		if d, err := l.Allow(ctx, "api", "k"); err != nil || !d.Allowed {
			t.Fatalf("Allow: %+v, %v", d, err)
		}
	}
	held := l.Stats().Limits[0].Held
	if held == 0 {
		t.Fatal("nothing leased: nothing to test")
	}
	h.pass.Store(false)
	go l.Allow(ctx, "api", "other") // a refill whose answer the hook holds
	select {
	case <-h.held:
	case <-time.After(10 * time.Second):
		t.Fatal("no take held")
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	err = l.Close(ended)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "not refunded") {
		t.Fatalf("Close(ended ctx) with a take out = %v, want the tokens not refunded, matching context.Canceled", err)
	}
	if st := l.Stats().Limits[0]; st.Held != 0 || st.RefundsLost != held {
		t.Fatalf("after Close: held %d, refunds lost %d; want 0 and the %d held", st.Held, st.RefundsLost, held)
	}
}

// TestCloseWaitsForAProbeInFlight: at Close a shared breaker (Config.Breaker) is
// half-open with another caller's probe in flight, so it refuses every other call; Close
// waits for the probe (at most half its ctx) rather than losing its refunds to it.
func TestCloseWaitsForAProbeInFlight(t *testing.T) {
	brk, err := breaker.New(breaker.Settings{Timeout: time.Second, FailureThreshold: 1, OpenTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	l := leasing(t, brk)
	ctx := context.Background()
	held := l.Stats().Limits[0].Held
	// Another user of the breaker trips it, and once it is half-open sends a probe that
	// answers after Close has started.
	_ = brk.Do(ctx, func(context.Context) error { return errors.New("dial tcp: connection refused") })
	waitFor(t, "the breaker to go half-open", func() bool { return brk.State() == breaker.StateHalfOpen })
	release, probed := make(chan struct{}), make(chan error, 1)
	go func() { probed <- brk.Do(ctx, func(context.Context) error { <-release; return nil }) }()
	waitFor(t, "the probe to be in flight", func() bool { return brk.Stats().InFlight == 1 })
	time.AfterFunc(50*time.Millisecond, func() { close(release) })
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := l.Close(cctx); err != nil {
		t.Fatalf("Close with another caller's probe in flight: %v", err)
	}
	if err := <-probed; err != nil {
		t.Fatalf("the probe: %v", err)
	}
	if st := l.Stats().Limits[0]; st.Refunded != held || st.RefundsLost != 0 {
		t.Fatalf("held %d at Close; refunded %d, lost %d", held, st.Refunded, st.RefundsLost)
	}
}

// TestCloseReportsAdmissionsNotCharged: what a FailLocal limit admitted during an
// outage that lasts through Close cannot be charged to its bucket; Close says so
// (wrapping global.ErrUnavailable) and LimitStats.Forgiven counts it, with a live ctx
// or an ended one, beside leased tokens it could not refund (which match ctx's error),
// down to a single admission.
func TestCloseReportsAdmissionsNotCharged(t *testing.T) {
	for _, tc := range []struct {
		name          string
		leased, ended bool
		requests      int // made during the outage
	}{
		{"live ctx", false, false, 5},
		{"live ctx, one admission", false, false, 1},
		{"ended ctx", false, true, 5},
		{"ended ctx, tokens leased", true, true, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, c := redistest.Mini(t)
			l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 4, Limits: []hybrid.Limit{
				{Name: "local", Rate: 100, Burst: 8, Policy: breaker.FailLocal(), MaxWait: time.Second},
				// Its lease holds tokens that only a refund gives back.
				{Name: "leased", Rate: 0.01, Burst: 400, Policy: breaker.FailClosed, MaxWait: time.Second, Lease: hybrid.LeaseTuning{Lifetime: time.Minute}},
			}})
			ctx := context.Background()
			leases := 0
			if tc.leased {
				leases = 30
			}
			for range leases {
				if d, err := l.Allow(ctx, "leased", "k"); err != nil || !d.Allowed {
					t.Fatalf("leasing: %+v, %v", d, err)
				}
			}
			if held := l.Stats().Limits[1].Held; tc.leased != (held > 0) {
				t.Fatalf("%d tokens held, want some: %v", held, tc.leased)
			}
			m.SetError("ERR injected outage")
			admitted := admittedOf(t, l, "local", "k", tc.requests)
			if admitted == 0 {
				t.Fatal("nothing admitted during the outage: nothing owed")
			}
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			if tc.ended {
				cancel()
			}
			defer cancel()
			err := l.Close(cctx)
			if !errors.Is(err, global.ErrUnavailable) || !strings.Contains(err.Error(), "not charged") || tc.ended != errors.Is(err, context.Canceled) {
				t.Fatalf("Close = %v, want the admissions not charged, ErrUnavailable, and context.Canceled: %v", err, tc.ended)
			}
			st := l.Stats().Limits
			if st[0].Forgiven != int64(admitted) || tc.leased != (st[1].RefundsLost > 0) {
				t.Fatalf("forgiven %d, refunds lost %d; want the %d admitted during the outage, and lost: %v", st[0].Forgiven, st[1].RefundsLost, admitted, tc.leased)
			}
			m.SetError("")
		})
	}
}

// TestFallbackResetsInAWindow: a decision the failure policy made while Redis did not
// answer says the key's bucket is full again in a window (Decision.Reset): its state is
// unknown, whatever the policy's own local limit holds (FailLocal's remaining tokens).
func TestFallbackResetsInAWindow(t *testing.T) {
	m, c := redistest.Mini(t)
	l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{
		{Name: "local", Rate: 100, Burst: 100, Policy: breaker.FailLocal(), MaxWait: time.Second},
		{Name: "open", Rate: 100, Burst: 100, Policy: breaker.FailOpen, MaxWait: time.Second},
		{Name: "closed", Rate: 100, Burst: 100, Policy: breaker.FailClosed, MaxWait: time.Second}}})
	m.SetError("ERR injected outage")
	for _, name := range []string{"local", "open", "closed"} {
		d, err := l.Allow(context.Background(), name, "k")
		if err != nil || d.Source != hybrid.SourceFallback || d.Reset != d.Window {
			t.Errorf("%s, Redis down: %+v, %v; want the policy's decision, resetting in a window (%v)", name, d, err, d.Window)
		}
	}
}

// TestMisuseDecisions: a call naming a limit or tier the Limiter does not have, or a
// negative cost, returns its error with a denial that can never pass (RetryAfter
// InfDuration) naming the limit and tier asked; OnDecision never hears of a limit or
// tier that does not exist.
func TestMisuseDecisions(t *testing.T) {
	_, c := redistest.Mini(t)
	var heard atomic.Int32
	l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1,
		OnDecision: func(string, hybrid.Decision) { heard.Add(1) },
		Limits: []hybrid.Limit{{Name: "api", Rate: 10, Burst: 20, Policy: breaker.FailClosed, MaxWait: time.Second,
			Tiers: []hybrid.Tier{{Name: "gold", Rate: 20, Burst: 40}}}}})
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		call        func() (hybrid.Decision, error)
		limit, tier string
		want        error
		silent      bool // OnDecision must not hear of it
	}{
		{"Allow, unknown limit", func() (hybrid.Decision, error) { return l.Allow(ctx, "nope", "k") }, "nope", "", hybrid.ErrUnknownLimit, true},
		{"AllowTier, unknown limit", func() (hybrid.Decision, error) { return l.AllowTier(ctx, "nope", "gold", "k", 1) }, "nope", "gold", hybrid.ErrUnknownLimit, true},
		{"AllowTier, unknown tier", func() (hybrid.Decision, error) { return l.AllowTier(ctx, "api", "silver", "k", 1) }, "api", "silver", hybrid.ErrUnknownTier, true},
		{"AllowN, negative cost", func() (hybrid.Decision, error) { return l.AllowN(ctx, "api", "k", -1) }, "api", "", hybrid.ErrInvalidCost, false},
		{"WaitN, unknown limit", func() (hybrid.Decision, error) { return l.WaitN(ctx, "nope", "k", 1) }, "nope", "", hybrid.ErrUnknownLimit, true},
		{"WaitN, negative cost", func() (hybrid.Decision, error) { return l.WaitN(ctx, "api", "k", -1) }, "api", "", hybrid.ErrInvalidCost, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := heard.Load()
			d, err := tc.call()
			if !errors.Is(err, tc.want) || d.Allowed || d.RetryAfter != hybrid.InfDuration || d.Limit != tc.limit || d.Tier != tc.tier {
				t.Errorf("%+v, %v; want denied for ever, limit %q tier %q, %v", d, err, tc.limit, tc.tier, tc.want)
			}
			if got := heard.Load() - before; tc.silent && got != 0 || got > 1 {
				t.Errorf("OnDecision heard %d decisions, want none: %v, or at most one", got, tc.silent)
			}
		})
	}
}
