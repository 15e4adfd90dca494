package hybrid

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
)

// send queues the refill f for the refiller. When the breaker is open the refill fails at
// once, without a trip through the refiller: every request then goes straight to its
// policy.
func (l *Limiter) send(f *flight) {
	if l.brk.State() == breaker.StateOpen {
		l.finish(f, global.Grant{}, breaker.ErrOpen, l.now())
		return
	}
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		l.finish(f, global.Grant{}, ErrClosed, l.now())
		return
	}
	l.pending = append(l.pending, f)
	l.mu.Unlock()
	l.poke()
}

// poke wakes the refiller without blocking.
func (l *Limiter) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// queueRefund queues n tokens of (lm, key) to be given back to the bucket.
func (l *Limiter) queueRefund(lm *limit, key string, n int) {
	l.mu.Lock()
	if l.refundsDone {
		// Close has sent its last refunds: a request that raced it (past its closed
		// check, then preempted) found expired tokens. Nothing will send them; say so.
		l.mu.Unlock()
		l.stats.refundsLost.Add(int64(n))
		return
	}
	l.refunds = append(l.refunds, refund{lim: lm, key: key, n: n})
	l.mu.Unlock()
	l.poke()
}

// evicted is the local store's eviction callback: the key's lease is refunded, and the
// answer of a refill still in flight will be too (it no longer finds its flight).
func (l *Limiter) evicted(lm *limit, key string, e *entry) {
	e.flight = nil
	if n := e.lease.Drain(); n > 0 {
		l.queueRefund(lm, key, n)
	}
}

// refiller is the Limiter's background goroutine: it sends the pending refills (several
// in one pipelined round trip), refunds, and expires leases whose lifetime has passed.
func (l *Limiter) refiller() {
	defer l.wg.Done()
	tick := time.NewTicker(l.tickEvery())
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			l.mu.Lock()
			l.stopped = true
			pending := l.pending
			l.pending = nil
			l.mu.Unlock()
			now := l.now()
			for _, f := range pending {
				l.finish(f, global.Grant{}, ErrClosed, now)
			}
			return
		case <-l.wake:
		case <-tick.C:
			l.expire(l.now())
		}
		l.refill()
		l.sendRefunds(context.Background(), false)
	}
}

// tickEvery is how often leases are checked for expiry: a quarter of the shortest
// lifetime, at least a millisecond.
func (l *Limiter) tickEvery() time.Duration {
	d := time.Hour
	for _, lm := range l.limits {
		d = min(d, lm.lease.Load().Lifetime/4)
	}
	return max(d, time.Millisecond)
}

// refill sends every pending refill: one Take, or TakeBatch round trips of up to
// maxBatch, each through the breaker (see refillBatch for its deadline).
func (l *Limiter) refill() {
	for {
		l.mu.Lock()
		batch := l.pending
		if len(batch) > maxBatch {
			batch = batch[:maxBatch:maxBatch]
			l.pending = l.pending[maxBatch:]
		} else {
			l.pending = nil
		}
		l.mu.Unlock()
		if len(batch) == 0 {
			return
		}
		l.refillBatch(batch)
	}
}

// refillBatch sends one round trip of refills through the breaker. The call's deadline
// is the breaker's own Timeout, not the limits': a request waits at most its limit's
// Timeout (then its policy decides), but the refill may finish later and still fill the
// lease for the requests after it. Had it the limit's Timeout as a caller deadline, a
// Timeout near or below the breaker's MinCountedTimeout would make every timeout look
// like the caller's own impatience: a stalled Redis would never open the breaker.
func (l *Limiter) refillBatch(batch []*flight) {
	ctx := context.Background()
	// The call may outlive Do (the breaker returns at the deadline): it gets its own
	// slices, never read again after a failure.
	if len(batch) == 1 {
		f := batch[0]
		var g global.Grant
		err := l.brk.Do(ctx, func(ctx context.Context) error {
			var err error
			g, err = l.store.Take(ctx, f.lim.glim, f.key, f.want, f.min)
			return err
		})
		l.stats.takes.Add(1)
		l.stats.roundTrips.Add(1)
		if err != nil {
			l.finish(f, global.Grant{}, err, l.now())
			return
		}
		l.finish(f, g, nil, l.now())
		return
	}
	reqs := make([]global.TakeRequest, len(batch))
	out := make([]global.TakeResult, len(batch))
	for i, f := range batch {
		reqs[i] = global.TakeRequest{Limit: f.lim.glim, Key: f.key, Want: f.want, Min: f.min}
	}
	answered, err := l.doBatch(ctx, func(ctx context.Context) error { return l.store.TakeBatch(ctx, reqs, out) })
	l.stats.takes.Add(int64(len(batch)))
	l.stats.roundTrips.Add(1)
	now := l.now()
	// When TakeBatch itself returned, each item's answer stands on its own: one item's
	// node being unavailable (a failover, a MOVED slot) must not throw away the tokens
	// the other nodes granted. Otherwise (breaker open, deadline) nothing is known.
	itemized := err == nil || answered
	for i, f := range batch {
		if itemized {
			l.finish(f, out[i].Grant, out[i].Err, now)
		} else {
			l.finish(f, global.Grant{}, err, now)
		}
	}
}

