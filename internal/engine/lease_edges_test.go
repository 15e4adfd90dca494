package engine

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// leaseWith returns a lease under c (normalized) that asked for a refill of cost 1 at t0
// and was answered at t0 with g: granted tokens on hand, expiring and paced as Granted
// says. It returns the normalized config too.
func leaseWith(t *testing.T, c LeaseConfig, g Grant) (Lease, LeaseConfig) {
	t.Helper()
	c, err := c.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	l := NewLease(1)
	st := l.Acquire(&c, t0, 1)
	if st.Refill.Want == 0 {
		t.Fatalf("a new lease started no refill: %+v", st)
	}
	if refund := l.Granted(&c, t0, st.Refill.Seq, g); refund != 0 {
		t.Fatalf("the answer to the refill in flight was refunded: %d", refund)
	}
	return l, c
}

// newEdgeLease returns a new lease and edgeCfg, normalized.
func newEdgeLease(t *testing.T) (Lease, LeaseConfig) {
	t.Helper()
	c, err := edgeCfg.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	return NewLease(1), c
}

// edgeCfg is a lease tuning whose grants at t0 leaving the bucket a few tokens expire at
// t0+50ms (one lifetime: not roomy) and are not paced (the bucket holds a round).
var edgeCfg = LeaseConfig{Rate: 1000, Burst: 1000, Servers: 1, Lifetime: 50 * ms, LowWatermark: -1}

// TestLeaseCanServeAgreesWithAcquire: CanServe reports exactly what Acquire would do
// with the tokens on hand: allow a request they cover while they are usable, up to the
// instant they expire, excluded, and a request of cost 0 at any time. The hot path's
// serves agrees for every cost above 0 (prefetch is off: nothing else to do).
func TestLeaseCanServeAgreesWithAcquire(t *testing.T) {
	tests := []struct {
		name string
		at   time.Duration
		n    int
		want bool
	}{
		{"all the tokens on hand", 10 * ms, 3, true},
		{"fewer than on hand", 10 * ms, 2, true},
		{"more than on hand", 10 * ms, 4, false},
		{"the last instant before expiry", 50*ms - 1, 3, true},
		{"the instant they expire", 50 * ms, 3, false},
		{"after expiry", 60 * ms, 1, false},
		{"cost 0 after expiry", 60 * ms, 0, true},
		{"negative cost", 10 * ms, -1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, c := leaseWith(t, edgeCfg, Grant{Granted: 3, Remaining: 2})
			if got := l.CanServe(&c, t0.Add(tt.at), tt.n); got != tt.want {
				t.Fatalf("CanServe(t0+%v, %d) = %v, want %v", tt.at, tt.n, got, tt.want)
			}
			if _, ok := l.serves(&c, t0.Add(tt.at).UnixNano(), tt.n); ok != (tt.want && tt.n > 0) {
				t.Fatalf("serves(t0+%v, %d) = %v, want %v", tt.at, tt.n, ok, tt.want && tt.n > 0)
			}
			if st := l.Acquire(&c, t0.Add(tt.at), tt.n); (st.Action == Allow) != tt.want {
				t.Fatalf("Acquire(t0+%v, %d) = %+v, CanServe said %v", tt.at, tt.n, st, tt.want)
			}
		})
	}
}

