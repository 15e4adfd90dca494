package engine

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// op is one step of a lease table test: an input at t0+at and what must come back.
type op struct {
	at   time.Duration
	kind opKind
	n    int // cost (acquire, recheck) or tokens granted (grant)

	remaining float64       // grant: the bucket's level after the take
	wait      time.Duration // grant: time until min is available
	staleSeq  bool          // grant/fail: answer a refill that is not the one in flight

	// expectations (acquire, recheck)
	act        Action
	reason     Reason
	want, min  int // refill asked for; 0 = none
	retryLo    time.Duration
	retryHi    time.Duration // RetryAfter must lie in [retryLo, retryHi]
	refund     int           // Step.Refund, or the return of grant/expire/drain
	tokensWant int           // tokens on hand after the op; -1 = do not check
}

type opKind uint8

const (
	acquire opKind = iota
	recheck
	grant
	fail
	expire
	drain
)

func (k opKind) String() string {
	return [...]string{"acquire", "recheck", "grant", "fail", "expire", "drain"}[k]
}

func runLease(t *testing.T, c LeaseConfig, ops []op) {
	t.Helper()
	c, err := c.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	l := NewLease(1)
	var seq uint64
	for i, o := range ops {
		now := t0.Add(o.at)
		switch o.kind {
		case acquire, recheck:
			var st Step
			if o.kind == acquire {
				st = l.Acquire(&c, now, o.n)
			} else {
				st = l.Recheck(&c, now, o.n)
			}
			if st.Refill.Want > 0 {
				seq = st.Refill.Seq
			}
			if st.Action != o.act || st.Reason != o.reason {
				t.Fatalf("step %d: %v(t0+%v, %d) = %v (%v), want %v (%v)", i, o.kind, o.at, o.n, st.Action, st.Reason, o.act, o.reason)
			}
			if st.Refill.Want != o.want || st.Refill.Min != o.min {
				t.Fatalf("step %d: %v(t0+%v, %d) refill want %d min %d, want %d min %d", i, o.kind, o.at, o.n, st.Refill.Want, st.Refill.Min, o.want, o.min)
			}
			if st.RetryAfter < o.retryLo || st.RetryAfter > o.retryHi {
				t.Fatalf("step %d: %v(t0+%v, %d) retry-after %v, want in [%v, %v]", i, o.kind, o.at, o.n, st.RetryAfter, o.retryLo, o.retryHi)
			}
			if st.Refund != o.refund {
				t.Fatalf("step %d: %v(t0+%v, %d) refund %d, want %d", i, o.kind, o.at, o.n, st.Refund, o.refund)
			}
		case grant:
			s := seq
			if o.staleSeq {
				s = seq - 1
			}
			if got := l.Granted(&c, now, s, Grant{Granted: o.n, Remaining: o.remaining, Wait: o.wait}); got != o.refund {
				t.Fatalf("step %d: Granted(t0+%v, %d) refund %d, want %d", i, o.at, o.n, got, o.refund)
			}
		case fail:
			s := seq
			if o.staleSeq {
				s = seq - 1
			}
			l.Failed(s)
		case expire:
			if got := l.Expire(&c, now); got != o.refund {
				t.Fatalf("step %d: Expire(t0+%v) = %d, want %d", i, o.at, got, o.refund)
			}
		case drain:
			if got, _ := l.Drain(); got != o.refund {
				t.Fatalf("step %d: Drain() = %d, want %d", i, got, o.refund)
			}
		}
		if o.tokensWant >= 0 && l.Tokens() != o.tokensWant {
			t.Fatalf("step %d: %v: tokens on hand %d, want %d", i, o.kind, l.Tokens(), o.tokensWant)
		}
		s := l.Stats()
		if s.Granted != s.Consumed+s.Refunded+int64(s.OnHand) {
			t.Fatalf("step %d: stats %+v: granted != consumed + refunded + on hand", i, s)
		}
	}
}

// Shorthands for table rows. tokens -1 skips the check.
func acq(at time.Duration, n int, act Action, reason Reason, want, minimum, tokens int) op {
	return op{at: at, kind: acquire, n: n, act: act, reason: reason, want: want, min: minimum, tokensWant: tokens}
}

