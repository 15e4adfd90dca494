package hybrid_test

import (
	"sync/atomic"

	"context"
	"errors"
	"github.com/redis/go-redis/v9"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/luascript"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// TestWaitPaces: three waits on a bucket of one token at 20/s all pass, and cannot pass
// sooner than the bucket refills twice (a lower bound: a slow machine only adds to it);
// WaitN sleeps for the RetryAfter it is told instead of asking again and again.
func TestWaitPaces(t *testing.T) {
	_, c := redistest.Mini(t)
	l := newLimiter(t, newStore(t, c), hybrid.Config{
		FleetSize: 1,
		Limits:    []hybrid.Limit{{Name: "api", Rate: 20, Burst: 1, Policy: breaker.FailClosed, MaxWait: time.Second}},
	})
	ctx := context.Background()
	start := time.Now()
	for i := range 3 {
		d, err := l.WaitN(ctx, "api", "k", 1)
		if err != nil || !d.Allowed {
			t.Fatalf("WaitN %d = %+v, %v; want allowed", i, d, err)
		}
	}
	elapsed := time.Since(start)
	st := l.Stats()
	decisions := st.PreCheck + st.Lease + st.Global + st.Fallback
	t.Logf("3 waits took %v and %d decisions (%+v)", elapsed.Round(time.Millisecond), decisions, st)
	if elapsed < 95*time.Millisecond {
		t.Errorf("3 tokens of a bucket of 1 at 20/s in %v; the bucket needs 100ms to refill twice", elapsed)
	}
	if decisions > 12 {
		t.Errorf("%d decisions for 3 waits: WaitN asks again before RetryAfter", decisions)
	}
}

// TestWaitErrors: WaitN gives up without sleeping when it cannot succeed.
func TestWaitErrors(t *testing.T) {
	_, c := redistest.Mini(t)
	l := newLimiter(t, newStore(t, c), hybrid.Config{
		FleetSize: 1,
		Limits: []hybrid.Limit{{Name: "api", Rate: 0.1, Burst: 2, Policy: breaker.FailClosed, MaxWait: time.Second},
			{Name: "held", Rate: 0.1, Burst: 1, Policy: breaker.FailClosed, MaxWait: time.Second}},
	})
	bg := context.Background()
	if d, err := l.WaitN(bg, "api", "k", 2); err != nil || !d.Allowed {
		t.Fatalf("WaitN(2) on a full bucket = %+v, %v", d, err)
	}
	if d, err := l.WaitN(bg, "held", "k", 1); err != nil || !d.Allowed {
		t.Fatalf("WaitN(1) on a full bucket = %+v, %v", d, err)
	}
	if r, err := l.ReserveN(bg, "held", "k", 1); err != nil || !r.OK() {
		t.Fatalf("ReserveN(1) on an empty bucket = %+v, %v; want a claim", r.Decision(), err)
	}
	// The bucket is empty and refills one token in 10 s; the deadline is sooner, and
	// outlives every case below on a loaded machine. "held"'s bucket is at minus its
	// burst, held there by the claim above: a request is denied, not reserved (no claim
	// may take it lower), with a RetryAfter of 10 s (when one may again), past the
	// deadline too, which WaitN must not sleep toward.
	short, cancel := context.WithTimeout(bg, 5*time.Second)
	defer cancel()
	canceled, cancel2 := context.WithCancel(bg)
	cancel2()
	tests := []struct {
		name string
		ctx  context.Context
		lim  string
		n    int
		want error
	}{
		{"retry after the deadline", short, "api", 1, hybrid.ErrWouldExceedDeadline},
		{"denied until after the deadline", short, "held", 1, hybrid.ErrWouldExceedDeadline},
		{"cost above the burst", bg, "api", 3, hybrid.ErrNeverAllowed},
		{"canceled while waiting", canceled, "api", 1, context.Canceled},
		{"unknown limit", bg, "nope", 1, hybrid.ErrUnknownLimit},
		{"negative cost", bg, "api", -1, hybrid.ErrInvalidCost},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := l.WaitN(tt.ctx, tt.lim, "k", tt.n)
			if !errors.Is(err, tt.want) || d.Allowed {
				t.Fatalf("WaitN = %+v, %v; want denied with %v", d, err, tt.want)
			}
		})
	}
	if err := short.Err(); err != nil {
		t.Errorf("WaitN slept until the deadline (%v) instead of giving up at once", err)
	}
	if err := l.Close(bg); err != nil {
		t.Fatal(err)
	}
	if _, err := l.WaitN(bg, "api", "k", 1); !errors.Is(err, hybrid.ErrClosed) {
		t.Fatalf("WaitN after Close: %v, want ErrClosed", err)
	}
}

