package engine

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// Lease defaults, applied by [LeaseConfig.Normalize] to zero fields.
const (
	// DefaultRefillInterval is how long one batch should last at the estimated demand.
	DefaultRefillInterval = 100 * time.Millisecond
	// DefaultLifetime is how long leased tokens stay usable before they are refunded.
	DefaultLifetime = time.Second
	// DefaultLowWatermark is the fraction of a batch below which a lease prefetches.
	DefaultLowWatermark = 0.5
	// DefaultDemandWindow is the window over which local demand is estimated.
	DefaultDemandWindow = time.Second
)

// roomBatch is how many refill intervals a batch lasts, at most half a roomy lifetime,
// when the key's bucket has room to spare (Lease.Batch), and roomLifetimes how many
// lifetimes the tokens of a grant that left the bucket roomy stay usable (Lease.Granted):
// such tokens are at most a share of half the bucket, which nobody else asked for. At 8
// servers on 10,000 Zipf keys within their limits (bench's compare, 32 goroutines, that
// row alone, medians of 3 on one quiet host), a batch of 5 refill intervals and one
// lifetime took 0.39 script runs a decision, 6.9 µs of Redis CPU; 25 and five lifetimes
// 0.23 and 5.0 µs, refunds at Close included.
const (
	roomBatch     = 25
	roomLifetimes = 5
)

// maxPace bounds one pacing interval so that tiny rates cannot overflow a Duration.
const maxPace = 24 * time.Hour

// MaxLeaseDuration bounds LeaseConfig's RefillInterval, Lifetime and DemandWindow: the
// core adds them to instants in int64 nanoseconds, and longer would overflow.
// MinLifetime is the shortest Lifetime: tokens must outlive the trip that brought them,
// or every grant expires before it is used and the lease takes and refunds in a loop.
const (
	MaxLeaseDuration = 24 * time.Hour
	MinLifetime      = time.Millisecond
)

// LeaseConfig is what the lease core needs to know about one limit. It is shared by every
// [Lease] of the limit and read, never written, by the core; to change it (the live server
// count moves), build a new one and pass that to later calls.
type LeaseConfig struct {
	// Rate is the fleet-wide refill rate of the global bucket, in tokens per second.
	Rate float64
	// Burst is the capacity of the global bucket.
	Burst int
	// Servers is the number of live servers sharing the bucket; 0 means 1.
	Servers int
	// RefillInterval is how long one batch should last at the estimated local demand:
	// batch = clamp(demand × RefillInterval, cost, Burst / Servers). A key whose bucket
	// had room to spare at the last answer gets a batch of 25 refill intervals (at most
	// half a roomy grant's life, five Lifetimes) at the steady demand when that is
	// larger: see [Lease.Batch].
	// default: 100ms
	RefillInterval time.Duration
	// Lifetime is how long leased tokens stay usable; unused ones are then refunded.
	// A grant renews the lifetime of every token on hand. A grant that leaves the
	// bucket holding twice the tokens on hand for every server renews it for five
	// lifetimes: a key far within its limit, which nobody else asks much of.
	// default: 1s
	Lifetime time.Duration
	// LowWatermark is the fraction of a batch below which a lease prefetches the next batch,
	// so that the common path does not wait. Negative disables prefetch.
	// default: 0.5
	LowWatermark float64
	// DemandWindow is the sliding window over which local demand is estimated.
	// default: 1s
	DemandWindow time.Duration

	noPacing bool // tests only: "retry after the bucket's wait" instead of pacing
}

// Normalize returns c with defaults filled in, or an error for a tuning it cannot
// honour. Rate and Burst are not checked here: they come from a
// limit redisstore.Limit.Validate accepted.
func (c LeaseConfig) Normalize() (LeaseConfig, error) {
	switch {
	case c.Servers < 0:
		return c, fmt.Errorf("servers %d must not be negative", c.Servers)
	case c.RefillInterval < 0, c.Lifetime < 0, c.DemandWindow < 0:
		return c, errors.New("durations must not be negative")
	case c.RefillInterval > MaxLeaseDuration, c.Lifetime > MaxLeaseDuration, c.DemandWindow > MaxLeaseDuration:
		return c, fmt.Errorf("refill interval %v, lifetime %v and demand window %v must be at most %v", c.RefillInterval, c.Lifetime, c.DemandWindow, MaxLeaseDuration)
	case c.Lifetime != 0 && c.Lifetime < MinLifetime:
		return c, fmt.Errorf("lifetime %v is below %v: leased tokens would expire before they are used", c.Lifetime, MinLifetime)
	case math.IsNaN(c.LowWatermark) || c.LowWatermark > 1:
		return c, fmt.Errorf("low watermark %v must be at most 1", c.LowWatermark)
	}
	if c.Servers == 0 {
		c.Servers = 1
	}
	if c.RefillInterval == 0 {
		c.RefillInterval = DefaultRefillInterval
	}
	if c.Lifetime == 0 {
		c.Lifetime = DefaultLifetime
	}
	if c.LowWatermark == 0 {
		c.LowWatermark = DefaultLowWatermark
	}
	if c.DemandWindow == 0 {
		c.DemandWindow = DefaultDemandWindow
	}
	return c, nil
}