func rec(at time.Duration, n int, act Action, reason Reason, want, minimum, tokens int) op {
	o := acq(at, n, act, reason, want, minimum, tokens)
	o.kind = recheck
	return o
}

func grt(at time.Duration, granted int, remaining float64, tokens int) op {
	return op{at: at, kind: grant, n: granted, remaining: remaining, tokensWant: tokens}
}

func denied(at time.Duration, n int, reason Reason, lo, hi time.Duration, tokens int) op {
	return op{at: at, kind: acquire, n: n, act: Deny, reason: reason, retryLo: lo, retryHi: hi, tokensWant: tokens}
}

const ms = time.Millisecond

func TestLeaseRules(t *testing.T) {
	big := LeaseConfig{Rate: 1000, Burst: 1000, Servers: 1}
	tests := []struct {
		name string
		cfg  LeaseConfig
		ops  []op
	}{
		{"cold key asks for one cost and waits", big, []op{
			acq(0, 1, Wait, ReasonRefill, 1, 1, 0),
			grt(1*ms, 1, 999, 1),
			rec(1*ms, 1, Allow, ReasonLease, 0, 0, 0),
		}},
		{"one refill in flight: others wait without a second refill", big, []op{
			acq(0, 1, Wait, ReasonRefill, 1, 1, 0),
			acq(0, 1, Wait, ReasonRefill, 0, 0, 0),
			acq(0, 2, Wait, ReasonRefill, 0, 0, 0),
		}},
		{"batch follows demand: 50 asked in the first 100ms -> 500/s x 100ms", big, append(
			repeatOps(50, acq(0, 1, Wait, ReasonRefill, 0, 0, 0), acq(0, 1, Wait, ReasonRefill, 1, 1, 0)),
			grt(1*ms, 1, 200, 1), // room for no roomy batch (2 x 127 for the one server)
			rec(1*ms, 1, Allow, ReasonLease, 0, 0, 0),
			acq(2*ms, 1, Wait, ReasonRefill, 51, 1, 0), // 51 asked / 100ms -> batch 51
		)},
		{"batch capped at burst / servers", LeaseConfig{Rate: 1000, Burst: 100, Servers: 10}, append(
			repeatOps(500, acq(0, 1, Wait, ReasonRefill, 0, 0, 0), acq(0, 1, Wait, ReasonRefill, 1, 1, 0)),
			grt(1*ms, 1, 99, 1),
			rec(1*ms, 1, Allow, ReasonLease, 10, 1, 0), // prefetch: 501 asked, batch capped at 10
			acq(2*ms, 1, Wait, ReasonRefill, 0, 0, 0),
		)},
		{"burst / servers below cost: one cost per server", LeaseConfig{Rate: 10, Burst: 10, Servers: 20}, append(
			repeatOps(100, acq(0, 3, Wait, ReasonRefill, 0, 0, 0), acq(0, 3, Wait, ReasonRefill, 3, 3, 0)),
			grt(1*ms, 3, 7, 3),
			rec(1*ms, 3, Allow, ReasonLease, 0, 0, 0),
			// 7 left, below a round, but a round of 3 x 20 cannot fit a bucket of 10: pace
			// until the bucket is full again, 3 / 10/s = 300ms, jittered
			denied(1*ms, 3, ReasonPaced, 149*ms, 450*ms, 0),
		)},
		{"AllowN is atomic: short tokens are kept, min = n - on hand", big, []op{
			acq(0, 1, Wait, ReasonRefill, 1, 1, 0),
			grt(1*ms, 3, 997, 3),
			rec(1*ms, 5, Wait, ReasonRefill, 2, 2, 3), // needs 2 more, asks at least 2
			grt(2*ms, 0, 1, 3),                        // bucket has 1: grant 0
			denied(3*ms, 5, ReasonPaced, 0, 2*ms, 3),  // still 3 on hand, none spent
			rec(3*ms, 3, Allow, ReasonLease, 0, 0, 0), // a cost-3 request fits
			acq(3*ms, 1, Wait, ReasonRefill, 7, 1, 0), // paced, but the bucket held 1, this request's need
			grt(4*ms, 0, 0, 0),                        // it is gone: paced again
			denied(5*ms, 1, ReasonPaced, 0, 10*ms, 0), // round 7 / 1000/s, jittered
			denied(5*ms, 1001, ReasonExceedsBurst, InfDuration, InfDuration, 0),
		}},
		{"zero grant paces about batch x servers / rate, jittered", LeaseConfig{Rate: 100, Burst: 100, Servers: 10}, []op{
			acq(0, 1, Wait, ReasonRefill, 1, 1, 0),
			grt(1*ms, 0, 0.5, 0),
			// fair share (1 x 10 - 0.5) / 100 = 95ms, jittered to [47.5ms, 142.5ms)
			denied(1*ms, 1, ReasonPaced, 46*ms, 142*ms, 0),
			denied(40*ms, 1, ReasonPaced, 10*ms, 111*ms, 0),
			acq(152*ms, 1, Wait, ReasonRefill, 3, 1, 0), // 4 asked in 152ms x 100ms -> 3
		}},
		{"pacing counts what the bucket still holds", LeaseConfig{Rate: 100, Burst: 100, Servers: 10}, []op{
			acq(0, 2, Wait, ReasonRefill, 2, 2, 0),
			{at: 1 * ms, kind: grant, n: 0, remaining: 1.5, wait: 5 * ms, tokensWant: 0},
			// a round is 2 x 10; the bucket lacks 18.5: 185ms, jittered to [92.5ms, 277.5ms)
			denied(1*ms, 1, ReasonPaced, 91*ms, 277*ms, 0),
		}},
		{"partial grant paces; tokens on hand still serve, prefetch waits", LeaseConfig{Rate: 1000, Burst: 1000, Servers: 4}, append(
			repeatOps(40, acq(0, 1, Wait, ReasonRefill, 0, 0, 0), acq(0, 1, Wait, ReasonRefill, 1, 1, 0)),
			grt(1*ms, 1, 800, 1), // room for no roomy batch (2 x 102 x 4 servers)
			rec(1*ms, 1, Allow, ReasonLease, 0, 0, 0),
			acq(1*ms, 1, Wait, ReasonRefill, 41, 1, 0),
			grt(2*ms, 4, 0.3, 4),                      // partial: paced ~ 41 x 4 / 1000 = 164ms
			rec(2*ms, 1, Allow, ReasonLease, 0, 0, 3), // below watermark, but no prefetch: paced
			rec(2*ms, 3, Allow, ReasonLease, 0, 0, 0),
			denied(3*ms, 1, ReasonPaced, 70*ms, 245*ms, 0),
		)},
		{"full grant leaving less than one fleet round paces", LeaseConfig{Rate: 1000, Burst: 1000, Servers: 10}, []op{
			acq(0, 1, Wait, ReasonRefill, 1, 1, 0),
			grt(1*ms, 1, 2, 1), // 2 left < 1 x 10: lacks 8, 8ms, jittered
			rec(1*ms, 1, Allow, ReasonLease, 0, 0, 0),
			denied(1*ms, 1, ReasonPaced, 4*ms, 12*ms, 0),
		}},
		{"full grant with room to spare does not pace", LeaseConfig{Rate: 1000, Burst: 1000, Servers: 10}, []op{
			acq(0, 1, Wait, ReasonRefill, 1, 1, 0),
			grt(1*ms, 1, 50, 1), // a round is 1 x 10; no roomy batch (2 x 5 x 10)
			rec(1*ms, 1, Allow, ReasonLease, 0, 0, 0),
			acq(1*ms, 1, Wait, ReasonRefill, 2, 1, 0),
		}},
		{"prefetch below the low watermark, once", LeaseConfig{Rate: 1000, Burst: 1000, Servers: 1, Lifetime: 5 * time.Second}, append(
			repeatOps(100, acq(0, 1, Wait, ReasonRefill, 0, 0, 0), acq(0, 1, Wait, ReasonRefill, 1, 1, 0)),
			grt(1*ms, 1, 400, 1),                        // room for no roomy batch (2 x 250)
			rec(1*ms, 1, Allow, ReasonLease, 100, 1, 0), // 0 < 0.5 x batch 100: prefetch
			grt(2*ms, 100, 300, 100),
			acq(3*ms, 20, Allow, ReasonLease, 0, 0, 80),      // 80 >= 0.5 x batch 120: no prefetch
			acq(3*ms, 30, Allow, ReasonLease, 0, 0, 50),      // 50 >= 0.5 x the last batch 100: not yet
			acq(3*ms, 10, Allow, ReasonLease, 160-40, 1, 40), // 40 < 50: prefetch up to the batch, now 160
			acq(3*ms, 10, Allow, ReasonLease, 0, 0, 30),      // in flight: no second prefetch
		)},
		{"no prefetch for an idle key: tokens would only expire", LeaseConfig{Rate: 1000, Burst: 1000, Servers: 1, Lifetime: 10 * ms}, []op{
			acq(0, 1, Wait, ReasonRefill, 1, 1, 0),
			grt(1*ms, 1, 999, 1),
			rec(1*ms, 1, Allow, ReasonLease, 0, 0, 0),
		}},
		{"expired tokens are refunded, then a refill starts", LeaseConfig{Rate: 1000, Burst: 1000, Servers: 1, Lifetime: 50 * ms}, []op{
			acq(0, 3, Wait, ReasonRefill, 3, 3, 0),
			grt(1*ms, 3, 5, 3), // below twice the 3 on hand: not roomy, one lifetime
			rec(1*ms, 1, Allow, ReasonLease, 0, 0, 2),
			{at: 50 * ms, kind: expire, refund: 0, tokensWant: 2}, // lifetime runs from the grant
			{at: 51 * ms, kind: acquire, n: 1, act: Wait, reason: ReasonRefill, want: 4, min: 1, refund: 2, tokensWant: 0},
		}},
		{"Expire on its own", LeaseConfig{Rate: 1000, Burst: 1000, Servers: 1, Lifetime: 50 * ms}, []op{
			acq(0, 2, Wait, ReasonRefill, 2, 2, 0),
			grt(1*ms, 2, 3, 2), // below twice the 2 on hand: not roomy, one lifetime
			{at: 51 * ms, kind: expire, refund: 2, tokensWant: 0},
			{at: 52 * ms, kind: expire, refund: 0, tokensWant: 0},
		}},
		// A grant that leaves the bucket holding twice the tokens on hand for every
		// server renews them for five lifetimes; one token less, for one.
		{"a roomy grant's tokens live five lifetimes", LeaseConfig{Rate: 1000, Burst: 1000, Servers: 2, Lifetime: 50 * ms}, []op{
			acq(0, 2, Wait, ReasonRefill, 2, 2, 0),
			grt(1*ms, 2, 8, 2), // 8 = 2 x 2 on hand x 2 servers
			{at: 51 * ms, kind: expire, refund: 0, tokensWant: 2},
			{at: 250 * ms, kind: expire, refund: 0, tokensWant: 2},
			{at: 251 * ms, kind: expire, refund: 2, tokensWant: 0},
		}},
		{"a grant short of room: one lifetime", LeaseConfig{Rate: 1000, Burst: 1000, Servers: 2, Lifetime: 50 * ms}, []op{
			acq(0, 2, Wait, ReasonRefill, 2, 2, 0),
			grt(1*ms, 2, 7, 2),
			{at: 50 * ms, kind: expire, refund: 0, tokensWant: 2},
			{at: 51 * ms, kind: expire, refund: 2, tokensWant: 0},
		}},
		{"drain returns tokens; the late answer of the forgotten refill is refunded", big, []op{
			acq(0, 4, Wait, ReasonRefill, 4, 4, 0),
			grt(1*ms, 4, 20, 4), // room for no roomy batch
			rec(1*ms, 3, Allow, ReasonLease, 0, 0, 1),
			acq(1*ms, 2, Wait, ReasonRefill, 5, 1, 1), // 6 asked -> batch 6, 1 on hand
			{at: 2 * ms, kind: drain, refund: 1, tokensWant: 0},
			{at: 3 * ms, kind: grant, n: 4, remaining: 992, refund: 4, tokensWant: 0},
			acq(4*ms, 2, Wait, ReasonRefill, 8, 2, 0),
		}},
		{"a failed refill clears the flight; its late answer is refunded", big, []op{
			acq(0, 1, Wait, ReasonRefill, 1, 1, 0),
			{at: 1 * ms, kind: fail, tokensWant: 0},
			{at: 2 * ms, kind: grant, n: 1, remaining: 999, refund: 1, tokensWant: 0},
			acq(3*ms, 1, Wait, ReasonRefill, 2, 1, 0),
			{at: 4 * ms, kind: fail, staleSeq: true, tokensWant: 0}, // not the flight: ignored
			acq(4*ms, 1, Wait, ReasonRefill, 0, 0, 0),
			{at: 5 * ms, kind: grant, n: 2, staleSeq: true, remaining: 9, refund: 2, tokensWant: 0},
			grt(5*ms, 3, 990, 3),
		}},
		{"cost 0 passes, negative cost is refused", big, []op{
			acq(0, 0, Allow, ReasonLease, 0, 0, 0),
			{at: 0, kind: acquire, n: -1, act: Deny, reason: ReasonInvalidCost, retryLo: InfDuration, retryHi: InfDuration, tokensWant: 0},
		}},
		{"cost above burst can never pass", LeaseConfig{Rate: 10, Burst: 5}, []op{
			{at: 0, kind: acquire, n: 6, act: Deny, reason: ReasonExceedsBurst, retryLo: InfDuration, retryHi: InfDuration, tokensWant: 0},
			acq(0, 5, Wait, ReasonRefill, 5, 5, 0),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runLease(t, tt.cfg, tt.ops) })
	}
}

