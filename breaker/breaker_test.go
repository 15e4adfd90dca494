package breaker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

	"github.com/fleetlimit/fleetlimit/internal/linger"
)

// store is a fake store call: it counts calls and answers with the error
// it is set to, or blocks until released when stall is set.
type store struct {
	calls atomic.Int64
	mu    sync.Mutex
	err   error
	stall chan struct{} // non-nil: calls block until it is closed
}

func (s *store) set(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

// stallUntilReleased makes calls block, ignoring their context, as go-redis
// does without ContextTimeoutEnabled; release ends the stall.
func (s *store) stallUntilReleased() (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.stall = ch
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.stall = nil
			s.mu.Unlock()
			close(ch)
		})
	}
}

func (s *store) call(context.Context) error {
	s.calls.Add(1)
	s.mu.Lock()
	err, stall := s.err, s.stall
	s.mu.Unlock()
	if stall != nil {
		<-stall
	}
	return err
}

// reply is a Redis error reply, as go-redis returns one.
type reply string

func (r reply) Error() string { return string(r) }
func (reply) RedisError()     {}

type changes struct {
	mu  sync.Mutex
	got []string
}

func (c *changes) record(b **Breaker) func(from, to State) {
	return func(from, to State) {
		(*b).State() // reading the breaker from the callback must not deadlock
		(*b).Stats()
		c.mu.Lock()
		c.got = append(c.got, from.String()+"->"+to.String())
		c.mu.Unlock()
	}
}

func (c *changes) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got)
}

func newTestBreaker(t *testing.T, st Settings) (*Breaker, *changes) {
	t.Helper()
	var b *Breaker
	ch := &changes{}
	st.OnStateChange = ch.record(&b)
	b, err := New(st)
	if err != nil {
		t.Fatal(err)
	}
	return b, ch
}

// TestBreakerLifecycle walks a breaker through its states in virtual time:
// opens after FailureThreshold consecutive store failures, makes no store
// call while open, lets one probe through after OpenTimeout (State, which
// finds that change, tells OnStateChange of it), re-opens on a failed probe
// and closes on a good one.
func TestBreakerLifecycle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, ch := newTestBreaker(t, Settings{FailureThreshold: 3, OpenTimeout: time.Second})
		s := &store{}
		ctx := context.Background()

		// Answers, even error answers, keep it closed, and count as successes.
		for _, answer := range []error{nil, redis.Nil, reply("ERR Error running script"), nil} {
			s.set(answer)
			if err := b.Do(ctx, s.call); err != answer {
				t.Fatalf("Do = %v, want the store's answer %v", err, answer)
			}
		}
		if st := b.Stats(); st.Successes != 4 || st.Failures != 0 {
			t.Fatalf("after 4 answers: stats %+v, want 4 successes", st)
		}
		// Two failures, a success (resets), then three failures open it.
		for i, e := range []error{io.EOF, syscall.ECONNREFUSED, nil, io.EOF, io.EOF} {
			s.set(e)
			b.Do(ctx, s.call)
			if got := b.State(); got != StateClosed {
				t.Fatalf("after failure %d: state %v, want closed", i, got)
			}
		}
		s.set(&net.OpError{Op: "read", Err: syscall.ECONNRESET})
		b.Do(ctx, s.call)
		if got := b.State(); got != StateOpen {
			t.Fatalf("after 3 consecutive failures: state %v, want open", got)
		}

		// Open: no store call, an immediate ErrOpen.
		calls := s.calls.Load()
		start := time.Now()
		for range 100 {
			if err := b.Do(ctx, s.call); !errors.Is(err, ErrOpen) || !errors.Is(err, gobreaker.ErrOpenState) {
				t.Fatalf("Do while open = %v, want ErrOpen", err)
			}
		}
		if s.calls.Load() != calls {
			t.Fatalf("%d store calls while open", s.calls.Load()-calls)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("rejections took %v of virtual time, want none", d)
		}

		// After OpenTimeout: half-open; a failed probe opens it again.
		time.Sleep(time.Second + time.Millisecond) // gobreaker: strictly after OpenTimeout
		if got := b.State(); got != StateHalfOpen {
			t.Fatalf("after OpenTimeout: state %v, want half-open", got)
		}
		// State, which found the change, has told OnStateChange of it.
		if got := ch.list(); got[len(got)-1] != "open->half-open" {
			t.Fatalf("changes told when State returned: %v, want open->half-open last", got)
		}
		s.set(io.EOF)
		b.Do(ctx, s.call)
		if got := b.State(); got != StateOpen {
			t.Fatalf("after a failed probe: state %v, want open", got)
		}

		// Half-open again: one probe at a time; others are refused.
		time.Sleep(time.Second + time.Millisecond) // gobreaker: strictly after OpenTimeout
		s.set(nil)
		release := s.stallUntilReleased()
		probe := make(chan error)
		go func() { probe <- b.Do(ctx, s.call) }()
		synctest.Wait() // the probe is in the store
		if err := b.Do(ctx, s.call); !errors.Is(err, ErrOpen) || !errors.Is(err, gobreaker.ErrTooManyRequests) {
			t.Fatalf("second call while the probe is in flight = %v, want ErrOpen", err)
		}
		release()
		if err := <-probe; err != nil {
			t.Fatalf("probe = %v", err)
		}
		if got := b.State(); got != StateClosed {
			t.Fatalf("after a good probe: state %v, want closed", got)
		}

		want := []string{"closed->open", "open->half-open", "half-open->open", "open->half-open", "half-open->closed"}
		if got := ch.list(); !slices.Equal(got, want) {
			t.Errorf("state changes %v, want %v", got, want)
		}
		st := b.Stats()
		if st.Rejected != 101 || st.Failures != 6 {
			t.Errorf("stats %+v: want 101 rejected, 6 failures", st)
		}
	})
}