// roomy reports whether a bucket at level holds tokens twice over for every server: a
// key far within its limit, whose grant of them gives them a roomy life (Lease.Granted)
// and whose batch may be that large (Lease.Batch). NaN and negative levels are not.
func (c *LeaseConfig) roomy(tokens, level float64) bool {
	return 2*tokens*float64(c.servers()) <= level
}

// roomyLifetime is how long the tokens of a grant that left the bucket roomy stay
// usable (Lease.Granted): roomLifetimes lifetimes, at most MaxLeaseDuration.
func (c *LeaseConfig) roomyLifetime() time.Duration {
	return min(roomLifetimes*c.Lifetime, MaxLeaseDuration)
}

// servers is c.Servers, never less than 1 (a zero config must not divide by zero).
func (c *LeaseConfig) servers() int {
	return max(c.Servers, 1)
}

// Cap is the most tokens one server holds or asks for at once for a request of cost n:
// Burst / Servers, or n when that is smaller (one cost per server).
func (c *LeaseConfig) Cap(n int) int {
	return max(c.Burst/c.servers(), n)
}

// Action is what the caller of [Lease.Acquire] must do with the request.
type Action uint8

const (
	// Allow: the request's tokens were taken from the lease.
	Allow Action = iota + 1
	// Deny: the request is denied locally; Step.RetryAfter says when to try again.
	Deny
	// Wait: no tokens on hand and a refill is in flight (perhaps started by this very step:
	// see Step.Refill). Wait for its answer, then call [Lease.Recheck]. If the refill fails,
	// the waiting requests go to the limit's failure policy; they do not recheck.
	Wait
)

// String returns the action's name.
func (a Action) String() string {
	switch a {
	case Allow:
		return "allow"
	case Deny:
		return "deny"
	case Wait:
		return "wait"
	}
	return fmt.Sprintf("Action(%d)", uint8(a))
}

// Refill asks the caller to take tokens from the global bucket: Want of them if the bucket
// has that many, else as many as it has if that is at least Min, else none. Want == 0 means
// no refill is asked for. The answer goes to [Lease.Granted] or [Lease.Failed] with Seq.
type Refill struct {
	Seq  uint64
	Want int
	Min  int
	// Resend, when not 0, is the Redis sequence number of a take whose answer was lost
	// (Lease.Lost): this refill goes under it, so that Redis answers it from its record
	// if that take ran (what it granted then) and runs this one if it did not.
	Resend uint64
}

// Step is the core's answer to one request.
type Step struct {
	Action Action
	Reason Reason
	// RetryAfter is set on Deny: how long until this server may admit the request.
	RetryAfter time.Duration
	// Remaining is the best known count of tokens left for the key: tokens on hand plus
	// what the global bucket reported at the last grant.
	Remaining int
	// Refill, when Want > 0, is a refill the caller must start now (a prefetch on Allow,
	// the refill to wait for on Wait).
	Refill Refill
	// Refund is a count of expired leased tokens the caller must give back to the bucket.
	Refund int
}

// Grant is the global bucket's answer to a [Refill].
type Grant struct {
	// Granted is how many tokens were taken (Want, a partial count >= Min, or 0).
	Granted int
	// Remaining is the bucket's level after the take.
	Remaining float64
	// Wait is, when Granted is 0, how long until Min tokens are available.
	Wait time.Duration
	// First reports that the bucket held no record of this server's takes (luascript.First).
	First bool
	// Credit is the refill the bucket lost to its cap, cumulative (redisstore.Grant.Credit).
	Credit float64
	// Replayed reports a take sent again (Refill.Resend) that Redis had run: Granted is
	// what it granted then, recovered now.
	Replayed bool
	// At is Redis's clock at the take (for a replay, at the take it replays).
	At time.Time
}

