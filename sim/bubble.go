package sim

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing/synctest"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/internal/linger"
)

// errShutdown ends the calls still waiting when a run is over.
var errShutdown = errors.New("sim: run over")

// bubble connects the event loop to the real breaker package. gobreaker and the breaker's
// deadlines read time.Now and start goroutines and timers; inside a testing/synctest bubble
// those follow a fake clock, which bubble keeps equal to the simulation's virtual clock
// whenever a breaker is involved:
//
//   - a call starts on a goroutine of its own, as breaker.Do wants; synctest.Wait then
//     lets it run until it is refused (breaker open, overloaded) or its fn blocks, waiting
//     for the simulated answer;
//   - the answer's event closes the call's reply channel at the answer's virtual instant;
//   - before the event loop moves past the deadline of a call still in flight, the bubble
//     clock is moved to that deadline, so that Do returns ErrTimeout at exactly that
//     instant and the timeout is handled there.
//
// Every step ends with synctest.Wait, and results are handled in call order, so a run is
// as deterministic as without the bubble.
type bubble struct {
	e        *events
	base     time.Time // the bubble's clock at virtual instant 0
	results  chan bubbleResult
	inflight []*bubbleCall // by deadline, then call order
	shutdown chan struct{}
	seq      uint64
}

type bubbleCall struct {
	id       uint64
	deadline time.Duration
	reply    chan struct{}
	done     func(err error)
	settled  bool        // Do returned
	replied  bool        // the answer arrived
	read     atomic.Bool // the call's fn returned the answer (not its context's end)
}

type bubbleResult struct {
	c   *bubbleCall
	err error
}

// newBubble must be called on the bubble's root goroutine at virtual instant 0.
func newBubble(e *events) *bubble {
	b := &bubble{e: e, base: time.Now(), results: make(chan bubbleResult, 1024), shutdown: make(chan struct{})}
	e.deadline = b.nextDeadline
	e.expire = b.expire
	return b
}

// sync moves the bubble's clock to the virtual now.
func (b *bubble) sync() {
	if d := b.base.Add(b.e.now).Sub(time.Now()); d > 0 {
		time.Sleep(d)
		synctest.Wait()
	}
}

// call starts one guarded call at the virtual now, whose deadline timer fires at the
// virtual instant deadline (the breaker's Timeout from now, or later when the caller's
// process is not running then: see starvedClock). send is called if the breaker lets the
// call out, with the function to call when its answer arrives; done is called, at the
// virtual instant it happens, with the call's outcome: nil, or the error of breaker.Do.
func (b *bubble) call(brk *breaker.Breaker, deadline time.Duration, send func(answered func()), done func(err error)) {
	b.callLate(brk, deadline, nil, send, done)
}

// callLate is call for a call that lingers (internal/linger: a take's, as
// hybrid.Limiter makes it) when late is not nil: late is called, at the virtual instant
// the answer arrives, when it arrives after Do gave up on the call and its call read it
// (before the call's own, longer deadline).
func (b *bubble) callLate(brk *breaker.Breaker, deadline time.Duration, late func(), send func(answered func()), done func(err error)) {
	b.sync()
	b.seq++
	c := &bubbleCall{id: b.seq, deadline: deadline, reply: make(chan struct{}), done: done}
	out := make(chan struct{}, 1)
	ctx := context.Background()
	if late != nil {
		ctx = linger.With(ctx)
	}
	go func() {
		err := brk.Do(ctx, func(ctx context.Context) error {
			out <- struct{}{}
			select {
			case <-c.reply:
				c.read.Store(true)
				return nil
			case <-ctx.Done():
				return ctx.Err()
			case <-b.shutdown:
				return errShutdown
			}
		})
		b.results <- bubbleResult{c, err}
	}()
	synctest.Wait()
	select {
	case <-out:
		i := len(b.inflight) // usually last: most deadlines are Timeout from their call
		for i > 0 && b.inflight[i-1].deadline > c.deadline {
			i--
		}
		b.inflight = slices.Insert(b.inflight, i, c)
		send(func() {
			// Also when Do returned at the deadline: a half-open probe's call goes on
			// past it (breaker.Settings.HalfOpenProbes), and its answer settles the
			// breaker; so does a lingering call's, read late; any other call's fn has
			// returned, and nothing reads reply.
			if c.replied {
				return
			}
			c.replied = true
			gaveUp := c.settled
			b.sync()
			close(c.reply)
			synctest.Wait()
			b.drain()
			if gaveUp && late != nil && c.read.Load() {
				late()
			}
		})
	default:
	}
	b.drain()
}

// drain handles every result Do has returned so far, in call order.
func (b *bubble) drain() {
	var rs []bubbleResult
	for {
		select {
		case r := <-b.results:
			rs = append(rs, r)
			continue
		default:
		}
		break
	}
	slices.SortFunc(rs, func(x, y bubbleResult) int { return int(x.c.id - y.c.id) })
	for _, r := range rs {
		r.c.settled = true
		r.c.done(r.err)
	}
}

// nextDeadline returns the earliest deadline of a call still in flight.
func (b *bubble) nextDeadline() (time.Duration, bool) {
	for len(b.inflight) > 0 && b.inflight[0].settled {
		b.inflight = b.inflight[1:]
	}
	if len(b.inflight) == 0 {
		return 0, false
	}
	return b.inflight[0].deadline, true
}

// expire runs at the deadline of the oldest call in flight: the bubble's clock moves there,
// Do returns ErrTimeout, and the timeout is handled.
func (b *bubble) expire() {
	b.sync()
	synctest.Wait()
	b.drain()
	// A call whose Do has not returned (it cannot happen: its timer fired) must not stall
	// the loop.
	if len(b.inflight) > 0 && !b.inflight[0].settled && b.inflight[0].deadline <= b.e.now {
		b.inflight = b.inflight[1:]
	}
}

// close releases every call still waiting, so the bubble's goroutines can end.
func (b *bubble) close() {
	close(b.shutdown)
	synctest.Wait()
	for {
		select {
		case <-b.results:
			continue
		default:
		}
		return
	}
}