// TestBreakerTimeout: a call that does not return is abandoned at the
// deadline, which counts as a failure; Do spends exactly Timeout.
func TestBreakerTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := newTestBreaker(t, Settings{Timeout: 10 * time.Millisecond, FailureThreshold: 2})
		s := &store{}
		release := s.stallUntilReleased()
		defer release()
		for i := range 2 {
			start := time.Now()
			err := b.Do(context.Background(), s.call)
			if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Do on a stalled store = %v, want ErrTimeout", err)
			}
			if d := time.Since(start); d != 10*time.Millisecond {
				t.Fatalf("Do returned after %v, want the 10ms deadline", d)
			}
			t.Logf("call %d: %v", i, err)
		}
		if got := b.State(); got != StateOpen {
			t.Fatalf("after 2 timeouts: %v, want open", got)
		}
		st := b.Stats()
		if st.Timeouts != 2 || st.Failures != 2 || st.Abandoned != 2 || st.InFlight != 2 {
			t.Errorf("stats %+v", st)
		}
		release()
		synctest.Wait()
		if n := b.Stats().InFlight; n != 0 {
			t.Errorf("%d calls in flight after the store answered", n)
		}
	})
}

// TestBreakerSocketDeadline: a client that sets its socket's deadline from the call's
// context (a net.Dialer's dial, go-redis with ContextTimeoutEnabled) may report the
// timeout before Do's own timer ends the context. Under a caller deadline shorter than
// MinCountedTimeout such a timeout still counts as nothing, and under Timeout as one.
func TestBreakerSocketDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // a store that accepts and never answers
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	// call reads an answer that never comes, its socket's deadline the context's.
	call := func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		if dl, ok := ctx.Deadline(); ok {
			c.SetDeadline(dl)
		}
		_, err = c.Read(make([]byte, 1))
		return err
	}
	for _, tc := range []struct {
		name     string
		deadline time.Duration
		failures bool
	}{
		{"caller deadline shorter than MinCountedTimeout", 3 * time.Millisecond, false},
		{"Timeout", time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(Settings{Timeout: 10 * time.Millisecond, FailureThreshold: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			for range 20 {
				ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
				if err := b.Do(ctx, call); !errors.Is(err, ErrTimeout) {
					t.Fatalf("Do = %v, want ErrTimeout", err)
				}
				cancel()
			}
			st := b.Stats()
			// Counted: each a failure, or starved when this process ran a whole budget
			// late (a loaded machine), never anything else. Not counted: no failure.
			if st.Timeouts != 20 || tc.failures && st.Failures+st.Starved != 20 || !tc.failures && st.Failures != 0 {
				t.Errorf("20 calls to a store that never answers: %+v, want 20 timeouts, counted %v", st, tc.failures)
			}
		})
	}
}

