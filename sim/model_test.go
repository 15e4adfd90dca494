package sim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// entropy feeds the operation generator: a seeded PRNG in TestModelMatchesScripts, the
// fuzzer's bytes in FuzzModelMatchesScripts.
type entropy interface{ IntN(n int) int }

type byteEntropy struct {
	b []byte
	i int
}

func (e *byteEntropy) IntN(n int) int {
	var v int
	for k := 0; k < 2; k++ {
		v <<= 8
		if e.i < len(e.b) {
			v |= int(e.b[e.i])
			e.i++
		}
	}
	return v % n
}

// mop is one operation of a differential sequence.
type mop struct {
	kind             string // bucket, caller, take, refund
	key              string
	capacity, rate   float64
	n, min           int // cost / want / amount; min for take
	server           string
	seq              uint64
	dt               time.Duration // clock move before the op (negative: Redis clock steps back)
	callerSkewMillis float64       // caller clock - Redis clock, for kind caller
}

func (o mop) String() string {
	return fmt.Sprintf("%s(%s cap=%v rate=%v n=%d min=%d %s seq=%d) after %v skew %vms",
		o.kind, o.key, o.capacity, o.rate, o.n, o.min, o.server, o.seq, o.dt, o.callerSkewMillis)
}

var (
	capacities = []float64{1, 2, 3, 10, 100, 10000}
	rates      = []float64{0.5, 1, 3, 7, 10, 100, 1000, 100000}
)

// genOps draws a random operation sequence. backwards allows the clock to step back and
// jump far (miniredis only: a real Redis runs on its own clock).
func genOps(e entropy, n int, backwards bool) []mop {
	type params struct{ capacity, rate float64 }
	keys := []string{"a", "b", "c"}
	p := map[string]params{}
	for _, k := range keys {
		p[k] = params{capacities[e.IntN(len(capacities))], rates[e.IntN(len(rates))]}
	}
	nservers := []int{2, 5, 300}[e.IntN(3)]
	seqs := map[string]uint64{}
	ops := make([]mop, 0, n)
	for range n {
		o := mop{key: keys[e.IntN(len(keys))]}
		pp := p[o.key]
		if e.IntN(10) == 0 { // a caller that disagrees about the limit
			pp = params{capacities[e.IntN(len(capacities))], rates[e.IntN(len(rates))]}
		}
		o.capacity, o.rate = pp.capacity, pp.rate
		c := int(o.capacity)
		switch e.IntN(7) {
		case 0, 1:
			o.kind, o.n = "bucket", 1+e.IntN(c+1)
		case 2:
			o.kind, o.n = "caller", 1+e.IntN(c+1)
			o.callerSkewMillis = float64(e.IntN(5001) - 1000)
		case 3, 4:
			o.kind, o.n = "take", 1+e.IntN(c+2)
			o.min = e.IntN(o.n + 1)
		default:
			o.kind, o.n = "refund", e.IntN(c+2)
		}
		if o.kind == "take" || o.kind == "refund" {
			o.server = fmt.Sprintf("s%d", e.IntN(nservers))
			s := seqs[o.server]
			switch e.IntN(10) {
			case 0: // replay of the last call
				o.seq = max(s, 1)
			case 1: // stale
				o.seq = max(s, 3) - 2
			default:
				s++
				seqs[o.server] = s
				o.seq = s
			}
		}
		switch r := e.IntN(20); {
		case r < 8:
			o.dt = time.Duration(e.IntN(5000)) * time.Microsecond
		case r < 14:
			o.dt = 0
		case r < 17:
			o.dt = time.Duration(e.IntN(200)) * time.Millisecond
		case !backwards:
			o.dt = time.Duration(e.IntN(3000)) * time.Microsecond
		case r < 19:
			o.dt = time.Duration(e.IntN(200)) * time.Second // past TTLs and the 120 s record age
		default:
			o.dt = -time.Duration(e.IntN(3000)) * time.Millisecond
		}
		ops = append(ops, o)
	}
	return ops
}