// repeatOps returns first followed by n-1 copies of rest.
func repeatOps(n int, rest, first op) []op {
	out := []op{first}
	for range n - 1 {
		out = append(out, rest)
	}
	return out
}

// TestLeaseConfigNormalize checks the tuning; a limit's rate and burst are checked by
// redisstore.Limit.Validate before a LeaseConfig is built (TestNewRejectsBadConfig).
func TestLeaseConfigNormalize(t *testing.T) {
	bad := []LeaseConfig{
		{Rate: 1, Burst: 1, Servers: -1},
		{Rate: 1, Burst: 1, Lifetime: -1},
		{Rate: 1, Burst: 1, LowWatermark: 2},
		{Rate: 1, Burst: 1, LowWatermark: nan()},
		// Durations the core adds to instants must not overflow them, and tokens must
		// outlive the trip that brings them (a Lifetime of MaxInt64 would expire every
		// grant on arrival: 172 takes for 3 requests).
		{Rate: 1, Burst: 1, Lifetime: math.MaxInt64},
		{Rate: 1, Burst: 1, Lifetime: MaxLeaseDuration + 1},
		{Rate: 1, Burst: 1, RefillInterval: MaxLeaseDuration + 1},
		{Rate: 1, Burst: 1, DemandWindow: math.MaxInt64},
		{Rate: 1, Burst: 1, Lifetime: time.Microsecond},
	}
	for _, c := range bad {
		if _, err := c.Normalize(); err == nil {
			t.Errorf("Normalize(%+v) accepted it", c)
		}
	}
	c, err := LeaseConfig{Rate: 1, Burst: 1}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	want := LeaseConfig{Rate: 1, Burst: 1, Servers: 1, RefillInterval: DefaultRefillInterval,
		Lifetime: DefaultLifetime, LowWatermark: DefaultLowWatermark, DemandWindow: DefaultDemandWindow}
	if c != want {
		t.Errorf("Normalize defaults = %+v, want %+v", c, want)
	}
}

