package breaker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/fleetlimit/fleetlimit/internal/linger"
	"github.com/fleetlimit/fleetlimit/internal/storeerr"
	"github.com/fleetlimit/fleetlimit/internal/sysclock"
)

// defaultTimeout is the deadline of each guarded call when Settings.Timeout is zero.
const defaultTimeout = 10 * time.Millisecond

// Defaults for the other zero fields of Settings.
const (
	defaultMaxInFlight      = 64
	defaultFailureThreshold = 5
	defaultOpenTimeout      = time.Second
	defaultHalfOpenProbes   = 1
)

var (
	// ErrOpen is returned by Do, without calling the store, while the
	// breaker is open, and while it is half-open and its probes are already
	// in flight. The error also wraps gobreaker's ErrOpenState or
	// ErrTooManyRequests.
	ErrOpen = errors.New("breaker: open")

	// ErrTimeout is returned by Do when the call did not return by its
	// deadline; Do returns at the deadline whether or not the call has.
	// The error also matches context.DeadlineExceeded.
	ErrTimeout = errors.New("breaker: store call timed out")

	// ErrOverloaded is returned by Do, without calling the store, when
	// MaxInFlight calls are already running (most likely stalled on an
	// unresponsive store): the request should go to its fallback at once.
	ErrOverloaded = errors.New("breaker: too many store calls in flight")

	// ErrInvalidConfig is wrapped by every error this package returns for a
	// configuration it cannot honour: Settings that New rejects, and a
	// Policy a limit cannot run (ErrNoPolicy, for the zero Policy, also
	// matches it).
	ErrInvalidConfig = errors.New("breaker: invalid configuration")
)

// The errors returned while open are built once: a rejection allocates
// nothing.
var (
	errOpenState   = fmt.Errorf("%w: %w", ErrOpen, gobreaker.ErrOpenState)
	errTooManyReqs = fmt.Errorf("%w (half-open, probes in flight): %w", ErrOpen, gobreaker.ErrTooManyRequests)
)

// State is the state of a Breaker.
type State int8

const (
	// StateClosed: calls go to the store; store failures are counted.
	StateClosed State = iota
	// StateHalfOpen: a few probe calls go to the store; their success
	// closes the breaker, a failure opens it again.
	StateHalfOpen
	// StateOpen: no call goes to the store; Do returns ErrOpen at once.
	StateOpen
)

// String returns "closed", "half-open" or "open".
func (s State) String() string {
	switch s {
	case StateClosed:
		return "closed"
	case StateHalfOpen:
		return "half-open"
	case StateOpen:
		return "open"
	}
	return fmt.Sprintf("State(%d)", int8(s))
}

func fromGobreaker(s gobreaker.State) State {
	switch s {
	case gobreaker.StateHalfOpen:
		return StateHalfOpen
	case gobreaker.StateOpen:
		return StateOpen
	}
	return StateClosed
}