// TestSlowPreCheckNeverWraps: a pre-check so slow that its next token is beyond a
// Duration's range answers InfDuration, not a negative RetryAfter that WaitN would
// poll on (found by review: 264 decisions in 300ms, then a negative retry-after).
func TestSlowPreCheckNeverWraps(t *testing.T) {
	_, c := redistest.Mini(t)
	l := newLimiter(t, newStore(t, c), hybrid.Config{
		FleetSize: 1,
		Limits:    []hybrid.Limit{{Name: "api", Rate: 1, Burst: 1, PreRate: 1e-300, Policy: breaker.FailClosed, MaxWait: time.Second}},
	})
	ctx := context.Background()
	if d, err := l.Allow(ctx, "api", "k"); err != nil || !d.Allowed {
		t.Fatalf("first Allow = %+v, %v", d, err)
	}
	d, err := l.Allow(ctx, "api", "k")
	if err != nil || d.Allowed || d.Source != hybrid.SourcePreCheck || d.RetryAfter != hybrid.InfDuration {
		t.Fatalf("second Allow = %+v, %v; want a pre-check denial with RetryAfter InfDuration", d, err)
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := l.WaitN(short, "api", "k", 1); !errors.Is(err, hybrid.ErrNeverAllowed) {
		t.Fatalf("WaitN = %v, want ErrNeverAllowed at once", err)
	}
}

// TestWaitAndReserveHonourTheirContext: as x/time/rate's, WaitN with a context that has
// ended returns its error at once and takes nothing, though the lease could serve it;
// and ReserveN whose claim on the refill is still waiting for Redis when its context
// ends returns the context's error, as AllowN's wait does, with a reservation that is
// not OK.
func TestWaitAndReserveHonourTheirContext(t *testing.T) {
	bg := context.Background()
	t.Run("WaitN", func(t *testing.T) {
		_, c := redistest.Mini(t)
		l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{
			{Name: "big", Rate: 1000, Burst: 1000, Policy: breaker.FailClosed, MaxWait: 3 * time.Second}}})
		for range 5 { // the lease holds tokens
			if d, _ := l.Allow(bg, "big", "k"); !d.Allowed {
				t.Fatalf("%+v", d)
			}
		}
		held := func() int64 { return l.Stats().Limits[0].Held }
		before := held()
		if before == 0 {
			t.Fatal("the lease holds nothing")
		}
		ended, cancel := context.WithCancel(bg)
		cancel()
		if d, err := l.WaitN(ended, "big", "k", 1); !errors.Is(err, context.Canceled) || d.Allowed {
			t.Fatalf("WaitN with an ended context: %+v, %v; want context.Canceled", d, err)
		}
		if got := held(); got != before {
			t.Fatalf("WaitN with an ended context took %d tokens", before-got)
		}
	})
	t.Run("ReserveN", func(t *testing.T) {
		_, c := redistest.Mini(t)
		hook := &heldCalls{entered: make(chan struct{}, 1), release: make(chan struct{})}
		c.AddHook(hook)
		l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{
			{Name: "jobs", Rate: 1, Burst: 5, Policy: breaker.FailClosed, MaxWait: 3 * time.Second}}})
		for { // drain: the key is paced, and its next reservation a claim, its only call
			if d, err := l.Allow(bg, "jobs", "k"); err != nil || !d.Allowed {
				break
			}
		}
		// The claim's call is held in Redis's way until the caller's context has ended.
		hook.on.Store(true)
		ctx, cancel := context.WithCancel(bg)
		go func() {
			<-hook.entered
			cancel()
		}()
		r, err := l.ReserveN(ctx, "jobs", "k", 1)
		hook.on.Store(false)
		close(hook.release)
		if !errors.Is(err, context.Canceled) || r.OK() {
			t.Fatalf("ReserveN whose claim outlived its context: ok %v, %v; want not OK and context.Canceled", r.OK(), err)
		}
	})
}