// TestLeaseUnspendUntilExpiry: tokens a caller did not use go back on hand while the
// tokens on hand are usable, up to the instant they expire, excluded; from that instant
// unspend refuses them and changes nothing (the caller refunds them).
func TestLeaseUnspendUntilExpiry(t *testing.T) {
	tests := []struct {
		name   string
		at     time.Duration
		back   bool
		tokens int // on hand after
	}{
		{"well before expiry", 10 * ms, true, 3},
		{"the last instant before expiry", 50*ms - 1, true, 3},
		{"the instant they expire", 50 * ms, false, 1},
		{"after expiry", 70 * ms, false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, c := leaseWith(t, edgeCfg, Grant{Granted: 3, Remaining: 2})
			if st := l.Acquire(&c, t0.Add(ms), 2); st.Action != Allow {
				t.Fatalf("Acquire of 2 of 3 on hand: %+v", st)
			}
			if got := l.unspend(t0.Add(tt.at), 2); got != tt.back {
				t.Fatalf("unspend(t0+%v, 2) = %v, want %v", tt.at, got, tt.back)
			}
			s := l.Stats()
			if s.OnHand != tt.tokens || s.Granted != s.Consumed+s.Refunded+int64(s.OnHand) {
				t.Fatalf("after unspend: %+v, want %d on hand and the stats balanced", s, tt.tokens)
			}
		})
	}
}

// TestLeasePacingEndsAtPacedUntil: a paced lease denies a request that finds no tokens
// until PacedUntil, with the time left as retry-after, and starts a refill for it at
// that instant.
func TestLeasePacingEndsAtPacedUntil(t *testing.T) {
	c := LeaseConfig{Rate: 100, Burst: 100, Servers: 10}
	tests := []struct {
		name   string
		before time.Duration // before PacedUntil
		act    Action
		retry  time.Duration
	}{
		{"a nanosecond before", 1, Deny, 1},
		{"a millisecond before", ms, Deny, ms},
		{"at the instant", 0, Wait, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, c := leaseWith(t, c, Grant{})
			until := l.PacedUntil()
			if !until.After(t0) {
				t.Fatalf("a grant of 0 from an empty bucket paced until %v, want after t0", until)
			}
			st := l.Acquire(&c, until.Add(-tt.before), 1)
			if st.Action != tt.act || st.RetryAfter != tt.retry || (st.Refill.Want > 0) != (tt.act == Wait) {
				t.Fatalf("Acquire at PacedUntil-%v = %+v, want %v, retry-after %v", tt.before, st, tt.act, tt.retry)
			}
		})
	}
}

// TestLeaseConfigNormalizeBounds: Normalize accepts every tuning at its bounds: the
// shortest lifetime, a low watermark of 1 (prefetch as soon as a token is spent), and
// the longest durations.
func TestLeaseConfigNormalizeBounds(t *testing.T) {
	for _, c := range []LeaseConfig{
		{Rate: 1, Burst: 1, Lifetime: MinLifetime},
		{Rate: 1, Burst: 1, LowWatermark: 1},
		{Rate: 1, Burst: 1, RefillInterval: MaxLeaseDuration, Lifetime: MaxLeaseDuration, DemandWindow: MaxLeaseDuration},
	} {
		n, err := c.Normalize()
		if err != nil {
			t.Errorf("Normalize(%+v): %v", c, err)
			continue
		}
		if n.Lifetime != cmpOr(c.Lifetime, DefaultLifetime) || n.LowWatermark != cmpOr(c.LowWatermark, DefaultLowWatermark) {
			t.Errorf("Normalize(%+v) = %+v: the tuning given was not kept", c, n)
		}
	}
}