// Settings configures a Breaker. Every field is optional; a zero field
// takes the default named in its comment, and a negative one is an error.
type Settings struct {
	// Name identifies the breaker (for example the Redis address) in
	// errors and logs.
	Name string

	// Timeout is the deadline of each guarded call: Do returns by then
	// whether or not the call has returned. The article recommends 5 to
	// 20 ms. default: 10 ms
	Timeout time.Duration

	// MinCountedTimeout: a call that times out counts as a store failure
	// only if it was given at least this long. A caller's context deadline
	// that leaves the call less is the caller's own choice, and its expiry
	// counts as neither success nor failure. default: Timeout/2
	//
	// A timeout seen late also counts as neither: when Do wakes at the
	// deadline more than the call's budget after it (at twice the budget or
	// later), the process was not scheduled for that long (a CPU-starved
	// client, a long GC pause), and the missed deadline says nothing about
	// the store. Stats.Starved counts these.
	MinCountedTimeout time.Duration

	// MaxInFlight bounds the store calls running at once, including calls
	// Do has given up on at their deadline that have not returned yet (a
	// stalled store holds them, and their connections). A call beyond the
	// bound gets ErrOverloaded at once. Size it near the client's pool
	// size. default: 64
	MaxInFlight int

	// FailureThreshold is the number of consecutive store failures that
	// open the breaker. default: 5
	FailureThreshold int

	// OpenTimeout is how long the breaker stays open before it lets probes
	// through (half-open). default: 1 s
	OpenTimeout time.Duration

	// HalfOpenProbes is the number of calls let through while half-open,
	// and the number of consecutive successes that close the breaker.
	// A probe's caller gets its answer or ErrTimeout by Timeout, as any
	// caller does, but the probe's call goes on for up to ten times Timeout
	// (at most OpenTimeout/2), and its answer, when it comes, settles the
	// breaker's state: the first call after an outage pays a reconnect.
	// default: 1
	HalfOpenProbes int

	// IsFailure reports whether an error a call returned means the store
	// did not answer; other errors (a denied request, a script error, a
	// missing key) are answers, and count as successes. The caller's own
	// cancellation, and the expiry of a caller's deadline shorter than
	// MinCountedTimeout, are never passed to it. default: the rule of
	// global.IsUnavailable, by which the global tier classifies its errors:
	// a timeout, a network error or any other failure below the Redis
	// protocol, a closed client, a pool timeout and a Redis reply that says
	// the server cannot serve now count; an error that carries one of
	// global's classes counts by its class; context.Canceled never counts.
	// Less a MOVED or ASK reply: a Cluster node that sends one answered, and
	// during a resharding the calls for a moving slot's keys would otherwise
	// open a healthy master's breaker.
	IsFailure func(error) bool

	// OnStateChange is told about every state change, in order, after the
	// breaker's locks are released, on the goroutine of a call that caused
	// or observed the change. It may call the breaker. The change from open
	// to half-open happens when the breaker is next used (Do or State)
	// after OpenTimeout, not on a timer. A call keeps its place among
	// MaxInFlight (Stats.InFlight) while its own goroutine tells of the
	// change its outcome caused: a Do from OnStateChange under MaxInFlight 1
	// is ErrOverloaded. (A change another goroutine is already telling of is
	// told by that goroutine, after the call may have ended.) A panic in it
	// goes on to the caller of the Do or State that told the change, and the
	// breaker stays whole: the changes after it are told by the next Do or
	// State that looks. A change told after Do returned, on the goroutine of a
	// call left to run or of its deadline's timer (a half-open probe that
	// outlives Do: the usual end of an outage), has no caller to go to: a
	// panic there ends the program, as a panic on any goroutine of its own
	// does.
	OnStateChange func(from, to State)

	// Clock is where Do reads the time and sets its deadlines: the start
	// of each call, the time left before the caller's deadline (read as an
	// instant of this clock), and the timer at which Do returns ErrTimeout.
	// With the system clock the context a call gets carries that deadline,
	// which go-redis applies to the socket when ContextTimeoutEnabled is set;
	// with any other clock it carries only the caller's deadline, and is done,
	// with context.DeadlineExceeded, when this clock's timer fires. The open
	// period (OpenTimeout) follows the system clock whatever this is (see
	// Clock). default: nil, the system clock (time.Now and time.AfterFunc)
	Clock Clock
}

// A Breaker guards the calls to one store (one Redis server), shared by
// every limit that uses the store; a hybrid.Limiter on a Redis Cluster keeps
// one per master, made from one Breaker's Settings. It is a circuit breaker
// (github.com/sony/gobreaker/v2) that counts only the store's failures,
// plus a deadline on every call and a bound on the calls in flight, so that
// an unresponsive store costs a request at most Timeout, and nothing while
// the breaker is open.
//
// Most callers use Do. A Breaker is safe for simultaneous use by multiple
// goroutines; it starts one goroutine per guarded call, which ends when the
// call returns.
type Breaker struct {
	settings    Settings // as given to New
	cb          *gobreaker.TwoStepCircuitBreaker[struct{}]
	timeout     time.Duration
	probe       time.Duration // a half-open probe's deadline: probeTimeout
	minCounted  time.Duration
	maxInFlight int64
	isFailure   func(error) bool
	onChange    func(from, to State)
	clock       Clock
	sysClock    bool // clock is the system clock: its deadlines go into the call's context

	inFlight atomic.Int64
	stats    counters

	evPending atomic.Int32 // len(events), readable without evMu
	evMu      sync.Mutex
	// The fields below are guarded by evMu.
	events      []stateEvent
	dispatching bool
}

type stateEvent struct{ from, to State }

type counters struct {
	calls, successes, failures, timeouts, excluded, rejected, overloaded, abandoned atomic.Int64
	starved                                                                         atomic.Int64
	maxInFlight                                                                     atomic.Int64
	transitions                                                                     [3]atomic.Int64 // by the state entered
}

// Markers passed to gobreaker's done callback: Do classifies the outcome
// itself.
var (
	errFailure  = errors.New("store failure")
	errExcluded = errors.New("not the store's outcome")
)