// heldCalls is a go-redis hook that, while on, holds every command and pipeline until
// release is closed, telling entered (buffered) of the first: a Redis that has not
// answered yet.
type heldCalls struct {
	on      atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (*heldCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *heldCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.hold()
		return next(ctx, cmd)
	}
}
func (h *heldCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.hold()
		return next(ctx, cmds)
	}
}

// hold holds the call, while on, until release.
func (h *heldCalls) hold() {
	if !h.on.Load() {
		return
	}
	select {
	case h.entered <- struct{}{}:
	default:
	}
	<-h.release
}

// TestWaitNEndsAsleep: a WaitN asleep toward its reservation's instant (a minute away)
// ends at once when its context does (context.Canceled), its reservation canceled and
// its token given back, or when Close runs (ErrClosed), not admitted, rather than acting
// a minute after the Limiter closed.
func TestWaitNEndsAsleep(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(l *hybrid.Limiter, cancel context.CancelFunc) error
		want error
	}{
		{"canceled", func(_ *hybrid.Limiter, cancel context.CancelFunc) error { cancel(); return nil }, context.Canceled},
		{"closed", func(l *hybrid.Limiter, _ context.CancelFunc) error { return l.Close(context.Background()) }, hybrid.ErrClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := spentJobs(t)
			bg := context.Background()
			type result struct {
				d   hybrid.Decision
				err error
			}
			done := make(chan result, 1)
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			go func() {
				d, err := l.WaitN(ctx, "jobs", "k", 1)
				done <- result{d, err}
			}()
			waitFor(t, "the WaitN's reservation", func() bool { return l.Stats().Limits[0].Reserved > 0 })
			if err := tc.end(l, cancel); err != nil {
				t.Fatal(err)
			}
			select {
			case r := <-done:
				if !errors.Is(r.err, tc.want) || r.d.Allowed {
					t.Errorf("WaitN: %+v, %v; want not allowed, %v", r.d, r.err, tc.want)
				}
				if tc.want == hybrid.ErrClosed && r.d.Reason.String() != "limiter closed" {
					t.Errorf("WaitN across Close: reason %v, want limiter closed", r.d.Reason)
				}
			case <-time.After(10 * time.Second): // its reservation acts in about a minute
				t.Fatal("WaitN still asleep 10 s after its end")
			}
			if tc.want == context.Canceled {
				waitFor(t, "the canceled reservation's token back", func() bool { return l.Stats().Limits[0].Reserved == 0 })
			}
		})
	}
}