// LeaseStats are the lifetime totals of a lease. Granted == Consumed + Refunded + OnHand.
type LeaseStats struct {
	Granted  int64 // tokens received from the bucket (including late grants refunded at once)
	Consumed int64 // tokens spent on allowed requests
	Refunded int64 // tokens handed back for refund (expired, drained, late)
	OnHand   int   // tokens held now
	Refills  int64 // refills started
	InFlight bool  // a refill is in flight
}

// Lease is the per-(limit, key) lease state of one server: tokens on hand and their expiry,
// the refill in flight, a local demand estimate and pacing. It is a pure state machine: no
// I/O, no goroutines, no clock of its own (every method takes now), no allocations. It is
// not safe for concurrent use; the caller serialises access (one mutex per key).
//
// Instants are kept as nanoseconds since the first instant the lease was given, so any
// clock works, a virtual one starting at the zero Time included, and the common path does
// integer arithmetic only.
//
// The zero Lease is empty and ready to use; [NewLease] seeds its pacing jitter.
type Lease struct {
	// Read or written by every request (kept together: one or two cache lines).
	base       int64 // UnixNano of the first instant seen; the others are offsets from it
	tokens     int
	expires    int64 // tokens on hand are usable before this offset
	pacedUntil int64 // no refill before this offset (unless the bucket holds the need)
	winStart   int64 // demand estimate: a sliding pair of windows...
	cur        int64 // ...tokens asked for in the current one
	want       int   // of the refill in flight, or the last one
	consumed   int64
	inflight   bool
	based      bool
	took       bool
	heard      bool // a refill was answered: bucket is what Redis said then
	// read is readMark of the Redis sequence number of the take whose grant a late answer
	// was last read from (Late): no later answer under that number is read, nor is the
	// number sent again (Lost); 0: none.
	read uint32

	// Read or written at refills.
	prev   int64 // tokens asked for in the previous window
	seq    uint64
	bucket int32 // bucket level at the last grant, floored
	// owe is what the failure policy admitted to requests that waited for takes whose
	// answers came late, that those answers could not pay for (Late): the next late
	// answers pay it first. An answer in time ends it (Granted).
	owe      int32
	rng      uint64 // splitmix64 state for pacing jitter
	granted  int64
	refunded int64
	refills  int64
	answered int64 // offset of the last answered take, if took
	heardAt  int64 // Redis's clock at the take heard last, Unix ms; 0: none
	// lostSeq is the Redis sequence number of the take whose answer was lost (Lost): every
	// refill goes under it until one is answered; 0: none.
	lostSeq uint64
}

// NewLease returns an empty lease whose pacing jitter is drawn from seed. Give every
// (server, key) its own seed, so that servers paced together do not wake together.
func NewLease(seed uint64) Lease {
	return Lease{rng: seed}
}

// at returns now as an offset from the lease's base instant, setting the base on first use.
// UnixNano overflows outside the years 1678-2262, but it wraps the same way for every
// instant, so the difference of two instants less than 292 years apart is exact: the zero
// Time works as a virtual epoch. It reads the wall clock reading, not the monotonic one
// (time.Time.Sub costs an overflow check for times without one, such as virtual ones).
func (l *Lease) at(now time.Time) int64 {
	if !l.based {
		l.base, l.based = now.UnixNano(), true
		l.pacedUntil = math.MinInt64
		return 0
	}
	return now.UnixNano() - l.base
}

// Stats returns the lease's totals.
func (l *Lease) Stats() LeaseStats {
	return LeaseStats{Granted: l.granted, Consumed: l.consumed, Refunded: l.refunded,
		OnHand: l.tokens, Refills: l.refills, InFlight: l.inflight}
}

// CanServe reports whether [Lease.Acquire] would allow a request of cost n at now from
// tokens on hand (enough of them, not expired), without changing anything. A caller that
// runs a cheaper check between the two (the limiter's per-server pre-check) uses it to
// keep the common path to one pass.
func (l *Lease) CanServe(c *LeaseConfig, now time.Time, n int) bool {
	return n >= 0 && n <= c.Burst && l.tokens >= n && (n == 0 || now.UnixNano()-l.base < l.expires)
}

// Tokens returns the tokens on hand (some may have expired; see [Lease.Expire]).
func (l *Lease) Tokens() int { return l.tokens }