func TestLeaseZeroConfigDoesNotPanic(t *testing.T) {
	var c LeaseConfig // not normalized: zero rate, burst, servers
	l := NewLease(3)
	st := l.Acquire(&c, t0, 1)
	if st.Action != Deny || st.Reason != ReasonExceedsBurst {
		t.Fatalf("Acquire on a zero config = %+v", st)
	}
	c.Burst = 1
	st = l.Acquire(&c, t0, 1)
	l.Granted(&c, t0, st.Refill.Seq, Grant{})
	if d := l.PacedUntil().Sub(t0); d <= 0 || d > maxPace {
		t.Fatalf("pacing with rate 0 = %v, want (0, %v]", d, maxPace)
	}
}

func TestLeaseJitterDeterministic(t *testing.T) {
	c, _ := LeaseConfig{Rate: 100, Burst: 100, Servers: 10}.Normalize()
	paced := func(seed uint64) time.Duration {
		l := NewLease(seed)
		st := l.Acquire(&c, t0, 1)
		l.Granted(&c, t0, st.Refill.Seq, Grant{})
		return l.PacedUntil().Sub(t0)
	}
	if paced(7) != paced(7) {
		t.Fatal("same seed, different jitter")
	}
	seen := map[time.Duration]bool{}
	for s := range uint64(20) {
		seen[paced(s)] = true
	}
	if len(seen) < 15 {
		t.Fatalf("20 seeds gave only %d distinct pacing intervals", len(seen))
	}
}