// TestLeaseSeen: a lease reports its bucket as seen (for Redis to re-create a lost one)
// only once an answer carried both the level and Redis's clock: the level floored at 0,
// the clock in Unix milliseconds.
func TestLeaseSeen(t *testing.T) {
	at := time.UnixMilli(1_900_000_000_123)
	tests := []struct {
		name string
		g    *Grant // nil: no answer yet
		want wire.Seen
	}{
		{"no answer yet", nil, wire.Seen{}},
		{"an answer without Redis's clock", &Grant{Granted: 1, Remaining: 7}, wire.Seen{}},
		{"an answer with it", &Grant{Granted: 1, Remaining: 7.9, At: at}, wire.Seen{Known: true, Level: 7, AtMS: at.UnixMilli()}},
		{"an empty bucket", &Grant{Remaining: -3, At: at}, wire.Seen{Known: true, Level: 0, AtMS: at.UnixMilli()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, c := newEdgeLease(t)
			st := l.Acquire(&c, t0, 1)
			if tt.g != nil {
				l.Granted(&c, t0, st.Refill.Seq, *tt.g)
			}
			if got := l.seen(); got != tt.want {
				t.Fatalf("seen() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestLeaseLateOwedUntilAnsweredInTime: what a late answer could not pay of what the
// failure policy admitted is paid first by the next late answers, until an answer in
// time (Granted): that ends it, and later late answers go on hand whole.
func TestLeaseLateOwedUntilAnsweredInTime(t *testing.T) {
	tests := []struct {
		name    string
		inTime  bool // a refill is answered in time between the two late answers
		paid    int  // of the second late answer's 4
		onHand  int  // after it
		granted int  // in time
	}{
		{"no answer in time between", false, 3, 1, 0},
		{"an answer in time between", true, 0, 4 + 4 - 1, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, c := newEdgeLease(t)
			// The policy admitted 5 to the waiters of a take whose late answer grants 2.
			if paid, ok := l.Late(&c, t0, 101, false, 5, Grant{Granted: 2}); !ok || paid != 2 {
				t.Fatalf("first late answer: paid %d, took %v; want 2, true", paid, ok)
			}
			if tt.inTime {
				st := l.Acquire(&c, t0.Add(ms), 1)
				if st.Refill.Want == 0 {
					t.Fatalf("no refill: %+v", st)
				}
				l.Granted(&c, t0.Add(ms), st.Refill.Seq, Grant{Granted: tt.granted, Remaining: 500})
				if st := l.Recheck(&c, t0.Add(ms), 1); st.Action != Allow {
					t.Fatalf("recheck after the grant: %+v", st)
				}
			}
			paid, ok := l.Late(&c, t0.Add(2*ms), 102, false, 0, Grant{Granted: 4})
			if !ok || paid != tt.paid {
				t.Fatalf("second late answer: paid %d, took %v; want %d, true", paid, ok, tt.paid)
			}
			if s := l.Stats(); s.OnHand != tt.onHand || s.Granted != s.Consumed+s.Refunded+int64(s.OnHand) {
				t.Fatalf("stats %+v, want %d on hand and balanced", s, tt.onHand)
			}
		})
	}
}

// TestLeaseFullGrantPacesBelowARound: a grant in full paces the lease when it leaves the
// bucket below one round (the batch for every server), and not when it leaves a round
// or more.
func TestLeaseFullGrantPacesBelowARound(t *testing.T) {
	c := LeaseConfig{Rate: 1000, Burst: 1000, Servers: 10} // a round of 1 is 10 tokens
	tests := []struct {
		remaining float64
		paced     bool
	}{
		{9.5, true},
		{10, false},
		{11, false},
	}
	for _, tt := range tests {
		l, _ := leaseWith(t, c, Grant{Granted: 1, Remaining: tt.remaining})
		if paced := !l.PacedUntil().IsZero(); paced != tt.paced {
			t.Errorf("a full grant leaving %v of a round of 10: paced %v (until %v), want %v", tt.remaining, paced, l.PacedUntil(), tt.paced)
		}
	}
}

// TestLeaseLostTakesGoAgain: after a take whose answer was lost, the lease's refills go
// under its Redis number (Refill.Resend) until one is answered, so that Redis answers
// from its record; unless the failure policy admitted its waiters (paid), the resend's
// own included: its grant paid for them and is not read back, and the next refill
// takes a fresh number.
func TestLeaseLostTakesGoAgain(t *testing.T) {
	tests := []struct {
		name   string
		paid   []bool // one take lost per entry, each the resend of the one before
		resent []bool // what Lost reports for each
		next   uint64 // Refill.Resend of the refill after them
	}{
		{"lost", []bool{false}, []bool{true}, 101},
		{"lost after the policy admitted", []bool{true}, []bool{false}, 0},
		{"its resend lost too", []bool{false, false}, []bool{true, true}, 101},
		{"its resend lost after the policy admitted", []bool{false, true}, []bool{true, false}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, c := newEdgeLease(t)
			for i, paid := range tt.paid {
				now := t0.Add(time.Duration(i) * ms)
				st := l.Acquire(&c, now, 1)
				if st.Refill.Want == 0 {
					t.Fatalf("take %d: no refill: %+v", i, st)
				}
				again := st.Refill.Resend != 0
				rseq := cmpOr(st.Refill.Resend, uint64(101+i))
				l.Failed(st.Refill.Seq)
				if got := l.Lost(st.Refill.Seq, rseq, again, paid); got != tt.resent[i] {
					t.Fatalf("take %d (rseq %d, again %v, paid %v): Lost = %v, want %v", i, rseq, again, paid, got, tt.resent[i])
				}
			}
			st := l.Acquire(&c, t0.Add(10*ms), 1)
			if st.Refill.Want == 0 || st.Refill.Resend != tt.next {
				t.Fatalf("the refill after: %+v, want one under Resend %d", st.Refill, tt.next)
			}
		})
	}
}

// TestLeaseLateKeepsALongerLife: a late answer's tokens are usable for a lifetime from
// its arrival, and never shorten the life the tokens on hand had: a roomy grant's.
func TestLeaseLateKeepsALongerLife(t *testing.T) {
	tests := []struct {
		name      string
		remaining float64       // the bucket at the grant before the late answer
		life      time.Duration // of the tokens on hand after the late answer at t0+10ms
	}{
		{"after a grant of one lifetime", 2, 50 * ms}, // its tokens would expire at t0+50ms
		{"after a roomy grant", 1000, 240 * ms},       // five lifetimes from t0
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, c := leaseWith(t, edgeCfg, Grant{Granted: 3, Remaining: tt.remaining})
			at := t0.Add(10 * ms)
			if _, ok := l.Late(&c, at, 101, false, 0, Grant{Granted: 2}); !ok {
				t.Fatal("the late answer was not taken")
			}
			if got := l.lifeFrom(at); got != tt.life {
				t.Fatalf("tokens on hand live %v after the late answer, want %v", got, tt.life)
			}
			if n := l.Expire(&c, at.Add(tt.life)); n != 5 {
				t.Fatalf("refunded %d at their expiry, want all 5", n)
			}
		})
	}
}

// TestLeaseLateReadOnce: a late answer under a Redis number is taken once, whatever its
// low 32 bits (zero included); its replays are not.
func TestLeaseLateReadOnce(t *testing.T) {
	for _, rseq := range []uint64{1, 7, 1 << 32, 5<<32 | 7, 1<<64 - 1} {
		l, c := newEdgeLease(t)
		if _, ok := l.Late(&c, t0, rseq, false, 0, Grant{Granted: 2}); !ok {
			t.Errorf("rseq %#x: the first late answer was not taken", rseq)
		}
		if _, ok := l.Late(&c, t0.Add(ms), rseq, false, 0, Grant{Granted: 2}); ok {
			t.Errorf("rseq %#x: its replay was taken too", rseq)
		}
		if n := l.Tokens(); n != 2 {
			t.Errorf("rseq %#x: %d tokens on hand, want the first answer's 2", rseq, n)
		}
	}
}

// TestLeasePacesAtLeastHalfAToken: however little the bucket lacks of a round, a paced
// lease waits at least half of one token's refill time (one token's, jittered by
// [0.5, 1.5)).
func TestLeasePacesAtLeastHalfAToken(t *testing.T) {
	const token = 100 * ms // at 10/s
	tests := []struct {
		name    string
		servers int
		g       Grant
	}{
		{"a full grant half a token short of a round", 10, Grant{Granted: 1, Remaining: 9.5}},
		{"a grant of 0 half a token short of the batch", 1, Grant{Remaining: 0.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := LeaseConfig{Rate: 10, Burst: 1000, Servers: tt.servers}.Normalize()
			if err != nil {
				t.Fatal(err)
			}
			for seed := range uint64(20) {
				l := NewLease(seed)
				st := l.Acquire(&c, t0, 1)
				l.Granted(&c, t0, st.Refill.Seq, tt.g)
				if d := l.PacedUntil().Sub(t0); d < token/2 || d >= 3*token/2 {
					t.Fatalf("seed %d: paced %v, want within [%v, %v)", seed, d, token/2, 3*token/2)
				}
			}
		})
	}
}

// edgeShapes returns the shapes of c for one server, closed at the end of the test, and
// c with its defaults filled in.
func edgeShapes(t *testing.T, c LimitConfig) (*shapes, LimitConfig) {
	t.Helper()
	ss, c, err := buildShapes(c, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range ss.all() {
			s.fallback.Close()
		}
	})
	return ss, c
}

// TestShapeSameBucket: keys move between two shapes without giving their leases back
// only when the bucket (rate, burst, version), the pre-check and the lease sizing
// (refill interval, lifetime, low watermark) are the same; the failure policy and
// MaxWait are not the bucket's.
func TestShapeSameBucket(t *testing.T) {
	base := LimitConfig{Name: "api", Rate: 100, Burst: 100, Policy: breaker.FailClosed,
		RefillInterval: 50 * ms, Lifetime: time.Second, LowWatermark: 0.5}
	tests := []struct {
		name string
		mod  func(*LimitConfig)
		same bool
	}{
		{"the same configuration", func(*LimitConfig) {}, true},
		{"another failure policy", func(c *LimitConfig) { c.Policy = breaker.FailOpen }, true},
		{"another MaxWait", func(c *LimitConfig) { c.MaxWait = time.Second }, true},
		{"another rate", func(c *LimitConfig) { c.Rate = 50 }, false},
		{"another burst", func(c *LimitConfig) { c.Burst = 50 }, false},
		{"another version", func(c *LimitConfig) { c.Version = 1 }, false},
		{"another pre-check rate", func(c *LimitConfig) { c.PreRate = 10 }, false},
		{"another pre-check burst", func(c *LimitConfig) { c.PreBurst = 10 }, false},
		{"another refill interval", func(c *LimitConfig) { c.RefillInterval = 100 * ms }, false},
		{"another lifetime", func(c *LimitConfig) { c.Lifetime = 2 * time.Second }, false},
		{"another low watermark", func(c *LimitConfig) { c.LowWatermark = 0.25 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := base
			tt.mod(&o)
			a, _ := edgeShapes(t, base)
			b, _ := edgeShapes(t, o)
			if got := a.base.sameBucket(b.base); got != tt.same {
				t.Fatalf("sameBucket = %v, want %v", got, tt.same)
			}
			if got := b.base.sameBucket(a.base); got != tt.same {
				t.Fatalf("sameBucket the other way = %v, want %v", got, tt.same)
			}
		})
	}
}

// TestShapesOf: a limit's shape of a tier is that tier's; of "" and of a tier the limit
// does not have (one a SetLimit removed while a request was being decided), the
// limit's own.
func TestShapesOf(t *testing.T) {
	ss, _ := edgeShapes(t, LimitConfig{Name: "api", Rate: 100, Burst: 100, Policy: breaker.FailClosed,
		Tiers: []TierConfig{{Name: "gold", Rate: 1000, Burst: 1000}, {Name: "free", Rate: 10, Burst: 10}}})
	for _, tc := range []struct {
		tier string
		want *Shape
	}{
		{"", ss.base},
		{"gold", ss.tiers[0]},
		{"free", ss.tiers[1]},
		{"gone", ss.base},
	} {
		if got := ss.of(tc.tier); got != tc.want {
			t.Errorf("of(%q) = %+v, want the shape of tier %q", tc.tier, got, tc.want.Tier())
		}
	}
}

// TestBuildShapesMaxCost: a limit's MaxCost defaults to 1, and each tier's is the
// limit's, at most the tier's burst.
func TestBuildShapesMaxCost(t *testing.T) {
	tests := []struct {
		name       string
		maxCost    int
		base, tier int // MaxCost of the limit's own shape and of its tier of burst 10
	}{
		{"default", 0, 1, 1},
		{"below the tier's burst", 5, 5, 5},
		{"at the tier's burst", 10, 10, 10},
		{"above the tier's burst", 20, 20, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := LimitConfig{Name: "api", Rate: 100, Burst: 100, Policy: breaker.FailClosed, MaxCost: tt.maxCost,
				Tiers: []TierConfig{{Name: "free", Rate: 10, Burst: 10}}}
			ss, got := edgeShapes(t, c)
			if got.MaxCost != tt.base || ss.base.cfg.MaxCost != tt.base || ss.of("free").cfg.MaxCost != tt.tier {
				t.Fatalf("MaxCost %d: the configuration's %d, the limit's shape's %d, the tier's %d; want %d, %d and %d",
					tt.maxCost, got.MaxCost, ss.base.cfg.MaxCost, ss.of("free").cfg.MaxCost, tt.base, tt.base, tt.tier)
			}
		})
	}
}