// TestBreakerCallerContext: the caller's cancellation and a caller deadline
// shorter than MinCountedTimeout never open the breaker; a caller deadline
// close to Timeout (the hybrid limiter passes its own) still counts.
func TestBreakerCallerContext(t *testing.T) {
	tests := []struct {
		name      string
		ctx       func() (context.Context, context.CancelFunc)
		cancelIn  time.Duration // cancel the caller's context after this
		wantErr   error
		wantTook  time.Duration
		wantState State
	}{
		{
			name:     "cancelled while in flight",
			ctx:      func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			cancelIn: 3 * time.Millisecond, wantErr: context.Canceled, wantTook: 3 * time.Millisecond,
			wantState: StateClosed,
		},
		{
			name: "cancelled before the call",
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx, cancel
			},
			wantErr: context.Canceled, wantState: StateClosed,
		},
		{
			name: "caller deadline shorter than MinCountedTimeout",
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 2*time.Millisecond)
			},
			wantErr: ErrTimeout, wantTook: 2 * time.Millisecond, wantState: StateClosed,
		},
		{
			name: "caller deadline about Timeout",
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 9*time.Millisecond)
			},
			wantErr: ErrTimeout, wantTook: 9 * time.Millisecond, wantState: StateOpen,
		},
		{
			name: "caller deadline longer than Timeout",
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), time.Hour)
			},
			wantErr: ErrTimeout, wantTook: 10 * time.Millisecond, wantState: StateOpen,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, _ := newTestBreaker(t, Settings{Timeout: 10 * time.Millisecond, FailureThreshold: 5})
				s := &store{}
				release := s.stallUntilReleased()
				defer release()
				for range 5 {
					ctx, cancel := tt.ctx()
					if tt.cancelIn > 0 {
						time.AfterFunc(tt.cancelIn, cancel)
					}
					start := time.Now()
					err := b.Do(ctx, s.call)
					cancel()
					if !errors.Is(err, tt.wantErr) {
						t.Fatalf("Do = %v, want %v", err, tt.wantErr)
					}
					if d := time.Since(start); d != tt.wantTook {
						t.Fatalf("Do took %v, want %v", d, tt.wantTook)
					}
				}
				if got := b.State(); got != tt.wantState {
					t.Errorf("after 5 such calls: %v, want %v (stats %+v)", got, tt.wantState, b.Stats())
				}
			})
		})
	}
}

// TestBreakerMaxInFlight: stalled calls hold their slots past their
// deadline; a call beyond MaxInFlight is refused at once without a store
// call; the slots come back when the store answers.
func TestBreakerMaxInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := newTestBreaker(t, Settings{MaxInFlight: 3, FailureThreshold: 100})
		s := &store{}
		release := s.stallUntilReleased()
		for range 3 {
			if err := b.Do(context.Background(), s.call); !errors.Is(err, ErrTimeout) {
				t.Fatalf("Do = %v, want ErrTimeout", err)
			}
		}
		start := time.Now()
		if err := b.Do(context.Background(), s.call); !errors.Is(err, ErrOverloaded) {
			t.Fatalf("Do with 3 stalled calls = %v, want ErrOverloaded", err)
		}
		if time.Since(start) != 0 || s.calls.Load() != 3 {
			t.Fatalf("overloaded call took %v and made %d store calls", time.Since(start), s.calls.Load())
		}
		release()
		synctest.Wait()
		if err := b.Do(context.Background(), s.call); err != nil {
			t.Fatalf("Do after the stall = %v", err)
		}
		if st := b.Stats(); st.MaxInFlight != 3 || st.Overloaded != 1 {
			t.Errorf("stats %+v", st)
		}
	})
}

// TestOverloadedCallsDoNotCount: a call refused with ErrOverloaded made no store call,
// and counts as neither success nor failure: however many there are, they do not open
// the breaker, nor reset its count of consecutive failures.
func TestOverloadedCallsDoNotCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, ch := newTestBreaker(t, Settings{MaxInFlight: 1, FailureThreshold: 2})
		s := &store{}
		s.set(io.EOF)
		b.Do(context.Background(), s.call) // one failure
		release := s.stallUntilReleased()
		defer release()
		stalled := make(chan error, 1)
		go func() { stalled <- b.Do(context.Background(), s.call) }()
		synctest.Wait() // the call holds the one slot, Do waits on it
		for range 5 {
			if err := b.Do(context.Background(), s.call); !errors.Is(err, ErrOverloaded) {
				t.Fatalf("Do beside a call in flight = %v, want ErrOverloaded", err)
			}
		}
		if got, st := b.State(), b.Stats(); got != StateClosed || st.Overloaded != 5 || st.Failures != 1 || st.Successes != 0 {
			t.Fatalf("after 5 overloaded calls: %v, stats %+v; want closed, 5 overloaded, 1 failure", got, st)
		}
		release()
		if err := <-stalled; !errors.Is(err, io.EOF) {
			t.Fatalf("the call in flight = %v, want the store's failure", err)
		}
		if got := b.State(); got != StateOpen {
			t.Errorf("after the second consecutive failure: %v, want open (changes %v)", got, ch.list())
		}
	})
}

