package engine

import (
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
)

// TestMultiOnePass: an all-or-nothing request whose items are all lease hits is decided
// in one pass and counted once per item; when a later item is not a hit, the hits before
// it are undone (tokens, pre-check and demand, uncounted) and the full path decides as
// it would have alone: here b's empty pre-check denies, and a is left as it was.
func TestMultiOnePass(t *testing.T) {
	e, a := testEngine(t, func(c *Config) {
		c.Limits = []LimitConfig{
			{Name: "api", Rate: 100, Burst: 100, Policy: breaker.FailClosed, LowWatermark: -1},
			{Name: "b", Rate: 100, Burst: 100, PreRate: 1, PreBurst: 2, Policy: breaker.FailClosed, LowWatermark: -1},
		}
	})
	b := e.Limit("b")
	// A lease on each key: a refill of one token, granted ten.
	for _, lm := range []*Limit{a, b} {
		leased(t, e, lm, "", "k", 10, t0)
		if tokens, _, _, _ := lmState(lm); tokens != 9 {
			t.Fatalf("%s: %d tokens on hand after a grant of 10 for one request, want 9", lm.Name(), tokens)
		}
	}
	state := lmState
	multi := func() *Multi {
		var m Multi
		m.Add(MultiItem{Limit: a, Key: "k", N: 1})
		m.Add(MultiItem{Limit: b, Key: "k", N: 1})
		if w, done := e.StartMulti(t0.UnixNano(), &m); w != nil || !done {
			t.Fatalf("StartMulti waited (%v, %v); every item is a hit or a certain denial", w, done)
		}
		return &m
	}

	ta, pa, _, aa := state(a)
	tb, _, _, ab := state(b)
	if m := multi(); !m.Allowed || m.Denied != -1 {
		t.Fatalf("two hits: %+v, want admitted", m)
	}
	ta1, pa1, _, aa1 := state(a)
	tb1, pb1, _, ab1 := state(b)
	if ta1 != ta-1 || tb1 != tb-1 || aa1 != aa+1 || ab1 != ab+1 || pa1 != pa-1 {
		t.Fatalf("two hits: a %d→%d tokens, %d→%d allowed; b %d→%d tokens, %d→%d allowed; a's pre-check %v→%v",
			ta, ta1, aa, aa1, tb, tb1, ab, ab1, pa, pa1)
	}
	if pb1 >= 1 {
		t.Fatalf("b's pre-check holds %v after two requests of its burst of 2, want under 1", pb1)
	}
	// b's pre-check is now empty: a is a hit, b is not; a is undone and the look denies.
	_, _, da1, _ := state(a)
	m := multi()
	if m.Allowed || m.Denied != 1 || m.Decision.Reason != ReasonPreCheck {
		t.Fatalf("an empty pre-check on the second item: %+v, want denied by it", m)
	}
	ta2, pa2, da2, aa2 := state(a)
	if ta2 != ta1 || pa2 != pa1 || da2 != da1 || aa2 != aa1 {
		t.Errorf("a, undone: tokens %d→%d, pre-check %v→%v, demand %v→%v, allowed %d→%d; want unchanged",
			ta1, ta2, pa1, pa2, da1, da2, aa1, aa2)
	}
	if s := a.Stats(); s.GivenBack != 0 {
		t.Errorf("a undone hit counted as given back: %d", s.GivenBack)
	}
}

// lmState is key k of lm: its lease's tokens on hand, its pre-check's tokens and its
// demand estimate at t0, and the limit's admitted decisions.
func lmState(lm *Limit) (tokens int, pre float64, demand float64, allowed int64) {
	lm.keys.Peek("k", func(en *entry, _ int64) {
		c := en.shape.lease.Load()
		tokens, pre, demand = en.lease.Tokens(), en.pre.TokensAt(t0.UnixNano()), en.lease.Demand(c, t0)
	})
	s := lm.Stats()
	for src := range NumSources {
		for r := range NumReasons {
			allowed += s.Decisions[1][src][r]
		}
	}
	return
}

// TestMultiAddCopiesEveryField: Add copies a MultiItem field by field, so a field
// MultiItem gains must be copied there too; the item read back equals the one added,
// every field set, in the Multi itself and past its first 8.
func TestMultiAddCopiesEveryField(t *testing.T) {
	if n := reflect.TypeFor[MultiItem]().NumField(); n != 4 {
		t.Fatalf("MultiItem has %d fields: copy the new ones in Multi.Add, and set them here", n)
	}
	var m Multi
	for i := range 10 {
		it := MultiItem{Limit: &Limit{}, Tier: "gold", Key: "k" + strconv.Itoa(i), N: i + 1}
		m.Add(it)
		if got := *m.At(i); got != it {
			t.Fatalf("item %d read back %+v, want %+v", i, got, it)
		}
	}
}

// TestGivenBackUnderItsTier: tokens of a key on a tier that go back to Redis because
// the lease no longer holds them go under the tier's shape, with the lease's own: under
// the limit's own shape Redis would add nothing of either. A hit of an all-or-nothing
// request undone (unhit) after another request swept its lease's expired tokens; a
// decision given back (Engine.Return) after its key was let go.
func TestGivenBackUnderItsTier(t *testing.T) {
	for _, tc := range []struct {
		name string
		// giveBack spends from k's lease of 9 tokens on hand at t0+2ms and gives back;
		// it returns when, for the trips that follow.
		giveBack func(t *testing.T, e *Engine, lm *Limit) time.Time
	}{
		{"unhit", func(t *testing.T, e *Engine, lm *Limit) time.Time {
			b := lm.kind.(*bucket)
			now := t0.Add(2 * ms).UnixNano()
			if _, ok := b.hit(now, "gold", "k", 1); !ok {
				t.Fatal("no hit on a lease of 9")
			}
			// Past the lease's lifetime, a request sweeps the 8 left; then the hit is undone.
			var d Decision
			e.Decide(t0.Add(1500*ms).UnixNano(), lm, "gold", "k", 1, &d)
			b.unhit(now, "gold", "k", 1)
			return t0.Add(1600 * ms)
		}},
		{"return", func(t *testing.T, e *Engine, lm *Limit) time.Time {
			var d Decision
			if w := e.Decide(t0.Add(2*ms).UnixNano(), lm, "gold", "k", 2, &d); w != nil || !d.Allowed {
				t.Fatalf("a lease of 9: %+v, want served", d)
			}
			lm.keys.Remove("k") // its 7 left queued under gold
			e.Return(t0.Add(3*ms), t0.Add(2*ms), lm, "gold", "k", 2, d)
			return t0.Add(4 * ms)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, lm := testEngine(t, func(c *Config) {
				c.Limits[0].Tiers = []TierConfig{{Name: "gold", Rate: 1000, Burst: 1000}}
			})
			gold := lm.Shape("gold")
			leased(t, e, lm, "gold", "k", 10, t0)
			at := tc.giveBack(t, e, lm)
			refunded := 0
			for tr := e.Next(); tr != nil; tr = e.Next() {
				for _, r := range tr.Refunds {
					if r.Limit != gold.glim {
						t.Errorf("refund of %d under %+v, want the tier's %+v", r.N, r.Limit, gold.glim)
					}
					refunded += r.N
				}
				answerAll(tr)
				e.Done(at, tr)
			}
			if refunded != 9 { // the grant of 10 less the first request's token
				t.Errorf("%d tokens refunded, want 9", refunded)
			}
		})
	}
}