// TestSetLimitKeepsLeasesOfTheSameBucket: a configuration change that leaves a key's
// bucket, pre-check and lease sizing as they were (another MaxWait, another policy)
// keeps the key's leased tokens serving; one that changes the bucket gives them back,
// and the key's next request is decided afresh under the new parameters.
func TestSetLimitKeepsLeasesOfTheSameBucket(t *testing.T) {
	tests := []struct {
		name     string
		mod      func(*LimitConfig)
		kept     bool
		reshaped int64
		refunded int
	}{
		{"another MaxWait", func(c *LimitConfig) { c.MaxWait = 2 * time.Second }, true, 0, 0},
		{"another policy", func(c *LimitConfig) { c.Policy = breaker.FailOpen }, true, 0, 0},
		{"another rate, under a higher version", func(c *LimitConfig) { c.Rate, c.Version = 200, 1 }, false, 1, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, lm := testEngine(t, nil)
			leased(t, e, lm, "", "k", 5, t0) // 4 on hand
			cfg := lm.Config()
			tt.mod(&cfg)
			if err := e.SetLimit(t0.Add(ms), cfg); err != nil {
				t.Fatal(err)
			}
			d, w := decide(e, t0.Add(2*ms), lm, "k", 1)
			if kept := w == nil && d.Allowed && d.Source == SourceLease; kept != tt.kept {
				t.Fatalf("the request after the change: %+v (waits: %v); served by the lease kept: %v, want %v", d, w != nil, kept, tt.kept)
			}
			if got := lm.Stats().Reshaped; got != tt.reshaped {
				t.Errorf("Reshaped %d, want %d", got, tt.reshaped)
			}
			if got := refundAll(e, t0.Add(2*ms)); got != tt.refunded {
				t.Errorf("%d tokens given back, want %d", got, tt.refunded)
			}
		})
	}
}