// New returns a closed Breaker, or an error wrapping ErrInvalidConfig.
func New(st Settings) (*Breaker, error) {
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"Timeout", int64(st.Timeout)},
		{"MinCountedTimeout", int64(st.MinCountedTimeout)},
		{"MaxInFlight", int64(st.MaxInFlight)},
		{"FailureThreshold", int64(st.FailureThreshold)},
		{"OpenTimeout", int64(st.OpenTimeout)},
		{"HalfOpenProbes", int64(st.HalfOpenProbes)},
	} {
		if f.v < 0 {
			return nil, fmt.Errorf("%w: %s is negative", ErrInvalidConfig, f.name)
		}
	}
	if st.HalfOpenProbes > 1<<16 || st.FailureThreshold > 1<<30 {
		return nil, fmt.Errorf("%w: HalfOpenProbes or FailureThreshold too large", ErrInvalidConfig)
	}
	b := &Breaker{
		settings:    st,
		timeout:     cmpOr(st.Timeout, defaultTimeout),
		maxInFlight: int64(cmpOr(st.MaxInFlight, defaultMaxInFlight)),
		isFailure:   st.IsFailure,
		onChange:    st.OnStateChange,
		clock:       st.Clock,
	}
	if b.clock == nil {
		b.clock = sysclock.Clock{}
	}
	b.sysClock = isSystem(b.clock)
	b.probe = probeTimeout(b.timeout, cmpOr(st.OpenTimeout, defaultOpenTimeout))
	b.minCounted = cmpOr(st.MinCountedTimeout, b.timeout/2)
	if b.minCounted > b.timeout {
		return nil, fmt.Errorf("%w: MinCountedTimeout %v exceeds Timeout %v", ErrInvalidConfig, b.minCounted, b.timeout)
	}
	if b.isFailure == nil {
		b.isFailure = storeerr.IsNodeFailure
	}
	threshold := uint32(cmpOr(st.FailureThreshold, defaultFailureThreshold))
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        st.Name,
		MaxRequests: uint32(cmpOr(st.HalfOpenProbes, defaultHalfOpenProbes)),
		Timeout:     cmpOr(st.OpenTimeout, defaultOpenTimeout),
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= threshold
		},
		IsSuccessful: func(err error) bool { return err == nil },
		IsExcluded:   func(err error) bool { return err == errExcluded },
		// gobreaker calls this with its mutex held: only queue the event.
		OnStateChange: func(_ string, from, to gobreaker.State) {
			b.stats.transitions[fromGobreaker(to)].Add(1)
			b.evMu.Lock()
			b.events = append(b.events, stateEvent{fromGobreaker(from), fromGobreaker(to)})
			b.evPending.Store(int32(len(b.events)))
			b.evMu.Unlock()
		},
	})
	return b, nil
}

// probeTimeout is the deadline of a half-open probe's call: ten times the Timeout, at
// most half the open time, never less than the Timeout. The first call after an outage
// pays what a healthy one does not: a new connection's dial and handshake, and, after a
// restart, Redis loading the scripts again. Held to the Timeout, such a probe times out
// on a store that is back, and the breaker stays open another open time for it.
func probeTimeout(timeout, open time.Duration) time.Duration {
	return max(timeout, min(10*timeout, open/2))
}