// TestCallNotStarted: a caller whose context is done before Do starts the call (cancelled,
// or its deadline passed) gets the context's error at once, without a store call; the call
// counts as excluded, and as nothing else.
func TestCallNotStarted(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"cancelled", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}, context.Canceled},
		{"deadline passed", func() (context.Context, context.CancelFunc) {
			return context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
		}, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := newTestBreaker(t, Settings{FailureThreshold: 1})
			s := &store{}
			ctx, cancel := tc.ctx()
			defer cancel()
			if err := b.Do(ctx, s.call); !errors.Is(err, tc.want) || errors.Is(err, ErrTimeout) {
				t.Fatalf("Do = %v, want %v", err, tc.want)
			}
			if st := b.Stats(); s.calls.Load() != 0 || st != (Stats{Excluded: 1}) || b.State() != StateClosed {
				t.Errorf("%d store calls, stats %+v, state %v; want none, only Excluded 1, closed", s.calls.Load(), st, b.State())
			}
		})
	}
}

// halfOpenStalled opens b (FailureThreshold 1, OpenTimeout 1 s) with a failed call,
// waits out the open time in the synctest bubble, and makes the store's next calls
// answer nil once released.
func halfOpenStalled(b *Breaker) (s *store, release func()) {
	s = &store{}
	s.set(io.EOF)
	b.Do(context.Background(), s.call)
	time.Sleep(time.Second + time.Millisecond) // gobreaker: strictly after OpenTimeout
	s.set(nil)
	return s, s.stallUntilReleased()
}

// TestBreakerHalfOpenCancelledProbe: a probe the caller cancels does not
// count, and lets another probe through.
func TestBreakerHalfOpenCancelledProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := newTestBreaker(t, Settings{FailureThreshold: 1, OpenTimeout: time.Second})
		s, release := halfOpenStalled(b)
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(time.Millisecond, cancel)
		if err := b.Do(ctx, s.call); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled probe = %v", err)
		}
		release()
		if err := b.Do(context.Background(), s.call); err != nil {
			t.Fatalf("second probe = %v, want it let through", err)
		}
		if got := b.State(); got != StateClosed {
			t.Errorf("state %v, want closed", got)
		}
	})
}

func TestBreakerPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := newTestBreaker(t, Settings{FailureThreshold: 1})
		func() {
			defer func() {
				if r := recover(); r != "boom" {
					t.Errorf("recovered %v, want the call's panic", r)
				}
			}()
			b.Do(context.Background(), func(context.Context) error { panic("boom") })
		}()
		if got := b.State(); got != StateOpen {
			t.Errorf("a panicking call did not count as a failure: %v", got)
		}
	})
}

// TestBreakerIsFailure: a custom classification replaces the default.
func TestBreakerIsFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		unavailable := errors.New("unavailable")
		b, _ := newTestBreaker(t, Settings{
			FailureThreshold: 2,
			IsFailure:        func(err error) bool { return errors.Is(err, unavailable) },
		})
		s := &store{}
		s.set(io.EOF) // not a failure for this classification
		for range 5 {
			b.Do(context.Background(), s.call)
		}
		if b.State() != StateClosed {
			t.Fatal("opened on errors IsFailure rejects")
		}
		s.set(fmt.Errorf("wrapped: %w", unavailable))
		for range 2 {
			b.Do(context.Background(), s.call)
		}
		if b.State() != StateOpen {
			t.Fatal("did not open on errors IsFailure accepts")
		}
	})
}

// TestNewInvalid: New refuses a negative field, a MinCountedTimeout above the Timeout
// (its default's included), and more than 1<<16 HalfOpenProbes or 1<<30 FailureThreshold;
// it accepts each bound itself.
func TestNewInvalid(t *testing.T) {
	for _, st := range []Settings{
		{Timeout: -1}, {MaxInFlight: -1}, {FailureThreshold: -1}, {OpenTimeout: -1},
		{HalfOpenProbes: -1}, {MinCountedTimeout: -1}, {Timeout: time.Millisecond, MinCountedTimeout: time.Second},
		{MinCountedTimeout: defaultTimeout + 1},
		{HalfOpenProbes: 1 << 20}, {HalfOpenProbes: 1<<16 + 1}, {FailureThreshold: 1<<30 + 1}, {FailureThreshold: 1 << 33},
	} {
		if _, err := New(st); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", st, err)
		}
	}
	for _, st := range []Settings{
		{HalfOpenProbes: 1 << 16}, {FailureThreshold: 1 << 30},
		{Timeout: time.Millisecond, MinCountedTimeout: time.Millisecond}, {MinCountedTimeout: defaultTimeout},
	} {
		if _, err := New(st); err != nil {
			t.Errorf("New(%+v) = %v, want it accepted", st, err)
		}
	}
	b, err := New(Settings{})
	if err != nil {
		t.Fatal(err)
	}
	if b.timeout != defaultTimeout || b.State() != StateClosed {
		t.Errorf("defaults: timeout %v, state %v", b.timeout, b.State())
	}
}