// TestReshapeLetsGoOfTheRefillInFlight: a key re-shaped to another bucket while its
// refill is out lets go of that refill, as an eviction would: its grant serves the
// requests that waited for it, as far as it goes, and the rest goes back to Redis.
func TestReshapeLetsGoOfTheRefillInFlight(t *testing.T) {
	e, lm := testEngine(t, func(c *Config) {
		c.Limits[0].Tiers = []TierConfig{{Name: "gold", Rate: 1000, Burst: 1000}}
	})
	_, w := decide(e, t0, lm, "k", 1)
	if w == nil {
		t.Fatal("no refill for a new key")
	}
	trip := e.Next()
	var d Decision
	if e.Decide(t0.Add(ms).UnixNano(), lm, "gold", "k", 0, &d) != nil || !d.Allowed {
		t.Fatalf("a request of cost 0 under tier gold: %+v, want allowed at once", d)
	}
	answerAll(trip)
	trip.TakeResults[0].Granted = 3
	e.Done(t0.Add(2*ms), trip)
	if d := w.Decision(); !d.Allowed {
		t.Fatalf("the request that waited: %+v, want served by the grant", d)
	}
	if got := refundAll(e, t0.Add(3*ms)); got != 2 {
		t.Errorf("%d of the grant's 3 given back, want the 2 nobody waited for", got)
	}
}