// PacedUntil returns the instant before which the lease will not ask the bucket again
// (the zero Time if it was never paced).
func (l *Lease) PacedUntil() time.Time {
	if !l.based || l.pacedUntil == math.MinInt64 {
		return time.Time{}
	}
	return time.Unix(0, l.base+l.pacedUntil)
}

// Acquire answers a new request of cost n at now, and counts it in the demand estimate
// unless it is above the burst: such a request can never pass, and its cost, however
// large, says nothing of the key's demand. Cost 0 is allowed without spending anything.
func (l *Lease) Acquire(c *LeaseConfig, now time.Time, n int) Step {
	var st Step
	l.acquire(c, now, n, &st)
	return st
}

// acquire is Acquire writing its answer into st (a zero Step), without copying it.
func (l *Lease) acquire(c *LeaseConfig, now time.Time, n int, st *Step) {
	t := l.at(now)
	if n > 0 && n <= c.Burst {
		l.roll(c, t)
		l.cur += int64(n)
	}
	l.decide(c, t, n, st)
}

// lifeFrom returns how long after now the tokens on hand stay usable, never less than
// 0: right after a grant at now, the life it gave them (Granted). It changes nothing.
func (l *Lease) lifeFrom(now time.Time) time.Duration {
	if !l.based {
		return 0
	}
	return time.Duration(max(l.expires-(now.UnixNano()-l.base), 0))
}

// tookWithin reports whether a take of this lease was answered less than d before now.
func (l *Lease) tookWithin(now time.Time, d time.Duration) bool {
	return l.took && l.based && now.UnixNano()-l.base-l.answered < int64(d)
}

// answeredWithin records that a take of this lease was answered at now, and reports
// whether the one before was answered less than d earlier.
func (l *Lease) answeredWithin(now time.Time, d time.Duration) bool {
	t := l.at(now)
	recent := l.took && t-l.answered < int64(d)
	l.answered, l.took = t, true
	return recent
}

// unspend gives back n tokens of a request the lease allowed at or before now and its
// caller did not use (another item of an all-or-nothing request was denied): they join
// the tokens on hand, under their expiry. It reports false, changing nothing, when that
// expiry has passed: the caller refunds them instead, as the lease would have.
func (l *Lease) unspend(now time.Time, n int) bool {
	if now.UnixNano()-l.base >= l.expires {
		return false
	}
	l.tokens += n
	l.consumed -= int64(n)
	return true
}

// unhit undoes an acquire of cost n > 0 at or before now that the tokens on hand served:
// as unspend, and the request leaves the demand estimate, since it is decided again.
func (l *Lease) unhit(now time.Time, n int) bool {
	l.cur = max(l.cur-int64(n), 0) // a roll since moved it to prev: left there
	return l.unspend(now, n)
}

// Recheck answers again a request that waited for a refill; unlike [Lease.Acquire] it does
// not count the request's demand a second time.
func (l *Lease) Recheck(c *LeaseConfig, now time.Time, n int) Step {
	var st Step
	l.decide(c, l.at(now), n, &st)
	return st
}

// decide answers a request of cost n at offset t into st, a zero Step.
func (l *Lease) decide(c *LeaseConfig, t int64, n int, st *Step) {
	st.Refund = l.expire(t)
	switch {
	case n < 0:
		st.Action, st.Reason = Deny, ReasonInvalidCost
		st.RetryAfter = InfDuration
	case n > c.Burst:
		st.Action, st.Reason = Deny, ReasonExceedsBurst
		st.RetryAfter = InfDuration
	case l.tokens >= n:
		l.spend(n)
		st.Action, st.Reason = Allow, ReasonLease
		st.Refill = l.prefetch(c, t, max(n, 1))
	case l.inflight:
		st.Action, st.Reason = Wait, ReasonRefill
	case t < l.pacedUntil && float64(l.bucket) < l.round(c, n-l.tokens):
		// Paced, and at the last answer the bucket did not hold this request's need for
		// every server: do not ask before the round refills.
		st.Action, st.Reason = Deny, ReasonPaced
		st.RetryAfter = time.Duration(l.pacedUntil - t)
	default:
		need := n - l.tokens
		want := max(l.batch(c, t, n)-l.tokens, need)
		st.Action, st.Reason = Wait, ReasonRefill
		st.Refill = l.start(want, need)
	}
	st.Remaining = l.remaining(c)
}