// TestLeaseBatchWithRoom checks the batch of a key far within its limit: 25 refill
// intervals (at most half a roomy lifetime, five lifetimes) at the steady demand once
// the bucket held that twice over for every server, the refill interval's batch
// otherwise.
func TestLeaseBatchWithRoom(t *testing.T) {
	// 20 requests in the first 500 ms of the demand window: sliding 20/s, fast 40/s.
	// A refill interval's batch is 40/s × 100 ms = 4; a roomy one 20/s × 2.5 s = 50.
	base := LeaseConfig{Rate: 1000, Burst: 10000, Servers: 4, Lifetime: time.Second}
	tests := []struct {
		name      string
		cfg       LeaseConfig
		remaining float64 // the bucket at the answer; < 0: no answer yet
		want      int
	}{
		{"room: twice the batch for every server", base, 400, 50},
		{"one token short of the room", base, 399, 4},
		{"nothing heard of the bucket", base, -1, 4},
		{"half of a shorter roomy lifetime (2 s)", func() LeaseConfig { c := base; c.Lifetime = 400 * ms; return c }(), 1000, 20},
		{"a roomy lifetime no longer than the refill interval's batch", func() LeaseConfig { c := base; c.Lifetime = 80 * ms; return c }(), 1000, 4},
		{"a longer lifetime: 25 refill intervals", func() LeaseConfig { c := base; c.Lifetime = 10 * time.Second; return c }(), 1000, 50},
		{"a shorter refill interval: 25 of them", func() LeaseConfig { c := base; c.RefillInterval = 50 * ms; return c }(), 1000, 25},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.cfg.Normalize()
			if err != nil {
				t.Fatal(err)
			}
			l := NewLease(1)
			st := l.Acquire(&c, t0, 1)
			if tt.remaining >= 0 {
				l.Granted(&c, t0, st.Refill.Seq, Grant{Granted: 1, Remaining: tt.remaining})
			}
			for i := 1; i < 20; i++ {
				l.Acquire(&c, t0.Add(time.Duration(i)*25*ms), 1)
			}
			if got := l.Batch(&c, t0.Add(500*ms), 1); got != tt.want {
				t.Fatalf("batch %d, want %d", got, tt.want)
			}
		})
	}
}