func cmpOr[T int | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// Settings returns the Settings the breaker was made with, as given to New (zero
// fields stay zero): New(b.Settings()) makes a breaker that behaves as b does, which is
// how a caller guarding several stores with one configuration makes one breaker each.
func (b *Breaker) Settings() Settings { return b.settings }

// State returns the breaker's state, first moving it from open to
// half-open if OpenTimeout has passed.
func (b *Breaker) State() State {
	s := fromGobreaker(b.cb.State())
	b.dispatch()
	return s
}

type outcome struct {
	err      error
	panicked bool
	panicVal any
}

// Do calls fn, the store call, unless the breaker is open, and returns its
// error. The call's deadline is the earlier of ctx's deadline and Timeout
// from now, on the breaker's Clock. fn gets a context with ctx's values that
// is done at that deadline, when ctx is done, or when Do returns; with the
// system clock its Deadline method reports the deadline (see
// Settings.Clock). fn must return the store's error as it is (wrapped with
// %w at most) so that it can be classified.
//
// Do returns by that deadline even if fn has not returned: fn then keeps
// running on its own goroutine until it does, holding one of MaxInFlight
// slots, and its result is dropped (fn must not write to memory the caller
// reads after Do returns). Use a client that honours the context, or a
// small read timeout, so abandoned calls end soon.
//
// A half-open probe's call (one made with no caller deadline shorter than
// Timeout) is the exception: its context is done only at the probe's own,
// longer deadline (Settings.HalfOpenProbes), and its outcome, when it comes
// after Do has returned ErrTimeout, is what settles the breaker's state. A
// hybrid.Limiter's refill is another: its call keeps its context to the same
// longer deadline, so that an answer that comes after Do returned ErrTimeout
// is still read (its Redis grant is spent either way); its timeout is counted
// when Do returns, as any call's.
//
// The error is nil or fn's error, or:
//   - ErrOpen (no call made) while the breaker is open or its half-open
//     probes are in flight;
//   - ErrOverloaded (no call made) when MaxInFlight calls are running;
//   - ErrTimeout, also matching context.DeadlineExceeded, when the deadline
//     passed first;
//   - ctx's error if ctx was done before the call could start, or was
//     cancelled while it ran.
//
// Only store failures (IsFailure) and counted timeouts count towards
// opening the breaker. The caller's cancellation, and a timeout under a
// caller's deadline shorter than MinCountedTimeout, count as nothing. If fn
// panics while Do waits for it, the panic counts as a failure and Do
// panics with the same value.
func (b *Breaker) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		b.stats.excluded.Add(1)
		return fmt.Errorf("breaker: call not started: %w", err)
	}
	done, err := b.cb.Allow()
	// Half-open once Allow let the call through: it was let through as a probe (a
	// breaker reaches half-open only from open). One a concurrent probe closed the
	// breaker meanwhile is taken as a plain call, as gobreaker takes its outcome.
	probe := err == nil && b.cb.State() == gobreaker.StateHalfOpen
	if err != nil {
		b.stats.rejected.Add(1)
		b.dispatch()
		if errors.Is(err, gobreaker.ErrTooManyRequests) {
			return errTooManyReqs
		}
		return errOpenState
	}
	n := b.inFlight.Add(1)
	if n > b.maxInFlight {
		b.stats.overloaded.Add(1)
		defer b.inFlight.Add(-1)    // after the report, as for a call made, even if OnStateChange panics
		b.report(done, errExcluded) // the report tells OnStateChange of the change Allow made, if any
		return ErrOverloaded
	}
	for m := b.stats.maxInFlight.Load(); n > m; m = b.stats.maxInFlight.Load() {
		if b.stats.maxInFlight.CompareAndSwap(m, n) {
			break
		}
	}
	b.stats.calls.Add(1)

	start := b.clock.Now()
	budget := b.timeout
	if dl, ok := ctx.Deadline(); ok && dl.Sub(start) < budget {
		budget = dl.Sub(start)
	}
	// A half-open probe's call has until probeTimeout, though Do returns at budget as
	// any call's does: the call then settles the breaker's state itself when it ends. A
	// lingering call (internal/linger) has as long, and settles nothing when it ends.
	callBudget := budget
	lingers := !probe && linger.Wanted(ctx)
	if (probe || lingers) && budget == b.timeout {
		callBudget = b.probe
	}
	cctx := newCallCtx(ctx)
	if b.sysClock {
		cctx.deadline = start.Add(callBudget)
	}

	// The call's goroutine and Do race to settle it: whoever moves state
	// from running decides whether Do reads the result (finished) or the
	// goroutine is on its own (abandoned; a probe left to settle the
	// breaker's state: by its end, or by its deadline if it has not ended; or
	// a lingering call, whose context lives to its own deadline).
	const running, finished, abandoned, left, lingering = 0, 1, 2, 3, 4
	var state atomic.Int32
	var settled atomic.Bool
	// The call's slot (inFlight) is freed once both its goroutine has ended and its
	// outcome is reported (gobreaker has it, and this goroutine has told OnStateChange
	// of the changes it is to tell), whichever comes last: a caller that reads no call
	// in flight on a half-open breaker knows no probe let through is pending there
	// either (hybrid's Close waits so for another caller's probe).
	var parts atomic.Int32
	parts.Store(2)
	release := func() {
		if parts.Add(-1) == 0 {
			b.inFlight.Add(-1)
		}
	}
	settle := func(o outcome) {
		if !settled.CompareAndSwap(false, true) {
			return
		}
		defer release()
		if o.panicked {
			b.report(done, errFailure)
		} else {
			// The caller has gone: its context's end is no longer the outcome's.
			b.finish(done, context.Background(), cctx, o.err, callBudget, b.clock.Now().Sub(start), true)
		}
		cctx.end(context.Canceled)
	}
	stop := b.clock.AfterFunc(callBudget, func() {
		cctx.expire()
		if state.Load() == left {
			settle(outcome{err: context.DeadlineExceeded})
		}
	})
	wait, stopWait := cctx.done, func() bool { return false }
	if callBudget > budget {
		ch := make(chan struct{})
		wait, stopWait = ch, b.clock.AfterFunc(budget, func() { close(ch) })
	}
	res := make(chan outcome, 1)
	go func() {
		defer release()
		o := call(cctx, fn)
		res <- o // buffered: never blocks
		if state.CompareAndSwap(running, finished) {
			return // Do reports the outcome
		}
		switch state.Load() {
		case left:
			stop()
			settle(o)
		case lingering:
			stop()
			cctx.end(context.Canceled)
		}
		if o.panicked {
			// Nobody waits for this call any more: the panic goes on, as
			// any panic on a goroutine of its own does.
			panic(o.panicVal)
		}
	}()
	handedOff := false
	defer func() {
		stopWait()
		if !handedOff {
			stop()
			cctx.end(context.Canceled) // the call's context ends when Do returns
		}
	}()

	var o outcome
	answered := false
	select {
	case o = <-res:
		answered = true
	case <-wait: // the deadline passed
	case <-ctx.Done():
		cctx.end(ctx.Err()) // unless the deadline passed first
	}
	if !answered {
		if !lingers && cctx.Err() == nil && state.CompareAndSwap(running, left) {
			// A probe past Do's deadline: the caller gets the timeout, the call goes
			// on to its own deadline and its end settles the probe.
			handedOff = true
			b.stats.abandoned.Add(1)
			b.stats.timeouts.Add(1) // Do returns at its deadline; settle counts the rest
			if cctx.Err() != nil {  // its deadline passed meanwhile
				settle(outcome{err: context.DeadlineExceeded})
			}
			return &timeoutError{budget: budget, cause: context.DeadlineExceeded}
		}
		if lingers && cctx.Err() == nil && state.CompareAndSwap(running, lingering) {
			// Past Do's deadline: the timeout is counted now, and the call goes on
			// to its own deadline for its caller to read what it answers.
			handedOff = true
			b.stats.abandoned.Add(1)
			defer release()
			return b.finish(done, ctx, deadlinePassed{cctx}, context.DeadlineExceeded, budget, b.clock.Now().Sub(start), false)
		}
		if state.CompareAndSwap(running, abandoned) {
			b.stats.abandoned.Add(1)
			defer release()
			return b.finish(done, ctx, cctx, cctx.Err(), budget, b.clock.Now().Sub(start), false)
		}
		o = <-res // it finished: its send came before its state change
	}
	defer release() // the call finished: Do reports it
	if o.panicked {
		// fn's panic goes on, with its own value even if OnStateChange panics in the report.
		defer func() { panic(o.panicVal) }()
		b.report(done, errFailure)
		return nil
	}
	return b.finish(done, ctx, cctx, o.err, budget, b.clock.Now().Sub(start), false)
}