// remaining is Step.Remaining: the tokens on hand and the bucket's level at the last
// answer.
func (l *Lease) remaining(c *LeaseConfig) int {
	if !l.heard {
		// Nothing is known of the key's bucket yet (a cost-0 request on a new key): a
		// bucket nobody took from is full, the likeliest; a refill's answer says better.
		return c.Burst
	}
	return l.tokens + int(l.bucket)
}

// spend takes n tokens from those on hand, which hold them, for a request allowed.
func (l *Lease) spend(n int) {
	l.tokens -= n
	l.consumed += int64(n)
}

// serves reports whether acquire at now (Unix nanoseconds) would allow a request of
// cost n from the tokens on hand and do nothing else: n > 0 of them on hand, unexpired
// (nothing to refund), and no refill to start after it (quiet); t is now as an offset
// (at), for hit. It changes nothing; hit then does what acquire would.
func (l *Lease) serves(c *LeaseConfig, now int64, n int) (t int64, ok bool) {
	t = now - l.base
	return t, l.based && n > 0 && n <= c.Burst && l.tokens >= n && t < l.expires && l.quiet(c, t, l.tokens-n)
}

// hit is acquire at offset t for a request of cost n that serves allowed, without the
// Step: it returns Step.Remaining. A lease hit is the path of nearly every decision,
// and this is acquire's work on it with no branch it cannot take.
func (l *Lease) hit(c *LeaseConfig, t int64, n int) int {
	l.roll(c, t)
	l.cur += int64(n)
	l.spend(n)
	return l.remaining(c)
}

// quiet reports whether prefetch starts no refill at t with tokens on hand, without
// estimating demand: a refill in flight, the key paced, prefetch off, or the tokens
// still above the watermark of the last batch (the common case; a batch that grew since
// is seen at the next refill).
func (l *Lease) quiet(c *LeaseConfig, t int64, tokens int) bool {
	return l.inflight || t < l.pacedUntil || c.LowWatermark < 0 ||
		l.want > 0 && float64(tokens) >= c.LowWatermark*float64(l.want)
}

// prefetch starts a refill when the tokens on hand fell below the low watermark, no refill
// is in flight, the key is not paced, and the sustained demand (the sliding estimate, not
// the fast one) would use two refill intervals' batches within a lifetime: a key seen
// once in a while must not hold tokens only to refund them, at three Redis calls for one
// request. The refill asks for the batch, roomy or not.
func (l *Lease) prefetch(c *LeaseConfig, t int64, cost int) Refill {
	if l.quiet(c, t, l.tokens) {
		return Refill{}
	}
	batch, interval := l.batches(c, t, cost)
	if float64(l.tokens) >= c.LowWatermark*float64(batch) || l.tokens >= batch {
		return Refill{}
	}
	// Judged on the refill interval's batch, which a roomy batch grows from: a roomy one
	// covers half a roomy grant's life, longer than the key's demand has been seen.
	if sliding, _ := l.rates(c, t); sliding*c.Lifetime.Seconds() < 2*float64(interval) {
		return Refill{}
	}
	return l.start(batch-l.tokens, 1)
}

func (l *Lease) start(want, minimum int) Refill {
	l.seq++
	l.inflight = true
	l.refills++
	l.want = want
	return Refill{Seq: l.seq, Want: want, Min: minimum, Resend: l.lostSeq}
}

// seen is what the lease last heard of its bucket, for a take (a refill's, a claim's) to
// re-create it from if Redis lost it (redisstore.TakeRequest.Seen): the level, floored
// at zero (a lost bucket comes back empty), and Redis's clock then.
func (l *Lease) seen() wire.Seen {
	if !l.heard || l.heardAt == 0 {
		return wire.Seen{}
	}
	return wire.Seen{Known: true, Level: float64(l.bucket), AtMS: l.heardAt}
}

// Batch returns the batch size the lease would ask for now for a request of cost n:
// clamp(demand × RefillInterval, n, Cap(n)), or a roomy batch when that is larger and
// the bucket held it twice over for every server at the last answer: the sliding
// estimate of demand over 25 refill intervals, at most half a roomy lifetime (five
// lifetimes: Granted).
func (l *Lease) Batch(c *LeaseConfig, now time.Time, n int) int {
	return l.batch(c, l.at(now), n)
}

// clampBatch is want tokens rounded up, at least n and at most capacity.
func clampBatch(want float64, n, capacity int) int {
	if want >= float64(capacity) {
		return capacity
	}
	return max(int(math.Ceil(want)), n)
}

func (l *Lease) batch(c *LeaseConfig, t int64, n int) int {
	b, _ := l.batches(c, t, n)
	return b
}