// TestRoomyKeyPrefetches: a key far within its limit, asked 20 times a second on one of
// 4 servers whose bucket always holds 9,000, gets roomy batches and prefetches the next
// before its tokens run out: requests wait for Redis only while its demand estimate
// warms up, not at the end of every batch.
func TestRoomyKeyPrefetches(t *testing.T) {
	for _, tc := range []struct {
		name      string
		remaining float64
		maxWaits  int
	}{
		{"roomy", 9000, 3},
		{"not roomy: refill-interval batches, prefetched", 40, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := LeaseConfig{Rate: 10000, Burst: 10000, Servers: 4}.Normalize()
			if err != nil {
				t.Fatal(err)
			}
			l := NewLease(1)
			waits, prefetches := 0, 0
			for i := range 400 { // 20 s at 20/s
				now := t0.Add(time.Duration(i) * 50 * ms)
				st := l.Acquire(&c, now, 1)
				if st.Refill.Want > 0 {
					if st.Action == Wait {
						waits++
					} else {
						prefetches++
					}
					l.Granted(&c, now, st.Refill.Seq, Grant{Granted: st.Refill.Want, Remaining: tc.remaining})
				}
				if st.Action == Wait {
					if st := l.Recheck(&c, now, 1); st.Action != Allow {
						t.Fatalf("request %d: %v after its refill's grant", i, st.Action)
					}
				}
			}
			if waits > tc.maxWaits || prefetches == 0 {
				t.Fatalf("%d waits and %d prefetches over 400 requests: want at most %d waits, and prefetches", waits, prefetches, tc.maxWaits)
			}
			t.Logf("%d waits, %d prefetches, %d refills", waits, prefetches, l.Stats().Refills)
		})
	}
}