// TestBreakerConcurrent runs many callers through a breaker whose store
// flips between failing and answering, under -race, and checks the
// counters add up and OnStateChange saw a consistent sequence.
func TestBreakerConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, ch := newTestBreaker(t, Settings{FailureThreshold: 3, OpenTimeout: 30 * time.Millisecond, MaxInFlight: 8})
		var fail atomic.Bool
		var wg sync.WaitGroup
		var results [5]atomic.Int64
		for g := range 16 {
			wg.Go(func() {
				for i := range 200 {
					err := b.Do(context.Background(), func(ctx context.Context) error {
						time.Sleep(time.Duration(g%3) * time.Millisecond)
						if fail.Load() {
							return io.EOF
						}
						return nil
					})
					switch {
					case err == nil:
						results[0].Add(1)
					case errors.Is(err, ErrOpen):
						results[1].Add(1)
					case errors.Is(err, ErrOverloaded):
						results[2].Add(1)
					case errors.Is(err, io.EOF):
						results[3].Add(1)
					default:
						results[4].Add(1)
					}
					if i%40 == 0 {
						fail.Store(g%2 == 0)
						time.Sleep(20 * time.Millisecond)
					}
				}
			})
		}
		wg.Wait()
		st := b.Stats()
		var got [len(results)]int64
		total := int64(0)
		for i := range results {
			got[i] = results[i].Load()
			total += got[i]
		}
		if total != 16*200 || got[1] != st.Rejected || got[2] != st.Overloaded || got[4] != 0 {
			t.Errorf("results (ok, open, overloaded, EOF, other) %v, stats %+v", got, st)
		}
		// Every change starts where the previous one ended.
		prev := "closed"
		for _, c := range ch.list() {
			from, to, _ := strings.Cut(c, "->")
			if from != prev {
				t.Fatalf("change %q does not follow %q: %v", c, prev, ch.list())
			}
			prev = to
		}
		// The transition counters agree with the changes OnStateChange heard of.
		var into [3]int64
		for _, c := range ch.list() {
			_, to, _ := strings.Cut(c, "->")
			into[map[string]State{"closed": StateClosed, "half-open": StateHalfOpen, "open": StateOpen}[to]]++
		}
		if st.Opened != into[StateOpen] || st.HalfOpened != into[StateHalfOpen] || st.Closed != into[StateClosed] || st.Opened == 0 {
			t.Errorf("transitions opened %d, half-opened %d, closed %d; OnStateChange heard %v", st.Opened, st.HalfOpened, st.Closed, into)
		}
		t.Logf("%d state changes; stats %+v", len(ch.list()), st)
	})
}

// TestBreakerSlowProbe: a half-open probe returns to its caller at Timeout, as any call
// does, but its call goes on to probeTimeout: an answer by then closes the breaker (a
// store back after an outage, its first call paying a reconnect), silence opens it again.
// A call marked to linger (a refill's take) that is let through as the probe is a probe
// like any other: its answer, not Do's timeout, settles the breaker.
func TestBreakerSlowProbe(t *testing.T) {
	tests := []struct {
		name      string
		answerIn  time.Duration // after Do returned; 0: never
		want      State
		successes int64
	}{
		{"answers after Timeout", 30 * time.Millisecond, StateClosed, 1},
		{"answers just within probeTimeout", 89 * time.Millisecond, StateClosed, 1},
		{"silent past probeTimeout", 0, StateOpen, 0},
	}
	for _, tc := range tests {
		for _, lingering := range []bool{false, true} {
			name := tc.name
			ctx := context.Background()
			if lingering {
				name, ctx = name+", lingering", linger.With(ctx)
			}
			t.Run(name, func(t *testing.T) {
				checkSlowProbe(t, ctx, tc.answerIn, tc.want, tc.successes)
			})
		}
	}
}