// batches returns the batch (Batch) and the refill interval's batch it grows from,
// clamp(demand × RefillInterval, n, Cap(n)): the same unless the batch is roomy.
func (l *Lease) batches(c *LeaseConfig, t int64, n int) (batch, interval int) {
	capacity := c.Cap(n)
	want := l.demand(c, t) * c.RefillInterval.Seconds()
	interval = clampBatch(want, n, capacity)
	if l.heard && want < float64(capacity) {
		// Room to spare: the bucket, at the last answer, held a roomy batch (roomBatch)
		// twice over for every server. Parking it here starves no server, and a key
		// seen a few times a second, which a refill interval's batch serves one token a
		// take, costs a take per roomy batch. At the steady estimate, floored, so that
		// two batches fit a roomy grant's life.
		sliding, _ := l.rates(c, t)
		long := math.Floor(sliding * min(roomBatch*c.RefillInterval, c.roomyLifetime()/2).Seconds())
		if long > want && c.roomy(long, float64(l.bucket)) {
			return clampBatch(long, n, capacity), interval
		}
	}
	return interval, interval
}

// Granted tells the lease the answer to its refill seq, received at now. It returns the
// tokens the caller must refund at once: all of them when seq is not the refill in flight
// (a late answer after [Lease.Drain] or [Lease.Failed]).
//
// After a grant of 0, a partial grant, or a grant that leaves the bucket below what the
// fleet asks for in one round (want × servers), the lease is paced: it does not ask again
// before the bucket could refill that round, (want × servers − remaining) / rate, about
// want × servers / rate when contention emptied it (jittered ±50%, so that the servers
// do not wake together; after a full grant never past the instant the bucket is full
// again, when its refill would start to be lost), and requests that find no tokens
// meanwhile are denied with that retry-after, unless the bucket held their need for
// every server at the last answer.
// The bucket's Wait for min is never longer, since min <= want.
func (l *Lease) Granted(c *LeaseConfig, now time.Time, seq uint64, g Grant) (refund int) {
	granted := max(g.Granted, 0)
	l.granted += int64(granted)
	if !l.inflight || seq != l.seq {
		l.refunded += int64(granted)
		return granted
	}
	t := l.at(now)
	l.inflight = false
	l.lostSeq = 0 // the refill went under it, if any: answered now
	l.owe = 0     // Redis answers in time again: what its late answers could not pay stays unpaid
	if granted > 0 {
		l.tokens += granted
		life := c.Lifetime
		if c.roomy(float64(l.tokens), g.Remaining) {
			// The bucket still holds twice what this server does for every server: the
			// key is far within its limit, and its tokens may wait here for its next
			// requests rather than go back and be taken again.
			life = c.roomyLifetime()
		}
		l.expires = t + int64(life)
	}
	l.bucket, l.heard = 0, true
	if !g.At.IsZero() {
		l.heardAt = g.At.UnixMilli()
	}
	if g.Remaining > 0 {
		l.bucket = int32(min(g.Remaining, math.MaxInt32))
	}
	full := float64(l.want) * float64(c.servers()) // one round: every server asks for want
	switch {
	case c.noPacing: // the plain rule pacing replaces: after nothing, retry when min is there
		if granted == 0 {
			l.pacedUntil = t + int64(min(max(g.Wait, 0), maxPace))
		}
	case granted == 0 || granted < l.want:
		// Contention shown: the bucket could not give this server its batch. Wait until
		// it could refill a whole round.
		l.pacedUntil = t + int64(l.capped(c, g, l.jitter(l.fairShare(c, full-max(g.Remaining, 0)))))
	case g.Remaining < l.round(c, l.want):
		// Granted in full, but the bucket is left below a round: contention is likely.
		// Wait until it could hold a round again, a round being at most the bucket (a
		// burst below one cost per server could never hold one).
		// Refill past a full bucket is lost: a jittered wait that ends after the bucket is
		// full again is folded back below that instant by as much as it overshot (never
		// below half of it, since the round is at most the burst).
		d := l.jitter(l.fairShare(c, l.round(c, l.want)-g.Remaining))
		if full := l.fairShare(c, float64(c.Burst)-g.Remaining); d > full {
			d = full - (d - full)
		}
		l.pacedUntil = t + int64(l.capped(c, g, d))
	}
	return 0
}