func call(ctx context.Context, fn func(context.Context) error) (o outcome) {
	defer func() {
		if r := recover(); r != nil {
			o = outcome{panicked: true, panicVal: r}
		}
	}()
	return outcome{err: fn(ctx)}
}

// finish classifies the outcome of a call, reports it to gobreaker and
// returns the error for the caller.
// finish settles a call given budget that returned err (or was abandoned with it) after
// took; handedOff: a probe Do returned from at its deadline, counted in Timeouts then.
func (b *Breaker) finish(done func(error), ctx, cctx context.Context, err error, budget, took time.Duration, handedOff bool) error {
	switch {
	case err == nil:
		b.stats.successes.Add(1)
		b.report(done, nil)
		return nil
	case errors.Is(ctx.Err(), context.Canceled):
		// The caller gave up; whatever happened to the call says nothing
		// about the store.
		b.stats.excluded.Add(1)
		b.report(done, errExcluded)
		if errors.Is(err, context.Canceled) {
			return fmt.Errorf("breaker: call abandoned: %w", err)
		}
		return err
	case storeerr.IsTimeout(err) && (cctx.Err() != nil || took >= budget):
		// The deadline passed: the store did not answer in time. The call may see it
		// before Do's timer does (a client that sets its socket's deadline from the
		// context's), so the time taken says it as well.
		if !handedOff {
			b.stats.timeouts.Add(1)
		}
		switch {
		case took >= 2*budget:
			// Woken a whole budget late: this process was not running, and
			// the store may well have answered in time.
			b.stats.starved.Add(1)
			b.stats.excluded.Add(1)
			b.report(done, errExcluded)
		case budget >= b.minCounted:
			b.stats.failures.Add(1)
			b.report(done, errFailure)
		default:
			b.stats.excluded.Add(1)
			b.report(done, errExcluded)
		}
		return &timeoutError{budget: budget, cause: err}
	case b.isFailure(err):
		b.stats.failures.Add(1)
		b.report(done, errFailure)
		return err
	default:
		b.stats.successes.Add(1)
		b.report(done, nil)
		return err
	}
}