// checkSlowProbe runs a half-open breaker's probe, made with ctx, whose store answers
// answerIn after Do returned at Timeout (0: never), and checks the state it leaves and
// the successes counted.
func checkSlowProbe(t *testing.T, ctx context.Context, answerIn time.Duration, wantState State, successes int64) {
	synctest.Test(t, func(t *testing.T) {
		b, ch := newTestBreaker(t, Settings{Timeout: 10 * time.Millisecond, FailureThreshold: 1, OpenTimeout: time.Second})
		s, release := halfOpenStalled(b)
		defer release()
		start := time.Now()
		if err := b.Do(ctx, s.call); !errors.Is(err, ErrTimeout) {
			t.Fatalf("slow probe = %v, want ErrTimeout", err)
		}
		if d := time.Since(start); d != 10*time.Millisecond {
			t.Fatalf("the probe's Do returned after %v, want Timeout", d)
		}
		if got := b.State(); got != StateHalfOpen {
			t.Fatalf("while the probe's call goes on: %v, want half-open", got)
		}
		if err := b.Do(context.Background(), s.call); !errors.Is(err, ErrOpen) {
			t.Fatalf("a second call while the probe goes on = %v, want ErrOpen", err)
		}
		if answerIn > 0 {
			time.Sleep(answerIn)
			release()
		} else {
			time.Sleep(200 * time.Millisecond)
		}
		synctest.Wait()
		if got := b.State(); got != wantState {
			t.Errorf("after the probe's call ended: %v, want %v (changes %v)", got, wantState, ch.list())
		}
		if st := b.Stats(); st.Successes != successes || st.Abandoned != 1 || st.Timeouts != 1 {
			t.Errorf("stats %+v, want %d successes, 1 abandoned, 1 timeout", st, successes)
		}
		release()
		synctest.Wait()
		if n := b.Stats().InFlight; n != 0 {
			t.Errorf("%d calls in flight after the store answered", n)
		}
	})
}

// TestLingeringCall: a call marked to linger (a refill's take) returns to its caller at
// Timeout with ErrTimeout, counted then, as any call; its context lives on to
// probeTimeout, so an answer by then is read by the call, and nothing it does when it
// ends changes the breaker's counts or state.
func TestLingeringCall(t *testing.T) {
	tests := []struct {
		name     string
		answerIn time.Duration // after Do returned; 0: never
		read     bool          // the call read an answer
	}{
		{"answers after Timeout", 30 * time.Millisecond, true},
		{"answers just within probeTimeout", 89 * time.Millisecond, true},
		{"silent past probeTimeout", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, ch := newTestBreaker(t, Settings{Timeout: 10 * time.Millisecond, FailureThreshold: 5, OpenTimeout: time.Second})
				answer := make(chan struct{})
				var read, ctxDone atomic.Bool
				var ended time.Duration
				start := time.Now()
				err := b.Do(linger.With(context.Background()), func(ctx context.Context) error {
					defer func() { ended = time.Since(start) }()
					select {
					case <-answer:
						read.Store(ctx.Err() == nil)
						return nil
					case <-ctx.Done():
						ctxDone.Store(true)
						return ctx.Err()
					}
				})
				if !errors.Is(err, ErrTimeout) {
					t.Fatalf("Do = %v, want ErrTimeout", err)
				}
				if d := time.Since(start); d != 10*time.Millisecond {
					t.Fatalf("Do returned after %v, want Timeout", d)
				}
				want := Stats{Calls: 1, Failures: 1, Timeouts: 1, Abandoned: 1, InFlight: 1, MaxInFlight: 1}
				if st := b.Stats(); st != want {
					t.Fatalf("stats when Do returned %+v, want %+v", st, want)
				}
				if tc.answerIn > 0 {
					time.Sleep(tc.answerIn)
					close(answer)
				} else {
					time.Sleep(200 * time.Millisecond)
				}
				synctest.Wait()
				if read.Load() != tc.read || ctxDone.Load() == tc.read {
					t.Errorf("the call read an answer: %v, its context ended first: %v; want read %v", read.Load(), ctxDone.Load(), tc.read)
				}
				if !tc.read && ended != 100*time.Millisecond {
					t.Errorf("a silent call ended after %v, want probeTimeout", ended)
				}
				want.InFlight = 0
				if st := b.Stats(); st != want || b.State() != StateClosed || len(ch.list()) != 0 {
					t.Errorf("after the call ended: %v, stats %+v, changes %v; want closed, %+v, none", b.State(), st, ch.list(), want)
				}
			})
		})
	}
}