// TestLeasePacingStopsAtFullBucket: after a full grant that leaves the bucket below a
// round, the jittered wait never ends after the bucket is full again (refill past that
// is lost), yet still spreads over [half, all] of that time. Burst 20 over 200 servers at
// 10/s: each lease holds one token; a grant leaving 19 is paced up to 0.1 s, the time the
// bucket takes to be full.
func TestLeasePacingStopsAtFullBucket(t *testing.T) {
	c, _ := LeaseConfig{Rate: 10, Burst: 20, Servers: 200}.Normalize()
	full := 100 * time.Millisecond
	seen := map[time.Duration]bool{}
	for seed := range uint64(200) {
		l := NewLease(seed)
		st := l.Acquire(&c, t0, 1)
		l.Granted(&c, t0, st.Refill.Seq, Grant{Granted: 1, Remaining: 19})
		d := l.PacedUntil().Sub(t0)
		if d < full/2 || d > full {
			t.Fatalf("seed %d: paced %v after a full grant leaving 19 of 20, want within [%v, %v]", seed, d, full/2, full)
		}
		seen[d] = true
	}
	if len(seen) < 150 {
		t.Fatalf("200 seeds gave only %d distinct pacing intervals", len(seen))
	}
}

// TestLeaseConservesTokens drives a lease with random demand, grants (full, partial, zero,
// over-long), failures, late answers, expiry and drains, and checks that the tokens it
// hands out (consumed) plus those it hands back (refunded) never exceed those granted, that
// the stats balance exactly, and that a server never holds more than its cap. On every
// request that Lease.serves says a hit serves, Lease.hit must leave the lease as Acquire
// does and answer as it does (the engine's hot path takes hit for Acquire).
func TestLeaseConservesTokens(t *testing.T) {
	seeds := 400
	if testing.Short() {
		seeds = 50
	}
	var hits, full int
	for seed := range seeds {
		r := rand.New(rand.NewPCG(uint64(seed), 99))
		c, err := LeaseConfig{
			Rate:           float64(1 + r.IntN(2000)),
			Burst:          1 + r.IntN(500),
			Servers:        1 + r.IntN(50),
			RefillInterval: time.Duration(1+r.IntN(200)) * ms,
			Lifetime:       time.Duration(1+r.IntN(500)) * ms,
			LowWatermark:   r.Float64() - 0.1,
		}.Normalize()
		if err != nil {
			t.Fatal(err)
		}
		maxCost := 1 + r.IntN(min(c.Burst, 8))
		l := NewLease(uint64(seed))
		now := t0
		var given, consumed, refunded int64
		var flight Refill
		var stale []Refill // refills whose answers may still come
		for range 2000 {
			now = now.Add(time.Duration(r.IntN(5000)) * time.Microsecond)
			switch k := r.IntN(10); {
			case k < 5: // a request
				n := r.IntN(maxCost + 1)
				hl := l
				at, served := hl.serves(&c, now.UnixNano(), n)
				var remaining int
				if served {
					remaining = hl.hit(&c, at, n)
				}
				st := l.Acquire(&c, now, n)
				switch {
				case !served:
					full++
				case hl != l || st != (Step{Action: Allow, Reason: ReasonLease, Remaining: remaining}):
					t.Fatalf("seed %d: hit of %d at %v left %+v, answered %d; Acquire left %+v, answered %+v", seed, n, now.Sub(t0), hl, remaining, l, st)
				default:
					hits++
				}
				refunded += int64(st.Refund)
				if st.Action == Allow {
					consumed += int64(max(n, 0))
				}
				if st.Refill.Want > 0 {
					if flight.Want > 0 {
						t.Fatalf("seed %d: second refill %+v while %+v in flight", seed, st.Refill, flight)
					}
					if st.Refill.Min < 1 || st.Refill.Min > st.Refill.Want {
						t.Fatalf("seed %d: bad refill %+v", seed, st.Refill)
					}
					flight = st.Refill
				}
			case k < 7 && flight.Want > 0: // the answer
				g := flight.Want
				switch r.IntN(3) {
				case 0:
					g = 0
				case 1:
					g = flight.Min + r.IntN(flight.Want-flight.Min+1)
				}
				given += int64(g)
				refunded += int64(l.Granted(&c, now, flight.Seq, Grant{Granted: g, Remaining: r.Float64() * float64(c.Burst), Wait: time.Duration(r.IntN(100)) * ms}))
				flight = Refill{}
			case k == 7 && flight.Want > 0:
				l.Failed(flight.Seq)
				stale = append(stale, flight)
				flight = Refill{}
			case k == 8 && len(stale) > 0: // a late answer
				s := stale[0]
				stale = stale[1:]
				given += int64(s.Want)
				if got := l.Granted(&c, now, s.Seq, Grant{Granted: s.Want}); got != s.Want {
					t.Fatalf("seed %d: late grant of %d refunded %d", seed, s.Want, got)
				}
				refunded += int64(s.Want)
			case k == 9:
				if r.IntN(4) == 0 {
					n, _ := l.Drain()
					refunded += int64(n)
					if flight.Want > 0 {
						stale = append(stale, flight)
						flight = Refill{}
					}
				} else {
					refunded += int64(l.Expire(&c, now))
				}
			}
			if consumed+refunded > given {
				t.Fatalf("seed %d: consumed %d + refunded %d > granted %d", seed, consumed, refunded, given)
			}
			s := l.Stats()
			if s.Granted != given || s.Consumed != consumed || s.Refunded != refunded || s.Granted != s.Consumed+s.Refunded+int64(s.OnHand) {
				t.Fatalf("seed %d: stats %+v, caller saw granted %d consumed %d refunded %d", seed, s, given, consumed, refunded)
			}
			if s.OnHand < 0 || s.OnHand > c.Cap(maxCost) {
				t.Fatalf("seed %d: %d on hand, cap %d", seed, s.OnHand, c.Cap(maxCost))
			}
		}
	}
	if hits < 1000 || full < 1000 {
		t.Errorf("%d requests a hit served and %d it did not: the walk does not test Lease.hit", hits, full)
	}
}