// result is one op's answer, the same shape from both sides.
type result struct {
	a, b float64 // bucket: allowed, tokens; refund: flag, tokens
	take takeReply
}

func applyOp(s scripts, now time.Time, prefix string, o mop) result {
	key := prefix + o.key
	switch o.kind {
	case "bucket":
		a, t := s.Bucket(now, key, o.capacity, o.rate, float64(o.n))
		return result{a: float64(a), b: t}
	case "caller":
		a, t := s.BucketCallerClock(now, key, o.capacity, o.rate, float64(o.n), luaMillis(now)+o.callerSkewMillis)
		return result{a: float64(a), b: t}
	case "take":
		return result{take: s.Take(now, key, o.capacity, o.rate, o.n, o.min, o.server, o.seq)}
	default:
		t, f := s.Refund(now, key, o.capacity, o.rate, o.n, o.server, o.seq)
		return result{a: float64(f), b: t}
	}
}

// near compares numbers parsed from both sides. A real Redis prints tostring() with %.14g
// (deps.md §1.5), so its tostring values may differ from the exact double in the last
// digits; tol is that relative tolerance (0 means exact).
func near(a, b, tol float64) bool {
	if a == b {
		return true
	}
	return math.Abs(a-b) <= tol*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

func sameResult(x, y result, tol float64) bool {
	return near(x.a, y.a, 0) && near(x.b, y.b, tol) &&
		x.take.Granted == y.take.Granted && near(x.take.Tokens, y.take.Tokens, tol) &&
		x.take.WaitMS == y.take.WaitMS && x.take.NowMS == y.take.NowMS && x.take.Flag == y.take.Flag
}

// sameFields compares a bucket hash: tokens and ts are stored with full precision on both
// sides (exact); record fields hold tostring() values (tol).
func sameFields(want, got map[string]string, tol float64) error {
	if len(want) != len(got) {
		return fmt.Errorf("fields %v, model %v", got, want)
	}
	for f, wv := range want {
		gv, ok := got[f]
		if !ok {
			return fmt.Errorf("field %s missing (model has %q)", f, wv)
		}
		t := tol
		if f == "tokens" || f == "ts" {
			t = 0
		}
		wp, gp := strings.Fields(wv), strings.Fields(gv)
		if len(wp) != len(gp) {
			return fmt.Errorf("field %s = %q, model %q", f, gv, wv)
		}
		for i := range wp {
			a, err1 := tonumber(wp[i], true)
			b, err2 := tonumber(gp[i], true)
			if !err1 || !err2 || !near(a, b, t) {
				return fmt.Errorf("field %s = %q, model %q", f, gv, wv)
			}
		}
	}
	return nil
}

func (m *model) clone() *model {
	c := *m
	c.keys = make(map[string]*mhash, len(m.keys))
	for k, h := range m.keys {
		hh := *h
		hh.fields = make(map[string]string, len(h.fields))
		for f, v := range h.fields {
			hh.fields[f] = v
		}
		c.keys[k] = &hh
	}
	return &c
}

// checkState compares every key of the sequence on the server with the model.
func checkState(ctx context.Context, c *redis.Client, m *model, now time.Time, prefix string, tol float64) error {
	for _, k := range []string{"a", "b", "c"} {
		got, err := c.HGetAll(ctx, prefix+k).Result()
		if err != nil {
			return err
		}
		if len(got) == 0 {
			got = nil
		}
		if err := sameFields(m.Fields(now, prefix+k), got, tol); err != nil {
			return fmt.Errorf("key %s: %w", k, err)
		}
	}
	return nil
}

// runMini runs ops on miniredis (clock set per op) and on the model, failing at the first
// difference.
func runMini(t testing.TB, mr *miniredis.Miniredis, c *redis.Client, prefix string, ops []mop) {
	t.Helper()
	ctx := context.Background()
	mr.ClockTTL(true)
	d, err := newDirectEval(mr)
	if err != nil {
		t.Fatal(err)
	}
	lua := &luaScripts{ev: d, mini: mr}
	if len(ops)%2 == 1 { // half the sequences go through go-redis and a connection instead
		lua.ev = clientEval{ctx: ctx, c: c}
	}
	m := newModel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for i, o := range ops {
		now = now.Add(o.dt)
		want := applyOp(m, now, prefix, o)
		got := applyOp(lua, now, prefix, o)
		if lua.err != nil {
			t.Fatalf("op %d %v: %v", i, o, lua.err)
		}
		if !sameResult(want, got, 0) {
			t.Fatalf("op %d %v at %v: scripts answered %+v, model %+v", i, o, now, got, want)
		}
		if err := checkState(ctx, c, m, now, prefix, 0); err != nil {
			t.Fatalf("op %d %v: %v", i, o, err)
		}
	}
}

// runReal runs ops on a real Redis, whose clock the test cannot set: each op's instant is
// bracketed by the wall clock read before and after the call, and the model must give the
// same answer and state for one of the milliseconds in that bracket.
func runReal(t testing.TB, c *redis.Client, prefix string, ops []mop) {
	t.Helper()
	ctx := context.Background()
	lua := &luaScripts{ev: clientEval{ctx: ctx, c: c}}
	m := newModel()
	for i, o := range ops {
		if o.dt > 0 {
			time.Sleep(o.dt / 10) // real time has to pass for a real Redis to refill
		}
		before := time.Now()
		got := applyOp(lua, before, prefix, o)
		after := time.Now()
		if lua.err != nil {
			t.Fatalf("op %d %v: %v", i, o, lua.err)
		}
		var errs []string
		matched := false
		for ms := int64(luaMillis(before)) - 1; ms <= int64(luaMillis(after))+1 && !matched; ms++ {
			at := time.UnixMilli(ms).UTC()
			cand := m.clone()
			want := applyOp(cand, at, prefix, o)
			if !sameResult(want, got, 1e-12) {
				errs = append(errs, fmt.Sprintf("at %dms model answered %+v", ms, want))
				continue
			}
			if err := checkState(ctx, c, cand, at, prefix, 1e-12); err != nil {
				errs = append(errs, fmt.Sprintf("at %dms: %v", ms, err))
				continue
			}
			m, matched = cand, true
		}
		if !matched {
			t.Fatalf("op %d %v: Redis answered %+v; no instant in the call's bracket matches:\n%s", i, o, got, strings.Join(errs, "\n"))
		}
	}
}

// TestModelMatchesScripts is the differential test that licenses the Go model: random
// operation sequences of Bucket, the caller-clock variant, Take and Refund (with replays,
// stale sequence numbers, clock jumps forward past TTLs and the 120 s record age, clock
// steps backwards, and hashes over 256 fields) must get the same answers and leave the same
// state on the model as the Lua scripts on miniredis and, when one answers, on a real Redis.
func TestModelMatchesScripts(t *testing.T) {
	seqs, n := 24, 250
	if testing.Short() {
		seqs, n = 6, 200
	}
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		for s := range seqs {
			r := rand.New(rand.NewPCG(uint64(s), 0x5eed))
			if tg.Real() {
				ops := genOps(r, n/4, false)
				runReal(t, tg.Client, redistest.Unique(t)+":", ops)
				continue
			}
			runMini(t, tg.Mini, tg.Client, fmt.Sprintf("seq%d:", s), genOps(r, n, true))
		}
	})
}

// FuzzModelMatchesScripts lets the fuzzer choose the operation sequences (miniredis only):
// go test ./sim -run '^$' -fuzz FuzzModelMatchesScripts
func FuzzModelMatchesScripts(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte(strings.Repeat("\xff\x00\x7f\x10", 64)))
	f.Add([]byte(strings.Repeat("take refund bucket caller", 8)))
	f.Fuzz(func(t *testing.T, b []byte) {
		mr, c := redistest.Mini(t)
		e := &byteEntropy{b: b}
		runMini(t, mr, c, "f:", genOps(e, min(len(b)/4+1, 150), true))
	})
}