// Failed tells the lease that its refill seq failed (timeout, Redis error, breaker open).
// The tokens on hand stay usable; the next request that needs more starts a new refill.
func (l *Lease) Failed(seq uint64) {
	if l.inflight && seq == l.seq {
		l.inflight = false
	}
}

// Lost says, once its waiters are decided, that the refill seq, which failed (Failed),
// was a take whose answer was lost: it timed out, so Redis may have run it. Unless the
// policy admitted some of its waiters (paid: its grant paid for them, and is not read
// back), the refills after it go under its Redis sequence number rseq (Refill.Resend)
// until one is answered: Redis answers a take it ran from its record, without spending
// again (Grant.Replayed), so that take's grant is recovered rather than lost; if it did
// not run, the refill runs. The grant may differ from what the refill asked: the lease
// takes what Redis answers, and a request it does not serve waits for the refill after
// it. A refill started since the failure went under the number in force then; a take
// that was itself sent again under rseq (again) whose number is no longer the one in
// force was read or let go meanwhile, and is not sent again. Lost reports whether a
// refill may read the take's grant back (resent), in which case its late answer must not
// (Late).
func (l *Lease) Lost(seq, rseq uint64, again, paid bool) (resent bool) {
	since := l.inflight || seq != l.seq // a refill started since
	switch {
	case again && l.lostSeq != rseq:
		return true // its grant was read, or let go: its late answer meets lostSeq != rseq
	case l.read == readMark(rseq):
		return false // a late answer of the same take read its grant: nothing is left to read back
	case l.lostSeq == rseq && since:
		return true // the take was itself sent again under rseq, and so was that refill
	case paid:
		if l.lostSeq == rseq {
			l.lostSeq = 0
		}
		return false
	case since:
		return false
	}
	l.lostSeq = rseq
	return true
}

// Late takes the grant g of the take rseq, whose answer came after its call had failed
// by timeout, at now, and reports whether it took it. owed is what the failure policy
// admitted to the requests that waited for that take: its tokens pay for that first,
// and for what earlier late answers could not pay, and are returned as paid; the rest
// are on hand until Lifetime from now. A take sent again under its number (resent: Lost
// reported so) reads the grant instead, so the lease takes it only while none is out
// and none was answered; and it takes one late answer under a number, the others being
// Redis's replays of it.
func (l *Lease) Late(c *LeaseConfig, now time.Time, rseq uint64, resent bool, owed int, g Grant) (paid int, ok bool) {
	if l.read == readMark(rseq) {
		return 0, false // a late answer under the same number was read: this one is its replay
	}
	if resent {
		if l.lostSeq != rseq || l.inflight {
			return 0, false
		}
		l.lostSeq = 0
	}
	l.read = readMark(rseq)
	t := l.at(now)
	granted := max(g.Granted, 0)
	l.granted += int64(granted)
	owe := int(l.owe) + max(owed, 0)
	paid = min(owe, granted)
	l.owe = int32(min(owe-paid, math.MaxInt32))
	l.consumed += int64(paid)
	if rest := granted - paid; rest > 0 {
		l.tokens += rest
		l.expires = max(l.expires, t+int64(c.Lifetime))
	}
	return paid, true
}

// readMark is what Lease.read holds for the Redis sequence number rseq: its low 32 bits,
// never 0 (none).
func readMark(rseq uint64) uint32 { return max(uint32(rseq), 1) }

// pay spends up to n tokens on hand on requests the failure policy admitted while they
// waited for the refill that brought them, and returns how many it spent.
func (l *Lease) pay(n int) int {
	x := max(min(n, l.tokens), 0)
	l.tokens -= x
	l.consumed += int64(x)
	return x
}

// Expire drops the tokens on hand if their lifetime has passed at now, and returns how many
// the caller must refund.
func (l *Lease) Expire(c *LeaseConfig, now time.Time) (refund int) {
	return l.expire(l.at(now))
}

func (l *Lease) expire(t int64) int {
	if l.tokens == 0 || t < l.expires {
		return 0
	}
	return l.giveBack()
}

// Drain empties the lease (on eviction or Close): it returns the tokens on hand for refund
// and forgets the refill in flight, whose answer, when it comes, [Lease.Granted] returns
// for refund too. It also returns abandoned: the number of a lost take that was to go
// again under it (Lost) and had not, 0 if none; no take will read that take's grant
// now, so its late answer, if it comes, must give it back. The demand estimate and
// pacing are kept.
func (l *Lease) Drain() (refund int, abandoned uint64) {
	if !l.inflight {
		abandoned = l.lostSeq
	}
	l.inflight = false
	l.lostSeq = 0
	return l.giveBack(), abandoned
}