// TestSetLimitVersionGuardsTheBuckets: a change of any bucket's parameters (the rate or
// burst of the limit or of a tier, a tier added or removed) needs a higher Version, and
// any change may come with one; a change of anything else needs none.
func TestSetLimitVersionGuardsTheBuckets(t *testing.T) {
	tests := []struct {
		name   string
		mod    func(*LimitConfig)
		needed bool
	}{
		{"another MaxWait", func(c *LimitConfig) { c.MaxWait = 2 * time.Second }, false},
		{"another lifetime", func(c *LimitConfig) { c.Lifetime = 2 * time.Second }, false},
		{"another rate", func(c *LimitConfig) { c.Rate = 200 }, true},
		{"another burst", func(c *LimitConfig) { c.Burst = 200 }, true},
		{"another tier rate", func(c *LimitConfig) { c.Tiers[0].Rate = 2000 }, true},
		{"another tier burst", func(c *LimitConfig) { c.Tiers[0].Burst = 2000 }, true},
		{"a tier added", func(c *LimitConfig) { c.Tiers = append(c.Tiers, TierConfig{Name: "free", Rate: 1, Burst: 1}) }, true},
		{"a tier removed", func(c *LimitConfig) { c.Tiers = nil }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, lm := testEngine(t, func(c *Config) {
				c.Limits[0].Tiers = []TierConfig{{Name: "gold", Rate: 1000, Burst: 1000}}
			})
			cfg := lm.Config()
			cfg.Tiers = append([]TierConfig(nil), cfg.Tiers...)
			tt.mod(&cfg)
			if err := e.CheckLimit(cfg); (err != nil) != tt.needed || err != nil && !errors.Is(err, errVersion) {
				t.Fatalf("CheckLimit at the same version: %v, want a higher version needed: %v", err, tt.needed)
			}
			cfg.Version++
			if err := e.SetLimit(t0, cfg); err != nil {
				t.Fatalf("SetLimit under a higher version: %v", err)
			}
		})
	}
}

// TestSetLimitPolicyChangeTakesEffect: a change of the failure policy alone, the bucket
// kept, decides the requests of a refill that fails from then on.
func TestSetLimitPolicyChangeTakesEffect(t *testing.T) {
	for _, tc := range []struct {
		name    string
		from    breaker.Policy
		to      breaker.Policy
		allowed bool
	}{
		{"closed to open", breaker.FailClosed, breaker.FailOpen, true},
		{"open to closed", breaker.FailOpen, breaker.FailClosed, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, lm := testEngine(t, func(c *Config) { c.Limits[0].Policy = tc.from })
			c := lm.Config()
			c.Policy = tc.to
			if err := e.SetLimit(t0, c); err != nil {
				t.Fatal(err)
			}
			_, w := decide(e, t0, lm, "k", 1)
			if w == nil {
				t.Fatal("no refill for a new key")
			}
			trip := e.Next()
			trip.Err = fmt.Errorf("deadline: %w", breaker.ErrTimeout)
			e.Done(t0.Add(10*ms), trip)
			if d := w.Decision(); d.Allowed != tc.allowed || d.Source != SourceFallback {
				t.Fatalf("%+v, want decided by the policy in force: allowed %v", d, tc.allowed)
			}
		})
	}
}