func BenchmarkLeaseAcquire(b *testing.B) {
	c, _ := LeaseConfig{Rate: 1e9, Burst: 1 << 30, Servers: 1}.Normalize()
	l := NewLease(1)
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Microsecond)
		st := l.Acquire(&c, now, 1)
		if st.Refill.Want > 0 {
			l.Granted(&c, now, st.Refill.Seq, Grant{Granted: st.Refill.Want, Remaining: 1 << 29})
		}
	}
}

func nan() float64 { return math.NaN() }

// TestCostAboveBurstIsNoDemand: a request above the burst is denied and left out of the
// key's demand estimate, however large its cost: the estimate after it and one request
// of 1 is the estimate after that request alone.
func TestCostAboveBurstIsNoDemand(t *testing.T) {
	c, err := (&LeaseConfig{Rate: 100, Burst: 100, Servers: 1}).Normalize()
	if err != nil {
		t.Fatal(err)
	}
	plain := NewLease(1)
	plain.Acquire(&c, t0.Add(ms), 1)
	want := plain.Demand(&c, t0.Add(ms))
	for _, n := range []int{101, 1 << 40, math.MaxInt} {
		l := NewLease(1)
		if st := l.Acquire(&c, t0, n); st.Action != Deny || st.Reason != ReasonExceedsBurst || st.RetryAfter != InfDuration {
			t.Errorf("cost %d: %+v, want denied for good", n, st)
		}
		l.Acquire(&c, t0.Add(ms), 1)
		if got := l.Demand(&c, t0.Add(ms)); got != want {
			t.Errorf("cost %d, then 1: demand %v, want %v (the 1 alone)", n, got, want)
		}
	}
}