func (l *Lease) giveBack() int {
	n := l.tokens
	l.tokens = 0
	l.refunded += int64(n)
	return n
}

// round is what the fleet asks the bucket for in one round when every server asks for
// want: want × servers, but never more than the bucket holds (Burst). Without that cap a
// limit whose burst is below one cost per server could never see a round in its bucket,
// and would pace every server after every grant, even for keys well within their limit.
func (l *Lease) round(c *LeaseConfig, want int) float64 {
	return min(float64(want)*float64(c.servers()), float64(c.Burst))
}

// capped bounds a pacing wait d after answer g. Waiting for a whole round is what keeps
// many servers from asking together, but a round may be the whole burst (always, for one
// server): 2 s of refill for a burst of 200 at 100/s, during which the server admits
// nothing and then finds a bucket it could have drawn from all along. So a server waits
// at most one refill interval, about what a batch should last, and at least as long as
// the bucket needs to refill one token for every server (asking sooner cannot find one
// for each) and as long as it needs to hold the refill's min (g.Wait, after a grant of
// 0). A wait above that bound is drawn again in [bound, 1.5 × bound), so the servers so
// capped still do not wake together, and never made longer.
func (l *Lease) capped(c *LeaseConfig, g Grant, d time.Duration) time.Duration {
	bound := max(c.RefillInterval, l.fairShare(c, float64(c.servers())), min(max(g.Wait, 0), maxPace))
	if d <= bound {
		return d
	}
	return min(d, time.Duration(float64(bound)*(1+0.5*uniform(&l.rng))))
}

// fairShare is the time the fleet's bucket needs to refill the tokens it lacks for one
// round of batches (batch × servers − what it still holds): about batch × servers / rate
// when contention has emptied it. It is never less than one token's time.
func (l *Lease) fairShare(c *LeaseConfig, lack float64) time.Duration {
	return min(tokenbucket.Duration(max(lack, 1), c.Rate), maxPace)
}

// jitter returns d scaled by a factor uniform in [0.5, 1.5).
func (l *Lease) jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.5 + uniform(&l.rng)))
}

// uniform advances the splitmix64 state s and returns a number uniform in [0, 1).
func uniform(s *uint64) float64 {
	*s += 0x9e3779b97f4a7c15
	z := *s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return unit(z)
}

// unit maps a uniformly drawn h to a number uniform in [0, 1): its top 53 bits.
func unit(h uint64) float64 { return float64(h>>11) / (1 << 53) }

// window is the demand window of c, never zero.
func window(c *LeaseConfig) int64 {
	if c.DemandWindow <= 0 {
		return int64(DefaultDemandWindow)
	}
	return int64(c.DemandWindow)
}

// roll moves the demand windows forward to t. An instant before the current window (a
// clock that stepped back) changes nothing.
func (l *Lease) roll(c *LeaseConfig, t int64) {
	w := window(c)
	switch el := t - l.winStart; {
	case el < w:
	case el < 2*w:
		l.prev, l.cur = l.cur, 0
		l.winStart += w
	default:
		l.prev, l.cur = 0, 0
		l.winStart = t
	}
}

// Demand returns the local demand estimate at now, in tokens per second: the larger of the
// sliding-window estimate and the fast one (see [Lease.Batch]).
func (l *Lease) Demand(c *LeaseConfig, now time.Time) float64 {
	return l.demand(c, l.at(now))
}

func (l *Lease) demand(c *LeaseConfig, t int64) float64 {
	sliding, fast := l.rates(c, t)
	return max(sliding, fast)
}

// rates returns two estimates of local demand in tokens per second. sliding weighs the
// previous window by how much of it still overlaps plus the current one; it is steady but
// slow to see a rise. fast is the current window alone over at least one refill interval;
// it sees a sudden rise at once and sizes batches, but a single request looks like a rate.
func (l *Lease) rates(c *LeaseConfig, t int64) (sliding, fast float64) {
	l.roll(c, t)
	w := window(c)
	el := max(t-l.winStart, 0)
	frac := min(float64(el)/float64(w), 1)
	sliding = (float64(l.prev)*(1-frac) + float64(l.cur)) / (float64(w) / 1e9)
	fast = float64(l.cur) / (float64(max(el, int64(c.RefillInterval), int64(time.Millisecond))) / 1e9)
	return sliding, fast
}