// finish applies the answer of refill f to its key's lease, if the key still holds that
// flight (else the tokens go back), and wakes the requests waiting for it.
func (l *Limiter) finish(f *flight, g global.Grant, err error, now time.Time) {
	lm := f.lim
	back := 0
	found := false
	if err == nil {
		l.stats.granted.Add(int64(g.Granted))
	} else {
		l.stats.refillErrors.Add(1)
	}
	lm.keys.Peek(f.key, func(e *entry, last time.Time) {
		if e.flight != f {
			return
		}
		found = true
		e.flight = nil
		if err != nil {
			e.lease.Failed(f.seq)
			return
		}
		back = e.lease.Granted(lm.lease.Load(), later(now, last), f.seq, Grant{Granted: g.Granted, Remaining: g.Remaining, Wait: g.Wait})
	})
	if err == nil && !found {
		back = g.Granted
	}
	f.err = err
	close(f.done)
	if back > 0 {
		l.queueRefund(lm, f.key, back)
	}
	if err == nil && g.Granted > back {
		l.mu.Lock()
		heap.Push(&l.expiries, expiry{lim: lm, key: f.key, at: now.Add(lm.lease.Load().Lifetime)})
		l.mu.Unlock()
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// expire refunds the leased tokens whose lifetime has passed at now, for keys nobody
// asked about since (a request finds and refunds its key's expired tokens itself).
func (l *Limiter) expire(now time.Time) {
	l.mu.Lock()
	var due []expiry
	for len(l.expiries) > 0 && !l.expiries[0].at.After(now) {
		due = append(due, heap.Pop(&l.expiries).(expiry))
	}
	l.mu.Unlock()
	for _, x := range due {
		n := 0
		x.lim.keys.Peek(x.key, func(e *entry, last time.Time) {
			n = e.lease.Expire(x.lim.lease.Load(), later(now, last))
		})
		if n > 0 {
			l.queueRefund(x.lim, x.key, n)
		}
	}
}

// sendRefunds gives the queued refunds back to their buckets, summed per key, with
// RefundBatch round trips of up to maxRefundBatch keys, each through the breaker under
// its own deadline (or ctx's, if shorter). Refunds that fail are dropped (counted): the tokens
// stay spent, which errs on the safe side. With all set (Close) it returns the failures.
func (l *Limiter) sendRefunds(ctx context.Context, all bool) error {
	l.mu.Lock()
	queued := l.refunds
	l.refunds = nil
	l.refundsDone = l.refundsDone || all // Close's send is the last
	l.mu.Unlock()
	if len(queued) == 0 {
		return nil
	}
	type bucketKey struct {
		lim *limit
		key string
	}
	at := make(map[bucketKey]int, len(queued)) // index in reqs
	reqs := make([]global.RefundRequest, 0, len(queued))
	lims := make([]*limit, 0, len(queued))
	for _, r := range queued {
		k := bucketKey{r.lim, r.key}
		i, ok := at[k]
		if !ok {
			i = len(reqs)
			at[k] = i
			// The seq is chosen now so that a batch can be sent again (see refundBatch).
			reqs = append(reqs, global.RefundRequest{Limit: r.lim.glim, Key: r.key, Seq: l.store.NextSeq()})
			lims = append(lims, r.lim)
		}
		reqs[i].N += r.n
	}
	for i := range reqs {
		reqs[i].N = min(reqs[i].N, lims[i].cfg.Burst) // the bucket holds no more
	}
	failed := 0
	var firstErr error
	for lo := 0; lo < len(reqs); lo += maxRefundBatch {
		hi := min(lo+maxRefundBatch, len(reqs))
		n, err := l.refundBatch(ctx, reqs[lo:hi])
		failed += n
		if firstErr == nil {
			firstErr = err
		}
	}
	if failed > 0 {
		l.stats.refundsLost.Add(int64(failed))
		if all {
			return fmt.Errorf("hybrid: %d leased tokens not refunded: %w", failed, firstErr)
		}
	}
	return nil
}

// maxRefundBatch is the most refunds sent in one pipelined round trip.
const maxRefundBatch = 256

// refundBatch sends one RefundBatch round trip through the breaker and returns the
// tokens that were not refunded, with the first error.
//
// A batch that Redis answers too slowly for the breaker's deadline (a busy or slow
// server, a large batch) is sent again in two halves, down to single refunds. That is
// safe because every item keeps the sequence number it was given in sendRefunds: where
// the abandoned attempt ran, Redis answers the resend as a replay and adds nothing.
// An open breaker, or any other failure, ends it: those tokens stay spent.
func (l *Limiter) refundBatch(ctx context.Context, reqs []global.RefundRequest) (int, error) {
	// The call's deadline is the breaker's own (see refillBatch), or ctx's if shorter.
	// It may outlive Do (the breaker returns at its deadline): it gets its own out,
	// never read after a failure; reqs is only read.
	out := make([]global.RefundResult, len(reqs))
	answered, err := l.doBatch(ctx, func(ctx context.Context) error { return l.store.RefundBatch(ctx, reqs, out) })
	l.stats.refundCalls.Add(1)
	if err != nil && errors.Is(err, breaker.ErrTimeout) && len(reqs) > 1 && ctx.Err() == nil {
		half := len(reqs) / 2
		n1, err1 := l.refundBatch(ctx, reqs[:half])
		n2, err2 := l.refundBatch(ctx, reqs[half:])
		return n1 + n2, cmp.Or(err1, err2)
	}
	failed, refunded := 0, 0
	firstErr := err
	if answered { // as in refillBatch: each item's answer stands on its own
		err, firstErr = nil, nil
	}
	for i, r := range reqs {
		if err != nil || out[i].Err != nil {
			failed += r.N
			if firstErr == nil {
				firstErr = out[i].Err
			}
			continue
		}
		refunded += r.N
	}
	l.stats.refunded.Add(int64(refunded))
	return failed, firstErr
}

// heartbeat announces this server in the fleet every interval and divides the limits by
// the live count; while Redis does not answer, the last known count stays.
func (l *Limiter) heartbeat() {
	defer l.wg.Done()
	tick := time.NewTicker(l.beat)
	defer tick.Stop()
	for {
		l.beatOnce()
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
	}
}

func (l *Limiter) beatOnce() {
	ctx, cancel := context.WithTimeout(context.Background(), l.beat)
	defer cancel()
	var live int
	err := l.brk.Do(ctx, func(ctx context.Context) error {
		var err error
		live, err = l.store.Heartbeat(ctx, l.fleet, l.store.ServerID(), 3*l.beat)
		return err
	})
	l.stats.heartbeats.Add(1)
	if err != nil || live < 1 {
		return
	}
	l.setServers(live)
}

// setServers divides every limit among n live servers from now on.
func (l *Limiter) setServers(n int) {
	if int64(n) == l.servers.Swap(int64(n)) {
		return
	}
	for _, lm := range l.limits {
		c := *lm.lease.Load()
		c.Servers = n
		lm.lease.Store(&c)
		_ = lm.fallback.SetServersAt(l.now(), n) // valid: the limit was accepted at New
	}
}

// Close stops the background goroutines, fails the refills not yet sent, and gives every
// unused leased token back to its bucket (in as few calls as it can, bounded by ctx).
// Calls after Close return ErrClosed. Close is idempotent; the error reports tokens that
// could not be refunded.
func (l *Limiter) Close(ctx context.Context) error {
	if l.closed.Swap(true) {
		return nil
	}
	close(l.stop)
	l.wg.Wait()
	for _, lm := range l.limits {
		lm.keys.Close() // drains every lease through evicted
		lm.fallback.Close()
	}
	l.mu.Lock()
	l.expiries = nil
	l.mu.Unlock()
	return l.sendRefunds(ctx, true)
}

// expiries is a min-heap of grants by the instant their lifetime ends. Grants of one
// limit arrive in that order, but limits' lifetimes differ: a queue in arrival order
// kept a short-lived grant waiting behind a long-lived one.
type expiries []expiry

func (h expiries) Len() int           { return len(h) }
func (h expiries) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h expiries) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiries) Push(x any)        { *h = append(*h, x.(expiry)) }
func (h *expiries) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = expiry{}
	*h = old[:len(old)-1]
	return x
}

// doBatch runs one pipelined batch call (TakeBatch or RefundBatch, writing each item's
// answer to its out) through the breaker. An item that found the store unavailable
// fails the call for the breaker to count; other item errors are read from out.
// answered reports that the call itself returned, so out holds every item's answer
// even when err is set; if not (breaker open, deadline), out must not be read: the
// call may still be running.
func (l *Limiter) doBatch(ctx context.Context, call func(ctx context.Context) error) (answered bool, err error) {
	var done atomic.Bool
	err = l.brk.Do(ctx, func(ctx context.Context) error {
		err := call(ctx)
		done.Store(true)
		if global.IsUnavailable(err) {
			return err
		}
		return nil
	})
	return done.Load(), err
}