// TestProbeTimeout: ten times the Timeout, at most half the open time, at least the
// Timeout.
func TestProbeTimeout(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct{ timeout, open, want time.Duration }{
		{10 * ms, time.Second, 100 * ms},
		{10 * ms, 200 * ms, 100 * ms},
		{10 * ms, 50 * ms, 25 * ms},
		{100 * ms, time.Second, 500 * ms},
		{50 * ms, 60 * ms, 50 * ms},
	} {
		if got := probeTimeout(tc.timeout, tc.open); got != tc.want {
			t.Errorf("probeTimeout(%v, %v) = %v, want %v", tc.timeout, tc.open, got, tc.want)
		}
	}
}

// TestInFlightHoldsAProbeUntilItsOutcomeIsIn: a call's slot (Stats.InFlight) is freed only
// once gobreaker has the call's outcome, so that a caller who reads no call in flight on a
// half-open breaker knows its own call will not be refused as a second probe (hybrid's
// Close waits so for another caller's probe). When a probe's success closes the breaker,
// that probe still holds its slot. The call's goroutine ends about when Do reads its
// outcome: 50 rounds give the two every chance to run in either order.
func TestInFlightHoldsAProbeUntilItsOutcomeIsIn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var b *Breaker
		var seen []int64 // InFlight as each probe closed the breaker
		b, err := New(Settings{FailureThreshold: 1, OpenTimeout: time.Second, OnStateChange: func(_, to State) {
			if to == StateClosed {
				seen = append(seen, b.Stats().InFlight)
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for range 50 {
			b.Do(ctx, func(context.Context) error { return io.EOF })
			if got := b.State(); got != StateOpen {
				t.Fatalf("after a failure: state %v, want open", got)
			}
			time.Sleep(time.Second + time.Millisecond) // gobreaker: strictly after OpenTimeout
			if err := b.Do(ctx, func(context.Context) error { return nil }); err != nil {
				t.Fatalf("probe: %v", err)
			}
		}
		synctest.Wait()
		if len(seen) != 50 {
			t.Fatalf("%d probes closed the breaker, want 50", len(seen))
		}
		for i, n := range seen {
			if n != 1 {
				t.Fatalf("probe %d closed the breaker with %d calls in flight, want itself: 1", i, n)
			}
		}
		if n := b.Stats().InFlight; n != 0 {
			t.Fatalf("%d calls in flight after the last, want 0", n)
		}
	})
}

// TestInFlightHoldsALeftCallUntilItsOutcomeIsIn: a call Do gives up on at its deadline
// keeps its slot until its outcome is reported, also when the call itself ends first:
// OnStateChange, told that the call's timeout opened the breaker, waits for the call's
// goroutine to end and still reads it in flight. The call is abandoned (an ordinary
// call: Do reports its timeout) or left (a half-open probe, whose own longer deadline
// reports it, after Do has returned).
func TestInFlightHoldsALeftCallUntilItsOutcomeIsIn(t *testing.T) {
	for _, probe := range []bool{false, true} {
		t.Run(map[bool]string{false: "abandoned", true: "probe"}[probe], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var b *Breaker
				seen := int64(-1) // InFlight as the timeout opened the breaker, the call ended
				b, err := New(Settings{FailureThreshold: 1, Timeout: 50 * time.Millisecond, OpenTimeout: time.Second,
					OnStateChange: func(_, to State) {
						if to == StateOpen {
							time.Sleep(time.Millisecond) // the call's last nanosecond
							synctest.Wait()              // its goroutine has ended
							seen = b.Stats().InFlight
						}
					}})
				if err != nil {
					t.Fatal(err)
				}
				ctx := context.Background()
				if probe {
					b.Do(ctx, func(context.Context) error { return io.EOF })
					synctest.Wait()
					time.Sleep(time.Second + time.Millisecond) // gobreaker: strictly after OpenTimeout
					if got := b.State(); got != StateHalfOpen {
						t.Fatalf("state %v, want half-open", got)
					}
					seen = -1
				}
				err = b.Do(ctx, func(ctx context.Context) error {
					// It ends just after its deadline: whoever reports its timeout (Do for
					// the abandoned call, the probe's timer) has moved its state first.
					<-ctx.Done()
					time.Sleep(time.Nanosecond)
					return ctx.Err()
				})
				if !errors.Is(err, ErrTimeout) {
					t.Fatalf("Do = %v, want ErrTimeout", err)
				}
				time.Sleep(time.Minute) // past a probe's own deadline
				synctest.Wait()
				if seen != 1 {
					t.Fatalf("the timeout opened the breaker with %d calls in flight, want the call's own: 1", seen)
				}
				if n := b.Stats().InFlight; n != 0 {
					t.Fatalf("%d calls in flight once the call ended, want 0", n)
				}
			})
		})
	}
}