// TestReserveNWaitsAtMostMaxWait: ReserveN waits for Redis at most the limit's MaxWait in
// all, the lease's refill and the claim after it together. A server whose lease is empty
// and whose peer drained the bucket waits 1 s for the refill (every take answers 1 s
// late), and its claim then has the 0.2 s MaxWait leaves, not 1.2 s more.
func TestReserveNWaitsAtMostMaxWait(t *testing.T) {
	_, c := redistest.Mini(t)
	slow := &slowTakes{}
	c.AddHook(slow)
	s := newStore(t, c)
	lim := hybrid.Limit{Name: "jobs", Rate: 0.1, Burst: 5, Policy: breaker.FailClosed, MaxWait: 1200 * time.Millisecond}
	brk, err := breaker.New(breaker.Settings{Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	a := newLimiter(t, s, hybrid.Config{FleetSize: 2, Limits: []hybrid.Limit{lim}})
	b := newLimiter(t, s, hybrid.Config{FleetSize: 2, Limits: []hybrid.Limit{lim}, Breaker: brk})
	bg := context.Background()
	for range 10 { // server a drains the key's bucket
		a.Allow(bg, "jobs", "k")
	}
	slow.delay.Store(int64(time.Second))
	start := time.Now()
	r, err := b.ReserveN(bg, "jobs", "k", 1)
	took := time.Since(start)
	slow.delay.Store(0)
	t.Logf("ReserveN: ok %v, delay %v, %+v, %v, in %v", r.OK(), r.Delay(), r.Decision(), err, took)
	if err != nil || took > 1700*time.Millisecond {
		t.Errorf("ReserveN: ok %v, %v, in %v; want at most MaxWait (1.2 s) and scheduling", r.OK(), err, took)
	}
}

// TestAllowMultiWaitsAtMostMaxWait: an all-or-nothing request waits for Redis at most
// its limits' MaxWait from its start, not a MaxWait per item: its items' refills go one
// after another, and against a Redis that answers every take 1 s late, four items of
// MaxWait 0.3 s whose policy admits took 1.2 s where each policy decides at 0.3 s.
func TestAllowMultiWaitsAtMostMaxWait(t *testing.T) {
	_, c := redistest.Mini(t)
	slow := &slowTakes{}
	c.AddHook(slow)
	brk, err := breaker.New(breaker.Settings{Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var lims []hybrid.Limit
	var items []hybrid.Item
	for _, name := range []string{"a", "b", "c", "d"} {
		lims = append(lims, hybrid.Limit{Name: name, Rate: 100, Burst: 100, Policy: breaker.FailOpen, MaxWait: 300 * time.Millisecond})
		items = append(items, hybrid.Item{Limit: name, Key: "k", Cost: 1})
	}
	l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1, Limits: lims, Breaker: brk})
	slow.delay.Store(int64(time.Second))
	defer slow.delay.Store(0)
	start := time.Now()
	md, err := l.AllowMulti(context.Background(), items)
	took := time.Since(start)
	if err != nil || !md.Allowed || md.Decision.Reason != hybrid.ReasonTimeout || took > 900*time.Millisecond {
		t.Errorf("AllowMulti: %+v, %v, in %v; want the policies' admission for a MaxWait run out, at 0.3 s and scheduling", md, err, took)
	}
}

// slowTakes is a go-redis hook that delays every take (and every pipeline holding one)
// by delay: a Redis that answers that late.
type slowTakes struct{ delay atomic.Int64 }

func (*slowTakes) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *slowTakes) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.wait([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}
func (h *slowTakes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.wait(cmds)
		return next(ctx, cmds)
	}
}

// wait sleeps delay (the latency it stands for) if cmds hold a take.
func (h *slowTakes) wait(cmds []redis.Cmder) {
	for _, cmd := range cmds {
		if args := cmd.Args(); len(args) >= 2 && args[0] == "evalsha" && args[1] == luascript.Take.Hash() {
			time.Sleep(time.Duration(h.delay.Load()))
			return
		}
	}
}

// TestCanceledWaitIsCounted: a request whose context ends while it waits for Redis is
// not allowed, returns the context's error, and is counted as canceled (Stats.Canceled,
// and its limit's decisions), so that the totals still add up to the requests made.
func TestCanceledWaitIsCounted(t *testing.T) {
	_, c := redistest.Mini(t)
	hook := &heldCalls{entered: make(chan struct{}, 1), release: make(chan struct{})}
	c.AddHook(hook)
	l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{
		{Name: "api", Rate: 100, Burst: 100, Policy: breaker.FailClosed, MaxWait: time.Minute}}})
	hook.on.Store(true) // the new key's refill is held in Redis's way
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-hook.entered
		cancel()
	}()
	d, err := l.Allow(ctx, "api", "k")
	hook.on.Store(false)
	close(hook.release)
	if !errors.Is(err, context.Canceled) || d.Allowed {
		t.Fatalf("Allow whose context ended while it waited: %+v, %v; want not allowed, context.Canceled", d, err)
	}
	if st := l.Stats(); st.Canceled != 1 || st.PreCheck+st.Lease+st.Global+st.Fallback+st.Canceled != 1 {
		t.Errorf("stats %+v: want the one request counted, as canceled", st)
	}
}