func (b *Breaker) report(done func(error), marker error) {
	done(marker)
	b.dispatch()
}

// deadlinePassed is a lingering call's context as Do sees it when it gives up on the
// call at Do's own deadline: past it, though the call's context lives on.
type deadlinePassed struct{ context.Context }

func (deadlinePassed) Err() error { return context.DeadlineExceeded }

// timeoutError is ErrTimeout with the budget the call had; it also matches
// the context error that ended the call.
type timeoutError struct {
	budget time.Duration
	cause  error
}

func (e *timeoutError) Error() string {
	return fmt.Sprintf("%v after %v: %v", ErrTimeout, e.budget, e.cause)
}

func (e *timeoutError) Is(target error) bool {
	return target == ErrTimeout || target == context.DeadlineExceeded
}

func (e *timeoutError) Unwrap() error { return e.cause }

// dispatch calls OnStateChange for the queued state changes, in order, with
// no lock held; one goroutine dispatches at a time.
func (b *Breaker) dispatch() {
	if b.evPending.Load() == 0 {
		return
	}
	b.evMu.Lock()
	if b.dispatching {
		b.evMu.Unlock()
		return // the goroutine dispatching will see the new events
	}
	b.dispatching = true
	telling := false
	defer func() {
		if telling {
			// OnStateChange panicked, with evMu released: the panic goes on to the
			// caller, and the next call tells the changes after this one.
			b.evMu.Lock()
			b.dispatching = false
			b.evMu.Unlock()
		}
	}()
	for len(b.events) > 0 {
		ev := b.events[0]
		b.events = b.events[1:]
		b.evPending.Store(int32(len(b.events)))
		b.evMu.Unlock()
		if b.onChange != nil {
			telling = true
			b.onChange(ev.from, ev.to)
			telling = false
		}
		b.evMu.Lock()
	}
	b.events = nil
	b.dispatching = false
	b.evMu.Unlock()
}

// Stats are counters of a Breaker's calls since New.
type Stats struct {
	Calls       int64 // calls made to the store
	Successes   int64 // calls that returned nil or an answer that is not a failure
	Failures    int64 // store failures counted towards opening, timeouts included
	Timeouts    int64 // calls Do returned from at the deadline, counted or not
	Excluded    int64 // calls the caller cancelled, or gave too short a deadline, or Starved
	Starved     int64 // timeouts Do saw a whole budget late (the process was not running): not counted
	Rejected    int64 // calls refused with ErrOpen
	Overloaded  int64 // calls refused with ErrOverloaded
	Abandoned   int64 // calls still running when Do returned
	InFlight    int64 // store calls running now, abandoned ones included; a call counts until the breaker has its outcome
	MaxInFlight int64 // the most store calls that ran at once
	// Opened, HalfOpened and Closed count the state changes into each state. A change
	// is counted when it happens, before OnStateChange hears of it.
	Opened, HalfOpened, Closed int64
}

// Stats returns the breaker's counters.
func (b *Breaker) Stats() Stats {
	return Stats{
		Calls:       b.stats.calls.Load(),
		Successes:   b.stats.successes.Load(),
		Failures:    b.stats.failures.Load(),
		Timeouts:    b.stats.timeouts.Load(),
		Excluded:    b.stats.excluded.Load(),
		Starved:     b.stats.starved.Load(),
		Rejected:    b.stats.rejected.Load(),
		Overloaded:  b.stats.overloaded.Load(),
		Abandoned:   b.stats.abandoned.Load(),
		InFlight:    b.inFlight.Load(),
		MaxInFlight: b.stats.maxInFlight.Load(),
		Opened:      b.stats.transitions[StateOpen].Load(),
		HalfOpened:  b.stats.transitions[StateHalfOpen].Load(),
		Closed:      b.stats.transitions[StateClosed].Load(),
	}
}