// TestOnStateChangePanics: a panic in OnStateChange goes on to the caller of the Do that
// told the change, frees the call's slot, and leaves the breaker whole: the change
// queued behind the one that panicked is told by the next call, and later changes are
// told as they happen. Three ways a Do tells a change: reporting a call's outcome, an
// overloaded call reporting its exclusion (it tells the change its own Allow made), and
// a call whose fn panicked, which goes on with fn's panic.
func TestOnStateChangePanics(t *testing.T) {
	t.Run("outcome", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var told []string
			panicked := false
			b, err := New(Settings{FailureThreshold: 1, OpenTimeout: time.Second, OnStateChange: func(from, to State) {
				told = append(told, from.String()+"->"+to.String())
				if to == StateHalfOpen && !panicked {
					panicked = true
					panic("boom")
				}
			}})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			b.Do(ctx, func(context.Context) error { return io.EOF })
			time.Sleep(time.Second + time.Millisecond) // gobreaker: strictly after OpenTimeout
			// The probe succeeds: open->half-open and half-open->closed are queued when
			// Do reports it, and telling the first panics.
			if r := recovered(func() { b.Do(ctx, func(context.Context) error { return nil }) }); r != "boom" {
				t.Errorf("recovered %v, want OnStateChange's panic", r)
			}
			// The call's slot is freed when its goroutine has ended too, which may be
			// after Do returned: wait for it.
			synctest.Wait()
			if n := b.Stats().InFlight; n != 0 {
				t.Errorf("%d calls in flight after the panic, want 0", n)
			}
			if got := b.State(); got != StateClosed {
				t.Errorf("state %v after the probe succeeded, want closed", got)
			}
			b.Do(ctx, func(context.Context) error { return io.EOF })
			want := []string{"closed->open", "open->half-open", "half-open->closed", "closed->open"}
			if !slices.Equal(told, want) {
				t.Errorf("OnStateChange told %v, want %v", told, want)
			}
		})
	})
	t.Run("overloaded", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b, err := New(Settings{FailureThreshold: 1, MaxInFlight: 1, Timeout: 50 * time.Millisecond, OpenTimeout: time.Second,
				OnStateChange: func(_, to State) {
					if to == StateHalfOpen {
						panic("boom")
					}
				}})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			// A call that ignores its context times out, opens the breaker and keeps
			// the one slot.
			stall := make(chan struct{})
			b.Do(ctx, func(context.Context) error { <-stall; return nil })
			time.Sleep(time.Second + time.Millisecond)
			// The next call's Allow moves the breaker to half-open; the call is
			// overloaded, and its report tells the change, which panics.
			if r := recovered(func() { b.Do(ctx, func(context.Context) error { return nil }) }); r != "boom" {
				t.Errorf("recovered %v, want OnStateChange's panic", r)
			}
			if n := b.Stats().InFlight; n != 1 {
				t.Errorf("%d calls in flight after the overloaded call, want the stalled one: 1", n)
			}
			close(stall)
			synctest.Wait()
			if n := b.Stats().InFlight; n != 0 {
				t.Errorf("%d calls in flight once the stalled call ended, want 0", n)
			}
			if st := b.Stats(); st.Overloaded != 1 {
				t.Errorf("Overloaded %d, want 1", st.Overloaded)
			}
		})
	})
	t.Run("fn panicked", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b, err := New(Settings{FailureThreshold: 1, OnStateChange: func(_, to State) { panic("callback") }})
			if err != nil {
				t.Fatal(err)
			}
			// fn's panic opens the breaker, and telling that panics too: fn's goes on.
			if r := recovered(func() { b.Do(context.Background(), func(context.Context) error { panic("fn") }) }); r != "fn" {
				t.Errorf("recovered %v, want fn's panic", r)
			}
			synctest.Wait() // the call's goroutine frees its slot as it ends
			if n := b.Stats().InFlight; n != 0 {
				t.Errorf("%d calls in flight after the panic, want 0", n)
			}
		})
	})
}

// recovered runs f and returns what it panicked with, or nil.
func recovered(f func()) (r any) {
	defer func() { r = recover() }()
	f()
	return nil
}