// TestWaitNReservationPastTheDeadline: a WaitN whose reservation would act after its
// context's deadline returns ErrWouldExceedDeadline at once, not allowed, with the
// reservation's delay as RetryAfter, and gives the reservation's tokens back.
func TestWaitNReservationPastTheDeadline(t *testing.T) {
	l := spentJobs(t)
	bg := context.Background()
	// The next token comes in a minute; the deadline is far sooner, and far later than
	// WaitN takes to give up on a loaded machine.
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	d, err := l.WaitN(ctx, "jobs", "k", 1)
	if !errors.Is(err, hybrid.ErrWouldExceedDeadline) || d.Allowed || d.RetryAfter < 50*time.Second || d.RetryAfter > time.Minute {
		t.Fatalf("WaitN: %+v, %v; want not allowed, ErrWouldExceedDeadline, RetryAfter about a minute", d, err)
	}
	if got := l.Stats().Limits[0].Reserved; got != 0 {
		t.Errorf("Reserved = %d after WaitN gave up, want 0: the reservation's token given back", got)
	}
}

// spentJobs returns a Limiter whose limit "jobs" (a token a minute, a burst of one) has
// spent key k's token: k's next token comes in a minute.
func spentJobs(t *testing.T) *hybrid.Limiter {
	t.Helper()
	_, c := redistest.Mini(t)
	l := newLimiter(t, newStore(t, c), hybrid.Config{FleetSize: 1, Limits: []hybrid.Limit{
		{Name: "jobs", Rate: 1.0 / 60, Burst: 1, Policy: breaker.FailClosed, MaxWait: time.Second}}})
	if d, err := l.Allow(context.Background(), "jobs", "k"); err != nil || !d.Allowed {
		t.Fatalf("the first request: %+v, %v", d, err)
	}
	return l
}

// TestWaitNClosedBetweenTries: a WaitN asleep between two tries (its claim refused: the
// bucket is as far below zero as it may go, a reservation holding its next token) ends
// when Close runs, with ErrClosed and the reason "limiter closed", not the denial's.
func TestWaitNClosedBetweenTries(t *testing.T) {
	l := spentJobs(t)
	bg := context.Background()
	r, err := l.ReserveN(bg, "jobs", "k", 1) // the next token, a minute away
	if err != nil || !r.OK() {
		t.Fatalf("ReserveN: %+v, %v; want OK", r.Decision(), err)
	}
	takes := l.Stats().Limits[0].Takes
	type result struct {
		d   hybrid.Decision
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := l.WaitN(bg, "jobs", "k", 1)
		done <- result{d, err}
	}()
	waitFor(t, "the WaitN's claim answered", func() bool { return l.Stats().Limits[0].Takes > takes })
	if err := l.Close(bg); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-done:
		if !errors.Is(res.err, hybrid.ErrClosed) || res.d.Allowed || res.d.Reason.String() != "limiter closed" {
			t.Errorf("WaitN across Close: %+v, %v; want not allowed, ErrClosed, limiter closed", res.d, res.err)
		}
	case <-time.After(10 * time.Second): // its next try is minutes away
		t.Fatal("WaitN still asleep 10 s after Close")
	}
}
